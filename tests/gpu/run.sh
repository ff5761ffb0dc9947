#!/usr/bin/env bash
# tests/gpu/run.sh — builds the CUDA backend and the GPU tests with
# `make CUDA=1 gpu-tests`, runs every GPU test binary and prints
# "N passed, N failed" (each binary prints TAP-style ok / not ok lines).
#
# Assets: NS_SHARED if set (a directory laid out like tests/fixtures:
# models/, goldens/), else the repository's tests/fixtures, which travel
# with the tree. On a bare GPU machine gpu-assets/deps (unpacked from
# gpu-assets/deps.txz, made by scripts/gpu-assets) holds the headers and
# small shared libraries the build needs (jansson, xxhash, the cblas
# header); when the system has no OpenBLAS, tests/gpu/blas_shim.c (a plain
# reference sgemm) is built in its place, used only by the CPU reference
# backend inside the tests.
# Logs of each test go to $NS_GPU_LOG_DIR (default build/cuda/gpu-logs).
# NS_GPU_ONLY="test_ops test_kv_fp8" runs only those binaries and skips the
# serve smoke test (a quick check inside a benchmark call; a run that
# passes only part of the suite is not the suite passing).
set -u
cd "$(dirname "$0")/../.."
ROOT=$PWD
ASSETS=$ROOT/gpu-assets
export NS_SHARED=${NS_SHARED:-$ROOT/tests/fixtures}
if [ -z "${CUDA_HOME:-}" ]; then
  if [ -d /usr/local/cuda ]; then CUDA_HOME=/usr/local/cuda; else CUDA_HOME=$(dirname "$(dirname "$(command -v nvcc)")"); fi
fi
export CUDA_HOME PATH=$CUDA_HOME/bin:$PATH
export LD_LIBRARY_PATH=$CUDA_HOME/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
# scripts/gpu-assets packs the dependencies as gpu-assets/deps.txz
# (deps.tgz: the larger bundle of earlier versions)
if [ ! -d "$ASSETS/deps" ] && [ -f "$ASSETS/deps.txz" ]; then tar xJf "$ASSETS/deps.txz" -C "$ASSETS"; fi
if [ ! -d "$ASSETS/deps" ] && [ -f "$ASSETS/deps.tgz" ]; then tar xzf "$ASSETS/deps.tgz" -C "$ASSETS"; fi
if [ -d "$ASSETS/deps" ]; then
  DEPS=$ASSETS/deps
  export CPATH=$DEPS/include${CPATH:+:$CPATH}
  export LIBRARY_PATH=$DEPS/lib${LIBRARY_PATH:+:$LIBRARY_PATH}
  export LD_LIBRARY_PATH=$DEPS/lib:$LD_LIBRARY_PATH
  if ! echo 'int main(void){return 0;}' | cc -x c - -lopenblas -o /tmp/ns_blas_probe 2>/dev/null; then
    echo "run.sh: no OpenBLAS here; using tests/gpu/blas_shim.c for the CPU reference"
    cc -O2 -shared -fPIC -I"$DEPS/include" -o "$DEPS/lib/libopenblas.so" tests/gpu/blas_shim.c || exit 1
  fi
fi
LOGS=${NS_GPU_LOG_DIR:-$ROOT/build/cuda/gpu-logs}
mkdir -p "$LOGS"
start=$(date +%s)
if ! make CUDA=1 -j"$(nproc)" gpu-tests >"$LOGS/build.log" 2>&1; then
  grep -E "error|Error" "$LOGS/build.log" | head -40
  tail -20 "$LOGS/build.log"
  echo "build failed"
  echo "0 passed, 1 failed"
  exit 1
fi
echo "build: $(( $(date +%s) - start ))s"
passed=0; failed=0; failed_names=()
for t in build/cuda/gpu-tests/test_*; do
  [ -x "$t" ] || continue
  name=$(basename "$t")
  if [ -n "${NS_GPU_ONLY:-}" ] && [[ " $NS_GPU_ONLY " != *" $name "* ]]; then continue; fi
  start=$(date +%s)
  "$t" >"$LOGS/$name.out" 2>&1
  rc=$?
  p=$(grep -c '^ok - ' "$LOGS/$name.out"); f=$(grep -c '^not ok - ' "$LOGS/$name.out")
  if [ $rc -ne 0 ] && [ "$f" -eq 0 ]; then f=1; fi   # crashed
  passed=$((passed + p)); failed=$((failed + f))
  printf '%-28s %3d passed %3d failed  (%ss)\n' "$name" "$p" "$f" $(( $(date +%s) - start ))
  grep -v '^ok - ' "$LOGS/$name.out" | head -150
  [ "$f" -ne 0 ] && failed_names+=("$name")
done
# End to end: the full binary serving over HTTP on the GPU.
if [ -n "${NS_GPU_ONLY:-}" ]; then
  echo "$passed passed, $failed failed (only: $NS_GPU_ONLY)"
  [ "$failed" -eq 0 ]; exit
fi
start=$(date +%s)
bash tests/gpu/serve_smoke.sh >"$LOGS/serve_smoke.out" 2>&1
rc=$?
p=$(grep -c '^ok - ' "$LOGS/serve_smoke.out"); f=$(grep -c '^not ok - ' "$LOGS/serve_smoke.out")
if [ $rc -ne 0 ] && [ "$f" -eq 0 ]; then f=1; fi
passed=$((passed + p)); failed=$((failed + f))
printf '%-28s %3d passed %3d failed  (%ss)\n' "serve_smoke" "$p" "$f" $(( $(date +%s) - start ))
grep -v '^ok - ' "$LOGS/serve_smoke.out" | head -60
[ "$f" -ne 0 ] && failed_names+=("serve_smoke")

[ ${#failed_names[@]} -gt 0 ] && echo "failed: ${failed_names[*]}"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
