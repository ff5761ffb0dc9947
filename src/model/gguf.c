/* gguf.c — GGUF v2/v3 parser (see gguf.h for the invariants).
 *
 * All reads go through a bounded cursor (rd_*) that fails instead of
 * reading past the end, and every count read from the file is compared
 * with the bytes left before anything is allocated for it, so a header
 * claiming 2^63 tensors is an error, not a huge malloc.
 */
#include "model/gguf.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "util/file.h"

#define GGUF_MAGIC 0x46554747u /* "GGUF" little-endian */
#define GGUF_DEFAULT_ALIGN 32u
#define GGUF_MAX_ALIGN (1u << 20)
#define GGUF_MAX_DIMS 4u
#define GGUF_MAX_NAME 65536u   /* llama.cpp caps tensor names at 64; keys are short too */
#define GGUF_MAX_NEST 3        /* array-of-array depth we are willing to skip */

bool ns_ggml_type_layout(uint32_t type, int64_t *block_elems, int64_t *block_bytes) {
    int64_t be = 0, bb = 0;
    switch (type) {
    case NS_GGML_F32: be = 1, bb = 4; break;
    case NS_GGML_F16: be = 1, bb = 2; break;
    case NS_GGML_BF16: be = 1, bb = 2; break;
    case NS_GGML_Q4_0: be = 32, bb = 18; break;
    case NS_GGML_Q4_1: be = 32, bb = 20; break;
    case NS_GGML_Q5_0: be = 32, bb = 22; break;
    case NS_GGML_Q5_1: be = 32, bb = 24; break;
    case NS_GGML_Q8_0: be = 32, bb = 34; break;
    case NS_GGML_Q8_1: be = 32, bb = 36; break;
    case NS_GGML_Q2_K: be = 256, bb = 84; break;
    case NS_GGML_Q3_K: be = 256, bb = 110; break;
    case NS_GGML_Q4_K: be = 256, bb = 144; break;
    case NS_GGML_Q5_K: be = 256, bb = 176; break;
    case NS_GGML_Q6_K: be = 256, bb = 210; break;
    case NS_GGML_Q8_K: be = 256, bb = 292; break;
    default: return false;
    }
    if (block_elems) *block_elems = be;
    if (block_bytes) *block_bytes = bb;
    return true;
}

const char *ns_ggml_type_name(uint32_t type) {
    switch (type) {
    case NS_GGML_F32: return "F32";
    case NS_GGML_F16: return "F16";
    case NS_GGML_BF16: return "BF16";
    case NS_GGML_Q4_0: return "Q4_0";
    case NS_GGML_Q4_1: return "Q4_1";
    case NS_GGML_Q5_0: return "Q5_0";
    case NS_GGML_Q5_1: return "Q5_1";
    case NS_GGML_Q8_0: return "Q8_0";
    case NS_GGML_Q8_1: return "Q8_1";
    case NS_GGML_Q2_K: return "Q2_K";
    case NS_GGML_Q3_K: return "Q3_K";
    case NS_GGML_Q4_K: return "Q4_K";
    case NS_GGML_Q5_K: return "Q5_K";
    case NS_GGML_Q6_K: return "Q6_K";
    case NS_GGML_Q8_K: return "Q8_K";
    default: break;
    }
    static _Thread_local char buf[32];
    snprintf(buf, sizeof buf, "type %u", type);
    return buf;
}

/* ------------------------------------------------------------ cursor */

typedef struct {
    const uint8_t *p;
    size_t size, pos;
    const char *path;
    ns_error *err;
} rd;

static ns_status rd_need(rd *r, uint64_t n, const char *what) {
    if (n > r->size - r->pos)
        return ns_fail(r->err, NS_ERR_FORMAT, "%s: truncated: %s needs %llu bytes at offset %zu, file has %zu",
                       r->path, what, (unsigned long long)n, r->pos, r->size);
    return NS_OK;
}

static ns_status rd_u32(rd *r, uint32_t *v, const char *what) {
    if (rd_need(r, 4, what) != NS_OK) return NS_ERR_FORMAT;
    memcpy(v, r->p + r->pos, 4);
    r->pos += 4;
    return NS_OK;
}

static ns_status rd_u64(rd *r, uint64_t *v, const char *what) {
    if (rd_need(r, 8, what) != NS_OK) return NS_ERR_FORMAT;
    memcpy(v, r->p + r->pos, 8);
    r->pos += 8;
    return NS_OK;
}

/* A GGUF string: u64 length then bytes. *s points into the file. */
static ns_status rd_str(rd *r, const char **s, uint64_t *len, const char *what) {
    ns_status rc = rd_u64(r, len, what);
    if (rc != NS_OK) return rc;
    if (rd_need(r, *len, what) != NS_OK) return NS_ERR_FORMAT;
    *s = (const char *)(r->p + r->pos);
    r->pos += (size_t)*len;
    return NS_OK;
}

static size_t scalar_size(uint32_t t) {
    switch (t) {
    case NS_GGUF_U8: case NS_GGUF_I8: case NS_GGUF_BOOL: return 1;
    case NS_GGUF_U16: case NS_GGUF_I16: return 2;
    case NS_GGUF_U32: case NS_GGUF_I32: case NS_GGUF_F32: return 4;
    case NS_GGUF_U64: case NS_GGUF_I64: case NS_GGUF_F64: return 8;
    default: return 0;
    }
}

/* Skips an array body of n elements of type t (t may itself be an array,
 * up to GGUF_MAX_NEST deep). str_off (may be NULL) receives the offset of
 * each string element. */
static ns_status skip_array(rd *r, uint32_t t, uint64_t n, int depth, uint64_t *str_off, const char *key) {
    if (t >= NS_GGUF_N_TYPES)
        return ns_fail(r->err, NS_ERR_FORMAT, "%s: metadata \"%s\": unknown array element type %u", r->path, key, t);
    size_t es = scalar_size(t);
    if (es) {
        if (n > (r->size - r->pos) / es)
            return ns_fail(r->err, NS_ERR_FORMAT, "%s: metadata \"%s\": array of %llu elements runs past the end",
                           r->path, key, (unsigned long long)n);
        if (t == NS_GGUF_BOOL)
            for (uint64_t i = 0; i < n; i++)
                if (r->p[r->pos + i] > 1)
                    return ns_fail(r->err, NS_ERR_FORMAT, "%s: metadata \"%s\": bool element %llu is %u", r->path,
                                   key, (unsigned long long)i, r->p[r->pos + i]);
        r->pos += (size_t)(n * es);
        return NS_OK;
    }
    /* strings and arrays take at least 8 bytes (u64 length) / 12 each */
    if (n > (r->size - r->pos) / 8)
        return ns_fail(r->err, NS_ERR_FORMAT, "%s: metadata \"%s\": array of %llu elements runs past the end", r->path,
                       key, (unsigned long long)n);
    for (uint64_t i = 0; i < n; i++) {
        if (t == NS_GGUF_STRING) {
            if (str_off) str_off[i] = r->pos;
            const char *s;
            uint64_t len;
            if (rd_str(r, &s, &len, key) != NS_OK) return NS_ERR_FORMAT;
        } else {
            if (depth >= GGUF_MAX_NEST)
                return ns_fail(r->err, NS_ERR_FORMAT, "%s: metadata \"%s\": arrays nested too deep", r->path, key);
            uint32_t et;
            uint64_t en;
            if (rd_u32(r, &et, key) != NS_OK || rd_u64(r, &en, key) != NS_OK) return NS_ERR_FORMAT;
            ns_status rc = skip_array(r, et, en, depth + 1, NULL, key);
            if (rc != NS_OK) return rc;
        }
    }
    return NS_OK;
}

bool ns_gguf_printable(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] < 0x20 || s[i] == 0x7f) return false;
    return true;
}

/* -------------------------------------------------------------- parse */

/* Uniqueness of keys / tensor names: a small open-addressing hash set of
 * indices (the counts are bounded by the file size). */
typedef struct {
    uint64_t *slot; /* index + 1, 0 = empty */
    uint64_t cap;
} idxset;

static bool idxset_init(idxset *s, uint64_t n) {
    s->cap = 16;
    while (s->cap < n * 2) s->cap *= 2;
    s->slot = calloc((size_t)s->cap, sizeof *s->slot);
    return s->slot != NULL;
}

/* Inserts name i; false if an equal name is already there. */
static bool idxset_add(idxset *s, const char *const *names, const uint32_t *lens, size_t stride_n, size_t stride_l,
                       uint64_t i) {
    const char *nm = *(const char *const *)((const char *)names + i * stride_n);
    uint32_t ln = *(const uint32_t *)((const char *)lens + i * stride_l);
    uint64_t h = XXH64(nm, ln, 0) & (s->cap - 1);
    for (;;) {
        uint64_t v = s->slot[h];
        if (!v) {
            s->slot[h] = i + 1;
            return true;
        }
        const char *o = *(const char *const *)((const char *)names + (v - 1) * stride_n);
        uint32_t ol = *(const uint32_t *)((const char *)lens + (v - 1) * stride_l);
        if (ol == ln && memcmp(o, nm, ln) == 0) return false;
        h = (h + 1) & (s->cap - 1);
    }
}

static ns_status parse_kv(ns_gguf *g, rd *r) {
    /* each kv takes >= 8 (key len) + 4 (type) + 1 bytes */
    if (g->n_kv > (r->size - r->pos) / 13)
        return ns_fail(r->err, NS_ERR_FORMAT, "%s: header claims %llu metadata entries, more than the file can hold",
                       g->path, (unsigned long long)g->n_kv);
    g->kv = calloc((size_t)g->n_kv + 1, sizeof *g->kv);
    if (!g->kv) return ns_fail(r->err, NS_ERR_NOMEM, "out of memory");
    for (uint64_t i = 0; i < g->n_kv; i++) {
        ns_gguf_kv *kv = &g->kv[i];
        const char *key;
        uint64_t klen;
        if (rd_str(r, &key, &klen, "metadata key") != NS_OK) return NS_ERR_FORMAT;
        if (klen == 0 || klen > GGUF_MAX_NAME || !ns_gguf_printable(key, (size_t)klen))
            return ns_fail(r->err, NS_ERR_FORMAT, "%s: metadata entry %llu has an invalid key (length %llu)", g->path,
                           (unsigned long long)i, (unsigned long long)klen);
        kv->key = key;
        kv->key_len = (uint32_t)klen;
        char kbuf[128];
        snprintf(kbuf, sizeof kbuf, "%.*s", (int)(klen < 100 ? klen : 100), key);
        if (rd_u32(r, &kv->type, kbuf) != NS_OK) return NS_ERR_FORMAT;
        if (kv->type >= NS_GGUF_N_TYPES)
            return ns_fail(r->err, NS_ERR_FORMAT, "%s: metadata \"%s\" has unknown type %u", g->path, kbuf, kv->type);
        if (kv->type == NS_GGUF_STRING) {
            const char *s;
            if (rd_str(r, &s, &kv->str_len, kbuf) != NS_OK) return NS_ERR_FORMAT;
            kv->val = (const uint8_t *)s;
        } else if (kv->type == NS_GGUF_ARRAY) {
            if (rd_u32(r, &kv->arr_type, kbuf) != NS_OK || rd_u64(r, &kv->arr_n, kbuf) != NS_OK) return NS_ERR_FORMAT;
            kv->val = r->p + r->pos;
            if (kv->arr_type == NS_GGUF_STRING && kv->arr_n > 0) {
                if (kv->arr_n > (r->size - r->pos) / 8)
                    return ns_fail(r->err, NS_ERR_FORMAT, "%s: metadata \"%s\": array of %llu strings runs past the end",
                                   g->path, kbuf, (unsigned long long)kv->arr_n);
                kv->arr_str_off = malloc((size_t)kv->arr_n * sizeof *kv->arr_str_off);
                if (!kv->arr_str_off) return ns_fail(r->err, NS_ERR_NOMEM, "out of memory");
            }
            ns_status rc = skip_array(r, kv->arr_type, kv->arr_n, 0, kv->arr_str_off, kbuf);
            if (rc != NS_OK) return rc;
        } else {
            size_t es = scalar_size(kv->type);
            if (rd_need(r, es, kbuf) != NS_OK) return NS_ERR_FORMAT;
            kv->val = r->p + r->pos;
            if (kv->type == NS_GGUF_BOOL && kv->val[0] > 1)
                return ns_fail(r->err, NS_ERR_FORMAT, "%s: metadata \"%s\": bool value %u", g->path, kbuf, kv->val[0]);
            r->pos += es;
        }
    }
    idxset s;
    if (!idxset_init(&s, g->n_kv)) return ns_fail(r->err, NS_ERR_NOMEM, "out of memory");
    for (uint64_t i = 0; i < g->n_kv; i++)
        if (!idxset_add(&s, &g->kv[0].key, &g->kv[0].key_len, sizeof g->kv[0], sizeof g->kv[0], i)) {
            free(s.slot);
            return ns_fail(r->err, NS_ERR_FORMAT, "%s: metadata key \"%.*s\" appears twice", g->path,
                           (int)(g->kv[i].key_len < 100 ? g->kv[i].key_len : 100), g->kv[i].key);
        }
    free(s.slot);
    return NS_OK;
}

static ns_status parse_alignment(ns_gguf *g, ns_error *err) {
    g->alignment = GGUF_DEFAULT_ALIGN;
    const ns_gguf_kv *kv = ns_gguf_find(g, "general.alignment");
    if (!kv) return NS_OK;
    if (kv->type != NS_GGUF_U32)
        return ns_fail(err, NS_ERR_FORMAT, "%s: general.alignment must be a u32 (is type %u)", g->path, kv->type);
    uint32_t a;
    memcpy(&a, kv->val, 4);
    if (a == 0 || (a & (a - 1)) || a > GGUF_MAX_ALIGN)
        return ns_fail(err, NS_ERR_FORMAT, "%s: general.alignment %u is not a power of two <= %u", g->path, a,
                       GGUF_MAX_ALIGN);
    g->alignment = a;
    return NS_OK;
}

static ns_status parse_tensor_info(ns_gguf *g, rd *r, uint64_t i) {
    ns_gguf_tensor *t = &g->tensors[i];
    const char *name;
    uint64_t nlen;
    if (rd_str(r, &name, &nlen, "tensor name") != NS_OK) return NS_ERR_FORMAT;
    if (nlen == 0 || nlen > GGUF_MAX_NAME || !ns_gguf_printable(name, (size_t)nlen))
        return ns_fail(r->err, NS_ERR_FORMAT, "%s: tensor %llu has an invalid name (length %llu)", g->path,
                       (unsigned long long)i, (unsigned long long)nlen);
    t->name = name;
    t->name_len = (uint32_t)nlen;
    const int nl = (int)(nlen < 100 ? nlen : 100);
    if (rd_u32(r, &t->n_dims, "tensor dims") != NS_OK) return NS_ERR_FORMAT;
    if (t->n_dims == 0 || t->n_dims > GGUF_MAX_DIMS)
        return ns_fail(r->err, NS_ERR_FORMAT, "%s: tensor \"%.*s\" has %u dims (1..4 allowed)", g->path, nl, name,
                       t->n_dims);
    uint64_t n_elem = 1;
    for (uint32_t d = 0; d < 4; d++) t->ne[d] = 1;
    for (uint32_t d = 0; d < t->n_dims; d++) {
        uint64_t v;
        if (rd_u64(r, &v, "tensor dim") != NS_OK) return NS_ERR_FORMAT;
        if (v == 0 || v > (uint64_t)INT64_MAX / n_elem)
            return ns_fail(r->err, NS_ERR_FORMAT, "%s: tensor \"%.*s\": dim %u = %llu is zero or overflows", g->path,
                           nl, name, d, (unsigned long long)v);
        t->ne[d] = (int64_t)v;
        n_elem *= v;
    }
    if (rd_u32(r, &t->type, "tensor type") != NS_OK || rd_u64(r, &t->offset, "tensor offset") != NS_OK)
        return NS_ERR_FORMAT;
    int64_t be, bb;
    if (!ns_ggml_type_layout(t->type, &be, &bb))
        return ns_fail(r->err, NS_ERR_FORMAT, "%s: tensor \"%.*s\" has unknown ggml type %u", g->path, nl, name,
                       t->type);
    if (t->ne[0] % be != 0)
        return ns_fail(r->err, NS_ERR_FORMAT, "%s: tensor \"%.*s\": row length %lld is not a multiple of %s's block of %lld",
                       g->path, nl, name, (long long)t->ne[0], ns_ggml_type_name(t->type), (long long)be);
    uint64_t blocks = n_elem / (uint64_t)be;
    if (blocks > UINT64_MAX / (uint64_t)bb)
        return ns_fail(r->err, NS_ERR_FORMAT, "%s: tensor \"%.*s\" size overflows", g->path, nl, name);
    t->nbytes = blocks * (uint64_t)bb;
    return NS_OK;
}

static ns_status parse_tensors(ns_gguf *g, rd *r) {
    /* each tensor info takes >= 8 + 1 + 4 + 8 + 4 + 8 bytes */
    if (g->n_tensors > (r->size - r->pos) / 33)
        return ns_fail(r->err, NS_ERR_FORMAT, "%s: header claims %llu tensors, more than the file can hold", g->path,
                       (unsigned long long)g->n_tensors);
    g->tensors = calloc((size_t)g->n_tensors + 1, sizeof *g->tensors);
    if (!g->tensors) return ns_fail(r->err, NS_ERR_NOMEM, "out of memory");
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        ns_status rc = parse_tensor_info(g, r, i);
        if (rc != NS_OK) return rc;
    }
    /* Data section: header end rounded up to the alignment. */
    uint64_t a = g->alignment, end = r->pos;
    uint64_t data = (end + a - 1) / a * a;
    /* A file without tensors (a vocabulary-only GGUF) needs no padding. */
    if (data > r->size && g->n_tensors == 0) data = r->size;
    if (data > r->size)
        return ns_fail(r->err, NS_ERR_FORMAT, "%s: truncated: data section would start at %llu, file has %zu bytes",
                       g->path, (unsigned long long)data, r->size);
    g->data_off = data;
    const uint64_t avail = r->size - data;
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        ns_gguf_tensor *t = &g->tensors[i];
        const int nl = (int)(t->name_len < 100 ? t->name_len : 100);
        if (t->offset % a != 0)
            return ns_fail(r->err, NS_ERR_FORMAT, "%s: tensor \"%.*s\": offset %llu is not a multiple of the alignment %u",
                           g->path, nl, t->name, (unsigned long long)t->offset, g->alignment);
        if (t->offset > avail || t->nbytes > avail - t->offset)
            return ns_fail(r->err, NS_ERR_FORMAT,
                           "%s: tensor \"%.*s\": data [%llu, +%llu) lies outside the data section (%llu bytes)", g->path,
                           nl, t->name, (unsigned long long)t->offset, (unsigned long long)t->nbytes,
                           (unsigned long long)avail);
        t->data = g->base + data + t->offset;
    }
    idxset s;
    if (!idxset_init(&s, g->n_tensors)) return ns_fail(r->err, NS_ERR_NOMEM, "out of memory");
    for (uint64_t i = 0; i < g->n_tensors; i++)
        if (!idxset_add(&s, &g->tensors[0].name, &g->tensors[0].name_len, sizeof g->tensors[0], sizeof g->tensors[0],
                        i)) {
            free(s.slot);
            return ns_fail(r->err, NS_ERR_FORMAT, "%s: tensor \"%.*s\" appears twice", g->path,
                           (int)(g->tensors[i].name_len < 100 ? g->tensors[i].name_len : 100), g->tensors[i].name);
        }
    free(s.slot);
    return NS_OK;
}

static ns_status parse(ns_gguf *g, ns_error *err) {
    rd r = {g->base, g->size, 0, g->path, err};
    uint32_t magic;
    if (g->size < 24)
        return ns_fail(err, NS_ERR_FORMAT, "%s: %zu bytes is too short for a GGUF header", g->path, g->size);
    rd_u32(&r, &magic, "magic");
    if (magic != GGUF_MAGIC) return ns_fail(err, NS_ERR_FORMAT, "%s: not a GGUF file (bad magic)", g->path);
    rd_u32(&r, &g->version, "version");
    if (g->version != 2 && g->version != 3)
        return ns_fail(err, NS_ERR_UNSUPPORTED, "%s: GGUF version %u is not supported (2 and 3 are)", g->path,
                       g->version);
    rd_u64(&r, &g->n_tensors, "tensor count");
    if (rd_u64(&r, &g->n_kv, "metadata count") != NS_OK) return NS_ERR_FORMAT;
    ns_status rc = parse_kv(g, &r);
    if (rc == NS_OK) rc = parse_alignment(g, err);
    if (rc == NS_OK) rc = parse_tensors(g, &r);
    return rc;
}

static ns_status open_common(ns_gguf *g, ns_gguf **out, ns_error *err) {
    ns_status rc = parse(g, err);
    if (rc != NS_OK) {
        ns_gguf_close(g);
        return rc;
    }
    *out = g;
    return NS_OK;
}

ns_status ns_gguf_open_mem(const void *buf, size_t len, ns_gguf **out, ns_error *err) {
    *out = NULL;
    ns_gguf *g = calloc(1, sizeof *g);
    if (!g) return ns_fail(err, NS_ERR_NOMEM, "out of memory");
    g->base = buf;
    g->size = len;
    g->path = strdup("<memory>");
    if (!g->path) {
        free(g);
        return ns_fail(err, NS_ERR_NOMEM, "out of memory");
    }
    return open_common(g, out, err);
}

ns_status ns_gguf_open(const char *path, ns_gguf **out, ns_error *err) {
    *out = NULL;
    ns_gguf *g = calloc(1, sizeof *g);
    if (!g) return ns_fail(err, NS_ERR_NOMEM, "out of memory");
    g->path = strdup(path);
    if (!g->path) {
        free(g);
        return ns_fail(err, NS_ERR_NOMEM, "out of memory");
    }
    ns_mmap m = {0};
    ns_status rc = ns_mmap_open(path, &m, err);
    if (rc != NS_OK) {
        ns_gguf_close(g);
        return rc;
    }
    g->map = m.data;
    g->map_len = m.size;
    g->base = m.data;
    g->size = m.size;
    return open_common(g, out, err);
}

void ns_gguf_close(ns_gguf *g) {
    if (!g) return;
    if (g->kv)
        for (uint64_t i = 0; i < g->n_kv; i++) free(g->kv[i].arr_str_off);
    free(g->kv);
    free(g->tensors);
    if (g->map) {
        ns_mmap m = {g->map, g->map_len};
        ns_mmap_close(&m);
    }
    free(g->path);
    free(g);
}

/* ------------------------------------------------------------- lookup */

const ns_gguf_kv *ns_gguf_find(const ns_gguf *g, const char *key) {
    size_t kl = strlen(key);
    for (uint64_t i = 0; i < g->n_kv; i++)
        if (g->kv[i].key_len == kl && memcmp(g->kv[i].key, key, kl) == 0) return &g->kv[i];
    return NULL;
}

const ns_gguf_tensor *ns_gguf_find_tensor(const ns_gguf *g, const char *name) {
    size_t nl = strlen(name);
    for (uint64_t i = 0; i < g->n_tensors; i++)
        if (g->tensors[i].name_len == nl && memcmp(g->tensors[i].name, name, nl) == 0) return &g->tensors[i];
    return NULL;
}

/* Integer value of a scalar of integer type t at p; false for non-integers
 * and for u64 values above INT64_MAX. */
static bool int_at(uint32_t t, const uint8_t *p, int64_t *v) {
    switch (t) {
    case NS_GGUF_U8: *v = p[0]; return true;
    case NS_GGUF_I8: *v = (int8_t)p[0]; return true;
    case NS_GGUF_BOOL: *v = p[0]; return true;
    case NS_GGUF_U16: { uint16_t x; memcpy(&x, p, 2); *v = x; return true; }
    case NS_GGUF_I16: { int16_t x; memcpy(&x, p, 2); *v = x; return true; }
    case NS_GGUF_U32: { uint32_t x; memcpy(&x, p, 4); *v = x; return true; }
    case NS_GGUF_I32: { int32_t x; memcpy(&x, p, 4); *v = x; return true; }
    case NS_GGUF_I64: { int64_t x; memcpy(&x, p, 8); *v = x; return true; }
    case NS_GGUF_U64: {
        uint64_t x;
        memcpy(&x, p, 8);
        if (x > (uint64_t)INT64_MAX) return false;
        *v = (int64_t)x;
        return true;
    }
    default: return false;
    }
}

static bool f64_at(uint32_t t, const uint8_t *p, double *v) {
    if (t == NS_GGUF_F32) {
        float f;
        memcpy(&f, p, 4);
        *v = f;
        return true;
    }
    if (t == NS_GGUF_F64) {
        memcpy(v, p, 8);
        return true;
    }
    int64_t i;
    if (t != NS_GGUF_BOOL && int_at(t, p, &i)) {
        *v = (double)i;
        return true;
    }
    return false;
}

ns_status ns_gguf_get_i64(const ns_gguf *g, const char *key, int64_t *v, bool *found, ns_error *err) {
    const ns_gguf_kv *kv = ns_gguf_find(g, key);
    if (found) *found = kv != NULL;
    if (!kv) return NS_OK;
    if (kv->type == NS_GGUF_BOOL || !int_at(kv->type, kv->val, v))
        return ns_fail(err, NS_ERR_FORMAT, "%s: metadata \"%s\" must be an integer (type %u)", g->path, key, kv->type);
    return NS_OK;
}

ns_status ns_gguf_get_f64(const ns_gguf *g, const char *key, double *v, bool *found, ns_error *err) {
    const ns_gguf_kv *kv = ns_gguf_find(g, key);
    if (found) *found = kv != NULL;
    if (!kv) return NS_OK;
    if (!f64_at(kv->type, kv->val, v) || !isfinite(*v))
        return ns_fail(err, NS_ERR_FORMAT, "%s: metadata \"%s\" must be a finite number (type %u)", g->path, key,
                       kv->type);
    return NS_OK;
}

ns_status ns_gguf_get_bool(const ns_gguf *g, const char *key, bool *v, bool *found, ns_error *err) {
    const ns_gguf_kv *kv = ns_gguf_find(g, key);
    if (found) *found = kv != NULL;
    if (!kv) return NS_OK;
    if (kv->type != NS_GGUF_BOOL)
        return ns_fail(err, NS_ERR_FORMAT, "%s: metadata \"%s\" must be a bool (type %u)", g->path, key, kv->type);
    *v = kv->val[0] != 0;
    return NS_OK;
}

ns_status ns_gguf_get_str_dup(const ns_gguf *g, const char *key, char **v, ns_error *err) {
    *v = NULL;
    const ns_gguf_kv *kv = ns_gguf_find(g, key);
    if (!kv) return NS_OK;
    if (kv->type != NS_GGUF_STRING)
        return ns_fail(err, NS_ERR_FORMAT, "%s: metadata \"%s\" must be a string (type %u)", g->path, key, kv->type);
    if (memchr(kv->val, 0, (size_t)kv->str_len))
        return ns_fail(err, NS_ERR_FORMAT, "%s: metadata \"%s\" holds a NUL byte", g->path, key);
    char *s = malloc((size_t)kv->str_len + 1);
    if (!s) return ns_fail(err, NS_ERR_NOMEM, "out of memory");
    memcpy(s, kv->val, (size_t)kv->str_len);
    s[kv->str_len] = 0;
    *v = s;
    return NS_OK;
}

const char *ns_gguf_arr_str(const ns_gguf *g, const ns_gguf_kv *kv, uint64_t i, uint64_t *len) {
    if (kv->type != NS_GGUF_ARRAY || kv->arr_type != NS_GGUF_STRING || i >= kv->arr_n || !kv->arr_str_off) return NULL;
    uint64_t off = kv->arr_str_off[i];
    memcpy(len, g->base + off, 8); /* validated by skip_array */
    return (const char *)(g->base + off + 8);
}

double ns_gguf_arr_f64(const ns_gguf_kv *kv, uint64_t i) {
    if (kv->type != NS_GGUF_ARRAY || i >= kv->arr_n) return 0;
    size_t es = scalar_size(kv->arr_type);
    double v;
    if (!es || !f64_at(kv->arr_type, kv->val + i * es, &v)) return 0;
    return v;
}

int64_t ns_gguf_arr_i64(const ns_gguf_kv *kv, uint64_t i) {
    if (kv->type != NS_GGUF_ARRAY || i >= kv->arr_n) return 0;
    size_t es = scalar_size(kv->arr_type);
    int64_t v;
    if (!es || !int_at(kv->arr_type, kv->val + i * es, &v)) return 0;
    return v;
}
