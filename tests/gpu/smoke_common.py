"""smoke_common.py — what the GPU serve smokes (serve_smoke.py, bf16 KV, and
serve_smoke_fp8.py, FP8 KV) share: a standard-library HTTP client of one
server, the TAP-style report that counts failures, the wait for /health,
and the checks both run the same way (greedy prefix against a golden, the
long re-sent prompt for the prefix cache, concurrent requests against their
solo answers). The GPU machine has no node, hence the standard library.

Imported by its siblings: a script run as `python3 tests/gpu/x.py` has
tests/gpu on sys.path.
"""
import json
import threading
import time
import urllib.request


class Smoke:
    """One server at base; failed counts the "not ok" lines printed."""

    def __init__(self, base):
        self.base = base
        self.failed = 0

    def get(self, path):
        with urllib.request.urlopen(self.base + path, timeout=30) as r:
            return r.status, json.loads(r.read().decode())

    def post(self, path, body, timeout=120):
        """POSTs body as JSON; returns (status, the parsed JSON answer)."""
        req = urllib.request.Request(self.base + path, data=json.dumps(body).encode(),
                                     headers={"content-type": "application/json"})
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read().decode())

    def report(self, ok, name, detail=""):
        print(("ok - " if ok else "not ok - ") + name + ((" # " + detail) if detail else ""), flush=True)
        self.failed += 0 if ok else 1

    def wait_ready(self, name):
        """Polls /health for up to 600 x 0.2 s plus the requests' own time;
        reports the result as test `name`."""
        ready = False
        for _ in range(600):
            try:
                with urllib.request.urlopen(self.base + "/health", timeout=5) as r:
                    if r.status == 200:
                        ready = True
                        break
            except Exception:
                pass
            time.sleep(0.2)
        self.report(ready, name)
        return ready

    def chat(self, content, max_tokens):
        """A greedy one-message chat completion: the answer's text."""
        _, t = self.post("/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": content}],
                                                  "max_tokens": max_tokens, "temperature": 0})
        return t["choices"][0]["message"]["content"]

    def long_prompt_twice(self, max_tokens):
        """The same 1500-word prompt twice (greedy): (cold answer, second
        answer, cold seconds, second seconds)."""
        long_prompt = " ".join(f"word{i}" for i in range(1500))
        body = {"model": "m", "messages": [{"role": "user", "content": long_prompt}], "max_tokens": max_tokens,
                "temperature": 0}
        t0 = time.time()
        _, a = self.post("/v1/chat/completions", body)
        t1 = time.time()
        _, b = self.post("/v1/chat/completions", body)
        t2 = time.time()
        return a, b, t1 - t0, t2 - t1

    def solo_and_concurrent(self, prompts, n_solo, max_tokens=16):
        """The first n_solo prompts one at a time, then all prompts at once
        (one thread each): (solo answers, concurrent answers or the
        exception a request raised), both dicts by prompt index."""
        solo = {i: self.chat(prompts[i], max_tokens) for i in range(n_solo)}
        res = {}

        def worker(i):
            try:
                res[i] = self.chat(prompts[i], max_tokens)
            except Exception as e:  # noqa
                res[i] = e

        ths = [threading.Thread(target=worker, args=(i,)) for i in range(len(prompts))]
        [t.start() for t in ths]
        [t.join() for t in ths]
        return solo, res


def same_prefix(ids, want):
    """How many leading tokens of ids equal want's."""
    n = 0
    while n < min(len(ids), len(want)) and ids[n] == want[n]:
        n += 1
    return n


def prefix_cache_ok(a, b):
    """The second answer's prompt came from the cache (all but the last
    page of 16 tokens at most) and equals the cold answer."""
    ua, ub = a["usage"], b["usage"]
    return (ub["prompt_tokens_details"]["cached_tokens"] >= ua["prompt_tokens"] - 16 and
            a["choices"][0]["message"]["content"] == b["choices"][0]["message"]["content"])
