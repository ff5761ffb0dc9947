#!/usr/bin/env bash
# test_trace_step.sh — bench/trace_step.py on a crafted kernel timeline:
# steps are cut at their first kernel, the plain embedding or (since
# docs/cuda.md v32) k_add_rmsnorm in an embedding mode (mangled or
# demangled), never at the layers' add + RMSNorm (mode 0); the step's
# span, the next step's start and each kernel's increment are right.
source "$(dirname "$0")/common.bash"

W=$TMP/work
mkdir -p "$W"
emb='_Z13k_add_rmsnormILb1ELi1EEvPfPKvS0_P13__nv_bfloat16PKfif11cu_prefetchliPKii'
add='_Z13k_add_rmsnormILb1ELi0EEvPfPKvS0_P13__nv_bfloat16PKfif11cu_prefetchliPKii'
{
    echo '"Start (ns)","Duration (ns)","Name"'
    for k in 0 1 2; do
        t=$((k * 100000))
        echo "$t,3000,\"$emb\""
        echo "$((t + 2000)),20000,\"k_gemv\""
        echo "$((t + 22000)),2000,\"$add\""
        echo "$((t + 30000)),5000,\"k_argmax\""
    done
    echo "300000,3000,\"k_add_rmsnorm<true, 2>(float*)\""
    echo "300500,1000,\"k_embed\""
} >"$W/tr.csv"
OUT=$(python3 "$NS_ROOT/bench/trace_step.py" "$W/tr.csv" 1) || fail "trace_step.py: exit $?: $OUT"
expect_line "$OUT" "14 kernels" "14 kernels, 5 steps"
expect_line "$OUT" "step 1:" "step 1: 4 kernels, 35.0 us (first start -> last end); next step starts 100.0 us after this one"
# the gemv starts 2 us in and ends at 22: it adds 19 us after the 3 us embed
echo "$OUT" | grep -q '^   1 start     2.00 end    22.00 dur   20.00 inc  19.00  k_gemv' || fail "gemv row: $OUT"
echo "ok: trace_step.py cuts steps at the plain and the fused embedding"
