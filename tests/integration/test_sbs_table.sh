#!/usr/bin/env bash
# test_sbs_table.sh — bench/sbs_table.py, the table of the llama.cpp
# side-by-side script, on crafted result files: the best llama-bench
# ubatch is taken, nightshift's median lines are read with their spread,
# the ratio and its range over both spreads are right, a line without a
# spread (older output, llama-batched-bench) gets none, a missing side
# reads "missing", and the target column says met / not met / inside the
# spread (default 1.2x, --target X); the 8b-bf16 shape's absolute
# targets of issue 12 make a second table with the same verdicts.
source "$(dirname "$0")/common.bash"

W=$TMP/work
mkdir -p "$W"
cat >"$W/m.llama-pp.json" <<'J'
[{"n_prompt": 8192, "n_gen": 0, "n_depth": 0, "n_ubatch": 512, "avg_ts": 100.0, "samples_ts": [99.0, 101.0]},
 {"n_prompt": 8192, "n_gen": 0, "n_depth": 0, "n_ubatch": 2048, "avg_ts": 120.0, "samples_ts": [110.0, 130.0]}]
J
cat >"$W/m.llama-tg.json" <<'J'
[{"n_prompt": 0, "n_gen": 64, "n_depth": 1024, "n_ubatch": 512, "avg_ts": 200.0, "samples_ts": [190.0, 200.0, 210.0]},
 {"n_prompt": 0, "n_gen": 64, "n_depth": 32768, "n_ubatch": 512, "avg_ts": 100.0, "samples_ts": [100.0]}]
J
cat >"$W/m.llama-batched.txt" <<'T'
|    PP |     TG |    B |   N_KV |   T_PP s | S_PP t/s |   T_TG s | S_TG t/s |      T s |    S t/s |
|-------|--------|------|--------|----------|----------|----------|----------|----------|----------|
|  1024 |     64 |    8 |   8704 |    0.381 | 21511.25 |    0.573 |   800.00 |    0.954 |  9121.78 |
T
cat >"$W/m.nightshift.txt" <<'T'
prefill   8192 tokens:    0.500 s      16384 tok/s      562 TFLOP/s =  72.0% of measured GEMM rate (chunks of 8192; median of 3, 0.400-0.800 s)
decode ctx   1024 batch   1:    4.000 ms/step     250.0 tok/s   15.29 GB/step  floor   3.589 ms =  83.4% of bandwidth roofline  host: forward 9 us, sample 4295 us  (median of 3, 3.900-4.100 ms)
decode ctx   1024 batch   8:    6.000 ms/step    1333.3 tok/s   16.36 GB/step  floor   3.841 ms =  65.8% of bandwidth roofline  (5.3x batch 1)  host: forward 13 us, sample 5821 us
decode ctx  32768 batch   8:   14.839 ms/step     539.1 tok/s   53.81 GB/step  floor  12.631 ms =  85.1% of bandwidth roofline  (median of 3, 14.800-14.900 ms)
T
OUT=$(python3 "$NS_ROOT/bench/sbs_table.py" "$W" m) || fail "sbs_table.py: exit $?: $OUT"
# prefill: best ubatch 120 (110-130); ours 16384 (10240-20480)
expect_line "$OUT" "| m | prefill 8192 tok/s |" "| m | prefill 8192 tok/s | 16384.0 | 120.0 | 136.533x | 78.769x-186.182x | met |"
# decode B1: 250 (243.9-256.4) against 200 (190-210): 1.25x, but 1.161x at
# the low end, so the 1.2x target lies inside the spread
expect_line "$OUT" "| m | decode ctx 1024 B1 tok/s |" \
  "| m | decode ctx 1024 B1 tok/s | 250.0 | 200.0 | 1.250x | 1.161x-1.350x | inside the spread |"
# batched: one figure on each side, no spread on either
expect_line "$OUT" "| m | decode ctx 1024 B8 tok/s |" "| m | decode ctx 1024 B8 tok/s | 1333.3 | 800.0 | 1.667x | - | met |"
# one side only
expect_line "$OUT" "| m | decode ctx 32768 B1 tok/s |" "| m | decode ctx 32768 B1 tok/s | missing | 100.0 | - | - | - |"
expect_line "$OUT" "| m | decode ctx 32768 B8 tok/s |" "| m | decode ctx 32768 B8 tok/s | 539.1 | missing | - | - | - |"
# another target: 1.4x lies above the B1 row's whole range (1.161-1.350)
OUT=$(python3 "$NS_ROOT/bench/sbs_table.py" --target 1.4 "$W" m) || fail "sbs_table.py --target 1.4: exit $?: $OUT"
expect_line "$OUT" "| model |" "| model | measure | nightshift | llama.cpp | ratio | ratio over both spreads | >= 1.4x |"
expect_line "$OUT" "| m | decode ctx 1024 B1 tok/s |" \
  "| m | decode ctx 1024 B1 tok/s | 250.0 | 200.0 | 1.250x | 1.161x-1.350x | not met |"
# the 8b-bf16 shape also gets issue 12's absolute targets, read over
# nightshift's spread: the 100k-token prompt as a time (<= 7.0 s)
cat >"$W/8b-bf16.nightshift.txt" <<'T'
prefill   8192 tokens:    0.230 s      35617 tok/s      562 TFLOP/s =  72.0% of measured GEMM rate (chunks of 8192; median of 3, 0.220-0.240 s)
prefill  32768 tokens:    1.600 s      20480 tok/s      562 TFLOP/s =  72.0% of measured GEMM rate (chunks of 8192; median of 3, 1.500-1.700 s)
decode ctx   1024 batch   1:    4.300 ms/step     232.6 tok/s   15.29 GB/step  floor   3.589 ms =  83.4% of bandwidth roofline  (median of 3, 4.250-4.350 ms)
T
cat >"$W/8b-bf16.nightshift-long.txt" <<'T'
prefill 100000 tokens:    7.203 s      13883 tok/s      602 TFLOP/s =  76.1% of measured GEMM rate (chunks of 8448; median of 3, 7.189-7.203 s)
T
OUT=$(python3 "$NS_ROOT/bench/sbs_table.py" "$W" m 8b-bf16) || fail "sbs_table.py m 8b-bf16: exit $?: $OUT"
expect_line "$OUT" "| model | issue 12" "| model | issue 12 target (H200) | nightshift | verdict |"
expect_line "$OUT" "| 8b-bf16 | prefill 8192 >=" \
  "| 8b-bf16 | prefill 8192 >= 32000 tok/s | 35617.0 (34133.3-37236.4) | met |"
# 20480 tok/s, 19275-21845 over the spread: the 21000 line lies inside it
expect_line "$OUT" "| 8b-bf16 | prefill 32768 >=" \
  "| 8b-bf16 | prefill 32768 >= 21000 tok/s | 20480.0 (19275.3-21845.3) | inside the spread |"
expect_line "$OUT" "| 8b-bf16 | 100000-token prompt" \
  "| 8b-bf16 | 100000-token prompt <= 7.0 s | 7.203 s (7.189-7.203) | not met |"
expect_line "$OUT" "| 8b-bf16 | decode ctx 32768 B1" "| 8b-bf16 | decode ctx 32768 B1 >= 170 tok/s | missing | - |"
expect_line "$OUT" "| 8b-bf16 | decode ctx 1024 B1 >=" \
  "| 8b-bf16 | decode ctx 1024 B1 >= 231 tok/s | 232.6 (229.9-235.3) | inside the spread |"
# a model without absolute targets prints no second table
OUT=$(python3 "$NS_ROOT/bench/sbs_table.py" "$W" m) || fail "sbs_table.py m: exit $?: $OUT"
grep -qF "issue 12 target" <<<"$OUT" && fail "model m got the issue 12 targets table"
python3 "$NS_ROOT/bench/sbs_table.py" --target x "$W" m >/dev/null 2>&1 && fail "sbs_table.py --target x: exit 0"
python3 "$NS_ROOT/bench/sbs_table.py" "$W" >/dev/null 2>&1 && fail "sbs_table.py without a model: exit 0"
echo "ok: side-by-side table, ratios and their ranges"
