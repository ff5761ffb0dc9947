/* gguf.c / gguf_model.c: the GGUF parser on hand-built files, corrupt
 * files (truncated, huge counts, bad offsets, wrong types: each a clean
 * NS_ERR_FORMAT/UNSUPPORTED with a message), a few thousand random
 * mutations of a real file (every open fails cleanly or succeeds, and what
 * succeeds is consistent; run it under ASan/UBSan too), sharded models
 * (split.*) giving the same logits as the single file, and the path rules
 * of --model. */
#include <fcntl.h>
#include <sys/stat.h>

#include <jansson.h>
#include <utf8proc.h>

#include "engine/runner.h"
#include "model/gguf.h"
#include "model/gguf_model.h"
#include "test.h"
#include "tokenizer/tok_gguf.h"
#include "util/buf.h"

/* ------------------------------------------------------------ writer */

typedef struct {
    uint8_t *p;
    size_t n, cap;
} wbuf;

static void put(wbuf *w, const void *src, size_t n) {
    if (w->n + n > w->cap) {
        w->cap = (w->n + n) * 2 + 64;
        w->p = realloc(w->p, w->cap);
    }
    memcpy(w->p + w->n, src, n);
    w->n += n;
}
static void u32(wbuf *w, uint32_t v) { put(w, &v, 4); }
static void u64(wbuf *w, uint64_t v) { put(w, &v, 8); }
static void str(wbuf *w, const char *s) {
    u64(w, strlen(s));
    put(w, s, strlen(s));
}
static void kv_u32(wbuf *w, const char *k, uint32_t v) {
    str(w, k);
    u32(w, NS_GGUF_U32);
    u32(w, v);
}
static void kv_str(wbuf *w, const char *k, const char *v) {
    str(w, k);
    u32(w, NS_GGUF_STRING);
    str(w, v);
}
static void pad(wbuf *w, size_t a) {
    static const uint8_t z[64];
    while (w->n % a) put(w, z, 1);
}

/* A small valid file: every scalar type, a string, arrays (ints, strings,
 * nested), an F32 vector and a Q8_0 matrix [2 x 32]. */
static wbuf sample_file(uint32_t version, uint32_t align) {
    wbuf w = {0};
    u32(&w, 0x46554747u);
    u32(&w, version);
    u64(&w, 2);  /* tensors */
    u64(&w, 17); /* kv */
    str(&w, "a.u8"), u32(&w, NS_GGUF_U8), put(&w, "\xfe", 1);
    str(&w, "a.i8"), u32(&w, NS_GGUF_I8), put(&w, "\xfe", 1);
    str(&w, "a.u16"), u32(&w, NS_GGUF_U16), put(&w, "\x01\x02", 2);
    str(&w, "a.i16"), u32(&w, NS_GGUF_I16), put(&w, "\xff\xff", 2);
    kv_u32(&w, "a.u32", 4000000000u);
    str(&w, "a.i32"), u32(&w, NS_GGUF_I32), u32(&w, (uint32_t)-5);
    float f = 1.5f;
    str(&w, "a.f32"), u32(&w, NS_GGUF_F32), put(&w, &f, 4);
    str(&w, "a.bool"), u32(&w, NS_GGUF_BOOL), put(&w, "\x01", 1);
    kv_str(&w, "a.str", "hello");
    str(&w, "a.u64"), u32(&w, NS_GGUF_U64), u64(&w, 1ull << 40);
    str(&w, "a.i64"), u32(&w, NS_GGUF_I64), u64(&w, (uint64_t)-7);
    double d = -2.25;
    str(&w, "a.f64"), u32(&w, NS_GGUF_F64), put(&w, &d, 8);
    str(&w, "a.arr_i32"), u32(&w, NS_GGUF_ARRAY), u32(&w, NS_GGUF_I32), u64(&w, 3);
    u32(&w, 7), u32(&w, 8), u32(&w, (uint32_t)-9);
    str(&w, "a.arr_str"), u32(&w, NS_GGUF_ARRAY), u32(&w, NS_GGUF_STRING), u64(&w, 3);
    str(&w, "x"), str(&w, ""), str(&w, "zz");
    str(&w, "a.nested"), u32(&w, NS_GGUF_ARRAY), u32(&w, NS_GGUF_ARRAY), u64(&w, 2);
    u32(&w, NS_GGUF_U8), u64(&w, 2), put(&w, "\x01\x02", 2);
    u32(&w, NS_GGUF_STRING), u64(&w, 1), str(&w, "n");
    str(&w, "a.empty"), u32(&w, NS_GGUF_ARRAY), u32(&w, NS_GGUF_F32), u64(&w, 0);
    kv_u32(&w, "general.alignment", align);
    /* tensors */
    str(&w, "v"), u32(&w, 1), u64(&w, 8), u32(&w, NS_GGML_F32), u64(&w, 0);
    str(&w, "m"), u32(&w, 2), u64(&w, 32), u64(&w, 2), u32(&w, NS_GGML_Q8_0), u64(&w, (32 + align - 1) / align * align);
    pad(&w, align);
    for (int i = 0; i < 8; i++) {
        float x = (float)i;
        put(&w, &x, 4);
    }
    pad(&w, align);
    uint8_t blk[34] = {0x00, 0x3c}; /* d = 1.0 */
    for (int r = 0; r < 2; r++) {
        for (int j = 0; j < 32; j++) blk[2 + j] = (uint8_t)(r * 32 + j);
        put(&w, blk, 34);
    }
    return w;
}

TEST(parse_every_type) {
    const uint32_t aligns[] = {32, 64, 8};
    for (int a = 0; a < 3; a++) {
        wbuf w = sample_file(3, aligns[a]);
        ns_gguf *g = NULL;
        ns_error err = {0};
        CHECKF(ns_gguf_open_mem(w.p, w.n, &g, &err) == NS_OK, "%s", err.msg);
        if (!g) continue;
        int64_t i;
        double d;
        bool b, found;
        CHECK(ns_gguf_get_i64(g, "a.u8", &i, &found, &err) == NS_OK && found && i == 254);
        CHECK(ns_gguf_get_i64(g, "a.i8", &i, NULL, &err) == NS_OK && i == -2);
        CHECK(ns_gguf_get_i64(g, "a.u16", &i, NULL, &err) == NS_OK && i == 0x0201);
        CHECK(ns_gguf_get_i64(g, "a.i16", &i, NULL, &err) == NS_OK && i == -1);
        CHECK(ns_gguf_get_i64(g, "a.u32", &i, NULL, &err) == NS_OK && i == 4000000000LL);
        CHECK(ns_gguf_get_i64(g, "a.i32", &i, NULL, &err) == NS_OK && i == -5);
        CHECK(ns_gguf_get_i64(g, "a.u64", &i, NULL, &err) == NS_OK && i == (1LL << 40));
        CHECK(ns_gguf_get_i64(g, "a.i64", &i, NULL, &err) == NS_OK && i == -7);
        CHECK(ns_gguf_get_f64(g, "a.f32", &d, NULL, &err) == NS_OK && d == 1.5);
        CHECK(ns_gguf_get_f64(g, "a.f64", &d, NULL, &err) == NS_OK && d == -2.25);
        CHECK(ns_gguf_get_f64(g, "a.i32", &d, NULL, &err) == NS_OK && d == -5);
        CHECK(ns_gguf_get_bool(g, "a.bool", &b, NULL, &err) == NS_OK && b);
        CHECK(ns_gguf_get_i64(g, "missing", &i, &found, &err) == NS_OK && !found);
        /* wrong types are errors, not coercions */
        CHECK(ns_gguf_get_i64(g, "a.str", &i, NULL, &err) == NS_ERR_FORMAT && strstr(err.msg, "a.str"));
        CHECK(ns_gguf_get_bool(g, "a.u8", &b, NULL, &err) == NS_ERR_FORMAT);
        CHECK(ns_gguf_get_i64(g, "a.f32", &i, NULL, &err) == NS_ERR_FORMAT);
        char *s = NULL;
        CHECK(ns_gguf_get_str_dup(g, "a.str", &s, &err) == NS_OK && s && !strcmp(s, "hello"));
        free(s);
        const ns_gguf_kv *kv = ns_gguf_find(g, "a.arr_i32");
        CHECK(kv && kv->arr_n == 3 && ns_gguf_arr_i64(kv, 2) == -9 && ns_gguf_arr_f64(kv, 0) == 7);
        kv = ns_gguf_find(g, "a.arr_str");
        uint64_t len;
        const char *e = kv ? ns_gguf_arr_str(g, kv, 2, &len) : NULL;
        CHECK(e && len == 2 && !memcmp(e, "zz", 2));
        CHECK(kv && ns_gguf_arr_str(g, kv, 1, &len) && len == 0);
        CHECK(kv && ns_gguf_arr_str(g, kv, 3, &len) == NULL);
        kv = ns_gguf_find(g, "a.nested");
        CHECK(kv && kv->arr_type == NS_GGUF_ARRAY && kv->arr_n == 2);
        CHECK(g->alignment == aligns[a] && g->data_off % aligns[a] == 0);
        const ns_gguf_tensor *t = ns_gguf_find_tensor(g, "m");
        CHECK(t && t->nbytes == 68 && t->ne[0] == 32 && t->ne[1] == 2 && t->data[2 + 34 + 5] == 37);
        t = ns_gguf_find_tensor(g, "v");
        float x;
        CHECK(t && t->nbytes == 32 && (memcpy(&x, t->data + 12, 4), x == 3.0f));
        ns_gguf_close(g);
        free(w.p);
    }
    /* version 2 reads the same; versions 1 and 4 are refused */
    const uint32_t vers[] = {2, 1, 4};
    for (int v = 0; v < 3; v++) {
        wbuf w = sample_file(vers[v], 32);
        ns_gguf *g = NULL;
        ns_error err = {0};
        ns_status st = ns_gguf_open_mem(w.p, w.n, &g, &err);
        CHECK(v == 0 ? st == NS_OK : (st == NS_ERR_UNSUPPORTED && strstr(err.msg, "version")));
        ns_gguf_close(g);
        free(w.p);
    }
}

static ns_status open_bytes(const uint8_t *p, size_t n, ns_error *err) {
    ns_gguf *g = NULL;
    ns_status st = ns_gguf_open_mem(p, n, &g, err);
    ns_gguf_close(g);
    return st;
}

/* Every proper prefix of the file is refused with a message. */
TEST(truncated_everywhere) {
    wbuf w = sample_file(3, 32);
    int bad = 0;
    for (size_t n = 0; n < w.n; n++) {
        uint8_t *copy = malloc(n + 1); /* exact-size buffer: ASan sees any overread */
        memcpy(copy, w.p, n);
        ns_error err = {0};
        if (open_bytes(copy, n, &err) != NS_ERR_FORMAT || !err.msg[0]) bad++;
        free(copy);
    }
    CHECKF(bad == 0, "%d truncations not refused cleanly", bad);
    free(w.p);
}

/* Patches the u64/u32 at byte offset off of a fresh sample and expects a
 * clean NS_ERR_FORMAT whose message contains want. */
static void expect_patch(size_t off, uint64_t v, int width, const char *want) {
    wbuf w = sample_file(3, 32);
    memcpy(w.p + off, &v, (size_t)width);
    ns_error err = {0};
    ns_status st = open_bytes(w.p, w.n, &err);
    CHECKF(st == NS_ERR_FORMAT && strstr(err.msg, want), "patch @%zu = %llu: %s (%s)", off, (unsigned long long)v,
           err.msg, ns_status_name(st));
    free(w.p);
}

/* Offset of the first occurrence of the GGUF string s (its u64 length). */
static size_t find_str(const char *s) {
    wbuf w = sample_file(3, 32);
    size_t n = strlen(s), off = 0;
    for (size_t i = 8; i + n <= w.n; i++)
        if (!memcmp(w.p + i, s, n) && !memcmp(w.p + i - 8, &(uint64_t){n}, 8)) {
            off = i - 8;
            break;
        }
    free(w.p);
    return off;
}

TEST(corrupt_headers) {
    expect_patch(0, 0x46554748u, 4, "magic");
    expect_patch(8, 1ull << 62, 8, "tensors");          /* huge tensor count */
    expect_patch(16, 1ull << 62, 8, "metadata entries"); /* huge kv count */
    size_t k = find_str("a.str");
    expect_patch(k + 8 + 5 + 4, 1ull << 63, 8, "truncated");   /* huge string length */
    expect_patch(k + 8 + 5, 13, 4, "unknown type");            /* value type 13 */
    size_t a = find_str("a.arr_i32");
    expect_patch(a + 8 + 9 + 4 + 4, 1ull << 61, 8, "runs past"); /* huge array count */
    expect_patch(a + 8 + 9 + 4, 99, 4, "element type");          /* bad element type */
    size_t b = find_str("a.bool");
    expect_patch(b + 8 + 6 + 4, 2, 1, "bool");
    size_t al = find_str("general.alignment");
    expect_patch(al + 8 + 17 + 4, 48, 4, "power of two");
    expect_patch(al + 8 + 17 + 4, 0, 4, "power of two");
    expect_patch(al + 8 + 17, NS_GGUF_I32, 4, "u32");
    size_t v = find_str("v");
    /* tensor "v": name(8+1) n_dims(4) dim(8) type(4) offset(8) */
    expect_patch(v + 9, 5, 4, "dims");
    expect_patch(v + 9, 0, 4, "dims");
    expect_patch(v + 13, 0, 8, "dim 0");
    expect_patch(v + 13, 1ull << 62, 8, "overflows"); /* 2^62 F32 values: bytes overflow */
    expect_patch(v + 21, 77, 4, "unknown ggml type");
    expect_patch(v + 25, 4, 8, "alignment");            /* misaligned offset */
    expect_patch(v + 25, 1ull << 40, 8, "outside");     /* past the end */
    expect_patch(v + 25, UINT64_MAX - 31, 8, "outside"); /* offset + size overflows */
    size_t m = find_str("m");
    expect_patch(m + 13, 16, 8, "multiple");            /* Q8_0 row of 16 */
    expect_patch(m + 21, 1ull << 62, 8, "overflow");    /* dims product overflows */
    /* a key or tensor name twice */
    size_t k2 = find_str("a.i8");
    expect_patch(k2 + 8, 0x38752e61, 4, "twice"); /* "a.u8" */
    expect_patch(m + 8, 'v', 1, "twice");
    /* control bytes in a key or tensor name (they would reach log lines) */
    expect_patch(k2 + 9, '\n', 1, "invalid key");
    expect_patch(m + 8, 0x1b, 1, "invalid name");
}

/* A few thousand random mutations of a real file (stories260K-Q4_0: SPM
 * vocabulary, F32/F16/Q4_0 tensors): each open succeeds or fails with a
 * message, and a file that opens has every tensor inside the buffer, and
 * its config and tokenizer either build or fail with a message. Mutations
 * hit the header (metadata and tensor infos) 9 times in 10. */
TEST(mutations) {
    char path[1024];
    snprintf(path, sizeof path, "%s", test_shared_path("gguf/stories260K-Q4_0.gguf"));
    FILE *f = fopen(path, "rb");
    CHECKF(f != NULL, "%s", path);
    if (!f) return;
    fseek(f, 0, SEEK_END);
    size_t n = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *orig = malloc(n), *buf = malloc(n);
    CHECK(fread(orig, 1, n, f) == n);
    fclose(f);
    ns_gguf *g0 = NULL;
    ns_error err = {0};
    CHECK(ns_gguf_open_mem(orig, n, &g0, &err) == NS_OK);
    size_t hdr = g0 ? (size_t)g0->data_off : n;
    ns_gguf_close(g0);
    uint64_t s = 0x9e3779b97f4a7c15ULL;
#define NEXT() (s ^= s << 13, s ^= s >> 7, s ^= s << 17, s)
    int opened = 0, refused = 0, silent = 0, tok_ok = 0, bad_tensor = 0;
    const int iters = 3000;
    for (int it = 0; it < iters; it++) {
        memcpy(buf, orig, n);
        size_t len = n;
        int nm = 1 + (int)(NEXT() % 4);
        for (int k = 0; k < nm; k++) {
            size_t pos = NEXT() % 10 ? NEXT() % hdr : NEXT() % n;
            switch (NEXT() % 4) {
            case 0: buf[pos] = (uint8_t)NEXT(); break;
            case 1: buf[pos] ^= (uint8_t)(1u << (NEXT() % 8)); break;
            case 2: memset(buf + pos, 0xff, n - pos < 8 ? n - pos : 8); break;
            default: len = pos; break; /* truncate */
            }
        }
        ns_gguf *g = NULL;
        ns_error e = {0};
        ns_status st = ns_gguf_open_mem(buf, len, &g, &e);
        if (st != NS_OK) {
            refused++;
            if (!e.msg[0]) silent++;
            continue;
        }
        opened++;
        for (uint64_t t = 0; t < g->n_tensors; t++) {
            const ns_gguf_tensor *x = &g->tensors[t];
            if (x->data < buf || x->data + x->nbytes > buf + len) bad_tensor++;
        }
        ns_model_config cfg;
        ns_error e2 = {0};
        if (ns_gguf_config(g, &cfg, &e2) != NS_OK && !e2.msg[0]) silent++;
        ns_tokenizer *tok = NULL;
        ns_error e3 = {0};
        if (ns_tokenizer_from_gguf(g, &tok, &e3) == NS_OK) {
            tok_ok++;
            int32_t *ids = NULL;
            size_t ni = 0;
            if (ns_tokenizer_encode(tok, "Once upon a time", 16, true, &ids, &ni, &e3) == NS_OK) free(ids);
            ns_tokenizer_free(tok);
        } else if (!e3.msg[0]) {
            silent++;
        }
        ns_gguf_close(g);
    }
#undef NEXT
    printf("#   %d mutations: %d opened (%d tokenizers built), %d refused\n", iters, opened, tok_ok, refused);
    CHECK_EQ_INT(silent, 0);
    CHECK_EQ_INT(bad_tensor, 0);
    CHECK(refused > iters / 10 && opened > 0);
    free(orig);
    free(buf);
}

/* ------------------------------------------------------------ shards */

/* Raw bytes of metadata entry i of g (key through value). */
static void kv_bytes(const ns_gguf *g, uint64_t i, const uint8_t **p, size_t *n) {
    const uint8_t *a = (const uint8_t *)g->kv[i].key - 8;
    const uint8_t *b = i + 1 < g->n_kv ? (const uint8_t *)g->kv[i + 1].key - 8 : (const uint8_t *)g->tensors[0].name - 8;
    *p = a;
    *n = (size_t)(b - a);
}

/* Writes shard no (0-based) of count: tensors [t0, t1) of g; shard 0 gets
 * g's metadata; every shard gets split.no / split.count /
 * split.tensors.count (split_no_override >= 0 lies about split.no). */
static void write_shard(const ns_gguf *g, const char *path, int no, int count, uint64_t t0, uint64_t t1,
                        int split_no_override) {
    wbuf w = {0};
    u32(&w, 0x46554747u);
    u32(&w, 3);
    u64(&w, t1 - t0);
    u64(&w, (no == 0 ? g->n_kv : 0) + 3);
    if (no == 0)
        for (uint64_t i = 0; i < g->n_kv; i++) {
            const uint8_t *p;
            size_t n;
            kv_bytes(g, i, &p, &n);
            put(&w, p, n);
        }
    str(&w, "split.no"), u32(&w, NS_GGUF_U16);
    uint16_t v16 = (uint16_t)(split_no_override >= 0 ? split_no_override : no);
    put(&w, &v16, 2);
    str(&w, "split.count"), u32(&w, NS_GGUF_U16);
    v16 = (uint16_t)count;
    put(&w, &v16, 2);
    str(&w, "split.tensors.count"), u32(&w, NS_GGUF_I32), u32(&w, (uint32_t)(count == 1 ? t1 - t0 : g->n_tensors));
    uint64_t off = 0;
    for (uint64_t t = t0; t < t1; t++) {
        const ns_gguf_tensor *x = &g->tensors[t];
        u64(&w, x->name_len);
        put(&w, x->name, x->name_len);
        u32(&w, x->n_dims);
        for (uint32_t d = 0; d < x->n_dims; d++) u64(&w, (uint64_t)x->ne[d]);
        u32(&w, x->type);
        u64(&w, off);
        off += (x->nbytes + 31) / 32 * 32;
    }
    pad(&w, 32);
    for (uint64_t t = t0; t < t1; t++) {
        put(&w, g->tensors[t].data, g->tensors[t].nbytes);
        pad(&w, 32);
    }
    FILE *f = fopen(path, "wb");
    CHECK(f && fwrite(w.p, 1, w.n, f) == w.n);
    if (f) fclose(f);
    free(w.p);
}

static float *last_logits(const char *path, const int32_t *ids, int32_t n, int32_t *vocab) {
    ns_error err = {0};
    ns_backend *be = NULL;
    ns_model *m = NULL;
    ns_engine *e = NULL;
    float *out = NULL;
    CHECK(ns_backend_cpu_create(1, &be, &err) == NS_OK);
    CHECKF(ns_model_load(path, be, &m, &err) == NS_OK, "%s: %s", path, err.msg);
    ns_engine_opts eo = {.max_batch_tokens = 32, .max_logits = 32, .page_tokens = 16, .n_pages = 8, .kv_dtype = NS_DT_F32};
    if (m && ns_engine_create(m, &eo, &e, &err) == NS_OK) {
        ns_runner r;
        CHECK(ns_runner_init(&r, e, &err) == NS_OK);
        CHECK(ns_runner_feed(&r, ids, n, false, NULL, NULL, &err) == NS_OK);
        *vocab = m->cfg.vocab_size;
        out = malloc((size_t)*vocab * sizeof *out);
        memcpy(out, r.logits, (size_t)*vocab * sizeof *out);
        ns_runner_free(&r);
    }
    ns_engine_free(e);
    ns_model_free(m);
    if (be) be->ops->destroy(be);
    return out;
}

TEST(sharded_model) {
    char src[1024], dir[] = "/tmp/ns_gguf_split_XXXXXX", p1[256], p2[256], p3[256];
    snprintf(src, sizeof src, "%s", test_shared_path("gguf/stories260K-Q8_0.gguf"));
    CHECK(mkdtemp(dir) != NULL);
    ns_gguf *g = NULL;
    ns_error err = {0};
    CHECKF(ns_gguf_open(src, &g, &err) == NS_OK, "%s", err.msg);
    if (!g) return;
    snprintf(p1, sizeof p1, "%s/m-00001-of-00002.gguf", dir);
    snprintf(p2, sizeof p2, "%s/m-00002-of-00002.gguf", dir);
    uint64_t half = g->n_tensors / 2;
    write_shard(g, p1, 0, 2, 0, half, -1);
    write_shard(g, p2, 1, 2, half, g->n_tensors, -1);
    const int32_t ids[] = {1, 403, 407, 261, 378, 432, 383};
    int32_t v1 = 0, v2 = 0;
    float *a = last_logits(src, ids, 7, &v1), *b = last_logits(p1, ids, 7, &v2);
    CHECK(a && b && v1 == v2 && memcmp(a, b, (size_t)v1 * sizeof *a) == 0);
    free(b);
    /* the directory form finds the first shard */
    b = last_logits(dir, ids, 7, &v2);
    CHECK(a && b && memcmp(a, b, (size_t)v1 * sizeof *a) == 0);
    free(a);
    free(b);
    ns_tokenizer *tok = NULL;
    CHECKF(ns_tokenizer_load(dir, &tok, &err) == NS_OK, "%s", err.msg);
    ns_tokenizer_free(tok);
    /* a lying split.no, a missing shard: clean errors */
    write_shard(g, p2, 1, 2, half, g->n_tensors, 0);
    ns_gguf_set *set = NULL;
    CHECK(ns_gguf_set_open(p1, &set, &err) == NS_ERR_FORMAT && strstr(err.msg, "split.no"));
    remove(p2);
    CHECK(ns_gguf_set_open(p1, &set, &err) == NS_ERR_IO);
    CHECK(set == NULL);
    /* two models in one directory: ambiguous */
    snprintf(p3, sizeof p3, "%s/other.gguf", dir);
    write_shard(g, p2, 1, 2, half, g->n_tensors, -1);
    FILE *f = fopen(p3, "wb");
    if (f) fclose(f);
    char *first = NULL;
    CHECK(!ns_gguf_model_path(dir, &first, &err) && err.status == NS_ERR_INVALID);
    remove(p1), remove(p2), remove(p3), rmdir(dir);
    ns_gguf_close(g);
}

/* A model whose weights are not what the architecture needs is refused by
 * name: a tensor left over, a missing one, an unsupported type. */
TEST(model_binding_errors) {
    char src[1024], dir[] = "/tmp/ns_gguf_bind_XXXXXX", p[256];
    snprintf(src, sizeof src, "%s", test_shared_path("gguf/stories260K-F32.gguf"));
    CHECK(mkdtemp(dir) != NULL);
    ns_gguf *g = NULL;
    ns_error err = {0};
    CHECK(ns_gguf_open(src, &g, &err) == NS_OK);
    if (!g) return;
    snprintf(p, sizeof p, "%s/m.gguf", dir);
    /* drop the last tensor: "missing tensor" */
    write_shard(g, p, 0, 1, 0, g->n_tensors - 1, -1);
    ns_model_config cfg;
    CHECKF(ns_gguf_model_validate(p, &cfg, &err) == NS_ERR_FORMAT && strstr(err.msg, "missing tensor"), "%s", err.msg);
    CHECK(ns_model_validate_dir(p, &cfg, &err) == NS_ERR_FORMAT);
    /* the whole file validates through the directory form */
    write_shard(g, p, 0, 1, 0, g->n_tensors, -1);
    CHECKF(ns_model_validate_dir(dir, &cfg, &err) == NS_OK, "%s", err.msg);
    CHECK(cfg.n_layers == 5 && cfg.hidden_size == 64 && cfg.vocab_size == 512 && cfg.n_kv_heads == 4);
    remove(p);
    rmdir(dir);
    ns_gguf_close(g);
    /* a file that is not GGUF, with the .gguf name */
    char bad[] = "/tmp/ns_gguf_bad_XXXXXX.gguf";
    int fd = mkstemps(bad, 5);
    CHECK(fd >= 0 && write(fd, "not a gguf file at all, really", 30) == 30);
    close(fd);
    ns_backend *be = NULL;
    ns_model *m = NULL;
    CHECK(ns_backend_cpu_create(1, &be, &err) == NS_OK);
    CHECK(ns_model_load(bad, be, &m, &err) == NS_ERR_FORMAT && strstr(err.msg, "magic") && m == NULL);
    be->ops->destroy(be);
    remove(bad);
}

/* gpt2-style vocabularies: the tiny-qwen3 tokenizer.json (Qwen's 151k
 * byte-level BPE) written into GGUF metadata the way llama.cpp's converter
 * does (tokens by id, merges, pre-tokenizer "qwen2", added special tokens as
 * CONTROL, other added tokens USER_DEFINED, the chat template), then the
 * tokenizer we build from it against Hugging Face's ids for the golden
 * texts (goldens/tokenizer-tiny-qwen3.json). Qwen's tokenizer.json NFC-
 * normalizes and llama.cpp does not: texts that NFC changes are skipped. */
static void kv_str_arr(wbuf *w, const char *k, json_t *const *items, size_t n) {
    str(w, k);
    u32(w, NS_GGUF_ARRAY);
    u32(w, NS_GGUF_STRING);
    u64(w, n);
    for (size_t i = 0; i < n; i++) {
        const char *v = items[i] ? json_string_value(items[i]) : "";
        size_t l = items[i] ? json_string_length(items[i]) : 0;
        u64(w, l);
        put(w, v, l);
    }
}

TEST(gpt2_tokenizer_matches_hf) {
    char p[1024];
    snprintf(p, sizeof p, "%s", test_shared_path("models/tiny-qwen3/tokenizer.json"));
    json_error_t je;
    json_t *tj = json_load_file(p, 0, &je);
    snprintf(p, sizeof p, "%s", test_shared_path("models/tiny-qwen3/tokenizer_config.json"));
    json_t *cj = json_load_file(p, 0, &je);
    snprintf(p, sizeof p, "%s", test_shared_path("goldens/tokenizer-tiny-qwen3.json"));
    json_t *gj = json_load_file(p, 0, &je);
    CHECK(tj && cj && gj);
    if (!tj || !cj || !gj) goto done;
    json_t *vocab = json_object_get(json_object_get(tj, "model"), "vocab"), *added = json_object_get(tj, "added_tokens");
    size_t n = 0, i;
    const char *key;
    json_t *v;
    json_object_foreach(vocab, key, v) if ((size_t)json_integer_value(v) + 1 > n) n = (size_t)json_integer_value(v) + 1;
    json_array_foreach(added, i, v) {
        size_t id = (size_t)json_integer_value(json_object_get(v, "id"));
        if (id + 1 > n) n = id + 1;
    }
    json_t **toks = calloc(n, sizeof *toks);
    int32_t *types = calloc(n, sizeof *types);
    json_object_foreach(vocab, key, v) {
        toks[json_integer_value(v)] = json_string(key);
        types[json_integer_value(v)] = 1;
    }
    json_array_foreach(added, i, v) {
        size_t id = (size_t)json_integer_value(json_object_get(v, "id"));
        json_decref(toks[id]);
        toks[id] = json_incref(json_object_get(v, "content"));
        types[id] = json_is_true(json_object_get(v, "special")) ? 3 : 4;
    }
    json_t *merges = json_object_get(json_object_get(tj, "model"), "merges");
    size_t nm = json_array_size(merges);
    json_t **ms = calloc(nm + 1, sizeof *ms);
    json_array_foreach(merges, i, v) {
        if (json_is_string(v)) {
            ms[i] = json_incref(v);
        } else {
            char buf[1024];
            snprintf(buf, sizeof buf, "%s %s", json_string_value(json_array_get(v, 0)), json_string_value(json_array_get(v, 1)));
            ms[i] = json_string(buf);
        }
    }
    const char *tmpl = json_string_value(json_object_get(cj, "chat_template"));
    wbuf w = {0};
    u32(&w, 0x46554747u), u32(&w, 3), u64(&w, 0), u64(&w, 7);
    kv_str(&w, "general.architecture", "qwen3");
    kv_str(&w, "tokenizer.ggml.model", "gpt2");
    kv_str(&w, "tokenizer.ggml.pre", "qwen2");
    kv_str_arr(&w, "tokenizer.ggml.tokens", toks, n);
    str(&w, "tokenizer.ggml.token_type"), u32(&w, NS_GGUF_ARRAY), u32(&w, NS_GGUF_I32), u64(&w, n);
    put(&w, types, n * 4);
    kv_str_arr(&w, "tokenizer.ggml.merges", ms, nm);
    kv_str(&w, "tokenizer.chat_template", tmpl ? tmpl : "");
    ns_gguf *g = NULL;
    ns_tokenizer *tok = NULL;
    ns_error err = {0};
    CHECKF(ns_gguf_open_mem(w.p, w.n, &g, &err) == NS_OK, "%s", err.msg);
    if (g) CHECKF(ns_tokenizer_from_gguf(g, &tok, &err) == NS_OK, "%s", err.msg);
    if (tok) {
        CHECK(tmpl && ns_tokenizer_chat_template(tok, NULL) && !strcmp(ns_tokenizer_chat_template(tok, NULL), tmpl));
        int checked = 0, bad = 0, skipped = 0;
        json_array_foreach(json_object_get(gj, "cases"), i, v) {
            const char *text = json_string_value(json_object_get(v, "text"));
            json_t *want = json_object_get(v, "ids");
            char *nfc = (char *)utf8proc_NFC((const utf8proc_uint8_t *)text);
            bool changed = !nfc || strcmp(nfc, text) != 0;
            free(nfc);
            if (changed) {
                skipped++;
                continue;
            }
            int32_t *ids = NULL;
            size_t ni = 0;
            if (ns_tokenizer_encode(tok, text, strlen(text), false, &ids, &ni, &err) != NS_OK) {
                bad++;
                continue;
            }
            bool same = ni == json_array_size(want);
            for (size_t k = 0; same && k < ni; k++) same = ids[k] == json_integer_value(json_array_get(want, k));
            if (!same) {
                bad++;
                printf("#   differs: \"%.60s\"\n", text);
            }
            free(ids);
            checked++;
        }
        printf("#   %d golden texts checked, %d skipped (NFC changes them)\n", checked, skipped);
        CHECK(checked >= 50);
        CHECK_EQ_INT(bad, 0);
    }
    ns_tokenizer_free(tok);
    ns_gguf_close(g);
    free(w.p);
    for (size_t k = 0; k < n; k++) json_decref(toks[k]);
    for (size_t k = 0; k < nm; k++) json_decref(ms[k]);
    free(toks);
    free(types);
    free(ms);
done:
    json_decref(tj);
    json_decref(cj);
    json_decref(gj);
}

/* The model fingerprint (the prefix cache's hash seed) covers the weights'
 * quantization: three types of one model, three fingerprints, each stable
 * across loads. */
TEST(fingerprint_covers_quantization) {
    const char *files[] = {"gguf/stories260K-F32.gguf", "gguf/stories260K-Q8_0.gguf", "gguf/stories260K-Q4_0.gguf"};
    uint64_t fp[3][2] = {{0}};
    ns_backend *be = NULL;
    ns_error err = {0};
    CHECK(ns_backend_cpu_create(1, &be, &err) == NS_OK);
    for (int i = 0; i < 3; i++)
        for (int k = 0; k < 2; k++) {
            char p[4200];
            snprintf(p, sizeof p, "%s", test_shared_path(files[i]));
            ns_model *m = NULL;
            CHECKF(ns_model_load(p, be, &m, &err) == NS_OK, "%s", err.msg);
            if (m) fp[i][k] = m->fingerprint;
            ns_model_free(m);
        }
    CHECK(fp[0][0] == fp[0][1] && fp[1][0] == fp[1][1] && fp[2][0] == fp[2][1]);
    CHECK(fp[0][0] != fp[1][0] && fp[1][0] != fp[2][0] && fp[0][0] != fp[2][0]);
    be->ops->destroy(be);
}

/* No dequantized copy of the model: quantized and F16 matrices are used
 * in place from the file's mapping (only llama's un-permuted q/k rows are a
 * copy, still in the file's type), and the model's weight bytes are about
 * the file's size. */
TEST(weights_stay_in_file_format) {
    const struct {
        const char *file;
        ns_dtype dt;
    } cases[] = {{"gguf/stories260K-F16.gguf", NS_DT_F16},
                 {"gguf/stories260K-Q8_0.gguf", NS_DT_Q8_0},
                 {"gguf/tiny-qwen3-k-Q4_K.gguf", NS_DT_Q4_K},
                 {"gguf/tiny-qwen3-k-Q6_K.gguf", NS_DT_Q6_K}};
    ns_backend *be = NULL;
    ns_error err = {0};
    CHECK(ns_backend_cpu_create(1, &be, &err) == NS_OK);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char p[4200];
        snprintf(p, sizeof p, "%s", test_shared_path(cases[i].file));
        ns_model *m = NULL;
        CHECKF(ns_model_load(p, be, &m, &err) == NS_OK, "%s", err.msg);
        if (!m) continue;
        const ns_layer_weights *w = &m->layers[0];
        CHECKF(w->w_up.dtype == cases[i].dt && w->w_up.alloc == NULL && w->wq.dtype == cases[i].dt &&
                   w->wq.alloc == NULL,
               "%s: ffn_up %s, alloc %p", cases[i].file, ns_dtype_name(w->w_up.dtype), w->w_up.alloc);
        struct stat sb;
        CHECK(stat(p, &sb) == 0 && m->weight_bytes <= (size_t)sb.st_size);
        ns_model_free(m);
    }
    be->ops->destroy(be);
}

int main(void) {
    RUN(parse_every_type);
    RUN(truncated_everywhere);
    RUN(corrupt_headers);
    RUN(mutations);
    RUN(sharded_model);
    RUN(model_binding_errors);
    RUN(gpt2_tokenizer_matches_hf);
    RUN(fingerprint_covers_quantization);
    RUN(weights_stay_in_file_format);
    TEST_MAIN_END;
}
