#!/usr/bin/env bash
# bench/llama_cpp_quant_side_by_side.sh — decode B1 of nightshift against
# llama.cpp on the SAME quantized GGUF (Qwen3-8B shape, random weights,
# every matrix Q4_K or Q8_0), on the same GPU in the same run (issue 14's
# benchmark). Also runs nightshift on dummy weights of the same type
# (--weight-type), which prints the decode roofline of the quantized bytes.
#
# Usage (on the GPU machine):
#   bash bench/llama_cpp_quant_side_by_side.sh LLAMA_SRC_TGZ [WORKDIR]
# It builds on bench/llama_cpp_side_by_side.sh (same LLAMA_SRC_TGZ and
# WORKDIR, default build/llama-side): that script's phases 1-3 must have
# run (llama.cpp built, WORKDIR/qwen3-8b-random-bf16.gguf written); run
# them with `SBS_PHASES="1 2 3" bash bench/llama_cpp_side_by_side.sh TGZ`.
#
# Phases (QSBS_PHASES, default "1 2 3 4 5"), each skipped when its output
# exists:
#   1. build llama-quantize in WORKDIR/build
#   2. llama-quantize --pure the bf16 GGUF to Q4_K_M (all Q4_K) and Q8_0
#   3. llama-bench decode: -p 0 -n 64 -d 1024, -fa 1 -ngl 99, per GGUF
#   4. nightshift bench_engine --model GGUF (decode ctx 1k batch 1 and 8),
#      then --dummy-weights --weight-type q4_k / q8_0 (roofline)
#   5. the table
# QSBS_TYPES (default "q4_k q8_0"); QSBS_REPS (default 3).
set -euo pipefail

die() {
    echo "llama_cpp_quant_side_by_side: $*" >&2
    exit 1
}

[ $# -ge 1 ] || die "usage: bash bench/llama_cpp_quant_side_by_side.sh LLAMA_SRC_TGZ [WORKDIR]"
cd "$(dirname "$0")/.."
ROOT=$PWD
WORK=$(realpath -m "${2:-$ROOT/build/llama-side}")
PHASES=${QSBS_PHASES:-1 2 3 4 5}
TYPES=${QSBS_TYPES:-q4_k q8_0}
REPS=${QSBS_REPS:-3}
CONFIG=$ROOT/bench/configs/qwen3-8b.json
if [ -z "${CUDA_HOME:-}" ]; then
    if [ -d /usr/local/cuda ]; then CUDA_HOME=/usr/local/cuda; else CUDA_HOME=$(dirname "$(dirname "$(command -v nvcc)")"); fi
fi
export CUDA_HOME PATH=$CUDA_HOME/bin:$PATH
want() { case " $PHASES " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }
CMAKE=$(command -v cmake || true)
if [ -z "$CMAKE" ]; then
    CMAKE=$(python3 -c 'import cmake, os; print(os.path.join(cmake.CMAKE_BIN_DIR, "cmake"))' 2>/dev/null || true)
fi
BF16=$WORK/qwen3-8b-random-bf16.gguf
QUANT_BIN=$WORK/build/bin/llama-quantize
BENCH_BIN=$WORK/build/bin/llama-bench
llama_type() { case "$1" in q4_k) echo Q4_K_M ;; q8_0) echo Q8_0 ;; *) die "unknown type $1" ;; esac; }

if want 1 && [ ! -x "$QUANT_BIN" ]; then
    [ -d "$WORK/build" ] || die "phase 1: no llama.cpp build in $WORK/build (run bench/llama_cpp_side_by_side.sh phase 1)"
    [ -n "$CMAKE" ] || die "phase 1: no cmake"
    echo "phase 1: building llama-quantize (log $WORK/quantize-build.log)"
    "$CMAKE" --build "$WORK/build" -j"$(nproc)" --target llama-quantize >"$WORK/quantize-build.log" 2>&1 ||
        die "phase 1: build failed (see $WORK/quantize-build.log)"
fi

for t in $TYPES; do
    G=$WORK/qwen3-8b-random-$t.gguf
    if want 2 && [ ! -f "$G" ]; then
        [ -f "$BF16" ] || die "phase 2: no $BF16 (run bench/llama_cpp_side_by_side.sh phases 2 and 3)"
        echo "phase 2: llama-quantize --pure $(llama_type "$t") (log $WORK/quantize-$t.log)"
        "$QUANT_BIN" --pure "$BF16" "$G.part" "$(llama_type "$t")" >"$WORK/quantize-$t.log" 2>&1 ||
            { rm -f "$G.part"; die "phase 2: llama-quantize failed (see $WORK/quantize-$t.log)"; }
        mv "$G.part" "$G"
    fi
    if want 3; then
        [ -f "$G" ] || die "phase 3: no $G"
        echo "phase 3: llama-bench decode on $t"
        "$BENCH_BIN" -m "$G" -ngl 99 -fa 1 -p 0 -n 64 -d 1024 -r "$REPS" -o json >"$WORK/llama-bench-$t.json" \
            2>"$WORK/llama-bench-$t.log" || die "phase 3: llama-bench failed (see $WORK/llama-bench-$t.log)"
    fi
    if want 4; then
        NS_BIN=$ROOT/build/cuda/gpu-tests/bench_engine
        [ -x "$NS_BIN" ] || make -C "$ROOT" CUDA=1 -j"$(nproc)" build/cuda/gpu-tests/bench_engine \
            >"$WORK/ns-build.log" 2>&1 || die "phase 4: make CUDA=1 failed (see $WORK/ns-build.log)"
        echo "phase 4: nightshift bench_engine on $t"
        "$NS_BIN" --device cuda --model "$G" --prefill none --contexts 1k --batches 1,8 >"$WORK/nightshift-$t.txt" 2>&1 ||
            { tail -20 "$WORK/nightshift-$t.txt"; die "phase 4: bench_engine --model failed"; }
        "$NS_BIN" --device cuda --dummy-weights "$CONFIG" --weight-type "$t" --prefill 8k --contexts 1k --batches 1,8 \
            >"$WORK/nightshift-dummy-$t.txt" 2>&1 ||
            { tail -20 "$WORK/nightshift-dummy-$t.txt"; die "phase 4: bench_engine --dummy-weights failed"; }
    fi
done

if want 5; then
    python3 - "$WORK" $TYPES <<'EOF'
import json, os, re, sys
work, types = sys.argv[1], sys.argv[2:]
def ns_decode(path):
    if not os.path.exists(path):
        return None
    for line in open(path):
        m = re.match(r"decode ctx\s+1024 batch\s+1:\s+([\d.]+) ms/step\s+([\d.]+) tok/s", line)
        if m:
            return float(m.group(2))
    return None
print("| Qwen3-8B shape, decode ctx 1k B1 | nightshift tok/s | llama.cpp tok/s | ratio | nightshift, dummy weights |")
print("|---|---|---|---|---|")
for t in types:
    lb = os.path.join(work, "llama-bench-%s.json" % t)
    l = max((float(r["avg_ts"]) for r in json.load(open(lb))), default=None) if os.path.exists(lb) else None
    a = ns_decode(os.path.join(work, "nightshift-%s.txt" % t))
    d = ns_decode(os.path.join(work, "nightshift-dummy-%s.txt" % t))
    f = lambda v: "%.1f" % v if v else "missing"
    print("| %s (same GGUF) | %s | %s | %s | %s |" % (t, f(a), f(l), "%.2fx" % (a / l) if a and l else "-", f(d)))
EOF
fi
