/* bench_report.c — the offline HTML report (see bench_report.h). */
#include "bench/bench_report.h"

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/buf.h"

/* Appends s HTML-escaped (text and attribute safe). */
static void esc(ns_buf *b, const char *s) {
    for (; s && *s; s++) {
        switch (*s) {
        case '<': ns_buf_puts(b, "&lt;"); break;
        case '>': ns_buf_puts(b, "&gt;"); break;
        case '&': ns_buf_puts(b, "&amp;"); break;
        case '"': ns_buf_puts(b, "&quot;"); break;
        case '\'': ns_buf_puts(b, "&#39;"); break;
        default: ns_buf_putc(b, *s);
        }
    }
}

static const char *str(json_t *o, const char *k) {
    json_t *v = json_object_get(o, k);
    return json_is_string(v) ? json_string_value(v) : "";
}

static void num(ns_buf *b, json_t *v) {
    if (json_is_number(v)) ns_buf_printf(b, "%.4g", json_number_value(v));
    else ns_buf_puts(b, "–");
}

/* The one-line provenance printed under every figure, so a chart cut out
 * of the report still says where it came from. */
static void figure_provenance(ns_buf *b, json_t *root) {
    json_t *p = json_object_get(root, "provenance");
    if (!p) return;
    json_t *m = json_object_get(p, "machine");
    ns_buf_puts(b, "<div class=\"prov\">");
    esc(b, str(p, "date"));
    ns_buf_puts(b, " · ");
    esc(b, str(p, "bench_version"));
    ns_buf_puts(b, " · ");
    esc(b, str(m, "cpu_model"));
    ns_buf_printf(b, " (%lld cores) · <code>", (long long)json_integer_value(json_object_get(m, "cores")));
    esc(b, str(p, "command"));
    ns_buf_puts(b, "</code></div>");
}

static const char *const g_css =
    "body{font:14px/1.45 system-ui,sans-serif;margin:1.5em auto;max-width:1100px;color:#1d2330;padding:0 1em}"
    "h1{font-size:22px}h2{font-size:17px;margin-top:1.6em;border-bottom:1px solid #d8dde6;padding-bottom:.2em}"
    "table{border-collapse:collapse;margin:.5em 0}th,td{border:1px solid #d8dde6;padding:.25em .5em;text-align:left;"
    "vertical-align:top}th{background:#f2f4f8}td.num{text-align:right;font-variant-numeric:tabular-nums}"
    ".pass{color:#0a7d38;font-weight:600}.fail,.withheld,.failure{color:#b3261e;font-weight:600}"
    ".banner{padding:.6em .9em;border-radius:6px;margin:.6em 0}.banner.bad{background:#fde8e7;border:1px solid #f3b4ae}"
    ".banner.ok{background:#e6f6ec;border:1px solid #a8dcb9}.banner.info{background:#eef3fb;border:1px solid #bcd0ee}"
    "svg{background:#fbfcfe;border:1px solid #e3e7ee;margin:.3em 0}svg text{font:11px system-ui,sans-serif;fill:#444}"
    ".a{stroke:#1f6fd1;fill:#1f6fd1}.b{stroke:#e07a10;fill:#e07a10}.miss{stroke:#b3261e;fill:none}polyline.series{fill:none}"
    "pre{white-space:pre-wrap;background:#f6f7f9;padding:.5em;max-height:16em;overflow:auto}"
    "code{background:#f2f4f8;padding:0 .2em}.prov{font-size:11px;color:#666;margin:0 0 1em}";

static void provenance(ns_buf *b, json_t *p) {
    ns_buf_puts(b, "<h2>Provenance</h2><table id=\"provenance\">");
    const char *rows[][2] = {{"date", "date"}, {"command", "command"}, {"bench binary", "bench_version"}};
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        ns_buf_printf(b, "<tr><th>%s</th><td><code>", rows[i][0]);
        esc(b, str(p, rows[i][1]));
        ns_buf_puts(b, "</code></td></tr>");
    }
    json_t *m = json_object_get(p, "machine");
    ns_buf_puts(b, "<tr><th>machine</th><td>");
    esc(b, str(m, "cpu_model"));
    ns_buf_printf(b, ", %lld cores, ", (long long)json_integer_value(json_object_get(m, "cores")));
    esc(b, str(m, "os"));
    ns_buf_puts(b, "</td></tr>");
    size_t i;
    json_t *s;
    json_array_foreach(json_object_get(p, "servers"), i, s) {
        ns_buf_puts(b, "<tr><th>server ");
        esc(b, str(s, "label"));
        ns_buf_puts(b, "</th><td><code>");
        esc(b, str(s, "url"));
        ns_buf_puts(b, "</code> model <code>");
        esc(b, str(s, "model"));
        ns_buf_puts(b, "</code>");
        if (*str(s, "command")) {
            ns_buf_puts(b, "<br>started by the bench: <code>");
            esc(b, str(s, "command"));
            ns_buf_puts(b, "</code>");
        }
        const char *extra[] = {"models", "version", "props"};
        for (size_t k = 0; k < 3; k++) {
            json_t *v = json_object_get(s, extra[k]);
            if (!v || json_is_null(v)) continue;
            char *t = json_dumps(v, JSON_INDENT(1) | JSON_ENCODE_ANY);
            ns_buf_printf(b, "<details><summary>/%s</summary><pre>", extra[k]);
            esc(b, t ? t : "");
            ns_buf_puts(b, "</pre></details>");
            free(t);
        }
        ns_buf_puts(b, "</td></tr>");
    }
    ns_buf_puts(b, "</table>");
}

static void identity(ns_buf *b, json_t *id) {
    const char *v = str(id, "verdict");
    ns_buf_puts(b, "<h2>Identity gate</h2>");
    if (strcmp(v, "not_applicable") == 0) {
        ns_buf_puts(b, "<p id=\"identity\" class=\"banner info\" data-verdict=\"not_applicable\">One server: nothing to "
                       "compare.</p>");
        return;
    }
    ns_buf_printf(b, "<div id=\"identity\" class=\"banner %s\" data-verdict=\"%s\"><span class=\"%s\">%s</span>",
                  strcmp(v, "pass") == 0 ? "ok" : "bad", v, strcmp(v, "pass") == 0 ? "pass" : "fail",
                  strcmp(v, "pass") == 0 ? "pass: both servers gave the same greedy outputs and token counts"
                                         : "FAIL: the servers did not do the same work");
    json_t *rs = json_object_get(id, "reasons");
    if (json_array_size(rs)) {
        ns_buf_puts(b, "<ul>");
        size_t i;
        json_t *r;
        json_array_foreach(rs, i, r) {
            if (i == 20) {
                ns_buf_printf(b, "<li>… and %zu more</li>", json_array_size(rs) - 20);
                break;
            }
            ns_buf_puts(b, "<li>");
            esc(b, json_string_value(r));
            ns_buf_puts(b, "</li>");
        }
        ns_buf_puts(b, "</ul>");
    }
    ns_buf_puts(b, "</div>");
}

/* Forest plot of the ratios on a log2 axis; withheld rows say so. */
static void forest(ns_buf *b, json_t *ms) {
    const size_t n = json_array_size(ms);
    double lo = 0.5, hi = 2.0;
    size_t i;
    json_t *m;
    json_array_foreach(ms, i, m) {
        if (json_is_true(json_object_get(m, "withheld"))) continue;
        lo = fmin(lo, json_number_value(json_object_get(m, "ci_lo")));
        hi = fmax(hi, json_number_value(json_object_get(m, "ci_hi")));
    }
    const double l0 = log2(lo) - 0.1, l1 = log2(hi) + 0.1, W = 720, L = 190, R = 20, H = 28.0 * (double)n + 40;
#define FX(v) (L + (W - L - R) * (log2(v) - l0) / (l1 - l0))
    ns_buf_printf(b, "<svg id=\"forest\" class=\"chart\" width=\"%.0f\" height=\"%.0f\" viewBox=\"0 0 %.0f %.0f\">", W, H, W, H);
    ns_buf_printf(b, "<line x1=\"%.1f\" y1=\"8\" x2=\"%.1f\" y2=\"%.0f\" stroke=\"#888\" stroke-dasharray=\"4 3\"/>", FX(1.0),
                  FX(1.0), H - 22);
    ns_buf_printf(b, "<text x=\"%.1f\" y=\"%.0f\" text-anchor=\"middle\">1 (equal)</text>", FX(1.0), H - 8);
    ns_buf_printf(b, "<text x=\"%.1f\" y=\"%.0f\" text-anchor=\"start\">%.3g</text>", (double)L, H - 8, exp2(l0));
    ns_buf_printf(b, "<text x=\"%.1f\" y=\"%.0f\" text-anchor=\"end\">%.3g</text>", W - R, H - 8, exp2(l1));
    json_array_foreach(ms, i, m) {
        const double y = 20 + 28.0 * (double)i;
        ns_buf_printf(b, "<text x=\"4\" y=\"%.0f\">", y + 4);
        esc(b, str(m, "name"));
        ns_buf_puts(b, "</text>");
        if (json_is_true(json_object_get(m, "withheld"))) {
            ns_buf_printf(b, "<text class=\"withheld\" x=\"%.0f\" y=\"%.0f\" fill=\"#b3261e\">ratio withheld</text>", L, y + 4);
            continue;
        }
        const double e = json_number_value(json_object_get(m, "ratio")), a = json_number_value(json_object_get(m, "ci_lo")),
                     c = json_number_value(json_object_get(m, "ci_hi"));
        ns_buf_printf(b, "<line class=\"ci b\" x1=\"%.1f\" y1=\"%.0f\" x2=\"%.1f\" y2=\"%.0f\" stroke-width=\"3\"/>", FX(a), y,
                      FX(c), y);
        ns_buf_printf(b, "<circle class=\"est b\" cx=\"%.1f\" cy=\"%.0f\" r=\"5\"><title>%.4g [%.4g, %.4g]</title></circle>",
                      FX(e), y, e, a, c);
    }
    ns_buf_puts(b, "</svg>");
#undef FX
}

static void comparison(ns_buf *b, json_t *root) {
    json_t *c = json_object_get(root, "comparison");
    if (!json_is_object(c)) return;
    ns_buf_puts(b, "<h2>Comparison (B / A, paired blocks)</h2>");
    if (json_is_true(json_object_get(c, "withheld"))) {
        ns_buf_puts(b, "<div id=\"comparison-withheld\" class=\"banner bad withheld\">All ratios withheld: ");
        esc(b, str(c, "withheld_reason"));
        ns_buf_puts(b, "</div>");
    }
    json_t *bs = json_object_get(root, "bootstrap");
    ns_buf_printf(b, "<p>Estimate: exp(mean of per-block ln(B/A)); interval: %.0f%% percentile bootstrap over blocks, "
                     "%lld resamples. A ratio &gt; 1 means B's figure is larger.</p>",
                  100 * json_number_value(json_object_get(bs, "level")),
                  (long long)json_integer_value(json_object_get(bs, "resamples")));
    ns_buf_puts(b, "<table id=\"comparison\"><tr><th>metric</th><th>B/A</th><th>interval</th><th>better</th></tr>");
    json_t *ms = json_object_get(c, "metrics"), *m;
    size_t i;
    json_array_foreach(ms, i, m) {
        ns_buf_puts(b, "<tr><td>");
        esc(b, str(m, "name"));
        ns_buf_printf(b, " <small>(%s is better)</small></td>", json_is_true(json_object_get(m, "higher_better")) ? "higher" : "lower");
        if (json_is_true(json_object_get(m, "withheld"))) {
            ns_buf_puts(b, "<td colspan=\"3\" class=\"withheld\">withheld: ");
            esc(b, str(m, "withheld_reason"));
            ns_buf_puts(b, "</td></tr>");
            continue;
        }
        ns_buf_puts(b, "<td class=\"num\">");
        num(b, json_object_get(m, "ratio"));
        ns_buf_puts(b, "</td><td class=\"num\">[");
        num(b, json_object_get(m, "ci_lo"));
        ns_buf_puts(b, ", ");
        num(b, json_object_get(m, "ci_hi"));
        ns_buf_puts(b, "]</td><td>");
        esc(b, str(m, "better"));
        ns_buf_puts(b, "</td></tr>");
    }
    ns_buf_puts(b, "</table>");
    forest(b, ms);
    figure_provenance(b, root);
}

/* Per-block values of metric `name` for each server; missing values are
 * red crosses on the axis (their block's failure is in the table below). */
static void metric_chart(ns_buf *b, json_t *root, json_t *metric) {
    const char *name = str(metric, "name");
    json_t *blocks = json_object_get(root, "block_runs"), *servers = json_object_get(root, "servers");
    const size_t nb = json_array_size(blocks), ns = json_array_size(servers);
    double top = 0;
    size_t i, j;
    json_t *bl, *sv;
    json_array_foreach(blocks, i, bl) json_array_foreach(servers, j, sv) {
        json_t *v = json_object_get(json_object_get(json_object_get(json_object_get(bl, "runs"), str(sv, "label")), "values"), name);
        if (json_is_number(v)) top = fmax(top, json_number_value(v));
    }
    top = top > 0 ? top * 1.1 : 1;
    const double W = 540, H = 170, L = 64, B = 24;
    const double dx = nb > 1 ? (W - L - 20) / (double)(nb - 1) : 0;
    ns_buf_puts(b, "<figure><figcaption>");
    esc(b, name);
    if (*str(metric, "unit")) {
        ns_buf_puts(b, " (");
        esc(b, str(metric, "unit"));
        ns_buf_puts(b, ")");
    }
    ns_buf_puts(b, " per block</figcaption>");
    ns_buf_printf(b, "<svg class=\"chart chart-metric\" data-metric=\"");
    esc(b, name);
    ns_buf_printf(b, "\" width=\"%.0f\" height=\"%.0f\" viewBox=\"0 0 %.0f %.0f\">", W, H, W, H);
    ns_buf_printf(b, "<line x1=\"%.0f\" y1=\"%.0f\" x2=\"%.0f\" y2=\"%.0f\" stroke=\"#999\"/>", L, H - B, W, H - B);
    ns_buf_printf(b, "<line x1=\"%.0f\" y1=\"6\" x2=\"%.0f\" y2=\"%.0f\" stroke=\"#999\"/>", L, L, H - B);
    ns_buf_printf(b, "<text x=\"%.0f\" y=\"14\" text-anchor=\"end\">%.4g</text>", L - 4, top);
    ns_buf_printf(b, "<text x=\"%.0f\" y=\"%.0f\" text-anchor=\"end\">0</text>", L - 4, H - B);
    for (size_t k = 0; k < nb; k++)
        ns_buf_printf(b, "<text x=\"%.1f\" y=\"%.0f\" text-anchor=\"middle\">%zu</text>", L + 10 + dx * (double)k, H - 6, k);
    json_array_foreach(servers, j, sv) {
        const char *lab = str(sv, "label"), *cls = j == 0 ? "a" : "b";
        ns_buf_printf(b, "<polyline class=\"%s series\" fill=\"none\" stroke-width=\"1.5\" points=\"", cls);
        json_array_foreach(blocks, i, bl) {
            json_t *v = json_object_get(json_object_get(json_object_get(json_object_get(bl, "runs"), lab), "values"), name);
            if (json_is_number(v))
                ns_buf_printf(b, "%.1f,%.1f ", L + 10 + dx * (double)i, (H - B) - (H - B - 8) * json_number_value(v) / top);
        }
        ns_buf_puts(b, "\"/>");
        json_array_foreach(blocks, i, bl) {
            json_t *v = json_object_get(json_object_get(json_object_get(json_object_get(bl, "runs"), lab), "values"), name);
            const double x = L + 10 + dx * (double)i + (j ? 3 : -3);
            if (json_is_number(v))
                ns_buf_printf(b, "<circle class=\"%s point\" cx=\"%.1f\" cy=\"%.1f\" r=\"3.5\"><title>%s block %zu: %.4g</title></circle>",
                              cls, x, (H - B) - (H - B - 8) * json_number_value(v) / top, lab, i, json_number_value(v));
            else
                ns_buf_printf(b, "<path class=\"miss missing\" stroke-width=\"2\" d=\"M%.1f %.1fl8 8m0 -8l-8 8\"><title>%s block %zu: "
                                 "no value (failed)</title></path>",
                              x - 4, H - B - 4, lab, i);
        }
    }
    for (size_t k = 0; k < ns; k++)
        ns_buf_printf(b, "<text class=\"%s\" x=\"%.0f\" y=\"14\" stroke=\"none\">● %s</text>", k == 0 ? "a" : "b",
                      W - 90 + 45.0 * (double)k, str(json_array_get(servers, k), "label"));
    ns_buf_puts(b, "</svg>");
    figure_provenance(b, root);
    ns_buf_puts(b, "</figure>");
}

static void failures(ns_buf *b, json_t *root) {
    json_t *blocks = json_object_get(root, "block_runs"), *bl;
    size_t i;
    int n = 0;
    ns_buf_puts(b, "<h2>Failures</h2><table id=\"failures\"><tr><th>block</th><th>server</th><th>failed / requests</th>"
                   "<th>first error</th><th>identity probe</th></tr>");
    json_array_foreach(blocks, i, bl) {
        const char *k;
        json_t *r;
        json_object_foreach(json_object_get(bl, "runs"), k, r) {
            json_t *pr = json_object_get(r, "probe");
            const bool probe_bad = !json_is_true(json_object_get(pr, "ok"));
            if (json_integer_value(json_object_get(r, "failed")) == 0 && !probe_bad) continue;
            n++;
            ns_buf_printf(b, "<tr class=\"failure\"><td>%zu</td><td>", i);
            esc(b, k);
            ns_buf_printf(b, "</td><td class=\"num\">%lld / %lld</td><td>", (long long)json_integer_value(json_object_get(r, "failed")),
                          (long long)json_integer_value(json_object_get(r, "requests")));
            esc(b, str(r, "first_error"));
            ns_buf_puts(b, "</td><td>");
            esc(b, probe_bad ? str(pr, "error") : "ok");
            ns_buf_puts(b, "</td></tr>");
        }
    }
    if (!n) ns_buf_puts(b, "<tr><td colspan=\"5\" class=\"pass\">no failed request</td></tr>");
    ns_buf_puts(b, "</table>");
}

static void block_table(ns_buf *b, json_t *root) {
    json_t *metrics = json_object_get(root, "metrics"), *blocks = json_object_get(root, "block_runs");
    json_t *m, *bl;
    size_t i, k;
    ns_buf_puts(b, "<h2>Per-block values</h2><table id=\"blocks\"><tr><th>block</th><th>order</th><th>server</th>");
    json_array_foreach(metrics, k, m) {
        ns_buf_puts(b, "<th>");
        esc(b, str(m, "name"));
        ns_buf_puts(b, "</th>");
    }
    ns_buf_puts(b, "<th>wall s</th></tr>");
    json_array_foreach(blocks, i, bl) {
        const char *lab;
        json_t *r;
        json_object_foreach(json_object_get(bl, "runs"), lab, r) {
            ns_buf_printf(b, "<tr><td>%zu</td><td>", i);
            esc(b, str(bl, "order"));
            ns_buf_puts(b, "</td><td>");
            esc(b, lab);
            ns_buf_puts(b, "</td>");
            json_array_foreach(metrics, k, m) {
                ns_buf_puts(b, "<td class=\"num\">");
                num(b, json_object_get(json_object_get(r, "values"), str(m, "name")));
                ns_buf_puts(b, "</td>");
            }
            ns_buf_puts(b, "<td class=\"num\">");
            num(b, json_object_get(r, "wall_s"));
            ns_buf_puts(b, "</td></tr>");
        }
    }
    ns_buf_puts(b, "</table>");
}

static ns_status write_file(const char *path, const char *data, size_t n, ns_error *err) {
    char tmp[4096];
    if ((size_t)snprintf(tmp, sizeof tmp, "%s.tmp", path) >= sizeof tmp)
        return ns_fail(err, NS_ERR_INVALID, "report path too long");
    FILE *f = fopen(tmp, "w");
    if (!f) return ns_fail(err, NS_ERR_IO, "cannot write %s", tmp);
    bool ok = fwrite(data, 1, n, f) == n;
    ok = fclose(f) == 0 && ok;
    if (!ok || rename(tmp, path) != 0) {
        remove(tmp);
        return ns_fail(err, NS_ERR_IO, "cannot write %s", path);
    }
    return NS_OK;
}

ns_status ns_bench_report_html(json_t *root, const char *path, ns_error *err) {
    ns_buf b;
    ns_buf_init(&b, (size_t)256 << 20);
    const char *scen = str(root, "scenario");
    ns_buf_puts(&b, "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>nightshift bench: ");
    esc(&b, scen);
    ns_buf_printf(&b, "</title><style>%s</style></head><body><h1>nightshift bench: <code>", g_css);
    esc(&b, scen);
    ns_buf_printf(&b, "</code></h1><p>%lld blocks, seed %lld", (long long)json_integer_value(json_object_get(root, "blocks")),
                  (long long)json_integer_value(json_object_get(root, "seed")));
    if (*str(root, "replay")) {
        ns_buf_puts(&b, "; recording: ");
        esc(&b, str(root, "replay"));
    }
    ns_buf_puts(&b, "</p>");
    if (json_is_true(json_object_get(root, "skipped"))) {
        ns_buf_puts(&b, "<div id=\"skipped\" class=\"banner bad\">Scenario skipped: ");
        esc(&b, str(root, "skip_reason"));
        ns_buf_puts(&b, "</div>");
    }
    identity(&b, json_object_get(root, "identity"));
    comparison(&b, root);
    ns_buf_puts(&b, "<h2>Per-server summary</h2><table id=\"summary\"><tr><th>server</th><th>metric</th><th>median</th>"
                    "<th>min</th><th>max</th><th>geomean [interval]</th><th>blocks with a value</th></tr>");
    size_t i, k;
    json_t *sv, *m;
    json_array_foreach(json_object_get(root, "servers"), i, sv) {
        json_array_foreach(json_object_get(root, "metrics"), k, m) {
            json_t *s = json_object_get(json_object_get(sv, "summary"), str(m, "name"));
            json_t *g = json_object_get(s, "geomean");
            ns_buf_puts(&b, "<tr><td>");
            esc(&b, str(sv, "label"));
            ns_buf_puts(&b, "</td><td>");
            esc(&b, str(m, "name"));
            ns_buf_puts(&b, "</td><td class=\"num\">");
            num(&b, json_object_get(s, "median"));
            ns_buf_puts(&b, "</td><td class=\"num\">");
            num(&b, json_object_get(s, "min"));
            ns_buf_puts(&b, "</td><td class=\"num\">");
            num(&b, json_object_get(s, "max"));
            ns_buf_puts(&b, "</td><td class=\"num\">");
            if (g) {
                num(&b, json_object_get(g, "estimate"));
                ns_buf_puts(&b, " [");
                num(&b, json_object_get(g, "ci_lo"));
                ns_buf_puts(&b, ", ");
                num(&b, json_object_get(g, "ci_hi"));
                ns_buf_puts(&b, "]");
            } else {
                ns_buf_puts(&b, "–");
            }
            ns_buf_printf(&b, "</td><td class=\"num\">%lld / %lld</td></tr>",
                          (long long)json_integer_value(json_object_get(s, "blocks_with_value")),
                          (long long)json_integer_value(json_object_get(root, "blocks")));
        }
    }
    ns_buf_puts(&b, "</table><h2>Charts</h2>");
    json_array_foreach(json_object_get(root, "metrics"), k, m) metric_chart(&b, root, m);
    failures(&b, root);
    block_table(&b, root);
    json_t *p = json_object_get(root, "provenance");
    if (p) provenance(&b, p);
    ns_status rc = ns_buf_puts(&b, "</body></html>\n");
    if (rc != NS_OK) {
        ns_buf_free(&b);
        return ns_fail(err, rc, "the report is too large");
    }
    rc = write_file(path, b.data, b.len, err);
    ns_buf_free(&b);
    return rc;
}
