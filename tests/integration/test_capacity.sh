#!/usr/bin/env bash
# Capacity, told to the client: GET /v1/capacity against the pool arithmetic
# (--kv-tokens 4096 --page-size 16 on tiny-qwen3, context 40960), the
# X-Nightshift-Max-Context-Tokens header on every kind of response,
# /v1/models' effective context_length, and the never-fits 400 answered at
# once with largest_prompt_tokens (which is then shown to fit).
cd "$(dirname "$0")/../.." && source tests/integration/common.bash
KEY=cap-key
POOL=4096
CTX=$(node -e 'console.log(require(process.argv[1]).max_position_embeddings)' "$MODEL/config.json")
start_server --kv-tokens $POOL --page-size 16 --api-key $KEY --ssd-cache "$TMP/ssd"
LIMIT=$((POOL < CTX ? POOL : CTX))

# req ARGS... -> STATUS, BODY_OUT, HDR (the max-context header, "" if absent)
req() {
  STATUS=$(curl -s -o "$TMP/resp" -D "$TMP/hdr" -w '%{http_code}' -H "Authorization: Bearer $KEY" "$@")
  BODY_OUT=$(cat "$TMP/resp")
  HDR=$(tr -d '\r' <"$TMP/hdr" | sed -n 's/^[Xx]-[Nn]ightshift-[Mm]ax-[Cc]ontext-[Tt]okens: *//p' | tail -1)
}
# expect_hdr WHAT [EXACT]: the header is there (and equal to EXACT if given)
expect_hdr() {
  [[ "$HDR" =~ ^[0-9]+$ ]] || fail "$1: no X-Nightshift-Max-Context-Tokens header ($(tr -d '\r' <"$TMP/hdr" | tr '\n' ' '))"
  [ "$HDR" -le "$LIMIT" ] || fail "$1: header $HDR > min(pool, context) $LIMIT"
  if [ $# -ge 2 ]; then [ "$HDR" = "$2" ] || fail "$1: header $HDR, want $2"; fi
}
cap() {
  req "$BASE/v1/capacity"
  [ "$STATUS" = 200 ] || fail "/v1/capacity: $STATUS $BODY_OUT"
  CAP=$BODY_OUT
}
capq() { json_get "$CAP" "$1"; }
# waits (up to 5 s) until nothing runs or waits: the snapshot follows the
# engine's step, so it may trail a response by a step
wait_idle() {
  for _ in $(seq 1 250); do
    cap
    [ "$(capq 'j.running+j.waiting+j.paused')" = 0 ] && [ "$(capq 'j.tiers.device.used_tokens')" = 0 ] && return 0
    sleep 0.02
  done
  fail "the server did not become idle: $CAP"
}
# the pool arithmetic that holds at any time
check_invariants() {
  [ "$(capq "[j.pool_tokens, j.context_tokens, j.largest_fits_alone_tokens].join()")" = "$POOL,$CTX,$LIMIT" ] ||
    fail "pool/context/largest_fits_alone: $CAP"
  [ "$(capq 'j.tiers.device.free_tokens + j.tiers.device.used_tokens')" = $POOL ] || fail "device free+used != pool: $CAP"
  [ "$(capq 'j.admissible_tokens >= 0 && j.admissible_tokens <= j.tiers.device.free_tokens && j.admissible_tokens <= j.largest_fits_alone_tokens')" = true ] ||
    fail "admissible out of range: $CAP"
  [ "$(capq '[j.tiers.device.enabled, j.tiers.ram.enabled, j.tiers.ssd.enabled].join()')" = true,false,true ] ||
    fail "tier enabled flags: $CAP"
  [ "$(capq '["free_tokens","used_tokens","cached_tokens"].every(k => ["device","ram","ssd"].every(t => Number.isInteger(j.tiers[t][k]) && j.tiers[t][k] >= 0))')" = true ] ||
    fail "tier fields: $CAP"
}

# --- idle: everything free, admissible = free - reserved (nothing reserved)
wait_idle
check_invariants
[ "$(capq '[j.running, j.waiting, j.paused, j.tiers.device.free_tokens, j.tiers.device.used_tokens, j.tiers.device.cached_tokens, j.admissible_tokens].join()')" = \
  "0,0,0,$POOL,0,0,$LIMIT" ] || fail "idle capacity: $CAP"
[ "$(capq '[j.tiers.ram.free_tokens, j.tiers.ram.used_tokens, j.tiers.ram.cached_tokens].join()')" = 0,0,0 ] ||
  fail "ram tier is off: $CAP"
[ "$(capq 'j.tiers.ssd.free_tokens > 0 && j.tiers.ssd.cached_tokens === 0')" = true ] || fail "ssd tier: $CAP"
expect_hdr "/v1/capacity" "$LIMIT"
# the route needs the key like the others (and the 401 carries the header)
STATUS=$(curl -s -o "$TMP/resp" -D "$TMP/hdr" -w '%{http_code}' "$BASE/v1/capacity")
HDR=$(tr -d '\r' <"$TMP/hdr" | sed -n 's/^[Xx]-[Nn]ightshift-[Mm]ax-[Cc]ontext-[Tt]okens: *//p')
[ "$STATUS" = 401 ] || fail "/v1/capacity without the key: $STATUS"
expect_hdr "401" "$LIMIT"

# --- the header everywhere
STATUS=$(curl -s -o "$TMP/resp" -D "$TMP/hdr" -w '%{http_code}' "$BASE/health")
HDR=$(tr -d '\r' <"$TMP/hdr" | sed -n 's/^[Xx]-[Nn]ightshift-[Mm]ax-[Cc]ontext-[Tt]okens: *//p')
[ "$STATUS" = 200 ] || fail "/health: $STATUS"
expect_hdr "/health" "$LIMIT"
req "$BASE/v1/models"
[ "$STATUS" = 200 ] || fail "/v1/models: $STATUS $BODY_OUT"
expect_hdr "/v1/models" "$LIMIT"
[ "$(json_get "$BODY_OUT" '[j.data[0].context_length, j.data[0].model_context_length].join()')" = "$LIMIT,$CTX" ] ||
  fail "/v1/models context_length (effective) / model_context_length: $BODY_OUT"
req "$BASE/v1/nothing"
[ "$STATUS" = 404 ] || fail "404: $STATUS"
expect_hdr "404" "$LIMIT"
req -X POST "$BASE/v1/models"
[ "$STATUS" = 405 ] || fail "405: $STATUS"
expect_hdr "405" "$LIMIT"
req -H 'Content-Type: application/json' -d '{"messages":[{"role":"user","content":"x"}],"temperature":9}' \
  "$BASE/v1/chat/completions"
[ "$STATUS" = 400 ] || fail "400: $STATUS $BODY_OUT"
expect_hdr "400"
req -H 'Content-Type: application/json' -d '{"messages":[{"role":"user","content":"Hello there"}],"max_tokens":8,"seed":1}' \
  "$BASE/v1/chat/completions"
[ "$STATUS" = 200 ] || fail "chat: $STATUS $BODY_OUT"
expect_hdr "chat completion"
req -N -H 'Content-Type: application/json' -d '{"prompt":"Once upon a time","max_tokens":8,"stream":true}' \
  "$BASE/v1/completions"
[ "$STATUS" = 200 ] || fail "stream: $STATUS $BODY_OUT"
grep -q '^data: \[DONE\]' "$TMP/resp" || fail "stream did not end with [DONE]: $BODY_OUT"
expect_hdr "streamed completion"

# --- after requests complete: their pages are cached, and cached pages are
# reclaimable, so the whole pool is still free and admissible
wait_idle
check_invariants
[ "$(capq 'j.tiers.device.cached_tokens > 0 && j.tiers.device.cached_tokens % 16 === 0')" = true ] ||
  fail "cached_tokens after requests: $CAP"
[ "$(capq '[j.tiers.device.free_tokens, j.tiers.device.used_tokens, j.admissible_tokens].join()')" = "$POOL,0,$LIMIT" ] ||
  fail "cached pages must count as free: $CAP"

# --- while a request runs: its pages are used, free + used is still the pool
curl -s -N -o /dev/null -H "Authorization: Bearer $KEY" \
  -H 'Content-Type: application/json' -d '{"prompt":"The long story","max_tokens":3000,"ignore_eos":true,"stream":true}' "$BASE/v1/completions" &
BG=$!
running=0
for _ in $(seq 1 250); do
  cap
  if [ "$(capq 'j.running === 1 && j.tiers.device.used_tokens > 0')" = true ]; then running=1; break; fi
  sleep 0.02
done
[ $running = 1 ] || fail "the long request never showed as running: $CAP"
check_invariants
[ "$(capq 'j.admissible_tokens < '$LIMIT' && j.admissible_tokens <= j.tiers.device.free_tokens')" = true ] ||
  fail "admissible while running: $CAP"
expect_hdr "/v1/capacity while running"
[ "$HDR" -lt "$LIMIT" ] || fail "header while running: $HDR, want < $LIMIT"
kill "$BG" 2>/dev/null
wait "$BG" 2>/dev/null
wait_idle
check_invariants

# --- never fits: a prompt of min(pool, context) tokens or more is refused
# at once (no generation), with the largest prompt that fits
for body_max in ',"max_tokens":8' ''; do
  ids=$(node -e 'console.log(JSON.stringify(Array.from({length:+process.argv[1]},(_,i)=>100+i%1000)))' $((POOL + 100)))
  echo "{\"prompt\":$ids$body_max}" >"$TMP/big.json"
  best=9
  for _ in 1 2 3; do
    t=$(curl -s -o "$TMP/resp" -D "$TMP/hdr" -w '%{time_total}' -H "Authorization: Bearer $KEY" \
      -H 'Content-Type: application/json' --data-binary @"$TMP/big.json" "$BASE/v1/completions")
    BODY_OUT=$(cat "$TMP/resp")
    best=$(node -e 'console.log(Math.min(+process.argv[1], +process.argv[2]))' "$best" "$t")
  done
  [ "$(json_get "$BODY_OUT" '[j.error.code, j.error.retryable, j.error.prompt_tokens, j.error.pool_tokens, j.error.context_tokens, j.error.largest_prompt_tokens].join()')" = \
    "context_exceeds_capacity,false,$((POOL + 100)),$POOL,$CTX,$((LIMIT - 1))" ] || fail "never-fits body: $BODY_OUT"
  [ "$(node -e 'console.log(+process.argv[1] < 0.05)' "$best")" = true ] || fail "never-fits took ${best}s (want < 50 ms)"
  HDR=$(tr -d '\r' <"$TMP/hdr" | sed -n 's/^[Xx]-[Nn]ightshift-[Mm]ax-[Cc]ontext-[Tt]okens: *//p')
  expect_hdr "never-fits 400" "$LIMIT"
  echo "never-fits${body_max:+ with max_tokens}: best of 3 ${best}s"
done
cap
[ "$(capq 'j.running + j.waiting')" = 0 ] || fail "a never-fits request was queued: $CAP"

# ... and a prompt of largest_prompt_tokens does fit (max_tokens is clamped
# to the one token left)
ids=$(node -e 'console.log(JSON.stringify(Array.from({length:+process.argv[1]},(_,i)=>100+i%1000)))' $((LIMIT - 1)))
echo "{\"prompt\":$ids,\"max_tokens\":8,\"ignore_eos\":true}" >"$TMP/fit.json"
req -H 'Content-Type: application/json' --data-binary @"$TMP/fit.json" "$BASE/v1/completions"
[ "$STATUS" = 200 ] || fail "a prompt of largest_prompt_tokens: $STATUS $BODY_OUT"
[ "$(json_get "$BODY_OUT" '[j.usage.prompt_tokens, j.usage.completion_tokens, j.choices[0].finish_reason].join()')" = \
  "$((LIMIT - 1)),1,length" ] || fail "largest prompt: $BODY_OUT"
expect_hdr "completion of the largest prompt"
health_ok
echo ok
