#!/usr/bin/env bash
# KV cache tiers over HTTP (CPU, tiny-qwen3): a restart after SIGKILL
# serves a flushed prompt from SSD; a session churned out of a small pool
# comes back from the RAM tier (or SSD); corrupt and truncated segment
# files are skipped, counted and never served; a full disk degrades the
# SSD tier while requests keep succeeding; another model never sees the
# first model's records. Greedy outputs are compared with cold runs.
set -u
cd "$(dirname "$0")/../.."
source tests/integration/common.bash
source tests/integration/kv_common.bash

SSD="$TMP/ssd"
P=16

admin_cache() { curl -s "$BASE/admin/cache"; }

A=$(prompt_ids 3000 7)

# --- cold reference outputs, no cache tiers at all
start_server --no-ssd-cache --kv-tokens 8192
complete "$A"; COLD_A=$OUT
[ "$CACHED" -eq 0 ] || fail "cold run cached $CACHED"
kill -KILL "$SERVER_PID"

# --- restart: flush, SIGKILL, start again on the same --ssd-cache
start_server --ssd-cache "$SSD" --kv-tokens 8192
complete "$A"
[ "$OUT" = "$COLD_A" ] || fail "output with the SSD tier differs from cold"
post /admin/flush '{}'
[ "$STATUS" = 200 ] || fail "/admin/flush: $STATUS $BODY_OUT"
durable=$(json_get "$BODY_OUT" 'j.durable')
[ "$durable" -ge $((3000 / P - 1)) ] || fail "flush reported only $durable durable pages: $BODY_OUT"
kill -KILL "$SERVER_PID"
start_server --ssd-cache "$SSD" --kv-tokens 8192
complete "$A"
[ "$CACHED" -ge $((3000 - P)) ] || fail "after restart cached_tokens $CACHED < 3000 - $P"
[ "$(tier ssd)" -ge $((3000 - 2 * P)) ] || fail "after restart not served from SSD: $TIERS"
[ "$OUT" = "$COLD_A" ] || fail "output restored from SSD differs from cold: $OUT vs $COLD_A"
kill -KILL "$SERVER_PID"

# --- churn: a pool of 2048 tokens and a RAM tier; A, then B and C, then A
B=$(prompt_ids 1500 11); C=$(prompt_ids 1500 13); A2=$(prompt_ids 1500 7)
start_server --no-ssd-cache --ram-cache 64M --kv-tokens 2048
complete "$A2"; COLD_A2=$OUT
complete "$B"; complete "$C"
complete "$A2"
[ "$(tier ram)" -gt 0 ] || fail "churned session not served from RAM: $TIERS"
[ "$CACHED" -ge $((1500 - P)) ] || fail "churned session cached only $CACHED"
[ "$OUT" = "$COLD_A2" ] || fail "output from the RAM tier differs from cold"
cache=$(admin_cache)
[ "$(json_get "$cache" 'j.tiers.ram.promotions')" -gt 0 ] || fail "/admin/cache shows no RAM promotions: $cache"
kill -KILL "$SERVER_PID"

# --- churn without a RAM tier: the SSD tier catches what the pool drops
start_server --ssd-cache "$TMP/ssd2" --kv-tokens 2048
complete "$A2"; complete "$B"; complete "$C"; complete "$A2"
[ "$(tier ssd)" -gt 0 ] || fail "churned session not served from SSD: $TIERS"
[ "$OUT" = "$COLD_A2" ] || fail "output from the SSD tier (churn) differs from cold"
kill -KILL "$SERVER_PID"

# --- corruption: flip bytes inside a record, truncate the segment's tail
seg=$(ls "$SSD"/seg-*.dat | head -1)
[ -n "$seg" ] || fail "no segment file in $SSD"
size=$(stat -c %s "$seg")
printf '\xff\xfe\xfd\xfc\xfb\xfa\xf9\xf8' | dd of="$seg" bs=1 seek=$((size / 3)) conv=notrunc status=none
truncate -s $((size * 2 / 3)) "$seg"
start_server --ssd-cache "$SSD" --kv-tokens 8192
complete "$A"
[ "$OUT" = "$COLD_A" ] || fail "output after corruption differs from cold (a corrupt page was served?)"
[ "$CACHED" -lt $((3000 - P)) ] || fail "every page still served after corruption ($CACHED)"
cache=$(admin_cache)
bad=$(json_get "$cache" 'j.tiers.ssd.checksum_failures')
[ "$bad" -gt 0 ] || fail "corrupt records were not counted: $cache"
health_ok
kill -KILL "$SERVER_PID"

# --- model change: the same directory with another model serves nothing
MODEL_B=$NS_SHARED/models/tiny-llama3
start_server --model "$MODEL_B" --ssd-cache "$SSD" --kv-tokens 8192
post /v1/completions "{\"prompt\":$(prompt_ids 300 7),\"max_tokens\":2,\"temperature\":0}"
[ "$STATUS" = 200 ] || fail "other model: status $STATUS"
[ "$(json_get "$BODY_OUT" 'j.usage.prompt_tokens_details.cached_tokens')" -eq 0 ] || fail "another model was served cached KV"
kill -KILL "$SERVER_PID"

# --- disk full: a 1 MiB file-size limit; the tier degrades, requests succeed
FULL="$TMP/full"
mkdir -p "$FULL"
LOG="$TMP/full.log"
( ulimit -f 1024; exec env NS_LOG_LEVEL=info "$NS_BIN" serve --host 127.0.0.1 --port 0 --threads 2 --model "$MODEL" \
    --ssd-cache "$FULL" --kv-tokens 8192 ) >"$LOG" 2>&1 &
SERVER_PID=$!
SERVER_PIDS+=("$SERVER_PID")
PORT=""
for _ in $(seq 1 300); do
  PORT=$(sed -n 's/.*listening on http:\/\/127\.0\.0\.1:\([0-9]*\).*/\1/p' "$LOG" | head -1)
  [ -n "$PORT" ] && break
  sleep 0.1
done
[ -n "$PORT" ] || fail "disk-full server did not start"
BASE="http://127.0.0.1:$PORT"
for _ in $(seq 1 100); do [ "$(curl -s -o /dev/null -w '%{http_code}' "$BASE/health")" = 200 ] && break; sleep 0.1; done
complete "$A"
[ "$OUT" = "$COLD_A" ] || fail "disk full: output differs"
post /admin/flush '{}'
complete "$(prompt_ids 3000 99)"
cache=$(admin_cache)
[ "$(json_get "$cache" 'j.tiers.ssd.degraded')" = true ] || fail "SSD tier not degraded on a full disk: $cache"
health_ok
echo "ok"
