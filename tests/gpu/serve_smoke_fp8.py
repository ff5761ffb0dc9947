"""serve_smoke_fp8.py — `nightshift serve --device cuda --kv-dtype fp8` end to
end, standard library only (run by tests/gpu/serve_smoke.sh after the bf16
smoke). Prints TAP-style "ok - name" / "not ok - name" lines.

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
import threading
import time
import urllib.request

base, shared = sys.argv[1], sys.argv[2]
failed = 0


def get(path):
    with urllib.request.urlopen(base + path, timeout=30) as r:
        return r.status, json.loads(r.read().decode())


def post(path, body, timeout=120):
    req = urllib.request.Request(base + path, data=json.dumps(body).encode(), headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return r.status, json.loads(r.read().decode())


def report(ok, name, detail=""):
    global failed
    print(("ok - " if ok else "not ok - ") + name + ((" # " + detail) if detail else ""), flush=True)
    failed += 0 if ok else 1


ready = False
for _ in range(600):
    try:
        with urllib.request.urlopen(base + "/health", timeout=5) as r:
            if r.status == 200:
                ready = True
                break
    except Exception:
        pass
    time.sleep(0.2)
report(ready, "fp8_health_ready")
if not ready:
    sys.exit(1)

_, st = get("/v1/status")
_, cap = get("/v1/capacity")
# tiny-qwen3: 4 layers x 2 x 2 kv heads x 32 dims = 512 codes + 4 bytes of scales per token
report(st.get("kv_dtype") == "fp8" and cap.get("kv_dtype") == "fp8" and st.get("kv_bytes_per_token") == 516,
       "fp8_reported", f"status {st.get('kv_dtype')}/{st.get('kv_bytes_per_token')}, capacity {cap.get('kv_dtype')}")

golden = json.load(open(shared + "/goldens/logits-tiny-qwen3.json"))
for p in golden["prompts"]:
    code, j = post("/v1/completions", {"model": "m", "prompt": p["prompt_ids"], "max_tokens": 48, "temperature": 0,
                                        "return_token_ids": True, "ignore_eos": True})
    ids = j["choices"][0].get("token_ids", [])
    want = p["greedy_48"]
    n_same = 0
    while n_same < min(len(ids), len(want)) and ids[n_same] == want[n_same]:
        n_same += 1
    report(code == 200 and len(ids) == 48, "fp8_greedy_" + p["label"], f"{n_same}/48 identical to the bf16 golden")

long_prompt = " ".join(f"word{i}" for i in range(1500))
body = {"model": "m", "messages": [{"role": "user", "content": long_prompt}], "max_tokens": 8, "temperature": 0}
_, a = post("/v1/chat/completions", body)
_, b = post("/v1/chat/completions", body)
ua, ub = a["usage"], b["usage"]
report(ub["prompt_tokens_details"]["cached_tokens"] >= ua["prompt_tokens"] - 16 and
       a["choices"][0]["message"]["content"] == b["choices"][0]["message"]["content"], "fp8_prefix_cache_hit",
       f"{ua['prompt_tokens']} prompt tokens, cached {ub['prompt_tokens_details']['cached_tokens']}")

prompts = [f"Tell me about item {i}." for i in range(8)]
solo = {}
for i in range(8):
    _, t = post("/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": prompts[i]}],
                                         "max_tokens": 16, "temperature": 0})
    solo[i] = t["choices"][0]["message"]["content"]
res = {}


def worker(i):
    try:
        _, t = post("/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": prompts[i]}],
                                             "max_tokens": 16, "temperature": 0})
        res[i] = t["choices"][0]["message"]["content"]
    except Exception as e:  # noqa
        res[i] = e


ths = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
[t.start() for t in ths]
[t.join() for t in ths]
same = sum(1 for i in range(8) if res.get(i) == solo[i])
report(same == 8, "fp8_concurrent_equals_solo", f"{same}/8 batched answers equal their solo runs")
print(f"# serve smoke fp8: {failed} failed")
sys.exit(1 if failed else 0)
