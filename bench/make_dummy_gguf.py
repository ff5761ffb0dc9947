#!/usr/bin/env python3
"""bench/make_dummy_gguf.py — a full-size GGUF of a model *shape* for speed
comparisons with llama.cpp, written in seconds and taking almost no disk.

Usage: make_dummy_gguf.py CONFIG.json TOKENIZER_DIR TYPE OUT.gguf
  CONFIG.json    an HF config (bench/configs/*.json): qwen3 or qwen3_moe
  TOKENIZER_DIR  a directory with the model family's tokenizer.json
                 (tests/fixtures/models/tiny-qwen3: the real Qwen vocabulary)
  TYPE           bf16 | q8_0 | q4_k: the type of every 2-D weight matrix
                 (experts included); token_embd stays BF16, norms F32, the
                 MoE router F32, as llama.cpp's quantizer leaves them.

Needs gguf-py (llama.cpp's, on PYTHONPATH) and numpy.

Why the file is mostly holes: matrix products cost the same whatever the
values, so the weight matrices are left as sparse-file holes (zeros: valid
blocks of every type, d = 0). Only what decides *which work runs* holds
real values: the token embeddings (random, so hidden states differ per
token) and the MoE router (random, so tokens spread over the experts as in
a trained model; with all-zero inputs every router logit would tie and
llama.cpp would send every token to the same 8 experts, making batched MoE
look faster than it is). Norm weights are 1. The numbers this file gives
are speeds only; its outputs are meaningless.
"""
import json
import os
import sys

import numpy as np

import gguf
from gguf import GGMLQuantizationType as Q

TYPES = {"bf16": Q.BF16, "q8_0": Q.Q8_0, "q4_k": Q.Q4_K}
FILE_TYPES = {"bf16": 32, "q8_0": 7, "q4_k": 15}  # llama_ftype: MOSTLY_BF16, MOSTLY_Q8_0, MOSTLY_Q4_K_M


def row_bytes(qtype, cols):
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    if cols % block:
        raise SystemExit(f"make_dummy_gguf: {cols} columns are not whole {qtype.name} blocks of {block}")
    return cols // block * size


def bf16_random(rng, n, scale):
    x = (rng.standard_normal(n, dtype=np.float32) * scale).view(np.uint32)
    return ((x + 0x8000) >> 16).astype(np.uint16)  # round to nearest (no NaNs: |x| small)


def vocab(tok_dir, n_vocab):
    tj = json.load(open(os.path.join(tok_dir, "tokenizer.json"), encoding="utf-8"))
    tokens = [None] * n_vocab
    types = [gguf.TokenType.UNUSED] * n_vocab
    for t, i in tj["model"]["vocab"].items():
        if i < n_vocab:
            tokens[i], types[i] = t, gguf.TokenType.NORMAL
    for a in tj.get("added_tokens", []):
        if a["id"] < n_vocab:
            tokens[a["id"]] = a["content"]
            types[a["id"]] = gguf.TokenType.CONTROL if a.get("special") else gguf.TokenType.USER_DEFINED
    for i in range(n_vocab):
        if tokens[i] is None:
            tokens[i] = f"[PAD{i}]"
    merges = [m if isinstance(m, str) else " ".join(m) for m in tj["model"]["merges"]]
    return tokens, types, merges


def n_experts(c):
    # transformers 5 writes num_local_experts where 4.x wrote num_experts
    return c.get("num_experts") or c.get("num_local_experts") or 0


def tensor_plan(c, wtype):
    """(name, numpy-order shape [outer..., cols], qtype, filler) for every tensor."""
    d, L = c["hidden_size"], c["num_hidden_layers"]
    hd = c.get("head_dim") or d // c["num_attention_heads"]
    nq, nkv = c["num_attention_heads"] * hd, c["num_key_value_heads"] * hd
    E = n_experts(c)
    plan = [("token_embd.weight", (c["vocab_size"], d), Q.BF16, "embed")]
    for i in range(L):
        b = f"blk.{i}."
        plan += [(b + "attn_norm.weight", (d,), Q.F32, "ones"),
                 (b + "attn_q.weight", (nq, d), wtype, None),
                 (b + "attn_k.weight", (nkv, d), wtype, None),
                 (b + "attn_v.weight", (nkv, d), wtype, None),
                 (b + "attn_output.weight", (d, nq), wtype, None),
                 (b + "attn_q_norm.weight", (hd,), Q.F32, "ones"),
                 (b + "attn_k_norm.weight", (hd,), Q.F32, "ones"),
                 (b + "ffn_norm.weight", (d,), Q.F32, "ones")]
        if E > 0 and i not in c.get("mlp_only_layers", []):
            ff = c["moe_intermediate_size"]
            plan += [(b + "ffn_gate_inp.weight", (E, d), Q.F32, "router"),
                     (b + "ffn_gate_exps.weight", (E, ff, d), wtype, None),
                     (b + "ffn_up_exps.weight", (E, ff, d), wtype, None),
                     (b + "ffn_down_exps.weight", (E, d, ff), wtype, None)]
        else:
            ff = c["intermediate_size"]
            plan += [(b + "ffn_gate.weight", (ff, d), wtype, None),
                     (b + "ffn_up.weight", (ff, d), wtype, None),
                     (b + "ffn_down.weight", (d, ff), wtype, None)]
    plan += [("output_norm.weight", (d,), Q.F32, "ones"),
             ("output.weight", (c["vocab_size"], d), wtype, None)]
    return plan


def add_metadata(w, c, arch, type_name, tokens, types, merges):
    hd = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
    w.add_name(f"dummy {arch} {type_name}")
    w.add_block_count(c["num_hidden_layers"])
    w.add_context_length(c.get("max_position_embeddings", 40960))
    w.add_embedding_length(c["hidden_size"])
    w.add_feed_forward_length(c["intermediate_size"])
    w.add_head_count(c["num_attention_heads"])
    w.add_head_count_kv(c["num_key_value_heads"])
    w.add_key_length(hd)
    w.add_value_length(hd)
    w.add_rope_freq_base(float(c.get("rope_theta", 1e6)))
    w.add_layer_norm_rms_eps(float(c.get("rms_norm_eps", 1e-6)))
    w.add_file_type(FILE_TYPES[type_name])
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    if n_experts(c) > 0:
        w.add_expert_count(n_experts(c))
        w.add_expert_used_count(c["num_experts_per_tok"])
        w.add_expert_feed_forward_length(c["moe_intermediate_size"])
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(c["bos_token_id"])
    w.add_eos_token_id(c["eos_token_id"])
    w.add_add_bos_token(False)


def main():
    if len(sys.argv) != 5 or sys.argv[3] not in TYPES:
        raise SystemExit(__doc__)
    cfg_path, tok_dir, type_name, out = sys.argv[1:]
    c = json.load(open(cfg_path))
    arch = {"qwen3": "qwen3", "qwen3_moe": "qwen3moe"}.get(c["model_type"])
    if arch is None:
        raise SystemExit(f"make_dummy_gguf: model_type {c['model_type']!r} not supported (qwen3, qwen3_moe)")
    tokens, types, merges = vocab(tok_dir, c["vocab_size"])
    w = gguf.GGUFWriter(out + ".part", arch)
    add_metadata(w, c, arch, type_name, tokens, types, merges)
    plan = tensor_plan(c, TYPES[type_name])
    sizes = []
    for name, shape, qt, _ in plan:
        nbytes = int(np.prod(shape[:-1], dtype=np.int64)) * row_bytes(qt, shape[-1])
        byte_shape = (*shape[:-1], row_bytes(qt, shape[-1]))
        w.add_tensor_info(name, byte_shape, np.dtype(np.uint8), nbytes, raw_dtype=qt)
        sizes.append(nbytes)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    f = w.fout[0]
    w.write_padding(f, f.tell())
    data_start = f.tell()
    align = w.data_alignment
    rng = np.random.default_rng(0)
    offset = 0
    for (name, shape, qt, fill), nbytes in zip(plan, sizes):
        if fill is not None:
            n = int(np.prod(shape, dtype=np.int64))
            if fill == "ones":
                data = np.ones(n, dtype=np.float32)
            elif fill == "router":
                data = (rng.standard_normal(n, dtype=np.float32) / np.float32(np.sqrt(shape[-1]))).astype(np.float32)
            else:  # embed: BF16
                data = bf16_random(rng, n, 1.0)
            assert data.nbytes == nbytes, name
            f.seek(data_start + offset)
            data.tofile(f)
        offset += (nbytes + align - 1) // align * align
    f.truncate(data_start + offset)  # the holes between the written tensors stay sparse
    f.close()
    os.replace(out + ".part", out)
    print(f"make_dummy_gguf: {out}: {arch} {type_name}, {len(plan)} tensors, "
          f"{(data_start + offset) / 1e9:.2f} GB logical")


if __name__ == "__main__":
    main()
