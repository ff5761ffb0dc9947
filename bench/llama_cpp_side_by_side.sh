#!/usr/bin/env bash
# bench/llama_cpp_side_by_side.sh — nightshift against llama.cpp on the same
# GPU in the same run, Qwen3-8B shape (bench/configs/qwen3-8b.json), random
# bf16 weights on both sides, flash attention on for llama.cpp; prints one
# table with the ratios (issue 12).
#
# Usage (on the GPU machine, from anywhere):
#   bash bench/llama_cpp_side_by_side.sh LLAMA_SRC_TGZ [WORKDIR]
# LLAMA_SRC_TGZ: llama.cpp source without .git, as prepared from the npm
# package node-llama-cpp (docs/cuda.md, "llama.cpp side by side", says
# exactly how). WORKDIR (default build/llama-side, ignored by git) holds
# the build, the checkpoint, the GGUF and the logs.
#
# Phases, each skipped when its output already exists, so a run cut by a
# time limit continues where it stopped when started again:
#   1. build llama-bench and llama-server (cmake, GGML_CUDA, sm_90)
#   2. random-weight checkpoint with transformers from the config's shape
#      (tokenizer files from tests/fixtures/models/tiny-qwen3: the Qwen
#      tokenizer, needed by the converter; no network on the GPU machine)
#   3. convert_hf_to_gguf.py --outtype bf16 (then the checkpoint is removed)
#   4. llama-bench: prefill 8192 / 32768 (-p, -n 0), decode at depth 1024 /
#      32768 with batch 1 (-n 64 -d), -fa 1 -ngl 99, best ubatch of
#      LLAMA_UBATCH (default 512,2048)
#   5. nightshift bench_engine (the `nightshift bench-engine` code) on the
#      same shapes, --device cuda --dummy-weights
#   6. the table
# Environment: SBS_PHASES (default "1 2 3 4 5 6") to run a subset;
# SBS_REPS (default 3) repetitions for llama-bench; CUDA_HOME as for
# tests/gpu/run.sh. Exits non-zero with a message naming the phase that
# failed; logs are in WORKDIR/*.log.
set -euo pipefail

die() {
    echo "llama_cpp_side_by_side: $*" >&2
    exit 1
}

[ $# -ge 1 ] || die "usage: bash bench/llama_cpp_side_by_side.sh LLAMA_SRC_TGZ [WORKDIR]"
TGZ=$(realpath "$1")
[ -f "$TGZ" ] || die "no source tarball at $1"
cd "$(dirname "$0")/.."
ROOT=$PWD
WORK=$(realpath -m "${2:-$ROOT/build/llama-side}")
mkdir -p "$WORK"
PHASES=${SBS_PHASES:-1 2 3 4 5 6}
REPS=${SBS_REPS:-3}
UBATCH=${LLAMA_UBATCH:-512,2048}
CONFIG=$ROOT/bench/configs/qwen3-8b.json
TOK_DIR=$ROOT/tests/fixtures/models/tiny-qwen3
if [ -z "${CUDA_HOME:-}" ]; then
    if [ -d /usr/local/cuda ]; then CUDA_HOME=/usr/local/cuda; else CUDA_HOME=$(dirname "$(dirname "$(command -v nvcc)")"); fi
fi
export CUDA_HOME PATH=$CUDA_HOME/bin:$PATH
NPROC=$(nproc)
want() { case " $PHASES " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }

# cmake: the system's, or the one a pip wheel installed
CMAKE=$(command -v cmake || true)
if [ -z "$CMAKE" ]; then
    CMAKE=$(python3 -c 'import cmake, os; print(os.path.join(cmake.CMAKE_BIN_DIR, "cmake"))' 2>/dev/null || true)
fi

SRC=$WORK/llama.cpp
BENCH_BIN=$WORK/build/bin/llama-bench
if want 1 && [ ! -x "$BENCH_BIN" ]; then
    [ -n "$CMAKE" ] || die "phase 1: no cmake (system or pip 'cmake' package) on this machine"
    if [ ! -f "$SRC/CMakeLists.txt" ]; then
        rm -rf "$SRC"
        tar xzf "$TGZ" -C "$WORK" || die "phase 1: cannot unpack $TGZ"
        [ -f "$SRC/CMakeLists.txt" ] || die "phase 1: $TGZ does not hold llama.cpp/CMakeLists.txt"
    fi
    echo "phase 1: building llama.cpp (log $WORK/build.log)"
    start=$(date +%s)
    if ! { "$CMAKE" -S "$SRC" -B "$WORK/build" -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON \
        -DCMAKE_CUDA_ARCHITECTURES=90 -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
        -DGGML_NATIVE=ON && "$CMAKE" --build "$WORK/build" -j"$NPROC" --target llama-bench llama-server; } \
        >"$WORK/build.log" 2>&1; then
        tail -30 "$WORK/build.log"
        die "phase 1: llama.cpp build failed"
    fi
    echo "phase 1: built in $(( $(date +%s) - start )) s"
fi

CKPT=$WORK/qwen3-8b-random
GGUF=$WORK/qwen3-8b-random-bf16.gguf
if want 2 && [ ! -f "$GGUF" ] && [ ! -f "$CKPT/.done" ]; then
    echo "phase 2: random-weight checkpoint (log $WORK/ckpt.log)"
    rm -rf "$CKPT"
    mkdir -p "$CKPT"
    cp "$CONFIG" "$CKPT/config.json"
    cp "$TOK_DIR/tokenizer.json" "$TOK_DIR/tokenizer_config.json" "$CKPT/"
    if ! python3 - "$CKPT" >"$WORK/ckpt.log" 2>&1 <<'EOF'
import sys, torch, transformers
out = sys.argv[1]
cfg = transformers.AutoConfig.from_pretrained(out)
torch.manual_seed(0)
dev = "cuda" if torch.cuda.is_available() else "cpu"
with torch.device(dev):
    model = transformers.AutoModelForCausalLM.from_config(cfg)
model = model.to(torch.bfloat16)
model.save_pretrained(out, safe_serialization=True, max_shard_size="4GB")
print("params", sum(p.numel() for p in model.parameters()))
EOF
    then
        tail -20 "$WORK/ckpt.log"
        die "phase 2: checkpoint generation failed"
    fi
    # the saved config may carry a newer dtype key; keep the original shape file
    touch "$CKPT/.done"
fi

if want 3 && [ ! -f "$GGUF" ]; then
    [ -f "$CKPT/.done" ] || die "phase 3: no checkpoint (run phase 2)"
    [ -f "$SRC/convert_hf_to_gguf.py" ] || tar xzf "$TGZ" -C "$WORK"
    echo "phase 3: converting to GGUF bf16 (log $WORK/convert.log)"
    if ! python3 "$SRC/convert_hf_to_gguf.py" "$CKPT" --outtype bf16 --outfile "$GGUF.part" >"$WORK/convert.log" 2>&1; then
        tail -20 "$WORK/convert.log"
        rm -f "$GGUF.part"
        die "phase 3: convert_hf_to_gguf.py failed"
    fi
    mv "$GGUF.part" "$GGUF"
    rm -rf "$CKPT" # 16 GB: the GGUF is all the benchmark needs
fi

LB_PP=$WORK/llama-bench-prefill.json
LB_TG=$WORK/llama-bench-decode.json
if want 4; then
    [ -x "$BENCH_BIN" ] || die "phase 4: no llama-bench (run phase 1)"
    [ -f "$GGUF" ] || die "phase 4: no GGUF (run phases 2 and 3)"
    echo "phase 4: llama-bench (log $WORK/llama-bench.log)"
    "$BENCH_BIN" -m "$GGUF" -ngl 99 -fa 1 -p 8192,32768 -n 0 -ub "$UBATCH" -b 8192 -r "$REPS" -o json \
        >"$LB_PP" 2>"$WORK/llama-bench.log" || die "phase 4: llama-bench prefill failed (see $WORK/llama-bench.log)"
    "$BENCH_BIN" -m "$GGUF" -ngl 99 -fa 1 -p 0 -n 64 -d 1024,32768 -r "$REPS" -o json \
        >"$LB_TG" 2>>"$WORK/llama-bench.log" || die "phase 4: llama-bench decode failed (see $WORK/llama-bench.log)"
fi

NS_OUT=$WORK/nightshift-bench.txt
if want 5; then
    NS_BIN=$ROOT/build/cuda/gpu-tests/bench_engine
    if [ ! -x "$NS_BIN" ]; then
        echo "phase 5: building bench_engine (make CUDA=1)"
        make -C "$ROOT" CUDA=1 -j"$NPROC" build/cuda/gpu-tests/bench_engine >"$WORK/ns-build.log" 2>&1 ||
            die "phase 5: make CUDA=1 failed (see $WORK/ns-build.log; tests/gpu/run.sh sets up the dependencies)"
    fi
    echo "phase 5: nightshift bench_engine"
    "$NS_BIN" --device cuda --dummy-weights "$CONFIG" --prefill 8192,32768 --contexts 1k,32k --batches 1 \
        >"$NS_OUT" 2>&1 || { tail -20 "$NS_OUT"; die "phase 5: bench_engine failed"; }
fi

if want 6; then
    if [ ! -f "$LB_PP" ] || [ ! -f "$LB_TG" ] || [ ! -f "$NS_OUT" ]; then
        die "phase 6: results missing (run phases 4 and 5)"
    fi
    python3 - "$LB_PP" "$LB_TG" "$NS_OUT" <<'EOF'
import json, re, sys
pp, tg, ns_path = sys.argv[1:4]
def best(path, key):
    out = {}
    for r in json.load(open(path)):
        k = key(r)
        out[k] = max(out.get(k, 0.0), float(r["avg_ts"]))
    return out
lpp = best(pp, lambda r: ("prefill", int(r["n_prompt"])))
ltg = best(tg, lambda r: ("decode", int(r["n_depth"])))
ns = {}
for line in open(ns_path):
    m = re.match(r"prefill\s+(\d+) tokens:\s+([\d.]+) s\s+([\d.]+) tok/s", line)
    if m:
        ns[("prefill", int(m.group(1)))] = float(m.group(3))
    m = re.match(r"decode ctx\s+(\d+) batch\s+1:\s+([\d.]+) ms/step\s+([\d.]+) tok/s", line)
    if m:
        ns[("decode", int(m.group(1)))] = float(m.group(3))
rows = [("prefill 8k tok/s", ("prefill", 8192)), ("prefill 32k tok/s", ("prefill", 32768)),
        ("decode ctx 1k B1 tok/s", ("decode", 1024)), ("decode ctx 32k B1 tok/s", ("decode", 32768))]
print("| measure | nightshift | llama.cpp | ratio |")
print("|---|---|---|---|")
for name, k in rows:
    a, b = ns.get(k), (lpp if k[0] == "prefill" else ltg).get(k)
    fa = "%.1f" % a if a else "missing"
    fb = "%.1f" % b if b else "missing"
    ratio = "%.2fx" % (a / b) if a and b else "-"
    print("| %s | %s | %s | %s |" % (name, fa, fb, ratio))
EOF
fi
