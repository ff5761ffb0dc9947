#include "model/safetensors.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>
#include <xxhash.h>

#include "util/log.h"

/* A safetensors header is JSON; real ones are at most a few MB. The cap
 * stops a corrupt length field from making us parse gigabytes. */
#define ST_MAX_HEADER (256u << 20)
#define ST_MAX_FILES 4096
#define ST_MAX_TENSORS (1 << 20)

static int parse_dtype(const char *s, ns_dtype *dt) {
    if (strcmp(s, "F32") == 0) *dt = NS_DT_F32;
    else if (strcmp(s, "BF16") == 0) *dt = NS_DT_BF16;
    else if (strcmp(s, "F16") == 0) *dt = NS_DT_F16;
    else return -1;
    return 0;
}

typedef struct st_range {
    size_t begin, end; /* [begin, end) in the data section */
    int32_t idx;       /* into st->tensors */
} st_range;

static int cmp_range(const void *a, const void *b) {
    const st_range *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    return (x->end > y->end) - (x->end < y->end);
}

/* Tensors [first, st->n_tensors) of one file must not share data bytes: a
 * header whose data_offsets overlap is corrupt (or crafted), and loading
 * it would alias weights silently. Empty tensors overlap nothing. */
static ns_status check_overlap(const ns_safetensors *st, int32_t first, const uint8_t *data, const char *path,
                               ns_error *err) {
    const int32_t n = st->n_tensors - first;
    if (n < 2) return NS_OK;
    st_range *r = malloc((size_t)n * sizeof *r);
    if (!r) return ns_fail(err, NS_ERR_NOMEM, "out of memory");
    int32_t m = 0;
    for (int32_t i = first; i < st->n_tensors; i++) {
        const ns_st_tensor *t = &st->tensors[i];
        if (!t->n_bytes) continue;
        size_t b = (size_t)((const uint8_t *)t->data - data);
        r[m++] = (st_range){b, b + t->n_bytes, i};
    }
    qsort(r, (size_t)m, sizeof *r, cmp_range);
    ns_status rc = NS_OK;
    int32_t far = -1; /* the range reaching furthest so far */
    for (int32_t i = 0; i < m && rc == NS_OK; i++) {
        if (far >= 0 && r[i].begin < r[far].end)
            rc = ns_fail(err, NS_ERR_FORMAT,
                         "%s: tensors \"%s\" (data_offsets [%zu, %zu]) and \"%s\" ([%zu, %zu]) overlap", path,
                         st->tensors[r[far].idx].name, r[far].begin, r[far].end, st->tensors[r[i].idx].name,
                         r[i].begin, r[i].end);
        if (far < 0 || r[i].end > r[far].end) far = i;
    }
    free(r);
    return rc;
}

static ns_status parse_file(ns_safetensors *st, int32_t fi, const char *path, XXH64_state_t *hs, ns_error *err) {
    const ns_mmap *m = &st->files[fi];
    const uint8_t *base = m->data;
    if (m->size < 8) return ns_fail(err, NS_ERR_FORMAT, "%s: truncated (no header length)", path);
    uint64_t hlen = 0;
    for (int i = 0; i < 8; i++) hlen |= (uint64_t)base[i] << (8 * i);
    if (hlen == 0 || hlen > ST_MAX_HEADER || hlen > m->size - 8)
        return ns_fail(err, NS_ERR_FORMAT, "%s: corrupt header length %llu (file is %zu bytes)", path,
                       (unsigned long long)hlen, m->size);
    XXH64_update(hs, base, 8 + hlen);
    uint64_t fsize = m->size;
    XXH64_update(hs, &fsize, sizeof fsize);
    const size_t data_off = 8 + (size_t)hlen;
    const size_t data_size = m->size - data_off;
    json_error_t je;
    json_t *h = json_loadb((const char *)base + 8, (size_t)hlen, 0, &je);
    if (!h) return ns_fail(err, NS_ERR_FORMAT, "%s: header is not valid JSON: %s", path, je.text);
    ns_status rc = NS_OK;
    if (!json_is_object(h)) {
        rc = ns_fail(err, NS_ERR_FORMAT, "%s: header is not a JSON object", path);
        goto done;
    }
    size_t n_new = json_object_size(h);
    if (n_new > ST_MAX_TENSORS || (size_t)st->n_tensors + n_new > ST_MAX_TENSORS) {
        rc = ns_fail(err, NS_ERR_FORMAT, "%s: too many tensors", path);
        goto done;
    }
    ns_st_tensor *nt = realloc(st->tensors, ((size_t)st->n_tensors + n_new) * sizeof *nt);
    if (!nt) {
        rc = ns_fail(err, NS_ERR_NOMEM, "out of memory");
        goto done;
    }
    st->tensors = nt;
    const int32_t first = st->n_tensors;
    const char *key;
    json_t *v;
    json_object_foreach(h, key, v) {
        if (strcmp(key, "__metadata__") == 0) continue;
        json_t *jd = json_object_get(v, "dtype"), *js = json_object_get(v, "shape"),
               *jo = json_object_get(v, "data_offsets");
        if (!json_is_object(v) || !json_is_string(jd) || !json_is_array(js) || !json_is_array(jo) ||
            json_array_size(jo) != 2) {
            rc = ns_fail(err, NS_ERR_FORMAT, "%s: tensor \"%s\" has a malformed header entry", path, key);
            goto done;
        }
        ns_st_tensor t = {0};
        if (parse_dtype(json_string_value(jd), &t.dtype) != 0) {
            rc = ns_fail(err, NS_ERR_UNSUPPORTED, "%s: tensor \"%s\" has unsupported dtype %s (F32, BF16, F16 only)",
                         path, key, json_string_value(jd));
            goto done;
        }
        size_t nd = json_array_size(js);
        if (nd > NS_ST_MAX_DIMS) {
            rc = ns_fail(err, NS_ERR_UNSUPPORTED, "%s: tensor \"%s\" has %zu dimensions", path, key, nd);
            goto done;
        }
        t.n_dims = (int32_t)nd;
        uint64_t numel = 1;
        for (size_t i = 0; i < nd; i++) {
            json_t *d = json_array_get(js, i);
            if (!json_is_integer(d) || json_integer_value(d) < 0 || json_integer_value(d) > ((json_int_t)1 << 40)) {
                rc = ns_fail(err, NS_ERR_FORMAT, "%s: tensor \"%s\" has a bad shape", path, key);
                goto done;
            }
            t.shape[i] = (int64_t)json_integer_value(d);
            if (t.shape[i] && numel > UINT64_MAX / (uint64_t)t.shape[i]) {
                rc = ns_fail(err, NS_ERR_FORMAT, "%s: tensor \"%s\" shape overflows", path, key);
                goto done;
            }
            numel *= (uint64_t)t.shape[i];
        }
        json_t *b0 = json_array_get(jo, 0), *b1 = json_array_get(jo, 1);
        if (!json_is_integer(b0) || !json_is_integer(b1) || json_integer_value(b0) < 0 ||
            json_integer_value(b1) < json_integer_value(b0)) {
            rc = ns_fail(err, NS_ERR_FORMAT, "%s: tensor \"%s\" has bad data_offsets", path, key);
            goto done;
        }
        uint64_t begin = (uint64_t)json_integer_value(b0), end = (uint64_t)json_integer_value(b1);
        uint64_t esz = ns_dtype_size(t.dtype);
        if (numel > UINT64_MAX / esz || numel * esz != end - begin) {
            rc = ns_fail(err, NS_ERR_FORMAT, "%s: tensor \"%s\": data size %llu does not match its shape and dtype",
                         path, key, (unsigned long long)(end - begin));
            goto done;
        }
        if (end > data_size) {
            rc = ns_fail(err, NS_ERR_FORMAT, "%s: tensor \"%s\" extends past the end of the file (truncated?)", path,
                         key);
            goto done;
        }
        for (int32_t i = 0; i < st->n_tensors; i++)
            if (strcmp(st->tensors[i].name, key) == 0) {
                rc = ns_fail(err, NS_ERR_FORMAT, "%s: tensor \"%s\" appears twice", path, key);
                goto done;
            }
        t.name = strdup(key);
        if (!t.name) {
            rc = ns_fail(err, NS_ERR_NOMEM, "out of memory");
            goto done;
        }
        t.data = base + data_off + begin;
        t.n_bytes = (size_t)(end - begin);
        t.file = fi;
        st->tensors[st->n_tensors++] = t;
    }
    rc = check_overlap(st, first, base + data_off, path, err);
done:
    json_decref(h);
    return rc;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* Collects the distinct shard names of an index file, sorted. */
static ns_status read_index(const char *dir, const char *ipath, char ***names_out, int32_t *n_out, ns_error *err) {
    char *text = NULL;
    json_t *j = NULL;
    char **names = NULL;
    int32_t n = 0;
    ns_status rc = ns_file_read(ipath, 64u << 20, &text, NULL, err);
    if (rc != NS_OK) return rc;
    json_error_t je;
    j = json_loads(text, 0, &je);
    json_t *wm = j ? json_object_get(j, "weight_map") : NULL;
    if (!json_is_object(wm)) {
        rc = ns_fail(err, NS_ERR_FORMAT, "%s: missing or malformed weight_map", ipath);
        goto done;
    }
    names = calloc(json_object_size(wm) + 1, sizeof *names);
    if (!names) {
        rc = ns_fail(err, NS_ERR_NOMEM, "out of memory");
        goto done;
    }
    const char *key;
    json_t *v;
    json_object_foreach(wm, key, v) {
        const char *f = json_string_value(v);
        if (!f || strchr(f, '/') || strcmp(f, "..") == 0) {
            rc = ns_fail(err, NS_ERR_FORMAT, "%s: bad shard name for \"%s\"", ipath, key);
            goto done;
        }
        int dup = 0;
        for (int32_t i = 0; i < n; i++) dup |= strcmp(names[i], f) == 0;
        if (dup) continue;
        if (n >= ST_MAX_FILES) {
            rc = ns_fail(err, NS_ERR_FORMAT, "%s: too many shards", ipath);
            goto done;
        }
        names[n] = strdup(f);
        if (!names[n]) {
            rc = ns_fail(err, NS_ERR_NOMEM, "out of memory");
            goto done;
        }
        n++;
    }
    qsort(names, (size_t)n, sizeof *names, cmp_str);
    *names_out = names;
    *n_out = n;
    names = NULL;
done:
    if (names) {
        for (int32_t i = 0; i < n; i++) free(names[i]);
        free(names);
    }
    (void)dir;
    json_decref(j);
    free(text);
    return rc;
}

ns_status ns_safetensors_open_dir(const char *dir, ns_safetensors **out, ns_error *err) {
    *out = NULL;
    ns_safetensors *st = calloc(1, sizeof *st);
    char *single = ns_path_join(dir, "model.safetensors");
    char *index = ns_path_join(dir, "model.safetensors.index.json");
    char *path = NULL;
    XXH64_state_t *hs = XXH64_createState();
    ns_status rc = NS_OK;
    if (!st || !single || !index || !hs) {
        rc = ns_fail(err, NS_ERR_NOMEM, "out of memory");
        goto fail;
    }
    XXH64_reset(hs, 0x6e73);
    if (ns_file_exists(single)) {
        st->file_names = calloc(1, sizeof(char *));
        if (!st->file_names || !(st->file_names[0] = strdup("model.safetensors"))) {
            rc = ns_fail(err, NS_ERR_NOMEM, "out of memory");
            goto fail;
        }
        st->n_files = 1;
    } else if (ns_file_exists(index)) {
        rc = read_index(dir, index, &st->file_names, &st->n_files, err);
        if (rc != NS_OK) goto fail;
        if (st->n_files == 0) {
            rc = ns_fail(err, NS_ERR_FORMAT, "%s: weight_map is empty", index);
            goto fail;
        }
    } else {
        rc = ns_fail(err, NS_ERR_IO, "%s: no model.safetensors or model.safetensors.index.json", dir);
        goto fail;
    }
    st->files = calloc((size_t)st->n_files, sizeof *st->files);
    if (!st->files) {
        rc = ns_fail(err, NS_ERR_NOMEM, "out of memory");
        goto fail;
    }
    for (int32_t i = 0; i < st->n_files; i++) {
        free(path);
        path = ns_path_join(dir, st->file_names[i]);
        if (!path) {
            rc = ns_fail(err, NS_ERR_NOMEM, "out of memory");
            goto fail;
        }
        rc = ns_mmap_open(path, &st->files[i], err);
        if (rc != NS_OK) goto fail;
        rc = parse_file(st, i, path, hs, err);
        if (rc != NS_OK) goto fail;
    }
    st->header_hash = XXH64_digest(hs);
    *out = st;
    st = NULL;
fail:
    XXH64_freeState(hs);
    free(path);
    free(single);
    free(index);
    ns_safetensors_close(st);
    return rc;
}

void ns_safetensors_close(ns_safetensors *st) {
    if (!st) return;
    for (int32_t i = 0; i < st->n_tensors; i++) free(st->tensors[i].name);
    free(st->tensors);
    if (st->files)
        for (int32_t i = 0; i < st->n_files; i++) ns_mmap_close(&st->files[i]);
    free(st->files);
    if (st->file_names)
        for (int32_t i = 0; i < st->n_files; i++) free(st->file_names[i]);
    free(st->file_names);
    free(st);
}

ns_st_tensor *ns_safetensors_find(ns_safetensors *st, const char *name) {
    for (int32_t i = 0; i < st->n_tensors; i++)
        if (strcmp(st->tensors[i].name, name) == 0) return &st->tensors[i];
    return NULL;
}

uint64_t ns_safetensors_fingerprint(const ns_safetensors *st) {
    /* Headers and sizes catch almost every difference; 64 sampled 4 KiB
     * windows per file catch a fine-tune that kept shapes and names. */
    XXH64_state_t *hs = XXH64_createState();
    if (!hs) return st->header_hash;
    XXH64_reset(hs, st->header_hash);
    for (int32_t f = 0; f < st->n_files; f++) {
        const uint8_t *p = st->files[f].data;
        size_t size = st->files[f].size;
        for (int k = 0; k < 64; k++) {
            size_t off = (size_t)((double)size * k / 64.0);
            size_t n = size - off < 4096 ? size - off : 4096;
            XXH64_update(hs, p + off, n);
        }
    }
    uint64_t h = XXH64_digest(hs);
    XXH64_freeState(hs);
    return h;
}
