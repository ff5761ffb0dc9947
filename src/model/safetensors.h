/* safetensors.h — read-only access to one or more .safetensors files.
 *
 * A set is opened from a model directory: model.safetensors, or the shards
 * named by model.safetensors.index.json. Files are memory-mapped; tensor
 * data pointers stay valid until ns_safetensors_close.
 *
 * Invariants after open: every tensor's byte range lies inside its file's
 * data section, matches dtype x shape exactly (overflow-checked), and names
 * are unique across shards. Anything else is NS_ERR_FORMAT naming the file.
 */
#ifndef NS_SAFETENSORS_H
#define NS_SAFETENSORS_H

#include <stdint.h>

#include "backend/backend.h"
#include "util/file.h"
#include "util/status.h"

#define NS_ST_MAX_DIMS 4

typedef struct ns_st_tensor {
    char *name;
    ns_dtype dtype;
    int32_t n_dims;
    int64_t shape[NS_ST_MAX_DIMS];
    const void *data;  /* into the mapping */
    size_t n_bytes;
    int32_t file;      /* index into files */
    bool used;         /* set by the model loader to find unexpected tensors */
} ns_st_tensor;

typedef struct ns_safetensors {
    int32_t n_files;
    ns_mmap *files;
    char **file_names;
    int32_t n_tensors;
    ns_st_tensor *tensors;
    uint64_t header_hash; /* xxh64 of all headers and file sizes (fingerprint input) */
} ns_safetensors;

/* Opens dir's safetensors set. *out owned by caller (ns_safetensors_close). */
ns_status ns_safetensors_open_dir(const char *dir, ns_safetensors **out, ns_error *err);
void ns_safetensors_close(ns_safetensors *st);
ns_st_tensor *ns_safetensors_find(ns_safetensors *st, const char *name);
/* Weights identity: header hash plus sampled data bytes of every file. */
uint64_t ns_safetensors_fingerprint(const ns_safetensors *st);

#endif
