/* bench_report.h — the single-file offline HTML report of `nightshift
 * bench`, rendered from its JSON result (bench_result.h plus the
 * "provenance" object cli_bench adds).
 *
 * Self-contained by construction: inline CSS, charts as inline SVG drawn
 * here (per-block values of each metric per server; a forest plot of the
 * B/A ratios with their confidence intervals on a log axis), no script,
 * no external asset, no CDN — it opens from a file on a machine with no
 * network. It never hides a bad run: the identity gate's verdict and
 * reasons, every withheld ratio with its reason, and every failed request
 * count with its first error are shown where the numbers would be.
 * Every string from the result (server answers, errors, outputs) is HTML-
 * escaped.
 *
 * Ownership: result is borrowed; the file at path is written whole
 * (a temporary file renamed into place). */
#ifndef NS_BENCH_REPORT_H
#define NS_BENCH_REPORT_H

#include <jansson.h>

#include "util/status.h"

ns_status ns_bench_report_html(json_t *result, const char *path, ns_error *err);

#endif
