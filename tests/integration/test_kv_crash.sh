#!/usr/bin/env bash
# Crash consistency of the SSD cache tier over HTTP (CPU, tinystories-656k):
# 100 iterations of start, serve (with /admin/flush now and then), then
# SIGKILL at a random moment while other requests are writing behind;
# after every restart each prompt a flush reported durable must be served
# from the cache, and every prompt's greedy output must equal the cold
# run's (a corrupt or foreign page would change it). Bounded: fails if the
# loop takes more than 300 s.
set -u
cd "$(dirname "$0")/../.."
source tests/integration/common.bash

MODEL=$NS_SHARED/models/tinystories-656k
SSD="$TMP/ssd"
P=16
N_PROMPTS=6
ITER=${NS_CRASH_ITERATIONS:-100}
declare -a PROMPT LEN COLD EXT

# complete IDS -> OUT (token ids), CACHED. The two numbers are read from
# the server's compact JSON with bash's own regex matching: a node process
# per request (json_get) cost about half of each iteration's time.
complete() {
  post /v1/completions "{\"prompt\":$1,\"max_tokens\":6,\"temperature\":0,\"return_token_ids\":true}"
  [ "$STATUS" = 200 ] || fail "completion: status $STATUS: $BODY_OUT"
  [[ "$BODY_OUT" =~ \"token_ids\":\[([0-9,]*)\] ]] || fail "completion: no token_ids: $BODY_OUT"
  OUT=${BASH_REMATCH[1]}
  [[ "$BODY_OUT" =~ \"cached_tokens\":([0-9]+) ]] || fail "completion: no cached_tokens: $BODY_OUT"
  CACHED=${BASH_REMATCH[1]}
}

# the prompts (300 + 25k random ids) and three next turns of each (the
# prompt + 60 new ids), made by one node process: line k is prompt k, line
# N_PROMPTS + 3k + j its turn j
mapfile -t LINES < <(node -e '
  const n = +process.argv[1], lines = [], ext = [];
  const rnd = (a, x, m) => { for (let i = 0; i < m; i++) { x = (x * 1103515245 + 12345) % 2147483648; a.push(3 + (x >> 8) % 2000); } return a; };
  for (let k = 0; k < n; k++) {
    const p = rnd([1], k + 1, 300 + 25 * k - 1);
    lines.push(JSON.stringify(p));
    for (let j = 0; j < 3; j++) ext.push(JSON.stringify(rnd(p.slice(), k * 7 + j + 1, 60)));
  }
  console.log(lines.concat(ext).join("\n"));' "$N_PROMPTS")
[ ${#LINES[@]} = $((N_PROMPTS * 4)) ] || fail "prompt generation: ${#LINES[@]} lines"
for k in $(seq 0 $((N_PROMPTS - 1))); do
  LEN[$k]=$((300 + 25 * k))
  PROMPT[$k]=${LINES[$k]}
  for j in 0 1 2; do EXT[$((k * 3 + j))]=${LINES[$((N_PROMPTS + k * 3 + j))]}; done
done

start_server --model "$MODEL" --no-ssd-cache
for k in $(seq 0 $((N_PROMPTS - 1))); do complete "${PROMPT[$k]}"; COLD[$k]=$OUT; done
kill -KILL "$SERVER_PID"; wait "$SERVER_PID" 2>/dev/null

declare -A DURABLE=()
t0=$(date +%s)
kills_during_writes=0
for i in $(seq 1 "$ITER"); do
  [ $(( $(date +%s) - t0 )) -le 300 ] || fail "crash loop over its time bound at iteration $i"
  start_server --model "$MODEL" --ssd-cache "$SSD"
  # every prompt reported durable by an earlier flush comes back, exact
  for k in "${!DURABLE[@]}"; do
    complete "${PROMPT[$k]}"
    [ "$CACHED" -ge $(( (LEN[$k] - 1) / P * P )) ] || fail "iteration $i: durable prompt $k cached only $CACHED of ${LEN[$k]}"
    [ "$OUT" = "${COLD[$k]}" ] || fail "iteration $i: durable prompt $k: output $OUT != cold ${COLD[$k]}"
  done
  # a random prompt, cached or not, gives the cold output
  k=$((RANDOM % N_PROMPTS))
  complete "${PROMPT[$k]}"
  [ "$OUT" = "${COLD[$k]}" ] || fail "iteration $i: prompt $k: output $OUT != cold ${COLD[$k]}"
  if [ $((RANDOM % 3)) -eq 0 ]; then
    post /admin/flush '{}'
    [ "$STATUS" = 200 ] || fail "iteration $i: flush status $STATUS"
    [[ "$BODY_OUT" =~ \"complete\":true ]] && DURABLE[$k]=1
  fi
  # heavy write-behind: new turns extending other prompts, killed midway
  for j in 1 2 3; do
    m=$(( (k + j) % N_PROMPTS ))
    curl -s -o /dev/null -H 'Content-Type: application/json' \
      --data-binary "{\"prompt\":${EXT[$((m * 3 + RANDOM % 3))]},\"max_tokens\":8,\"temperature\":0}" \
      "$BASE/v1/completions" &
  done
  sleep "0.$(printf '%03d' $((RANDOM % 200)))"
  kill -KILL "$SERVER_PID"
  wait "$SERVER_PID" 2>/dev/null
  wait 2>/dev/null
  kills_during_writes=$((kills_during_writes + 1))
done
[ ${#DURABLE[@]} -gt 0 ] || fail "no flush ever completed"
echo "ok: $ITER SIGKILL restarts in $(( $(date +%s) - t0 )) s; ${#DURABLE[@]} prompts durable and restored exactly"
