"""serve_smoke_fp8.py — `nightshift serve --device cuda --kv-dtype fp8` end to
end, standard library only (run by tests/gpu/serve_smoke.sh after the bf16
smoke; the client and the shared checks are in smoke_common.py). Prints
TAP-style "ok - name" / "not ok - name" lines.

Checks: /v1/status and /v1/capacity report the FP8 format (half of bf16's
bytes per token); greedy completions of the tiny-qwen3 golden prompts
succeed (how many of the 48 golden tokens they reproduce is printed: FP8
KV is lossy, docs/cuda.md bounds it); a re-sent long prompt is served from
the prefix cache with the cold answer (FP8 pages are reused as bytes); 8
concurrent requests give their solo answers (FP8 page bytes do not depend
on how tokens were batched).
"""
import json
import sys

from smoke_common import Smoke, prefix_cache_ok, same_prefix

base, shared = sys.argv[1], sys.argv[2]
sm = Smoke(base)
if not sm.wait_ready("fp8_health_ready"):
    sys.exit(1)

_, st = sm.get("/v1/status")
_, cap = sm.get("/v1/capacity")
# tiny-qwen3: 4 layers x 2 x 2 kv heads x 32 dims = 512 codes per token, and
# a 4-byte scale per (layer, K/V, kv head) and page: 64 bytes per page
# (4 per token at 16-token pages, 1 at the CUDA default of 64)
P = st.get("page_tokens") or 0
want = 512 + 64 // P if P > 0 and 64 % P == 0 else None
sm.report(st.get("kv_dtype") == "fp8" and cap.get("kv_dtype") == "fp8" and want is not None
          and st.get("kv_bytes_per_token") == want, "fp8_reported",
          f"status {st.get('kv_dtype')}/{st.get('kv_bytes_per_token')} (pages of {P}: {want} expected), "
          f"capacity {cap.get('kv_dtype')}")

golden = json.load(open(shared + "/goldens/logits-tiny-qwen3.json"))
for p in golden["prompts"]:
    code, j = sm.post("/v1/completions", {"model": "m", "prompt": p["prompt_ids"], "max_tokens": 48, "temperature": 0,
                                          "return_token_ids": True, "ignore_eos": True})
    ids = j["choices"][0].get("token_ids", [])
    n_same = same_prefix(ids, p["greedy_48"])
    sm.report(code == 200 and len(ids) == 48, "fp8_greedy_" + p["label"], f"{n_same}/48 identical to the bf16 golden")

a, b, _, _ = sm.long_prompt_twice(8)
ua, ub = a["usage"], b["usage"]
sm.report(prefix_cache_ok(a, b), "fp8_prefix_cache_hit",
          f"{ua['prompt_tokens']} prompt tokens, cached {ub['prompt_tokens_details']['cached_tokens']}")

prompts = [f"Tell me about item {i}." for i in range(8)]
solo, res = sm.solo_and_concurrent(prompts, 8)
same = sum(1 for i in range(8) if res.get(i) == solo[i])
sm.report(same == 8, "fp8_concurrent_equals_solo", f"{same}/8 batched answers equal their solo runs")
print(f"# serve smoke fp8: {sm.failed} failed")
sys.exit(1 if sm.failed else 0)
