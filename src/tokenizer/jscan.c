#include "tokenizer/jscan.h"

#include <stdlib.h>
#include <string.h>

#include "tokenizer/tokutil.h"

#define MAX_DEPTH 64

void ns_jscan_ws(ns_jscan *j) {
    while (j->i < j->n) {
        char c = j->s[j->i];
        if (c != ' ' && c != '\n' && c != '\r' && c != '\t') break;
        j->i++;
    }
}

bool ns_jscan_eat(ns_jscan *j, char c) {
    ns_jscan_ws(j);
    if (j->i < j->n && j->s[j->i] == c) {
        j->i++;
        return true;
    }
    return false;
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static bool hex4(ns_jscan *j, uint32_t *v) {
    if (j->n - j->i < 4) return false;
    uint32_t x = 0;
    for (int k = 0; k < 4; k++) {
        int h = hexval(j->s[j->i + (size_t)k]);
        if (h < 0) return false;
        x = x * 16 + (uint32_t)h;
    }
    j->i += 4;
    *v = x;
    return true;
}

ns_status ns_jscan_string(ns_jscan *j, ns_buf *out) {
    ns_buf_reset(out);
    ns_jscan_ws(j);
    if (j->i >= j->n || j->s[j->i] != '"') return NS_ERR_FORMAT;
    j->i++;
    size_t run = j->i;
    for (;;) {
        if (j->i >= j->n) return NS_ERR_FORMAT;
        unsigned char c = (unsigned char)j->s[j->i];
        if (c == '"' || c == '\\' || c < 0x20) {
            if (c < 0x20) return NS_ERR_FORMAT;
            size_t len = j->i - run;
            if (len) {
                if (!ns_utf8_valid(j->s + run, len, NULL)) return NS_ERR_FORMAT;
                if (ns_buf_append(out, j->s + run, len) != NS_OK) return NS_ERR_NOMEM;
            }
            j->i++;
            if (c == '"') break;
            if (j->i >= j->n) return NS_ERR_FORMAT;
            char e = j->s[j->i++];
            char lit = 0;
            switch (e) {
            case '"': lit = '"'; break;
            case '\\': lit = '\\'; break;
            case '/': lit = '/'; break;
            case 'b': lit = '\b'; break;
            case 'f': lit = '\f'; break;
            case 'n': lit = '\n'; break;
            case 'r': lit = '\r'; break;
            case 't': lit = '\t'; break;
            case 'u': {
                uint32_t cp, lo;
                if (!hex4(j, &cp)) return NS_ERR_FORMAT;
                if (cp >= 0xDC00 && cp <= 0xDFFF) return NS_ERR_FORMAT; /* lone low surrogate */
                if (cp >= 0xD800 && cp <= 0xDBFF) {
                    if (j->n - j->i < 2 || j->s[j->i] != '\\' || j->s[j->i + 1] != 'u') return NS_ERR_FORMAT;
                    j->i += 2;
                    if (!hex4(j, &lo) || lo < 0xDC00 || lo > 0xDFFF) return NS_ERR_FORMAT;
                    cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                }
                if (cp == 0) return NS_ERR_FORMAT; /* jansson rejects NUL in strings too */
                char b[4];
                if (ns_buf_append(out, b, ns_utf8_encode(cp, b)) != NS_OK) return NS_ERR_NOMEM;
                break;
            }
            default: return NS_ERR_FORMAT;
            }
            if (lit && ns_buf_append(out, &lit, 1) != NS_OK) return NS_ERR_NOMEM;
            run = j->i;
            continue;
        }
        j->i++;
    }
    if (!out->data && ns_buf_append(out, "", 0) != NS_OK) return NS_ERR_NOMEM;
    return NS_OK;
}

ns_status ns_jscan_number(ns_jscan *j, double *out) {
    ns_jscan_ws(j);
    size_t a = j->i;
    if (j->i < j->n && j->s[j->i] == '-') j->i++;
    size_t digits = j->i;
    while (j->i < j->n && ((j->s[j->i] >= '0' && j->s[j->i] <= '9') || j->s[j->i] == '.' || j->s[j->i] == 'e' ||
                           j->s[j->i] == 'E' || j->s[j->i] == '+' || j->s[j->i] == '-'))
        j->i++;
    size_t len = j->i - a;
    if (j->i == digits || len > 63) return NS_ERR_FORMAT;
    char tmp[64];
    memcpy(tmp, j->s + a, len);
    tmp[len] = 0;
    char *end = NULL;
    *out = strtod(tmp, &end);
    return end == tmp + len ? NS_OK : NS_ERR_FORMAT;
}

static ns_status skip_string(ns_jscan *j) {
    if (j->i >= j->n || j->s[j->i] != '"') return NS_ERR_FORMAT;
    for (j->i++; j->i < j->n; j->i++) {
        char c = j->s[j->i];
        if (c == '\\') j->i++;
        else if (c == '"') {
            j->i++;
            return NS_OK;
        }
    }
    return NS_ERR_FORMAT;
}

static ns_status skip_value(ns_jscan *j, int depth) {
    if (depth > MAX_DEPTH) return NS_ERR_FORMAT;
    ns_jscan_ws(j);
    if (j->i >= j->n) return NS_ERR_FORMAT;
    char c = j->s[j->i];
    if (c == '"') return skip_string(j);
    if (c == '{' || c == '[') {
        char close = c == '{' ? '}' : ']';
        j->i++;
        if (ns_jscan_eat(j, close)) return NS_OK;
        for (;;) {
            if (c == '{') {
                ns_jscan_ws(j);
                if (skip_string(j) != NS_OK || !ns_jscan_eat(j, ':')) return NS_ERR_FORMAT;
            }
            if (skip_value(j, depth + 1) != NS_OK) return NS_ERR_FORMAT;
            if (ns_jscan_eat(j, ',')) continue;
            return ns_jscan_eat(j, close) ? NS_OK : NS_ERR_FORMAT;
        }
    }
    /* true / false / null / number: consume the bare token. */
    size_t a = j->i;
    while (j->i < j->n && strchr(",}] \t\r\n", j->s[j->i]) == NULL) j->i++;
    return j->i > a ? NS_OK : NS_ERR_FORMAT;
}

ns_status ns_jscan_skip(ns_jscan *j) { return skip_value(j, 0); }

/* Compares the raw key at the cursor (no escapes expected) with want. */
static bool key_is(ns_jscan *j, size_t ks, size_t ke, const char *want) {
    size_t wl = strlen(want);
    return ke - ks == wl && memcmp(j->s + ks, want, wl) == 0;
}

/* Walks the members of the object at the cursor; for each, records the raw
 * key bounds (without quotes) and leaves the cursor at the value. */
static bool next_member(ns_jscan *j, bool first, size_t *ks, size_t *ke, bool *done) {
    *done = false;
    if (first) {
        if (!ns_jscan_eat(j, '{')) return false;
        if (ns_jscan_eat(j, '}')) {
            *done = true;
            return true;
        }
    } else {
        if (ns_jscan_eat(j, '}')) {
            *done = true;
            return true;
        }
        if (!ns_jscan_eat(j, ',')) return false;
    }
    ns_jscan_ws(j);
    *ks = j->i + 1;
    if (skip_string(j) != NS_OK) return false;
    *ke = j->i - 1;
    return ns_jscan_eat(j, ':');
}

bool ns_jscan_model_spans(const char *doc, size_t n, size_t vocab[2], size_t merges[2]) {
    ns_jscan j = {doc, n, 0};
    vocab[0] = vocab[1] = merges[0] = merges[1] = 0;
    size_t ks, ke;
    bool done, found_model = false;
    for (bool first = true;; first = false) {
        if (!next_member(&j, first, &ks, &ke, &done)) return false;
        if (done) break;
        if (!key_is(&j, ks, ke, "model")) {
            if (skip_value(&j, 0) != NS_OK) return false;
            continue;
        }
        if (found_model) return false; /* duplicate key: let jansson decide */
        found_model = true;
        for (bool mfirst = true;; mfirst = false) {
            if (!next_member(&j, mfirst, &ks, &ke, &done)) return false;
            if (done) break;
            bool is_vocab = key_is(&j, ks, ke, "vocab"), is_merges = key_is(&j, ks, ke, "merges");
            ns_jscan_ws(&j);
            size_t a = j.i;
            if (skip_value(&j, 0) != NS_OK) return false;
            size_t *span = is_vocab ? vocab : is_merges ? merges : NULL;
            if (span) {
                if (span[1]) return false; /* duplicate */
                span[0] = a;
                span[1] = j.i;
            }
        }
    }
    ns_jscan_ws(&j);
    return found_model && j.i == n;
}
