#!/usr/bin/env bash
# test_sbs_script.sh — bench/llama_cpp_side_by_side.sh's phases 3-6 with
# stand-ins for llama-bench, llama-batched-bench and bench_engine (this
# machine has no GPU): the commands each phase runs (the 100k prompt on
# both sides, bench_engine's chunk and config for it, the rounds'
# alternation without the ablation rows), that a second run skips what
# exists, and the table's long-prompt and rounds rows.
source "$(dirname "$0")/common.bash"

W=$TMP/side
mkdir -p "$W/build/bin"
CALLS=$TMP/calls.log
export CALLS
touch "$W/8b-bf16.gguf" "$W/8b-q4_k.gguf" "$TMP/src.txz"

# llama-bench: one JSON entry per -p length (prefill) or -d depth (decode);
# decode's tok/s grows by 10 on each call, so the rounds differ
cat >"$W/build/bin/llama-bench" <<'EOF'
#!/usr/bin/env bash
echo "llama-bench $*" >>"$CALLS"
p=0 n=0 d=0
while [ $# -gt 0 ]; do
  case "$1" in -p) p=$2; shift ;; -n) n=$2; shift ;; -d) d=$2; shift ;; esac
  shift
done
sep=""
echo "["
if [ "$n" != 0 ]; then
  k=$(grep -c "llama-bench .*-n 64" "$CALLS")
  for x in ${d//,/ }; do
    ts=$((180 + 10 * k))
    echo "$sep{\"n_prompt\": 0, \"n_gen\": $n, \"n_depth\": $x, \"n_ubatch\": 512, \"avg_ts\": $ts, \"samples_ts\": [$ts]}"
    sep=","
  done
else
  for x in ${p//,/ }; do
    ts=20000; [ "$x" = 100000 ] && ts=7000
    echo "$sep{\"n_prompt\": $x, \"n_gen\": 0, \"n_depth\": 0, \"n_ubatch\": 2048, \"avg_ts\": $ts, \"samples_ts\": [$ts]}"
    sep=","
  done
fi
echo "]"
EOF
cat >"$W/build/bin/llama-batched-bench" <<'EOF'
#!/usr/bin/env bash
echo "llama-batched-bench $*" >>"$CALLS"
echo "|  1024 |     64 |    8 |   8704 |    0.381 | 21511.25 |    0.573 |   800.00 |    0.954 |  9121.78 |"
EOF
# bench_engine: a line per --prefill length and per (context, batch);
# 4 ms per decode step (250 tok/s at batch 1), a 100k prompt in 7 s
cat >"$TMP/bench_engine" <<'EOF'
#!/usr/bin/env bash
echo "bench_engine $*" >>"$CALLS"
pf=none ctx=none bs=none
while [ $# -gt 0 ]; do
  case "$1" in --prefill) pf=$2; shift ;; --contexts) ctx=$2; shift ;; --batches) bs=$2; shift ;; esac
  shift
done
kn() { local v=${1%k}; [ "$v" != "$1" ] && v=$((v * 1024)); echo "$v"; }
[ "$pf" = none ] || for p in ${pf//,/ }; do
  t=0.500; [ "$p" = 100000 ] && t=7.000
  echo "prefill $(printf %6d "$p") tokens:    $t s   $(awk "BEGIN{printf \"%.0f\", $p / $t}") tok/s  (median of 3, $t-$t s)"
done
[ "$ctx" = none ] || [ "$bs" = none ] || for c in ${ctx//,/ }; do for b in ${bs//,/ }; do
  echo "decode ctx $(printf %6d "$(kn "$c")") batch $(printf %3d "$b"):    4.000 ms/step   $(awk "BEGIN{printf \"%.1f\", $b * 250}") tok/s  (median of 3, 4.000-4.000 ms)"
done; done
EOF
chmod +x "$W/build/bin/llama-bench" "$W/build/bin/llama-batched-bench" "$TMP/bench_engine"

run_sbs() {
  CUDA_HOME=/nonexistent SBS_MODELS="8b-bf16 8b-q4_k" SBS_PHASES="3 4 5 6" SBS_ROUNDS=2 SBS_NS_BIN=$TMP/bench_engine \
    bash "$NS_ROOT/bench/llama_cpp_side_by_side.sh" "$TMP/src.txz" "$W" 2>&1
}
OUT=$(run_sbs) || fail "side-by-side script: exit $?: $OUT"

grep -q -- "llama-bench .*-p 100000 -n 0 " "$CALLS" || fail "no llama.cpp 100k prompt: $(cat "$CALLS")"
grep -q -- "bench_engine .*qwen3-8b-128k.json --prefill 100000 --contexts none --batches none --chunk 8448 " "$CALLS" ||
  fail "no nightshift 100k prompt in chunks of 8448: $(cat "$CALLS")"
[ "$(grep -c -- "--contexts 1k --batches 1 .*--no-ablation" "$CALLS")" = 2 ] || fail "not two nightshift rounds: $(cat "$CALLS")"
# rounds only for SBS_ROUND_MODELS (8b-bf16); the quantized model runs on its GGUF
[ -s "$W/8b-bf16.round2.llama-tg.json" ] && [ -s "$W/8b-bf16.round2.nightshift.txt" ] || fail "no round 2: $(ls "$W")"
[ ! -e "$W/8b-bf16.round3.llama-tg.json" ] && [ ! -e "$W/8b-q4_k.round1.llama-tg.json" ] || fail "rounds beyond SBS_ROUNDS / SBS_ROUND_MODELS: $(ls "$W")"
grep -q -- "bench_engine --device cuda --model $W/8b-q4_k.gguf " "$CALLS" || fail "q4_k not on its GGUF: $(cat "$CALLS")"

# 100000 / 7 s = 14286 tok/s (14285.7 both ends of the spread) against 7000
expect_line "$OUT" "| 8b-bf16 | prefill 100000 tok/s |" \
  "| 8b-bf16 | prefill 100000 tok/s | 14286.0 | 7000.0 | 2.041x | 2.041x-2.041x | met |"
# phase 3's decode calls were llama-bench's first two -n 64 (8b-bf16 190
# tok/s, 8b-q4_k 200); the rounds got 210 and 220: ratios 1.190 and 1.136
expect_line "$OUT" "| 8b-bf16 | decode ctx 1024 B1 tok/s |" \
  "| 8b-bf16 | decode ctx 1024 B1 tok/s | 250.0 | 190.0 | 1.316x | 1.316x-1.316x | met |"
expect_line "$OUT" "| 8b-bf16 | decode ctx 1024 B1 tok/s, 2" \
  "| 8b-bf16 | decode ctx 1024 B1 tok/s, 2 alternated rounds (medians) | 250.0 | 215.0 | 1.163x | 1.136x-1.190x (the rounds' ratios) | not met |"
expect_line "$OUT" "| 8b-q4_k | decode ctx 1024 B1 tok/s |" \
  "| 8b-q4_k | decode ctx 1024 B1 tok/s | 250.0 | 200.0 | 1.250x | 1.250x-1.250x | met |"
grep -qF "| 8b-q4_k | decode ctx 1024 B1 tok/s, " <<<"$OUT" && fail "a rounds row for 8b-q4_k: $OUT"

# a second run measures nothing again
n=$(wc -l <"$CALLS")
run_sbs >/dev/null || fail "second run: exit $?"
[ "$(wc -l <"$CALLS")" = "$n" ] || fail "the second run measured again: $(tail -n +"$((n + 1))" "$CALLS")"
echo "ok: side-by-side script, its 100k prompt and rounds, and their table rows"
