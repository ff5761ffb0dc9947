#!/usr/bin/env python3
"""http_agents.py -- HTTP load generator for the agent benchmarks of issue #10.

Drives an OpenAI-compatible server (nightshift, or llama.cpp's llama-server
for side-by-side runs) with prompts of random token ids on /v1/completions,
streamed, and measures what a coding agent feels: time to first token (TTFT)
of long cold prompts, of several at once, of warm follow-up turns, and whether
requests survive memory pressure. Python 3 standard library only.

    http_agents.py BASE_URL cold       [-n N] [--runs R]
    http_agents.py BASE_URL concurrent [-n N] [-k K]
    http_agents.py BASE_URL warm       [-n N] [-k K] [--gen G] [--new T]
    http_agents.py BASE_URL pressure   [-n N] [--sessions S] [--max-tokens M]

cold        one cold N-token prompt (R times, a new prompt each): TTFT.
concurrent  K cold N-token prompts at once: wall time until all are done,
            TTFT min/median/max.
warm        K sessions at once: a cold N-token turn that generates G tokens
            (setup), then the next turn of each session, whose prompt is the
            cold prompt + the G generated tokens + T new tokens: TTFT of the
            warm turns (median), and cached prompt tokens where the server
            reports them.
pressure    S sessions of N tokens at once, each generating M tokens: wall
            of each request, aborts (non-200 answers, error events, broken
            streams), total wall.

Every request: {"prompt": [ids], "stream": true, "temperature": 0,
"ignore_eos": true, "max_tokens": M, "stream_options": {"include_usage": true}}
(ignore_eos is understood by nightshift and llama.cpp). TTFT is the time from
sending the request to the first SSE data chunk that carries text (or token
ids). The ids are drawn uniformly from [0, vocab - skip-top), so special and
padding ids at the top of the vocabulary are left out; every session gets its
own prompt, so cold prompts are cold (a new --seed each run by default).

The warm setup turn is not streamed and asks for "return_token_ids" (a
nightshift extension) so that the next turn repeats the generated ids exactly;
a server that does not return them (llama.cpp) has the generated text
re-tokenized with POST /tokenize (llama.cpp's shape, which nightshift also
serves).

Output: a compact table, then one JSON line per mode (for docs/perf.md).

Against nightshift (a model of real size without a checkpoint):
    build/cuda/nightshift serve --device cuda --dummy-weights bench/configs/qwen3-8b.json --port 8080
    bench/http_agents.py http://127.0.0.1:8080 cold -n 30000
Against llama.cpp: llama-server -m MODEL.gguf -np K -c K*(N+G+T+M) (the
context is split between the -np slots); its cache_prompt defaults to true,
which a warm turn needs (a slot keeps its last prompt), and nothing else is
sent that nightshift does not also accept.
"""

import argparse
import http.client
import json
import os
import random
import statistics
import sys
import threading
import time
import urllib.parse


class Result:
    """One request: status, timings, usage."""

    def __init__(self):
        self.status = None  # HTTP status (None: no answer)
        self.error = None  # text of an abort, None when it went through
        self.ttft = None  # seconds to the first chunk with text or tokens
        self.wall = None  # seconds to the end of the answer
        self.chunks = 0  # data chunks with text or tokens
        self.prompt_tokens = None
        self.completion_tokens = None
        self.cached_tokens = None
        self.finish_reason = None
        self.text = ""
        self.token_ids = None

    @property
    def ok(self):
        return self.error is None


class Client:
    def __init__(self, base_url, api_key=None, timeout=3600.0):
        u = urllib.parse.urlsplit(base_url if "://" in base_url else "http://" + base_url)
        if u.scheme not in ("http", "https"):
            raise SystemExit("http_agents: BASE_URL must be http:// or https://, not %r" % base_url)
        self.https = u.scheme == "https"
        self.host = u.hostname or "127.0.0.1"
        self.port = u.port or (443 if self.https else 80)
        prefix = u.path.rstrip("/")
        if prefix.endswith("/v1"):  # accept OPENAI_BASE_URL-style .../v1
            prefix = prefix[:-3]
        self.prefix = prefix
        self.headers = {"Content-Type": "application/json"}
        if api_key:
            self.headers["Authorization"] = "Bearer " + api_key
        self.timeout = timeout

    def connect(self):
        cls = http.client.HTTPSConnection if self.https else http.client.HTTPConnection
        c = cls(self.host, self.port, timeout=self.timeout)
        c.connect()
        return c

    def request(self, method, path, body=None, conn=None):
        """-> (status, parsed JSON or text); raises on a transport error."""
        c = conn or self.connect()
        try:
            data = json.dumps(body).encode() if body is not None else None
            c.request(method, self.prefix + path, body=data, headers=self.headers)
            r = c.getresponse()
            raw = r.read()
            try:
                return r.status, json.loads(raw)
            except ValueError:
                return r.status, raw.decode("utf-8", "replace")
        finally:
            if conn is None:
                c.close()

    def stream(self, body, conn, t0=None):
        """Streams a /v1/completions request on conn; returns a Result."""
        res = Result()
        t0 = time.perf_counter() if t0 is None else t0
        done = False
        try:
            conn.request("POST", self.prefix + "/v1/completions", body=json.dumps(body).encode(),
                         headers=self.headers)
            r = conn.getresponse()
            res.status = r.status
            if r.status != 200:
                raw = r.read().decode("utf-8", "replace")
                res.error = "HTTP %d: %s" % (r.status, error_message(raw))
            else:
                for line in r:
                    line = line.strip()
                    if not line.startswith(b"data:"):
                        continue  # blank separators, ": keep-alive" comments
                    payload = line[5:].strip()
                    if payload == b"[DONE]":
                        done = True
                        break
                    try:
                        ev = json.loads(payload)
                    except ValueError:
                        res.error = "bad SSE data: %r" % payload[:200]
                        break
                    if ev.get("error"):
                        res.error = "error event: %s" % error_message(ev)
                        continue  # [DONE] follows
                    got = False
                    for ch in ev.get("choices") or []:
                        text = ch.get("text")
                        if text is None:
                            text = (ch.get("delta") or {}).get("content")
                        if text:
                            res.text += text
                            got = True
                        if ch.get("token_ids") or ch.get("tokens"):
                            got = True
                        if ch.get("finish_reason"):
                            res.finish_reason = ch["finish_reason"]
                    if ev.get("tokens") or (ev.get("content") and "choices" not in ev):
                        got = True
                    if got:
                        res.chunks += 1
                        if res.ttft is None:
                            res.ttft = time.perf_counter() - t0
                    take_usage(res, ev)
                if res.error is None and not done:
                    res.error = "the stream ended without [DONE]"
        except (OSError, http.client.HTTPException) as e:
            res.error = "%s: %s" % (type(e).__name__, e)
        res.wall = time.perf_counter() - t0
        return res


def error_message(x):
    if isinstance(x, str):
        try:
            x = json.loads(x)
        except ValueError:
            return x.strip()[:300]
    if isinstance(x, dict):
        e = x.get("error", x)
        if isinstance(e, dict):
            code = e.get("code")
            msg = e.get("message", json.dumps(e))
            return "%s (%s)" % (msg, code) if code else msg
        return str(e)[:300]
    return str(x)[:300]


def take_usage(res, ev):
    u = ev.get("usage")
    if isinstance(u, dict):
        res.prompt_tokens = u.get("prompt_tokens", res.prompt_tokens)
        res.completion_tokens = u.get("completion_tokens", res.completion_tokens)
        d = u.get("prompt_tokens_details")
        if isinstance(d, dict) and d.get("cached_tokens") is not None:
            res.cached_tokens = d["cached_tokens"]
    t = ev.get("timings")  # llama.cpp
    if isinstance(t, dict) and t.get("cache_n") is not None and res.cached_tokens is None:
        res.cached_tokens = t["cache_n"]


def run_parallel(client, bodies, stream=True):
    """Sends all bodies at once (one connection each, opened beforehand);
    -> (results, wall seconds from the common start to the last answer)."""
    n = len(bodies)
    results = [None] * n
    conns = [None] * n
    for i in range(n):
        try:
            conns[i] = client.connect()
        except OSError as e:
            raise SystemExit("http_agents: cannot connect to %s:%d: %s" % (client.host, client.port, e))
    barrier = threading.Barrier(n + 1)
    start = [0.0]

    def worker(i):
        barrier.wait()
        t0 = time.perf_counter()
        if stream:
            results[i] = client.stream(bodies[i], conns[i], t0)
        else:
            results[i] = one_shot(client, bodies[i], conns[i], t0)
        conns[i].close()

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    start[0] = time.perf_counter()
    barrier.wait()
    for t in threads:
        t.join()
    return results, time.perf_counter() - start[0]


def one_shot(client, body, conn, t0):
    """A non-streamed completion (the warm setup turn)."""
    res = Result()
    try:
        status, j = client.request("POST", "/v1/completions", body, conn)
        res.status = status
        if status != 200:
            res.error = "HTTP %d: %s" % (status, error_message(j))
        elif not isinstance(j, dict) or not j.get("choices"):
            res.error = "no choices in the answer"
        else:
            ch = j["choices"][0]
            res.text = ch.get("text") or ""
            res.finish_reason = ch.get("finish_reason")
            ids = ch.get("token_ids") or ch.get("tokens") or j.get("tokens")
            if isinstance(ids, list) and all(isinstance(x, int) for x in ids):
                res.token_ids = ids
            take_usage(res, j)
    except (OSError, http.client.HTTPException) as e:
        res.error = "%s: %s" % (type(e).__name__, e)
    res.wall = time.perf_counter() - t0
    return res


# ---- prompts and request bodies


def random_prompt(rng, n, args):
    hi = max(1, args.vocab - args.skip_top)
    return [rng.randrange(hi) for _ in range(n)]


def body_for(prompt, max_tokens, args, stream=True):
    b = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True, "stream": stream}
    if args.model:
        b["model"] = args.model
    if stream:
        b["stream_options"] = {"include_usage": True}
    else:
        b["return_token_ids"] = True  # nightshift [ext]; others ignore it
    return b


# ---- statistics and output


def stats(xs):
    xs = [x for x in xs if x is not None]
    if not xs:
        return None
    return {"min": round(min(xs), 4), "median": round(statistics.median(xs), 4), "max": round(max(xs), 4)}


def summarize(mode, results, wall, args, prompt_tokens, gen_tokens, extra=None):
    """One row of the table and one JSON object."""
    aborts = [r for r in results if not r.ok]
    errors = []
    for r in aborts:
        if r.error not in errors:
            errors.append(r.error)
    out = {
        "bench": "http_agents",
        "mode": mode,
        "label": args.label,
        "base_url": args.base_url,
        "model": args.model,
        "seed": args.seed,
        "requests": len(results),
        "prompt_tokens": prompt_tokens,
        "max_tokens": gen_tokens,
        "wall_s": round(wall, 4),
        "ttft_s": stats([r.ttft for r in results if r.ok]),
        "request_wall_s": stats([r.wall for r in results]),
        "cached_tokens": stats([r.cached_tokens for r in results if r.ok]),
        "completion_tokens": sum(r.completion_tokens or r.chunks for r in results if r.ok),
        "aborts": len(aborts),
        "errors": errors[:5],
    }
    if out["ttft_s"] and prompt_tokens:
        out["prefill_tok_s_at_median_ttft"] = round(prompt_tokens / out["ttft_s"]["median"], 1)
    if extra:
        out.update(extra)
    return out


COLS = [("mode", 11, "s"), ("reqs", 5, "d"), ("prompt", 7, "d"), ("gen", 5, "d"), ("wall_s", 8, ".2f"),
        ("ttft_min", 9, ".3f"), ("ttft_med", 9, ".3f"), ("ttft_max", 9, ".3f"), ("req_med", 8, ".2f"),
        ("req_max", 8, ".2f"), ("cached", 7, "d"), ("aborts", 6, "d")]


def row_values(o):
    t = o["ttft_s"] or {}
    w = o["request_wall_s"] or {}
    c = o["cached_tokens"] or {}
    return [o["mode"], o["requests"], o["prompt_tokens"], o["max_tokens"], o["wall_s"], t.get("min"),
            t.get("median"), t.get("max"), w.get("median"), w.get("max"),
            int(c["median"]) if c else None, o["aborts"]]


def print_report(rows):
    print("  ".join(("%" + ("-" if f == "s" else "") + str(w) + "s") % name for name, w, f in COLS))
    for o in rows:
        cells = []
        for (name, w, f), v in zip(COLS, row_values(o)):
            if v is None:
                cells.append("%*s" % (w, "-"))
            elif f == "s":
                cells.append("%-*s" % (w, v))
            else:
                cells.append("%*s" % (w, format(v, f)))
        print("  ".join(cells))
    for o in rows:
        for e in o["errors"]:
            print("  %s: abort: %s" % (o["mode"], e))
    for o in rows:
        print(json.dumps(o, separators=(",", ":")))
    sys.stdout.flush()


# ---- modes


def mode_cold(client, args, rng):
    rows, results, walls = [], [], 0.0
    for _ in range(args.runs):
        p = random_prompt(rng, args.tokens, args)
        conn = client.connect()
        results.append(client.stream(body_for(p, args.max_tokens, args), conn))
        conn.close()
        walls += results[-1].wall
    rows.append(summarize("cold", results, walls, args, args.tokens, args.max_tokens,
                          {"ttft_each_s": [None if r.ttft is None else round(r.ttft, 4) for r in results]}))
    return rows


def mode_concurrent(client, args, rng):
    bodies = [body_for(random_prompt(rng, args.tokens, args), args.max_tokens, args) for _ in range(args.k)]
    results, wall = run_parallel(client, bodies)
    extra = {"prompt_tok_s": round(args.k * args.tokens / wall, 1) if wall > 0 else None}
    return [summarize("concurrent", results, wall, args, args.tokens, args.max_tokens, extra)]


def mode_warm(client, args, rng):
    prompts = [random_prompt(rng, args.tokens, args) for _ in range(args.k)]
    setup, setup_wall = run_parallel(client, [body_for(p, args.gen, args, stream=False) for p in prompts],
                                     stream=False)
    rows = [summarize("warm-setup", setup, setup_wall, args, args.tokens, args.gen)]
    bodies, sources = [], []
    for p, r in zip(prompts, setup):
        gen = r.token_ids
        src = "token_ids"
        if gen is None and r.ok:
            src = "tokenize"
            try:
                st, j = client.request("POST", "/tokenize", {"content": r.text, "add_special": False})
                gen = j.get("tokens") if st == 200 and isinstance(j, dict) else None
                if gen and isinstance(gen[0], dict):
                    gen = [t["id"] for t in gen]
            except (OSError, http.client.HTTPException):
                gen = None
        if gen is None:
            src = "random"  # the setup failed or nothing could tokenize
            gen = random_prompt(rng, args.gen, args)
        sources.append(src)
        bodies.append(body_for(p + gen + random_prompt(rng, args.new, args), args.max_tokens, args))
    results, wall = run_parallel(client, bodies)
    n_prompt = len(bodies[0]["prompt"]) if bodies else 0
    rows.append(summarize("warm", results, wall, args, n_prompt, args.max_tokens,
                          {"cold_tokens": args.tokens, "generated_tokens": args.gen, "new_tokens": args.new,
                           "generated_ids_from": sorted(set(sources))}))
    # a warm turn's TTFT is about its new tokens, not the whole prompt
    rows[-1].pop("prefill_tok_s_at_median_ttft", None)
    return rows


def mode_pressure(client, args, rng):
    bodies = [body_for(random_prompt(rng, args.tokens, args), args.max_tokens, args) for _ in range(args.sessions)]
    results, wall = run_parallel(client, bodies)
    extra = {
        "request_walls_s": [round(r.wall, 3) for r in results],
        "short": sum(1 for r in results if r.ok and r.completion_tokens is not None
                     and r.completion_tokens < args.max_tokens),
    }
    return [summarize("pressure", results, wall, args, args.tokens, args.max_tokens, extra)]


MODES = {"cold": mode_cold, "concurrent": mode_concurrent, "warm": mode_warm, "pressure": mode_pressure}


def wait_ready(client, seconds):
    """Polls GET /health until 200 (a server without /health counts as up)."""
    deadline = time.time() + seconds
    last = None
    while True:
        try:
            st, j = client.request("GET", "/health")
            if st in (200, 404):
                return
            last = "HTTP %d %s" % (st, j)
        except (OSError, http.client.HTTPException) as e:
            last = str(e)
        if time.time() >= deadline:
            raise SystemExit("http_agents: the server is not ready after %g s (%s)" % (seconds, last))
        time.sleep(0.25)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    ap.add_argument("base_url", help="server address, e.g. http://127.0.0.1:8080 (a trailing /v1 is fine)")
    ap.add_argument("mode", choices=sorted(MODES), help="what to measure (see below)")
    ap.add_argument("-n", "--tokens", type=int, default=30000, help="prompt tokens per cold prompt (default 30000)")
    ap.add_argument("-k", type=int, default=8, help="concurrent sessions for concurrent and warm (default 8)")
    ap.add_argument("--runs", type=int, default=1, help="cold: prompts, one after the other (default 1)")
    ap.add_argument("--gen", type=int, default=256, help="warm: tokens generated by the setup turn (default 256)")
    ap.add_argument("--new", type=int, default=300, help="warm: new tokens in the warm turn (default 300)")
    ap.add_argument("--sessions", type=int, default=16, help="pressure: requests at once (default 16)")
    ap.add_argument("--max-tokens", type=int, default=None,
                    help="tokens to generate per measured request (default 16; pressure: 256)")
    ap.add_argument("--vocab", type=int, default=151936, help="vocabulary size (default 151936, Qwen3)")
    ap.add_argument("--skip-top", type=int, default=300,
                    help="ids this close to the vocabulary's top are not drawn (special and padding ids; "
                         "default 300)")
    ap.add_argument("--seed", type=int, default=None, help="prompt seed (default: a new one each run)")
    ap.add_argument("--model", default=None, help="model field to send (default: the first id of /v1/models)")
    ap.add_argument("--api-key", default=os.environ.get("NIGHTSHIFT_API_KEY") or os.environ.get("OPENAI_API_KEY"),
                    help="bearer key (default $NIGHTSHIFT_API_KEY, else $OPENAI_API_KEY)")
    ap.add_argument("--label", default=None, help="free text copied into the JSON lines, e.g. 'nightshift H200'")
    ap.add_argument("--timeout", type=float, default=3600, help="per-request socket timeout, s (default 3600)")
    ap.add_argument("--wait", type=float, default=600,
                    help="wait this long for GET /health to answer 200 first, s (default 600)")
    args = ap.parse_args(argv)
    if args.max_tokens is None:
        args.max_tokens = 256 if args.mode == "pressure" else 16
    for name in ("tokens", "k", "runs", "sessions", "max_tokens", "vocab"):
        if getattr(args, name) < 1:
            ap.error("--%s must be at least 1" % name.replace("_", "-"))
    for name in ("gen", "new", "skip_top"):
        if getattr(args, name) < 0:
            ap.error("--%s must not be negative" % name.replace("_", "-"))
    if args.mode == "warm" and args.gen < 1:
        ap.error("--gen must be at least 1")
    if args.seed is None:
        args.seed = random.SystemRandom().randrange(1 << 31)
    client = Client(args.base_url, args.api_key, args.timeout)
    wait_ready(client, args.wait)
    if args.model is None:
        try:
            st, j = client.request("GET", "/v1/models")
            if st == 200 and isinstance(j, dict) and j.get("data"):
                args.model = j["data"][0].get("id")
        except (OSError, http.client.HTTPException):
            pass
    rng = random.Random("%d/%s" % (args.seed, args.mode))  # modes of one seed draw other prompts
    rows = MODES[args.mode](client, args, rng)
    print_report(rows)
    return 1 if any(o["aborts"] for o in rows) and args.mode != "pressure" else 0


if __name__ == "__main__":
    sys.exit(main())
