#!/usr/bin/env bash
# The command line is predictable (issue #8): every subcommand answers
# --help/-h on stdout with exit 0 and rejects an unknown flag or a missing
# value with a message and its usage on stderr, exit 2; --version names the
# commit and the backends; serve refuses an unusable --model before it
# listens; and the examples in the README and in every usage text run as
# written (placeholders DIR, /path/to/..., CONFIG_JSON filled in), on the
# CPU, in a few seconds.
cd "$(dirname "$0")/../.." || exit 1
if [ -z "${NS_SHARED:-}" ]; then
  NS_SHARED=tests/fixtures
  [ -d "$NS_SHARED/models" ] || NS_SHARED=../shared
fi
NS_SHARED=$(cd "$NS_SHARED" && pwd) || { echo "FAIL: no test assets (NS_SHARED)"; exit 1; }
source tests/integration/common.bash

B=$NS_BIN
SMALL=$NS_SHARED/models/tinystories-656k # small tokenizer: fast to load
COMMANDS=(serve generate tokenize eval bench-engine replay check-prompts bench)
# the usage examples of these need a running server or a recording: they run
# in test_record_replay.sh, test_check_prompts.sh and test_bench.sh
EXAMPLES_ELSEWHERE=" replay check-prompts bench "


# run CMD... — runs the binary; sets RC, OUT, ERR (never starts a server
# that stays up: a hang fails the test through the timeout).
run() {
  timeout 60 "$B" "$@" >"$TMP/out" 2>"$TMP/err"
  RC=$?
  OUT=$(cat "$TMP/out")
  ERR=$(cat "$TMP/err")
}
expect_usage_error() { # what_to_find_in_stderr CMD ARGS...
  local want=$1
  shift
  run "$@"
  [ "$RC" = 2 ] || fail "nightshift $*: exit $RC, want 2 (stderr: $ERR)"
  [ -z "$OUT" ] || fail "nightshift $*: a usage error printed to stdout: $OUT"
  grep -qF -- "$want" <<<"$ERR" || fail "nightshift $*: stderr does not mention '$want': $ERR"
  grep -q "^usage: nightshift $1" <<<"$ERR" || fail "nightshift $*: no usage on stderr: $ERR"
}

# A config small enough to benchmark in well under a second on the CPU.
TINY_CFG=$TMP/tiny-config.json
cat >"$TINY_CFG" <<'EOF'
{"architectures": ["LlamaForCausalLM"], "vocab_size": 256, "hidden_size": 64, "intermediate_size": 128,
 "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 512,
 "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": true}
EOF

# ---- top level
run --help
[ "$RC" = 0 ] || fail "--help: exit $RC"
for c in "${COMMANDS[@]}"; do grep -q "^  $c " <<<"$OUT" || fail "--help does not list $c: $OUT"; done
run
[ "$RC" = 2 ] || fail "no arguments: exit $RC, want 2"
for c in "${COMMANDS[@]}"; do grep -q "^  $c " <<<"$ERR" || fail "bare nightshift does not list $c: $ERR"; done
run frobnicate
[ "$RC" = 2 ] && grep -q 'unknown command "frobnicate"' <<<"$ERR" || fail "unknown command: exit $RC: $ERR"

# ---- --version: version, a real commit (or "unknown" outside git), backends
for v in --version version; do
  run $v
  [ "$RC" = 0 ] || fail "$v: exit $RC"
  grep -Eq '^nightshift [0-9]+\.[0-9]+\.[0-9]+' <<<"$OUT" || fail "$v: no version: $OUT"
  grep -Eq '^backends: cpu' <<<"$OUT" || fail "$v: no backends line: $OUT"
  commit=$(sed -n 's/^commit: *//p' <<<"$OUT")
  [[ "$commit" =~ ^([0-9a-f]{7,40}(-dirty)?|unknown)$ ]] || fail "$v: bad commit '$commit': $OUT"
  # built from this checkout: the commit must exist here (it may be older
  # than HEAD if someone committed after the build)
  if [ "$commit" != unknown ] && git rev-parse --git-dir >/dev/null 2>&1; then
    git cat-file -e "${commit%-dirty}^{commit}" 2>/dev/null || fail "$v: commit $commit is not in this repository"
  fi
done
HAVE_CUDA=0
grep -q '^backends:.*cuda' <<<"$OUT" && ! grep -q 'without cuda' <<<"$OUT" && HAVE_CUDA=1

# ---- every subcommand: --help / -h / help CMD, unknown flag, missing value
declare -A VALUE_FLAG=([serve]=--port [generate]=--prompt [tokenize]=--model [eval]=--tokens [bench-engine]=--device
  [replay]=--url [check-prompts]=--model [bench]=--url)
for c in "${COMMANDS[@]}"; do
  for h in --help -h; do
    run "$c" $h
    [ "$RC" = 0 ] || fail "$c $h: exit $RC: $ERR"
    grep -q "^usage: nightshift $c" <<<"$OUT" || fail "$c $h: no usage on stdout: $OUT"
    [ -z "$ERR" ] || fail "$c $h: wrote to stderr: $ERR"
  done
  run help "$c"
  [ "$RC" = 0 ] && grep -q "^usage: nightshift $c" <<<"$OUT" || fail "help $c: exit $RC: $OUT"
  expect_usage_error "--frobnicate" "$c" --frobnicate
  expect_usage_error "${VALUE_FLAG[$c]} needs a value" "$c" "${VALUE_FLAG[$c]}"
  # every flag the usage documents is one the parser knows: followed by a
  # bogus flag it is at worst "needs a value"/"bad value" or, for a switch
  # such as serve --no-ssd-cache, "unknown option --frobnicate" (never
  # "unknown option $f", and never a server that starts)
  flags=$("$B" "$c" --help | grep -oE '^  (-n, )?--[a-z-]+' | grep -oE -- '--[a-z-]+' | sort -u)
  [ -n "$flags" ] || fail "$c --help lists no flags"
  for f in $flags; do
    [ "$f" = --help ] && continue
    run "$c" "$f" --frobnicate --frobnicate
    ! grep -q "unknown option $f" <<<"$ERR" || fail "$c --help documents $f but the parser rejects it: $ERR"
    [ "$RC" = 2 ] || fail "$c $f (alone): exit $RC, want a usage error"
  done
  # defaults are documented: every option line but the required/placeholder ones says "default"
  "$B" "$c" --help | grep -E '^  (-n, )?--' | grep -vE 'default|required|instead|--dummy-weights|--model DIR  +Hugging' |
    grep -vE '^  --(prompt|tokens|ids|kv-tokens|kv-pages|kv-memory|gpu-memory) ' >"$TMP/nodefault"
  [ ! -s "$TMP/nodefault" ] || fail "$c --help: options without a default: $(cat "$TMP/nodefault")"
done
expect_usage_error "must be an integer" generate --prompt hi -n many
expect_usage_error "--kv-memory must be a size" serve --kv-memory lots
expect_usage_error "--device must be cpu or cuda" serve --device tpu
expect_usage_error "give exactly one of --prompt or --tokens" generate
expect_usage_error "--tokens is required" eval
expect_usage_error "--model DIR is required" tokenize
expect_usage_error "give at most one of --model DIR or --dummy-weights" serve --model "$SMALL" --dummy-weights "$TINY_CFG"
# serve --record*: values checked, and the record options need --record DIR
expect_usage_error 'bad value for --record-max-bytes: "lots"' serve --record "$TMP/rec" --record-max-bytes lots
expect_usage_error 'bad value for --record-keep: "-1"' serve --record "$TMP/rec" --record-keep -1
expect_usage_error "need --record DIR" serve --record-redact
expect_usage_error "need --record DIR" serve --record-keep 2
# replay / check-prompts / bench: what is required is said before anything runs
expect_usage_error "give the recording FILE" replay --url http://127.0.0.1:1
expect_usage_error "give --url ROOT" replay "$TMP/none.jsonl"
expect_usage_error "give --model DIR" check-prompts "$TMP/none.jsonl"
expect_usage_error "give --scenario" bench --url http://127.0.0.1:1
expect_usage_error 'unknown scenario "nope"' bench --url http://127.0.0.1:1 --scenario nope

expect_usage_error "--repeats is at most 15" bench-engine --dummy-weights "$TINY_CFG" --repeats 16
expect_usage_error 'bad value for --repeats: "0"' bench-engine --dummy-weights "$TINY_CFG" --repeats 0

# ---- bench-engine: every point is the median of --repeats timed runs,
# with its spread on the line
run bench-engine --device cpu --dummy-weights "$TINY_CFG" --prefill 32 --batches 1 --contexts 32 --repeats 2 --no-ablation
[ "$RC" = 0 ] || fail "bench-engine --repeats 2: exit $RC: $ERR"
grep -qE '^prefill +32 tokens: .*median of 2, [0-9.]+-[0-9.]+ s\)' <<<"$OUT" || fail "bench-engine prefill line: $OUT"
grep -qE '^decode ctx +32 batch +1: .*\(median of 2, [0-9.]+-[0-9.]+ ms\)' <<<"$OUT" || fail "bench-engine decode line: $OUT"

# ---- bench-engine: the argv convention (was "unknown argument cuda"); its
# CPU run is the usage example, below
if [ $HAVE_CUDA = 0 ]; then
  run bench-engine --device cuda --dummy-weights "$TINY_CFG"
  [ "$RC" = 1 ] && grep -q "no CUDA backend" <<<"$ERR" || fail "bench-engine --device cuda on a CPU build: exit $RC: $ERR"
fi

# ---- serve refuses an unusable --model before it listens
mkdir -p "$TMP/broken" "$TMP/arch" "$TMP/noweights" "$TMP/shape" "$TMP/notok"
echo '{"architectures": [' >"$TMP/broken/config.json"
sed 's/Qwen3ForCausalLM/MambaForCausalLM/; s/"qwen3"/"mamba"/' "$MODEL/config.json" >"$TMP/arch/config.json"
cp "$MODEL/config.json" "$MODEL/tokenizer.json" "$TMP/noweights/"
cp "$MODEL/config.json" "$MODEL/model.safetensors" "$TMP/notok/"
sed 's/"intermediate_size": *[0-9]*/"intermediate_size": 96/' "$MODEL/config.json" >"$TMP/shape/config.json"
ln -s "$(cd "$MODEL" && pwd)/model.safetensors" "$TMP/shape/model.safetensors"
cp "$MODEL/tokenizer.json" "$TMP/shape/"
check_refused() { # DIR WHAT_IN_STDERR
  run serve --host 127.0.0.1 --port 0 --model "$1"
  [ "$RC" = 1 ] || fail "serve --model $1: exit $RC, want 1: $ERR"
  grep -q "not a usable model directory" <<<"$ERR" || fail "serve --model $1: unclear message: $ERR"
  grep -qF -- "$2" <<<"$ERR" || fail "serve --model $1: message does not say '$2': $ERR"
  ! grep -qi "listening" <<<"$OUT$ERR" || fail "serve --model $1: listened before failing: $ERR"
}
check_refused /nonexistent "No such file or directory"
check_refused "$TMP/broken" "bad JSON"
check_refused "$TMP/arch" "unknown architecture"
check_refused "$TMP/noweights" "no model.safetensors"
check_refused "$TMP/shape" "expected [96, 64]"
check_refused "$TMP/notok" "tokenizer.json"
check_refused "$MODEL/config.json" "not a directory"
# ... and an unusable --dummy-weights config likewise
run serve --host 127.0.0.1 --port 0 --dummy-weights "$TMP/broken/config.json"
[ "$RC" = 1 ] && grep -qF -- "--dummy-weights: $TMP/broken/config.json: " <<<"$ERR" ||
  fail "serve --dummy-weights with a broken config: exit $RC: $ERR"
! grep -qi "listening" <<<"$OUT$ERR" || fail "serve --dummy-weights with a broken config listened: $ERR"

# ---- the documented examples run as written
# serve_example CMDLINE — starts it on a free port, waits for /health 200,
# stops it with SIGTERM; the directory check must come before "listening".
serve_example() {
  LOG=$TMP/serve-example.log
  NS_LOG_LEVEL=info bash -c "exec $1" >"$LOG" 2>&1 &
  local pid=$! port=""
  SERVER_PIDS+=("$pid")
  for _ in $(seq 1 200); do
    port=$(sed -n 's/.*listening on http:\/\/127\.0\.0\.1:\([0-9]*\).*/\1/p' "$LOG" | head -1)
    [ -n "$port" ] && break
    kill -0 "$pid" 2>/dev/null || fail "example '$1' exited: $(cat "$LOG")"
    sleep 0.05
  done
  [ -n "$port" ] || fail "example '$1' did not listen"
  for _ in $(seq 1 200); do
    [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/health")" = 200 ] && break
    sleep 0.05
  done
  [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/health")" = 200 ] || fail "example '$1' not ready"
  if grep -q -- "--model" <<<"$1"; then
    sed -n '1,/listening/p' "$LOG" | grep -q "tokenizer OK" || fail "example '$1': no model check before listening"
  fi
  kill -TERM "$pid"
  wait "$pid" || fail "example '$1': exit $? after SIGTERM: $(tail -5 "$LOG")"
}
# run_example LINE — LINE as written in the docs, with "nightshift" (or
# build/nightshift) at the start of the command or after a pipe.
n_examples=0
run_example() {
  local line=$1 cmd
  # a CPU test: GPU examples (an 8B dummy model) belong to tests/gpu
  [[ "$line" == *--device\ cuda* || "$line" == *build/cuda/* ]] && return 0
  cmd=$(sed -E -e 's/[[:space:]]+#.*$//' \
    -e "s#(^|\\| )(build/)?nightshift #\\1\"$B\" #" \
    -e "s#(\\.\\./shared|tests/fixtures)/models/#$NS_SHARED/models/#g" \
    -e "s#/path/to/[A-Za-z0-9._-]+#$SMALL#g" \
    -e "s#(^|[ =])DIR( |$)#\\1$SMALL\\2#g" \
    -e "s#CONFIG_JSON#$TINY_CFG#g" <<<"$line")
  n_examples=$((n_examples + 1))
  if [[ "$line" =~ nightshift\ serve ]]; then
    serve_example "$(sed -E 's/--port [0-9]+/--port 0/' <<<"$cmd") --host 127.0.0.1 --threads 2"
    return 0
  fi
  timeout 60 bash -c "$cmd" >"$TMP/out" 2>"$TMP/err" </dev/null
  local rc=$?
  [ $rc = 0 ] || fail "example '$line' (run as: $cmd): exit $rc: $(cat "$TMP/err")"
  [ -s "$TMP/out" ] || fail "example '$line': no output"
  if [[ "$line" =~ bench-engine ]]; then
    grep -q '^prefill ' "$TMP/out" && grep -q '^decode ctx ' "$TMP/out" || fail "example '$line': no results"
  fi
}
for c in "" "${COMMANDS[@]}"; do
  [[ "$EXAMPLES_ELSEWHERE" == *" $c "* ]] && continue
  while IFS= read -r line; do run_example "$line"; done < <("$B" $c --help | grep -E '^ +(echo .*\| )?nightshift [a-z]' |
    grep -v '<' | sed -E 's/^ +//')
done
before=$n_examples
while IFS= read -r line; do run_example "$line"; done < <(sed -n '/^```sh/,/^```/p' README.md |
  grep -E '^(echo .*\| )?build/(cuda/)?nightshift ')
[ $before -ge 6 ] || fail "only $before examples found in the usage texts"
[ $n_examples -gt $before ] || fail "no examples found in README.md"

# ---- what the examples print
run generate --model "$SMALL" --prompt "Once upon a time" -n 8 --temperature 0
first=$OUT
run generate --model "$SMALL" --prompt "Once upon a time" -n 8 --temperature 0
[ "$RC" = 0 ] && [ -n "$OUT" ] && [ "$OUT" = "$first" ] || fail "greedy generate is not repeatable: '$first' vs '$OUT'"
run generate --model "$SMALL" --tokens 1,2,3 -n 4 --seed 7 --ids
[[ "$RC" = 0 && "$OUT" =~ ^\[[0-9]+(,[0-9]+){0,3}\]$ ]] || fail "generate --ids: exit $RC: $OUT $ERR"
run generate --prompt Hello -n 4
[ "$RC" = 0 ] && grep -q "RANDOM weights" <<<"$ERR" || fail "generate without --model does not warn: $ERR"
echo "Hello world" | "$B" tokenize --model "$SMALL" >"$TMP/out" || fail "tokenize: exit $?"
grep -Eq '^\[[0-9]+(,[0-9]+)*\]$' "$TMP/out" || fail "tokenize: not an ids array: $(cat "$TMP/out")"
printf '"a"\n\n"b c"\n' | "$B" tokenize --model "$SMALL" --jsonl >"$TMP/out" || fail "tokenize --jsonl: exit $?"
[ "$(wc -l <"$TMP/out")" = 2 ] || fail "tokenize --jsonl: want 2 lines: $(cat "$TMP/out")"
run eval --model "$SMALL" --tokens 1,2,3 --top 5
[ "$RC" = 0 ] || fail "eval: exit $RC: $ERR"
[ "$(json_get "$OUT" 'j.top.length + "," + j.argmax.length + "," + j.next_token_logprob.length')" = 5,3,2 ] ||
  fail "eval: wrong shape: $OUT"

echo "ok: $n_examples documented examples, ${#COMMANDS[@]} subcommands"
