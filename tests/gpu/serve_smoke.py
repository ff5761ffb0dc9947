"""serve_smoke.py — `nightshift serve --device cuda` end to end, with the
standard library only (the GPU machine has no node; the client and the
checks shared with serve_smoke_fp8.py are in smoke_common.py). Prints
TAP-style "ok - name" / "not ok - name" lines; run by tests/gpu/serve_smoke.sh.

Checks: health; greedy /v1/completions on the tiny-qwen3 golden prompts
(token ids in, token ids out) against the golden continuations, where a
divergence is accepted only after the CUDA logits' own top-2 margin was a
near tie (bf16 weights); a streamed chat completion with usage; the prefix
cache (cached_tokens on a re-sent prompt); several concurrent requests.
"""
import json
import sys
import urllib.request

from smoke_common import Smoke, prefix_cache_ok, same_prefix

base, shared = sys.argv[1], sys.argv[2]
sm = Smoke(base)
if not sm.wait_ready("health_ready"):
    sys.exit(1)

golden = json.load(open(shared + "/goldens/logits-tiny-qwen3.json"))
for p in golden["prompts"]:
    st, j = sm.post("/v1/completions", {"model": "m", "prompt": p["prompt_ids"], "max_tokens": 48, "temperature": 0,
                                        "return_token_ids": True, "logprobs": 2, "ignore_eos": True})
    ids = j["choices"][0].get("token_ids", [])
    want = p["greedy_48"]
    n_same = same_prefix(ids, want)
    detail = f"{n_same}/48 identical"
    ok = n_same == len(want)
    if not ok and n_same < len(ids):
        # accept a divergence that follows a near tie in our own logits
        top = j["choices"][0]["logprobs"]["top_logprobs"][n_same]
        vals = sorted(top.values(), reverse=True)
        margin = vals[0] - vals[1] if len(vals) > 1 else 99
        detail += f", diverges after a top-2 margin of {margin:.4f}"
        ok = margin < 0.02
    sm.report(st == 200 and ok, "greedy_golden_" + p["label"], detail)

# streamed chat with usage
req = urllib.request.Request(base + "/v1/chat/completions", data=json.dumps({
    "model": "m", "messages": [{"role": "user", "content": "Write a haiku about GPUs."}], "max_tokens": 24,
    "stream": True, "stream_options": {"include_usage": True}}).encode(), headers={"content-type": "application/json"})
chunks, usage = 0, None
with urllib.request.urlopen(req, timeout=120) as r:
    for line in r:
        line = line.decode().strip()
        if line.startswith("data: ") and line != "data: [DONE]":
            c = json.loads(line[6:])
            chunks += 1
            usage = c.get("usage") or usage
sm.report(chunks > 1 and usage and usage["completion_tokens"] == 24, "chat_stream_with_usage", f"{chunks} chunks")

# prefix cache on the GPU: the same long prompt twice
a, b, cold_s, cached_s = sm.long_prompt_twice(4)
ua, ub = a["usage"], b["usage"]
sm.report(prefix_cache_ok(a, b), "prefix_cache_hit",
          f"{ua['prompt_tokens']} prompt tokens, cached {ub['prompt_tokens_details']['cached_tokens']}, "
          f"cold {cold_s:.3f}s, cached {cached_s:.3f}s")

# concurrency: 16 clients at once, greedy; each must equal its solo answer
prompts = [f"Tell me about item {i}." for i in range(16)]
solo, res = sm.solo_and_concurrent(prompts, 4)
same = sum(1 for i in range(4) if res.get(i) == solo[i])
sm.report(all(isinstance(res.get(i), str) for i in range(16)), "concurrent_16_complete")
sm.report(same == 4, "concurrent_equals_solo", f"{same}/4 batched answers equal their solo runs")
print(f"# serve smoke: {sm.failed} failed")
sys.exit(1 if sm.failed else 0)
