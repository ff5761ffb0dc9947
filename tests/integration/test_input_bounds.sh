#!/usr/bin/env bash
# Bounded work per request before admission: a 20 MB prompt against
# tiny-qwen3's 40960-token context is refused (400 context_length_exceeded,
# "more than 40960 tokens") after tokenizing a bounded prefix, as chat and
# as completions text, and costs the server little memory.
#
# Memory is the server's peak RSS (VmHWM, reset through clear_refs before
# each request). Bound: 64 MiB per 20 MB request. What a 20 MB body costs
# before tokenizing, and may not: the server receives it into a buffer that
# grows by doubling (up to ~2x the body while it copies: ~40 MiB) and JSON
# parsing holds the prompt string once more (20 MiB; chat renders it once
# more too, into memory the receive buffer freed). Tokenizing then adds
# O(context): ids and a batch of pre-tokenizer pieces (the whole encode of
# this text took ~350 MiB). The first big requests of fresh connection
# threads also build malloc arenas; they run as warm-up before measuring.
# Four such requests at once stay under 4 x 96 MiB (before: 2.88 GB).
cd "$(dirname "$0")/../.." && source tests/integration/common.bash
[ -r /proc/self/status ] && [ -w /proc/self/clear_refs ] || fail "needs Linux /proc (VmHWM, clear_refs)"
# ASan's quarantine keeps freed memory and its shadow adds more: under a
# sanitizer build the behavior is checked, the RSS bounds are not
SAN=0
grep -qa __asan_init "$NS_BIN" && SAN=1
start_server

hwm() { sed -n 's/^VmHWM:[[:space:]]*\([0-9]*\) kB/\1/p' "/proc/$SERVER_PID/status"; }
reset_hwm() { echo 5 >"/proc/$SERVER_PID/clear_refs"; }

N=1747627 # "hello world " x N = 20 MiB
node -e "process.stdout.write(JSON.stringify({prompt:'hello world '.repeat($N),max_tokens:4}))" >"$TMP/text.json"
node -e "process.stdout.write(JSON.stringify({messages:[{role:'user',content:'hello world '.repeat($N)}],max_tokens:4}))" >"$TMP/chat.json"
node -e "process.stdout.write(JSON.stringify({prompt:'a'.repeat(12*$N),max_tokens:4}))" >"$TMP/run.json"
[ "$(stat -c %s "$TMP/text.json")" -gt 20000000 ] || fail "test body too small"

# big PATH FILE -> STATUS, R (the response), KB (peak RSS growth), SECS
big() {
  reset_hwm
  local before t0 t1
  before=$(hwm)
  t0=$(date +%s%N)
  STATUS=$(curl -s -H 'Content-Type: application/json' -o "$TMP/resp" -w '%{http_code}' --data-binary @"$2" "$BASE$1")
  t1=$(date +%s%N)
  R=$(head -c 600 "$TMP/resp")
  KB=$(($(hwm) - before))
  SECS=$(((t1 - t0) / 1000000))ms
}

refused() { # PATH FILE PARAM
  [ "$STATUS" = 400 ] || fail "$1 $2: status $STATUS: $R"
  [ "$(json_get "$R" '[j.error.code,j.error.param,j.error.prompt_tokens>40960,j.error.prompt_tokens_exact,j.error.context_tokens].join()')" = \
    "context_length_exceeded,$3,true,false,40960" ] || fail "$1 $2: $R"
  json_get "$R" 'j.error.message' | grep -q 'your prompt has more than 40960 tokens' || fail "$1 $2: message: $R"
}

post /v1/completions '{"prompt":"hi","max_tokens":2}'
[ "$STATUS" = 200 ] || fail "warm-up: $STATUS $BODY_OUT"
for i in 1 2; do # warm-up: connection threads' malloc arenas
  big /v1/chat/completions "$TMP/chat.json"
  refused chat "$i" messages
  echo "warm-up chat $i: +$((KB / 1024)) MiB in $SECS"
  big /v1/completions "$TMP/text.json"
  refused text "$i" prompt
  echo "warm-up text $i: +$((KB / 1024)) MiB in $SECS"
done

for what in "chat /v1/chat/completions $TMP/chat.json messages" "text /v1/completions $TMP/text.json prompt" \
  "run /v1/completions $TMP/run.json prompt"; do
  set -- $what
  big "$2" "$3"
  refused "$2" "$1" "$4"
  echo "$1: refused, peak RSS +$((KB / 1024)) MiB in $SECS"
  [ "$SAN" = 1 ] || [ "$KB" -lt $((64 * 1024)) ] || fail "$1: peak RSS grew by $((KB / 1024)) MiB (bound 64)"
done
# the 'a' run is one pre-tokenizer piece: its lower bound refuses it unmerged
[ "$(json_get "$R" 'j.error.prompt_tokens>100000')" = true ] || fail "run: not refused by its bound: $R"

# four at once
reset_hwm
before=$(hwm)
pids=()
for i in 1 2 3 4; do
  curl -s -H 'Content-Type: application/json' -o "$TMP/r$i" -w '%{http_code}' --data-binary @"$TMP/chat.json" \
    "$BASE/v1/chat/completions" >"$TMP/s$i" &
  pids+=($!)
done
wait "${pids[@]}"
KB=$(($(hwm) - before))
for i in 1 2 3 4; do
  # 400 refused, or 503 server_busy when the body budget was full
  s=$(cat "$TMP/s$i")
  [ "$s" = 400 ] || [ "$s" = 503 ] || fail "concurrent $i: status $s: $(head -c 300 "$TMP/r$i")"
done
echo "4 at once: peak RSS +$((KB / 1024)) MiB"
[ "$SAN" = 1 ] || [ "$KB" -lt $((4 * 96 * 1024)) ] || fail "4 at once: peak RSS grew by $((KB / 1024)) MiB (bound 384)"
[ "$SAN" = 0 ] || echo "(sanitizer build: RSS bounds not checked)"

health_ok
post /v1/chat/completions '{"messages":[{"role":"user","content":"hi"}],"max_tokens":2}'
[ "$STATUS" = 200 ] || fail "a normal request afterwards: $STATUS $BODY_OUT"
echo ok
