/* cli_check_prompts.c — `nightshift check-prompts` (see cli_check_prompts.h). */
#include "cli/cli_check_prompts.h"

#include <errno.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/api.h"
#include "api/chat.h"
#include "api/messages_conv.h"
#include "api/responses_conv.h"
#include "cli/cli_common.h"
#include "record/prompt_diff.h"
#include "record/session.h"
#include "template/template.h"
#include "tokenizer/tokenizer.h"

/* A rendered turn. */
typedef struct rendered {
    bool ok;
    char error[600];
    json_t *chat;   /* the chat body the prompt came from (owned; NULL for completions) */
    char *text;     /* owned */
    int32_t *ids;   /* owned */
    size_t n_ids;
    int32_t *out_ids; /* the recorded output ids (owned) */
    size_t n_out_ids;
} rendered;

static void usage(FILE *f) {
    fprintf(f, "usage: nightshift check-prompts FILE --model DIR [--json OUT]\n"
               "  Renders every request of a recording (serve --record DIR: DIR/requests.jsonl) with the\n"
               "  model's chat template and tokenizer, groups them into sessions and, for each turn that\n"
               "  does not extend the previous turn's prompt append-only, says why (system prompt changed,\n"
               "  tools changed, message N edited, reasoning stripped, whitespace trimmed at the answer\n"
               "  boundary, template re-render difference) and how many prefill tokens the break cost.\n"
               "  Example:\n"
               "    nightshift check-prompts rec/requests.jsonl --model ~/models/Qwen3-8B\n"
               "  --model DIR   (required) the model directory whose tokenizer and chat template render\n"
               "                the prompts\n"
               "  --json OUT    also write the sessions, turns and breaks as JSON to OUT (default: none)\n"
               "A redacted recording (serve --record-redact) cannot be checked: its texts are gone.\n");
}

static bool contains(const char *s, const char *needle) { return s && strstr(s, needle) != NULL; }

/* The API state the chat path needs: tokenizer, template and the flags
 * serve derives from the template source (cli_serve.c load_main). */
static ns_status open_model(const char *dir, ns_api *a, ns_error *err) {
    ns_api_init(a, "check-prompts");
    ns_status rc = ns_tokenizer_load(dir, &a->tok, err);
    if (rc != NS_OK) return rc;
    const char *src = ns_tokenizer_chat_template(a->tok, NULL);
    if (src) {
        rc = ns_template_parse(src, strlen(src), &a->tmpl, err);
        if (rc != NS_OK) return rc;
    }
    a->tmpl_src = src;
    a->tmpl_wants_string_args = contains(src, "arguments is string") || contains(src, "arguments is not string");
    a->toolfmt = ns_toolfmt_detect(src ? src : "");
    a->reasoning = contains(src, "<think>");
    /* recorded prompts are analysed whatever their length */
    a->cfg.max_position_embeddings = 1 << 28;
    return NS_OK;
}

static void set_err(rendered *r, const char *what, const char *msg) {
    snprintf(r->error, sizeof r->error, "%s: %.500s", what, msg); /* a long message is cut */
}

/* The chat body a request renders through (a new reference), or NULL with r->error. */
static json_t *chat_body(const ns_rec_entry *e, rendered *r) {
    ns_http_error he = {0};
    json_t *body = (json_t *)e->body, *chat = NULL;
    if (e->kind == NS_REC_CHAT) return json_incref(body);
    if (e->kind == NS_REC_MESSAGES) {
        ns_msgs_conv c;
        if (!ns_msgs_convert(body, false, &c, &he)) {
            set_err(r, "the request does not convert", he.message);
        } else {
            chat = json_deep_copy(c.chat);
            ns_msgs_conv_free(&c);
        }
    } else if (e->kind == NS_REC_RESPONSES) {
        ns_resp_conv c;
        if (!ns_resp_convert(body, &c, &he)) {
            set_err(r, "the request does not convert", he.message);
        } else {
            chat = json_deep_copy(c.chat);
            ns_resp_conv_free(&c);
        }
    } else {
        set_err(r, "unsupported endpoint", e->endpoint);
    }
    ns_http_error_clear(&he);
    return chat;
}

static void render_chat(ns_api *a, const ns_rec_entry *e, rendered *r) {
    json_t *chat = chat_body(e, r);
    if (!chat) return;
    ns_chat_prompt cp;
    ns_http_error he = {0};
    if (!ns_chat_prompt_build(a, chat, true, &cp, &he)) {
        set_err(r, "the template does not render it", he.message);
        ns_http_error_clear(&he);
        json_decref(chat);
        return;
    }
    r->chat = chat;
    r->text = cp.text;
    r->ids = cp.ids;
    r->n_ids = cp.n_ids;
    cp.text = NULL;
    cp.ids = NULL;
    ns_chat_prompt_free(&cp);
    r->ok = r->ids != NULL;
    if (!r->ok) set_err(r, "tokenizing failed", "no ids");
}

static void render_completion(ns_api *a, const ns_rec_entry *e, rendered *r) {
    const json_t *p = json_object_get(e->body, "prompt");
    ns_error err = {0};
    if (json_is_string(p)) {
        r->text = strdup(json_string_value(p));
        if (ns_tokenizer_encode(a->tok, json_string_value(p), json_string_length(p), true, &r->ids, &r->n_ids,
                                &err) != NS_OK)
            set_err(r, "tokenizing failed", err.msg);
        else r->ok = r->text != NULL;
        return;
    }
    if (json_is_array(p) && json_array_size(p) > 0 && json_is_integer(json_array_get(p, 0))) {
        size_t n = json_array_size(p);
        r->ids = malloc(n * sizeof *r->ids);
        if (!r->ids) {
            set_err(r, "out of memory", "prompt ids");
            return;
        }
        for (size_t i = 0; i < n; i++) r->ids[i] = (int32_t)json_integer_value(json_array_get(p, i));
        r->n_ids = n;
        r->ok = true;
        return;
    }
    set_err(r, "unsupported prompt", "only a string or one array of token ids is checked");
}

static void render(ns_api *a, const ns_rec_entry *e, rendered *r) {
    memset(r, 0, sizeof *r);
    if (e->kind == NS_REC_COMPLETIONS) render_completion(a, e, r);
    else if (!a->tmpl) set_err(r, "no chat template", "the model has none");
    else render_chat(a, e, r);
    const json_t *ids = json_object_get(json_object_get(e->rec, "output"), "ids");
    size_t n = json_array_size(ids);
    if (r->ok && n > 0 && (r->out_ids = malloc(n * sizeof *r->out_ids))) {
        for (size_t i = 0; i < n; i++) r->out_ids[i] = (int32_t)json_integer_value(json_array_get(ids, i));
        r->n_out_ids = n;
    }
}

static void rendered_free(rendered *r) {
    json_decref(r->chat);
    free(r->text);
    free(r->ids);
    free(r->out_ids);
}

/* The analysis view of a rendered turn. */
static ns_pdiff_turn turn_of(const ns_rec_entry *e, const rendered *r, json_t **items_tmp) {
    const json_t *out = json_object_get(e->rec, "output");
    *items_tmp = r->chat ? json_incref(json_object_get(r->chat, "messages")) : json_incref(e->items);
    return (ns_pdiff_turn){
        .items = *items_tmp,
        .tools = r->chat ? json_object_get(r->chat, "tools") : NULL,
        .out_content = json_string_value(json_object_get(out, "content")),
        .out_reasoning = json_string_value(json_object_get(out, "reasoning")),
        .out_ids = r->out_ids,
        .n_out_ids = r->n_out_ids,
        .ids = r->ids,
        .n_ids = r->n_ids,
        .text = r->text,
    };
}

/* Compares turn k of session s (rendered cr) with turn k-1 (pr); appends the JSON of the
 * turn to turns and prints a break. Returns the prefill cost (0: none). */
static size_t check_turn(const ns_recording *rec, const rendered *pr, const rendered *cr, const ns_rec_session *s,
                         int k, json_t *turns, int *n_breaks) {
    const ns_rec_entry *pe = &rec->e[s->idx[k - 1]], *ce = &rec->e[s->idx[k]];
    json_t *t = json_pack("{s:i,s:i,s:I}", "turn", k, "record", ce->line, "prompt_tokens", (json_int_t)cr->n_ids);
    const json_t *rc = json_object_get(ce->rec, "cached_tokens");
    if (json_is_integer(rc)) json_object_set(t, "recorded_cached_tokens", (json_t *)rc);
    if (!pr->ok || !cr->ok) {
        json_object_set_new(t, "error", json_string(!cr->ok ? cr->error : "the previous turn did not render"));
        printf("  turn %d (record %d): not checked: %s\n", k, ce->line, !cr->ok ? cr->error : "the previous turn did not render");
        json_array_append_new(turns, t);
        return 0;
    }
    json_t *pi, *ci;
    ns_pdiff_turn pt = turn_of(pe, pr, &pi), ct = turn_of(ce, cr, &ci);
    ns_pdiff_result res;
    size_t cost = 0;
    if (!ns_pdiff_compare(&pt, &ct, &res)) {
        json_object_set_new(t, "error", json_string("out of memory"));
    } else {
        json_object_set_new(t, "append_only", json_boolean(res.append_only));
        json_object_set_new(t, "reusable_tokens", json_integer((json_int_t)res.reusable));
        json_object_set_new(t, "diverge_at", json_integer((json_int_t)res.diverge_at));
        json_object_set_new(t, "prefill_tokens", json_integer((json_int_t)res.prefill_tokens));
        json_object_set_new(t, "lost_tokens", json_integer((json_int_t)res.lost_tokens));
        json_t *reasons = json_array();
        if (!res.append_only) {
            ++*n_breaks;
            cost = res.prefill_tokens;
            char rec_cached[64] = "";
            if (json_is_integer(rc))
                snprintf(rec_cached, sizeof rec_cached, "; the server reported %lld cached",
                         (long long)json_integer_value(rc));
            printf("  turn %d (record %d): BREAK at token %zu of %zu: %zu prompt tokens prefilled again (%zu cached "
                   "tokens lost%s)\n",
                   k, ce->line, res.diverge_at, cr->n_ids, res.prefill_tokens, res.lost_tokens, rec_cached);
        }
        for (int i = 0; i < res.n_reasons; i++) {
            const ns_pdiff_reason *r = &res.reasons[i];
            json_array_append_new(reasons, json_pack("{s:s,s:o,s:s}", "kind", ns_pdiff_kind_name(r->kind), "message",
                                                     r->message >= 0 ? json_integer(r->message) : json_null(),
                                                     "detail", r->detail));
            printf("    %s: %s\n", ns_pdiff_kind_name(r->kind), r->detail);
        }
        json_object_set_new(t, "reasons", reasons);
        ns_pdiff_result_free(&res);
    }
    json_decref(pi);
    json_decref(ci);
    json_array_append_new(turns, t);
    return cost;
}

/* Renders one session's turns in order, keeping two at a time (a long
 * recording's prompts need not all be in memory at once). */
static json_t *check_all(ns_api *a, const ns_recording *rec, size_t *total_cost, int *total_breaks) {
    json_t *sessions = json_array();
    if (!sessions) return NULL;
    for (int si = 0; si < rec->n_sessions; si++) {
        const ns_rec_session *s = &rec->s[si];
        const ns_rec_entry *first = &rec->e[s->idx[0]];
        printf("session %d: %d turns, %s, from record %d\n", si, s->n, first->endpoint, first->line);
        json_t *turns = json_array();
        rendered rd[2];
        render(a, first, &rd[0]);
        const rendered *r0 = &rd[0];
        json_t *t0 = json_pack("{s:i,s:i,s:I}", "turn", 0, "record", first->line, "prompt_tokens", (json_int_t)r0->n_ids);
        if (!r0->ok) {
            json_object_set_new(t0, "error", json_string(r0->error));
            printf("  turn 0 (record %d): not rendered: %s\n", first->line, r0->error);
        }
        json_array_append_new(turns, t0);
        size_t cost = 0;
        int breaks = 0;
        for (int k = 1; k < s->n; k++) {
            render(a, &rec->e[s->idx[k]], &rd[k % 2]);
            cost += check_turn(rec, &rd[(k - 1) % 2], &rd[k % 2], s, k, turns, &breaks);
            rendered_free(&rd[(k - 1) % 2]);
        }
        rendered_free(&rd[(s->n - 1) % 2]);
        if (breaks == 0 && s->n > 1) printf("  append-only: every turn extends the previous one\n");
        *total_cost += cost;
        *total_breaks += breaks;
        json_array_append_new(sessions, json_pack("{s:i,s:s,s:i,s:i,s:I,s:o}", "session", si, "endpoint",
                                                  first->endpoint, "turns", s->n, "breaks", breaks,
                                                  "prefill_tokens_lost", (json_int_t)cost, "turn_results", turns));
    }
    return sessions;
}

int ns_cli_check_prompts(int argc, char **argv) {
    const char *file = NULL, *model = NULL, *json_out = NULL;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (ns_cli_is_help(a)) {
            usage(stdout);
            return 0;
        }
        if (strcmp(a, "--model") == 0 || strcmp(a, "--json") == 0) {
            const char *v = ns_cli_flag_value(argc, argv, &i);
            if (!v) return ns_cli_usage_error("check-prompts", usage, "%s needs a value", a);
            if (a[2] == 'm') model = v;
            else json_out = v;
        } else if (a[0] == '-' && a[1]) {
            return ns_cli_usage_error("check-prompts", usage, "unknown option %s", a);
        } else if (file) {
            return ns_cli_usage_error("check-prompts", usage, "give one recording file (got %s too)", a);
        } else {
            file = a;
        }
    }
    if (!file) return ns_cli_usage_error("check-prompts", usage, "give the recording FILE");
    if (!model) return ns_cli_usage_error("check-prompts", usage, "give --model DIR");
    ns_recording rec;
    ns_error err = {0};
    if (ns_recording_load(file, &rec, &err) != NS_OK) {
        fprintf(stderr, "nightshift check-prompts: %s\n", err.msg);
        return 1;
    }
    int rc = 1;
    ns_api *a = calloc(1, sizeof *a);
    json_t *sessions = NULL, *root = NULL;
    if (rec.any_redacted) {
        fprintf(stderr,
                "nightshift check-prompts: %s is a redacted recording (serve --record-redact): its message texts "
                "were replaced by token counts and hashes, so the prompts cannot be rendered; record without "
                "--record-redact to check them\n",
                file);
        goto out;
    }
    if (!a || open_model(model, a, &err) != NS_OK) {
        fprintf(stderr, "nightshift check-prompts: --model %s: %s\n", model, a ? err.msg : "out of memory");
        goto out;
    }
    size_t cost = 0;
    int breaks = 0;
    sessions = check_all(a, &rec, &cost, &breaks);
    if (!sessions) {
        fprintf(stderr, "nightshift check-prompts: out of memory\n");
        goto out;
    }
    printf("summary: %d requests, %d sessions, %d breaks, %zu prompt tokens prefilled again because of them\n", rec.n,
           rec.n_sessions, breaks, cost);
    root = json_pack("{s:s,s:s,s:i,s:i,s:i,s:I,s:O}", "file", file, "model", model, "requests", rec.n, "sessions_count",
                     rec.n_sessions, "breaks", breaks, "prefill_tokens_lost", (json_int_t)cost, "sessions", sessions);
    if (json_out && (!root || json_dump_file(root, json_out, JSON_INDENT(1)) != 0)) {
        fprintf(stderr, "nightshift check-prompts: cannot write %s: %s\n", json_out, strerror(errno));
        goto out;
    }
    rc = 0;
out:
    json_decref(root);
    json_decref(sessions);
    if (a) {
        ns_template_free(a->tmpl);
        ns_tokenizer_free(a->tok);
        free(a);
    }
    ns_recording_free(&rec);
    return rc;
}
