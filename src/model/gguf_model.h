/* gguf_model.h — a model from GGUF file(s): hyper-parameters from the
 * metadata, tensors bound by GGUF names onto ns_model.
 *
 * Accepted paths: a .gguf file (or any file starting with the GGUF magic); the first shard of a split model
 * (NAME-00001-of-0000N.gguf, the other shards beside it); or a directory
 * without config.json that holds exactly one model (one .gguf, or the
 * shards of one). Architectures (general.architecture): llama, qwen2 (q/k/v
 * biases), qwen3 (q/k norms) and qwen3moe (every layer a softmax-routed
 * mixture of experts, top-k weights renormalized, as llama.cpp runs it).
 *
 * Weights: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K, used in place
 * from the memory map where the backend allows (the CPU backend computes
 * on quantized blocks; other backends refuse quantized weights with
 * NS_ERR_UNSUPPORTED). Norm vectors must be F32/F16/BF16.
 *
 * llama: GGUF converters permute the rows of attn_q / attn_k within each
 * head so that llama.cpp can rotate adjacent pairs; our forward rotates
 * the two halves of a head (Hugging Face layout), so those two matrices
 * are un-permuted into a copy owned by the model (whole quantized rows
 * move; no values change).
 *
 * Invariants after load: as model.h's, plus every tensor of the file(s)
 * was used (a tensor left over means an unsupported variant), and the
 * fingerprint covers the file headers (tensor types = the quantization),
 * sizes and sampled data, so KV pages never cross weight formats.
 */
#ifndef NS_GGUF_MODEL_H
#define NS_GGUF_MODEL_H

#include <stdbool.h>

#include "model/gguf.h"
#include "model/model.h"

#define NS_GGUF_MAX_SHARDS 256

/* Shards of one model, in order; files[0] holds the metadata. */
typedef struct ns_gguf_set {
    int n;
    ns_gguf **files;
} ns_gguf_set;

/* If path names a GGUF model (see above), *gguf_path receives the first
 * file's path (malloc'd, caller frees) and true is returned; false (and
 * NULL) otherwise. Errors only for an ambiguous directory (NS_ERR_INVALID:
 * several models) or out of memory; check err->status when false. */
bool ns_gguf_model_path(const char *path, char **gguf_path, ns_error *err);

/* Opens the file and, for a split model, its sibling shards (checking
 * split.count / split.no / split.tensors.count). *out owned by the caller
 * (ns_gguf_set_close). */
ns_status ns_gguf_set_open(const char *first, ns_gguf_set **out, ns_error *err);
void ns_gguf_set_close(ns_gguf_set *s);
const ns_gguf_tensor *ns_gguf_set_find(const ns_gguf_set *s, const char *name);

/* Hyper-parameters from the metadata (range-checked like config.json). */
ns_status ns_gguf_config(const ns_gguf *g, ns_model_config *cfg, ns_error *err);

/* ns_model_load / ns_model_validate_dir for GGUF paths (model.c
 * dispatches here). The loaded model owns the set (m->gguf). */
ns_status ns_gguf_model_load(const char *path, ns_backend *be, ns_model **out, ns_error *err);
ns_status ns_gguf_model_validate(const char *path, ns_model_config *cfg, ns_error *err);
/* Releases what ns_gguf_model_load attached to a model (ns_model_free). */
void ns_gguf_model_release(struct ns_gguf_model *gm);

#endif
