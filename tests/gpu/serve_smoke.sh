#!/usr/bin/env bash
# tests/gpu/serve_smoke.sh — builds the full CUDA binary and runs
# `nightshift serve --device cuda` end to end (tests/gpu/serve_smoke.py).
# Called by tests/gpu/run.sh; needs the server's libraries (microhttpd,
# pcre2, utf8proc: from the system or gpu-assets/deps).
set -u
cd "$(dirname "$0")/../.."
LOGS=${NS_GPU_LOG_DIR:-build/cuda/gpu-logs}
mkdir -p "$LOGS"
if ! make CUDA=1 -j"$(nproc)" build/cuda/nightshift >"$LOGS/build_full.log" 2>&1; then
  tail -20 "$LOGS/build_full.log"
  echo "not ok - serve_smoke_build"
  exit 1
fi
PORT=${NS_SMOKE_PORT:-18080}
build/cuda/nightshift serve --device cuda --model "$NS_SHARED/models/tiny-qwen3" --host 127.0.0.1 --port "$PORT" \
  --gpu-memory 0.05 --log-level info >"$LOGS/serve.log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null' EXIT
python3 tests/gpu/serve_smoke.py "http://127.0.0.1:$PORT" "$NS_SHARED"
rc=$?
grep -E "request [0-9]+:|WARN|ERROR" "$LOGS/serve.log" | head -12 | sed 's/^/# /'
# the same server with FP8 KV pages (--kv-dtype fp8): tests/gpu/serve_smoke_fp8.py
kill $pid 2>/dev/null; wait $pid 2>/dev/null
build/cuda/nightshift serve --device cuda --kv-dtype fp8 --model "$NS_SHARED/models/tiny-qwen3" --host 127.0.0.1 \
  --port $((PORT + 1)) --gpu-memory 0.05 --no-ssd-cache --log-level info >"$LOGS/serve_fp8.log" 2>&1 &
pid=$!
python3 tests/gpu/serve_smoke_fp8.py "http://127.0.0.1:$((PORT + 1))" "$NS_SHARED" || rc=1
grep -E "WARN|ERROR" "$LOGS/serve_fp8.log" | head -6 | sed 's/^/# fp8: /'
exit $rc
