/* gguf.h — reader for GGUF files (versions 2 and 3), memory-mapped.
 *
 * A GGUF file is: magic "GGUF", version, tensor count, metadata count,
 * the metadata key/value pairs (typed: integers, floats, bool, strings,
 * arrays of any of these), the tensor infos (name, dims, ggml type,
 * offset relative to the data section), padding to general.alignment
 * (default 32), then the tensor data.
 *
 * Invariants after a successful open (every one is checked against the
 * file, so a corrupt or hostile file is an NS_ERR_FORMAT error with a
 * message naming what is wrong, never a crash or an out-of-bounds read):
 *  - every string, array and tensor lies inside the file; every count,
 *    length, product and offset has been overflow-checked before use;
 *  - metadata keys and tensor names are unique, non-empty and free of
 *    control bytes (so messages that quote them cannot forge log lines);
 *  - every tensor has 1..4 dims, each >= 1, a known ggml type, a first
 *    dim that is a multiple of the type's block size, an offset that is a
 *    multiple of the alignment, and nbytes = elements / block * block
 *    bytes inside the data section;
 *  - general.alignment, if present, is a u32 power of two (<= 1 MiB).
 * Nested arrays (array of arrays) are accepted and skipped, but their
 * values cannot be read (no architecture needs them).
 *
 * Ownership: an ns_gguf owns its mapping (or borrows the caller's buffer
 * for ns_gguf_open_mem) and every pointer it hands out (strings are NOT
 * NUL-terminated: use the (ptr, len) pairs or ns_gguf_get_str_dup).
 * Thread safety: immutable after open; readers may share it.
 */
#ifndef NS_GGUF_H
#define NS_GGUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "util/status.h"

/* Metadata value types (the GGUF spec's numbering). */
typedef enum {
    NS_GGUF_U8 = 0,
    NS_GGUF_I8 = 1,
    NS_GGUF_U16 = 2,
    NS_GGUF_I16 = 3,
    NS_GGUF_U32 = 4,
    NS_GGUF_I32 = 5,
    NS_GGUF_F32 = 6,
    NS_GGUF_BOOL = 7,
    NS_GGUF_STRING = 8,
    NS_GGUF_ARRAY = 9,
    NS_GGUF_U64 = 10,
    NS_GGUF_I64 = 11,
    NS_GGUF_F64 = 12,
    NS_GGUF_N_TYPES
} ns_gguf_type;

/* ggml tensor types we know the block layout of (ggml's numbering). */
typedef enum {
    NS_GGML_F32 = 0,
    NS_GGML_F16 = 1,
    NS_GGML_Q4_0 = 2,
    NS_GGML_Q4_1 = 3,
    NS_GGML_Q5_0 = 6,
    NS_GGML_Q5_1 = 7,
    NS_GGML_Q8_0 = 8,
    NS_GGML_Q8_1 = 9,
    NS_GGML_Q2_K = 10,
    NS_GGML_Q3_K = 11,
    NS_GGML_Q4_K = 12,
    NS_GGML_Q5_K = 13,
    NS_GGML_Q6_K = 14,
    NS_GGML_Q8_K = 15,
    NS_GGML_BF16 = 30
} ns_ggml_type;

/* Block size (elements) and bytes per block of a ggml type; false if the
 * type is unknown to us. */
bool ns_ggml_type_layout(uint32_t type, int64_t *block_elems, int64_t *block_bytes);
/* "F32", "Q4_K", ... or "type N" for unknown ones (static storage for
 * known types; unknown ones use a thread-local buffer). */
const char *ns_ggml_type_name(uint32_t type);

typedef struct ns_gguf_kv {
    const char *key;      /* into the file; key_len bytes */
    uint32_t key_len;
    uint32_t type;        /* ns_gguf_type */
    /* scalars and strings: the value's bytes (a string's bytes after its
     * u64 length). Arrays: the first element. */
    const uint8_t *val;
    uint64_t str_len;     /* STRING only */
    uint32_t arr_type;    /* ARRAY only: element type */
    uint64_t arr_n;       /* ARRAY only: element count */
    /* ARRAY of STRING: offsets (into the file) of each element's length
     * prefix, so element i is O(1). Owned by the ns_gguf. */
    uint64_t *arr_str_off;
} ns_gguf_kv;

typedef struct ns_gguf_tensor {
    const char *name; /* into the file; name_len bytes */
    uint32_t name_len;
    uint32_t n_dims;
    int64_t ne[4];    /* ggml order: ne[0] is the contiguous (row) dim */
    uint32_t type;    /* ns_ggml_type */
    uint64_t offset;  /* relative to the data section */
    uint64_t nbytes;
    const uint8_t *data;
} ns_gguf_tensor;

typedef struct ns_gguf {
    uint32_t version;
    uint32_t alignment;
    uint64_t n_kv, n_tensors;
    ns_gguf_kv *kv;
    ns_gguf_tensor *tensors;
    const uint8_t *base; /* whole file */
    size_t size;
    uint64_t data_off;   /* start of the data section */
    void *map;           /* mmap to release (NULL for _mem) */
    size_t map_len;
    char *path;          /* for messages ("<memory>" for _mem) */
} ns_gguf;

/* Opens and validates path (mmapped read-only). *out owned by the caller
 * (ns_gguf_close). Errors: NS_ERR_IO, NS_ERR_FORMAT, NS_ERR_UNSUPPORTED
 * (a version other than 2/3), NS_ERR_NOMEM. */
ns_status ns_gguf_open(const char *path, ns_gguf **out, ns_error *err);
/* Same over a caller-owned buffer that must outlive *out (fuzzing, tests). */
ns_status ns_gguf_open_mem(const void *buf, size_t len, ns_gguf **out, ns_error *err);
void ns_gguf_close(ns_gguf *g);

/* True when s[0..n) has no control bytes (< 0x20, 0x7f): safe to quote in
 * a message or log line. */
bool ns_gguf_printable(const char *s, size_t n);

/* Lookup by exact key; NULL if absent. */
const ns_gguf_kv *ns_gguf_find(const ns_gguf *g, const char *key);
const ns_gguf_tensor *ns_gguf_find_tensor(const ns_gguf *g, const char *name);

/* Typed getters. NS_ERR_FORMAT if the key exists with an incompatible
 * type or an out-of-range value; NS_ERR_RANGE-free: missing keys leave
 * *v untouched and return NS_OK with *found false (found may be NULL).
 * Any integer type converts to int64 (u64 above INT64_MAX fails); f32
 * and f64 convert to double; integers do not convert to floats except
 * through get_f64. */
ns_status ns_gguf_get_i64(const ns_gguf *g, const char *key, int64_t *v, bool *found, ns_error *err);
ns_status ns_gguf_get_f64(const ns_gguf *g, const char *key, double *v, bool *found, ns_error *err);
ns_status ns_gguf_get_bool(const ns_gguf *g, const char *key, bool *v, bool *found, ns_error *err);
/* *v is a malloc'd NUL-terminated copy owned by the caller (NULL if
 * missing). A string holding a NUL byte is NS_ERR_FORMAT. */
ns_status ns_gguf_get_str_dup(const ns_gguf *g, const char *key, char **v, ns_error *err);

/* Array element access (kv must be an ARRAY; i < arr_n, else 0/NULL). */
/* Element i of a string array: pointer into the file, *len its length. */
const char *ns_gguf_arr_str(const ns_gguf *g, const ns_gguf_kv *kv, uint64_t i, uint64_t *len);
/* Element i of a numeric array as double / int64 (0 for other types). */
double ns_gguf_arr_f64(const ns_gguf_kv *kv, uint64_t i);
int64_t ns_gguf_arr_i64(const ns_gguf_kv *kv, uint64_t i);

#endif
