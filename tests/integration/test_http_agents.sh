#!/usr/bin/env bash
# bench/http_agents.py, the load generator of the HTTP benchmarks (issue
# #10), runs each of its modes against `serve --dummy-weights` (a tiny
# config, random weights, the demo tokenizer widened to the config's vocab)
# with tiny numbers: every mode prints its table and one JSON line per mode;
# a warm turn hits the prefix cache for the cold prompt and the generated
# tokens; a prompt over the KV pool counts as an abort, with the server's
# error; more sessions than the pool holds wait instead of failing. A few
# seconds on the CPU.
cd "$(dirname "$0")/../.." || exit 1
source tests/integration/common.bash
command -v python3 >/dev/null || fail "python3 not found"

CFG=$TMP/tiny-config.json
cat >"$CFG" <<'EOF'
{"architectures": ["LlamaForCausalLM"], "vocab_size": 1024, "hidden_size": 64, "intermediate_size": 128,
 "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 2048,
 "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": true}
EOF

# start_server of common.bash adds --model; this one serves --dummy-weights
LOG=$TMP/server.log
NS_LOG_LEVEL=info "$NS_BIN" serve --host 127.0.0.1 --port 0 --threads 2 --dummy-weights "$CFG" \
  --kv-tokens 1024 >"$LOG" 2>&1 &
SERVER_PID=$!
SERVER_PIDS+=("$SERVER_PID")
PORT=""
for _ in $(seq 1 500); do
  PORT=$(sed -n 's/.*listening on http:\/\/127\.0\.0\.1:\([0-9]*\).*/\1/p' "$LOG" | head -1)
  [ -n "$PORT" ] && break
  kill -0 "$SERVER_PID" 2>/dev/null || fail "serve --dummy-weights exited during start-up"
  sleep 0.02
done
[ -n "$PORT" ] || fail "serve --dummy-weights did not report its port"
BASE="http://127.0.0.1:$PORT"
grep -q "RANDOM bf16 weights" "$LOG" || fail "serve --dummy-weights does not warn about random weights"

# agents MODE ARGS... — runs the script (it waits for /health itself); sets
# RC, OUT; the JSON lines go to $TMP/json
agents() {
  OUT=$(timeout 60 python3 bench/http_agents.py "$BASE" "$@" --vocab 1024 --seed 7 --wait 20 2>&1)
  RC=$?
  grep '^{' <<<"$OUT" >"$TMP/json"
}
# field MODE EXPR — a Python expression on the JSON line of MODE (as o)
field() {
  python3 -c 'import json,sys
for l in open(sys.argv[1]):
    o = json.loads(l)
    if o["mode"] == sys.argv[2]:
        print(eval(sys.argv[3]))' "$TMP/json" "$1" "$2"
}
check_ok() { # MODE REQUESTS
  [ "$RC" = 0 ] || fail "http_agents $1: exit $RC: $OUT"
  grep -q '^mode  *reqs  *prompt' <<<"$OUT" || fail "http_agents $1: no table: $OUT"
  [ "$(field "$1" 'o["requests"], o["aborts"], o["ttft_s"] is not None')" = "($2, 0, True)" ] ||
    fail "http_agents $1: wrong summary: $OUT"
}

agents cold -n 200 --runs 2 --max-tokens 4
check_ok cold 2
[ "$(field cold 'o["model"], o["completion_tokens"], o["cached_tokens"]["max"]')" = "('tiny-config', 8, 0)" ] ||
  fail "cold: model, tokens or cache: $OUT"

agents concurrent -n 200 -k 3 --max-tokens 4
check_ok concurrent 3
[ "$(field concurrent 'o["ttft_s"]["min"] <= o["ttft_s"]["median"] <= o["ttft_s"]["max"] <= o["wall_s"]')" = True ] ||
  fail "concurrent: TTFT statistics out of order: $OUT"

agents warm -n 200 -k 2 --gen 8 --new 130 --max-tokens 4
check_ok warm 2
[ "$(field warm-setup 'o["requests"], o["aborts"], o["completion_tokens"], o["cached_tokens"]["max"]')" = \
  "(2, 0, 16, 0)" ] || fail "warm: setup turns: $OUT"
# the warm prompt is cold + generated + new; the cold prompt and the
# generated ids (but the last, whose KV is not computed) come from the cache
# (the scheduler may recompute a few pages rather than prefill a short tail)
[ "$(field warm 'o["prompt_tokens"], o["cached_tokens"]["min"] > 200, o["generated_ids_from"]')" = \
  "(338, True, ['token_ids'])" ] || fail "warm: prompt or cache hits: $OUT"

agents pressure -n 300 --sessions 4 --max-tokens 8
check_ok pressure 4
[ "$(field pressure 'len(o["request_walls_s"]), o["short"], o["completion_tokens"]')" = "(4, 0, 32)" ] ||
  fail "pressure: per-request walls or tokens: $OUT"

# a prompt over the KV pool is an abort, with the server's reason
agents cold -n 1500 --max-tokens 4
[ "$RC" = 1 ] || fail "cold over the pool: exit $RC, want 1: $OUT"
[ "$(field cold 'o["aborts"]')" = 1 ] && grep -q "context_exceeds_capacity" <<<"$OUT" ||
  fail "cold over the pool: no abort reported: $OUT"

kill -TERM "$SERVER_PID"
wait "$SERVER_PID" || fail "serve --dummy-weights: exit $? after SIGTERM"
echo "ok: http_agents cold, concurrent, warm, pressure"
