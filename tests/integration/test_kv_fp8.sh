#!/usr/bin/env bash
# FP8 KV pages end to end over HTTP (CPU, tiny-qwen3, --kv-dtype fp8):
# /v1/status, /admin/cache and /metrics report the format and its bytes per
# token; a prompt reused from the pool and one restored from the SSD tier
# after a restart give the cold FP8 run's tokens (pages move as bytes,
# never re-quantized); an F32 server on the same SSD directory restores
# nothing of the FP8 records (another hash seed: counted foreign), and the
# FP8 records are still served to the next FP8 server. A bad --kv-dtype is
# refused before the server listens.
set -u
cd "$(dirname "$0")/../.."
source tests/integration/common.bash
source tests/integration/kv_common.bash

SSD="$TMP/ssd"
P=16

A=$(prompt_ids 700 5)

# --- refused: a name that is no KV type, and bf16 on the CPU backend
out=$("$NS_BIN" serve --host 127.0.0.1 --port 0 --model "$MODEL" --kv-dtype fp4 2>&1); rc=$?
[ $rc = 2 ] && grep -q -- '--kv-dtype must be auto, bf16, f32 or fp8' <<<"$out" || fail "--kv-dtype fp4: exit $rc: $out"
out=$("$NS_BIN" serve --host 127.0.0.1 --port 0 --model "$MODEL" --kv-dtype bf16 --no-ssd-cache 2>&1); rc=$?
[ $rc = 2 ] && grep -q 'cpu backend stores KV as f32 or fp8' <<<"$out" || fail "--kv-dtype bf16 on the CPU: exit $rc: $out"
! grep -qi "listening" <<<"$out" || fail "--kv-dtype bf16: listened before failing"

# --- cold FP8 run (the SSD tier starts empty), the format reported, pool reuse, flush
start_server --ssd-cache "$SSD" --kv-tokens 4096 --kv-dtype fp8
complete "$A"; COLD_FP8=$OUT
[ "$CACHED" -eq 0 ] || fail "cold fp8 run cached $CACHED"
st=$(curl -s "$BASE/v1/status")
[ "$(json_get "$st" 'j.kv_dtype')" = fp8 ] || fail "/v1/status kv_dtype: $st"
# tiny-qwen3: 4 layers x 2 (K, V) x 2 kv heads x 32 dims x 1 byte + 16 scales of 4 bytes per 16-token page
[ "$(json_get "$st" 'j.kv_bytes_per_token')" = 516 ] || fail "/v1/status kv_bytes_per_token: $st"
cache=$(curl -s "$BASE/admin/cache")
[ "$(json_get "$cache" 'j.kv_dtype')" = fp8 ] && [ "$(json_get "$cache" 'j.page_bytes')" = $((516 * 16)) ] ||
  fail "/admin/cache: $cache"
capa=$(curl -s "$BASE/v1/capacity")
[ "$(json_get "$capa" 'j.kv_dtype + "/" + j.kv_bytes_per_token')" = fp8/516 ] || fail "/v1/capacity: $capa"
metrics=$(curl -s "$BASE/metrics")
grep -q '^nightshift_kv_dtype_info{dtype="fp8"} 1$' <<<"$metrics" || fail "/metrics: no fp8 dtype info"
grep -q '^nightshift_kv_bytes_per_token 516$' <<<"$metrics" || fail "/metrics: kv_bytes_per_token"
complete "$A"
[ "$CACHED" -ge $((700 - P)) ] || fail "fp8 pool reuse cached only $CACHED"
[ "$OUT" = "$COLD_FP8" ] || fail "fp8 output from the pool differs from cold: $OUT vs $COLD_FP8"
post /admin/flush '{}'
[ "$STATUS" = 200 ] || fail "/admin/flush: $STATUS $BODY_OUT"
kill -KILL "$SERVER_PID"

# --- restart: the FP8 pages come back from SSD as bytes
start_server --ssd-cache "$SSD" --kv-tokens 4096 --kv-dtype fp8
complete "$A"
[ "$(tier ssd)" -ge $((700 - 2 * P)) ] || fail "fp8 prompt not restored from SSD: $TIERS"
[ "$OUT" = "$COLD_FP8" ] || fail "fp8 output restored from SSD differs from cold: $OUT vs $COLD_FP8"
kill -KILL "$SERVER_PID"

# --- an F32 server on the same directory: no hit across formats
start_server --ssd-cache "$SSD" --kv-tokens 4096
complete "$A"
[ "$CACHED" -eq 0 ] || fail "f32 server reused fp8 pages: cached $CACHED ($TIERS)"
[ "$(json_get "$(curl -s "$BASE/v1/status")" 'j.kv_dtype')" = f32 ] || fail "/v1/status of the f32 server"
cache=$(curl -s "$BASE/admin/cache")
[ "$(json_get "$cache" 'j.tiers.ssd.foreign_records')" -gt 0 ] || fail "fp8 records not counted foreign: $cache"
kill -KILL "$SERVER_PID"
start_server --ssd-cache "$SSD" --kv-tokens 4096 --kv-dtype fp8
complete "$A"
[ "$(tier ssd)" -ge $((700 - 2 * P)) ] || fail "fp8 records not served after an f32 server ran: $TIERS"
[ "$OUT" = "$COLD_FP8" ] || fail "fp8 output restored after an f32 server differs from cold"
kill -KILL "$SERVER_PID"

echo "ok - test_kv_fp8"
