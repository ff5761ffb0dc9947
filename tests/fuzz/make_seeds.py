#!/usr/bin/env python3
"""tests/fuzz/make_seeds.py — (re)writes the seed corpora tests/fuzz/corpus/<fuzzer>/
from the tests: the golden tokenizer and template cases, the template unit
tests' tables, the fixture configs, request bodies like the integration
tests', and tiny safetensors checkpoints built here. A development tool
(stdlib Python 3 only); the seeds it writes are committed, so neither make
fuzz nor CI runs it. Each seed's input layout is the one its harness
documents (tests/fuzz/fuzz_*.c)."""
import hashlib
import json
import os
import re
import shutil
import struct
import sys

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
FIX = os.path.join(ROOT, "tests", "fixtures")
OUT = os.path.join(ROOT, "tests", "fuzz", "corpus")
MODELS = ["tiny-qwen3", "tiny-llama3", "tinystories-656k"]


def write(fuzzer, data):
    d = os.path.join(OUT, fuzzer)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    name = hashlib.sha1(data).hexdigest()[:16]
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def read(*p):
    with open(os.path.join(*p), "rb") as f:
        return f.read()


# ---- C string literals of the template unit tests' rcase tables
def c_string(lit):
    out = bytearray()
    i = 0
    while i < len(lit):
        c = lit[i]
        if c != "\\":
            out += c.encode()
            i += 1
            continue
        n = lit[i + 1]
        if n in "01234567":
            j = i + 1
            while j < len(lit) and j < i + 4 and lit[j] in "01234567":
                j += 1
            out.append(int(lit[i + 1:j], 8) & 255)
            i = j
        elif n == "x":
            j = i + 2
            while j < len(lit) and lit[j] in "0123456789abcdefABCDEF":
                j += 1
            out.append(int(lit[i + 2:j], 16) & 255)
            i = j
        else:
            out += {"n": b"\n", "t": b"\t", "r": b"\r", "\\": b"\\", '"': b'"', "'": b"'", "0": b"\0"}.get(n, n.encode())
            i += 2
    return bytes(out)


STR = r'"(?:[^"\\]|\\.)*"'
FIELD = r'((?:%s\s*)+|NULL)' % STR
RCASE = re.compile(r'\{\s*' + FIELD + r'\s*,\s*' + FIELD + r'\s*,\s*' + FIELD + r'\s*\}', re.S)


def field(f):
    if f == "NULL":
        return None
    return b"".join(c_string(m[1:-1]) for m in re.findall(STR, f, re.S))


def template_seeds():
    n = 0
    for fn in ["test_template.c", "test_template_filters.c"]:
        src = read(ROOT, "tests", "unit", "template", fn).decode()
        for m in RCASE.finditer(src):
            tsrc, ctx = field(m.group(1)), field(m.group(2))
            write("fuzz_template", b"\x00" + tsrc + b"\x00" + (ctx or b""))
            n += 1
    for i, model in enumerate(["tiny-qwen3", "tiny-llama3"]):
        g = json.loads(read(FIX, "goldens", "template-%s.json" % model))
        for c in g["cases"]:
            ctx = {"messages": c["messages"], "add_generation_prompt": c["add_generation_prompt"]}
            if c.get("tools") is not None:
                ctx["tools"] = c["tools"]
            ctx.update(c.get("kwargs") or {})
            ctx.update({"bos_token": "<s>", "eos_token": "</s>"})
            write("fuzz_template", bytes([1 + i]) + json.dumps(ctx, ensure_ascii=False).encode())
            n += 1
    return n


def tokenizer_seeds():
    n = 0
    for ti, model in enumerate(MODELS):
        g = json.loads(read(FIX, "goldens", "tokenizer-%s.json" % model))
        for k, c in enumerate(g["cases"]):
            text = c["text"].encode()
            if len(text) > 2000:
                continue
            sel = ti | (4 if k % 2 else 0) | (8 if k % 3 == 0 else 0)
            write("fuzz_tokenizer", bytes([sel, 200 + (k % 40)]) + text)
            ids = c.get("ids_with_specials") or c.get("ids") or []
            if ids and k % 4 == 0:
                write("fuzz_tokenizer", bytes([ti | 16]) + b"".join(struct.pack("<I", i)[:3] for i in ids[:200]))
            n += 1
    return n


def config_seeds():
    n = 0
    for model in MODELS:
        cfg = read(FIX, "models", model, "config.json")
        write("fuzz_config", cfg)
        gp = os.path.join(FIX, "models", model, "generation_config.json")
        if os.path.exists(gp):
            write("fuzz_config", cfg + b"\x00" + read(gp))
        n += 2
    for f in sorted(os.listdir(os.path.join(ROOT, "bench", "configs"))):
        if f.endswith(".json"):
            write("fuzz_config", read(ROOT, "bench", "configs", f))
            n += 1
    base = json.loads(read(FIX, "models", "tiny-qwen3", "config.json"))
    for patch in [{"rope_scaling": {"rope_type": "linear", "factor": 2.0}}, {"head_dim": 6, "num_key_value_heads": 3},
                  {"model_type": "llama", "architectures": None}, {"eos_token_id": 5}, {"rope_scaling": None}]:
        c = dict(base)
        c.update(patch)
        write("fuzz_config", json.dumps({k: v for k, v in c.items() if v is not None}))
        n += 1
    return n


# ---- tiny safetensors checkpoints (the harness's built-in config: 1 layer,
# hidden 8, 2 heads of 4, 1 KV head, ff 16, vocab 16, tied embeddings)
def st_bytes(tensors, dtype):
    esz = {"F32": 4, "BF16": 2, "F16": 2}[dtype]
    header, data = {"__metadata__": {"format": "pt"}}, b""
    for name, shape in tensors:
        cnt = 1
        for s in shape:
            cnt *= s
        blob = bytes((i * 37 + len(name)) % 251 for i in range(cnt * esz))
        if dtype == "F32":  # small finite floats
            blob = b"".join(struct.pack("<f", ((i % 17) - 8) / 64.0) for i in range(cnt))
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(blob)]}
        data += blob
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + data


def llama_tensors(hidden=8, heads=2, kv=1, hd=4, ff=16, vocab=16, layers=1, qk_norm=False, tied=True):
    t = [("model.embed_tokens.weight", [vocab, hidden])]
    for l in range(layers):
        p = "model.layers.%d." % l
        t += [(p + "input_layernorm.weight", [hidden]), (p + "self_attn.q_proj.weight", [heads * hd, hidden]),
              (p + "self_attn.k_proj.weight", [kv * hd, hidden]), (p + "self_attn.v_proj.weight", [kv * hd, hidden]),
              (p + "self_attn.o_proj.weight", [hidden, heads * hd]), (p + "post_attention_layernorm.weight", [hidden]),
              (p + "mlp.gate_proj.weight", [ff, hidden]), (p + "mlp.up_proj.weight", [ff, hidden]),
              (p + "mlp.down_proj.weight", [hidden, ff])]
        if qk_norm:
            t += [(p + "self_attn.q_norm.weight", [hd]), (p + "self_attn.k_norm.weight", [hd])]
    t.append(("model.norm.weight", [hidden]))
    if not tied:
        t.append(("lm_head.weight", [vocab, hidden]))
    return t


def safetensors_seeds():
    n = 0
    for dtype in ["F32", "BF16", "F16"]:
        st = st_bytes(llama_tensors(), dtype)
        write("fuzz_safetensors", b"\x04" + st)  # built-in config, load too
        write("fuzz_safetensors", b"\x00" + st[:len(st) // 2])  # truncated
        n += 2
    qcfg = {"architectures": ["Qwen3ForCausalLM"], "vocab_size": 16, "hidden_size": 8, "intermediate_size": 16,
            "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 2, "head_dim": 4,
            "max_position_embeddings": 64, "tie_word_embeddings": False, "eos_token_id": 3}
    st = st_bytes(llama_tensors(kv=2, layers=2, qk_norm=True, tied=False), "BF16")
    write("fuzz_safetensors", b"\x05" + json.dumps(qcfg).encode() + b"\x00" + st)
    names = [t[0] for t in llama_tensors()]
    idx = {"metadata": {"total_size": 1}, "weight_map": {k: "model-00001-of-00001.safetensors" for k in names}}
    write("fuzz_safetensors", b"\x06" + json.dumps(idx).encode() + b"\x00" + st_bytes(llama_tensors(), "BF16"))
    # a real header (tinystories), its data cut off
    real = read(FIX, "models", "tinystories-656k", "model.safetensors")
    hlen = struct.unpack("<Q", real[:8])[0]
    write("fuzz_safetensors", b"\x01" + read(FIX, "models", "tinystories-656k", "config.json") + b"\x00" +
          real[:8 + hlen + 256])
    return n + 3


def http_seeds():
    tools = [{"type": "function", "function": {"name": "read_file", "description": "read a file",
                                               "parameters": {"type": "object", "properties": {"path": {"type": "string"}},
                                                              "required": ["path"]}}}]
    msgs = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "hi"}]
    bodies = [
        # (route index in ns_api_routes, model bit, body, scripted output)
        (0, 0, {"messages": msgs, "max_tokens": 16}, "Hello there."),
        (0, 0, {"messages": msgs, "stream": True, "stream_options": {"include_usage": True}}, "<think>hmm</think>Hi!"),
        (0, 0, {"messages": msgs, "tools": tools, "stream": True},
         "<tool_call>\n{\"name\": \"read_file\", \"arguments\": {\"path\": \"a.c\"}}\n</tool_call>"),
        (0, 0, {"messages": msgs + [{"role": "assistant", "content": "", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "read_file", "arguments": "{\"path\": \"x\"}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "data"}], "tools": tools, "tool_choice": "auto"},
         "done"),
        (0, 0, {"messages": msgs, "logprobs": True, "top_logprobs": 3, "stop": ["\n\n", "END"], "seed": 7,
                "temperature": 0.7, "top_p": 0.9, "top_k": 40, "min_p": 0.05, "presence_penalty": 0.5,
                "frequency_penalty": 0.5, "repetition_penalty": 1.1, "response_format": {"type": "text"}},
         "one END two"),
        (0, 1, {"messages": msgs, "tools": tools, "stream": True},
         "{\"name\": \"read_file\", \"parameters\": {\"path\": \"b\"}}"),
        (0, 1, {"messages": [{"role": "user", "content": [{"type": "text", "text": "part"}]}],
                "max_completion_tokens": 4, "return_token_ids": True}, "abc"),
        (2, 0, {"prompt": "Once upon a time", "max_tokens": 8, "stream": True, "logprobs": 2}, " there was"),
        (2, 0, {"prompt": [1, 2, 3], "max_tokens": 4, "echo": False, "ignore_eos": True}, "xyz"),
        (2, 1, {"prompt": "def f():", "stop": "\n", "n": 1, "temperature": 0}, "\n    return 1\n"),
        (9, 0, {"text": "Hello <|im_start|> world", "add_special_tokens": True}, ""),
        (9, 0, {"messages": msgs}, ""),
        (10, 0, {"tokens": [9707, 1879, 151645]}, ""),
        (10, 1, {"tokens": [128000, 9906]}, ""),
        (11, 0, {"messages": msgs, "tools": tools, "add_generation_prompt": True}, ""),
        (11, 1, {"messages": msgs, "chat_template_kwargs": {"enable_thinking": False}}, ""),
        (13, 0, {"timeout_ms": 10}, ""),
    ]
    n = 0
    for route, model, body, out in bodies:
        sel = route | (model << 4) | (32 if n % 2 else 0)
        data = bytes([sel]) + json.dumps(body).encode() + (b"\x00" + out.encode() if out else b"")
        write("fuzz_http_body", data)
        n += 1
    for route in [4, 6, 7, 12, 14]:  # GET routes: models, capacity, health, metrics, admin/cache
        write("fuzz_http_body", bytes([route]))
        n += 1
    for raw in [b"{", b"[]", b"{\"messages\": 5}", b"\xff\xfe", b"{\"a\":" * 200]:
        write("fuzz_http_body", b"\x00" + raw)
        n += 1
    return n


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--clean":
        shutil.rmtree(OUT, ignore_errors=True)
    counts = {
        "fuzz_template": template_seeds(),
        "fuzz_tokenizer": tokenizer_seeds(),
        "fuzz_config": config_seeds(),
        "fuzz_safetensors": safetensors_seeds(),
        "fuzz_http_body": http_seeds(),
    }
    for k, v in counts.items():
        print("%-18s %d seeds" % (k, v))


if __name__ == "__main__":
    main()
