/* cli_bench.h — `nightshift bench --url A [--url B] --scenario NAME
 * --blocks N --seed S --json FILE --html FILE`: drives one or two
 * OpenAI-compatible servers (this one, llama.cpp's server, vLLM) with a
 * named workload (bench/bench_scenario.h) in paired AB/BA blocks, gates
 * the comparison on identical outputs (bench/bench_result.h), computes
 * bootstrap CIs of the per-block log-ratios (bench/bench_stats.h), and
 * writes a JSON result and a single-file offline HTML report
 * (bench/bench_report.h), both with provenance (date, command, this
 * binary's --version, machine, each server's /v1/models). With
 * --server-cmd it starts the servers itself (bench/bench_server.h), which
 * restart-resume needs, and stops them before it returns.
 *
 * argv holds the options only. Returns 0 when the run completed and its
 * outputs were written (failed requests and withheld ratios are results,
 * shown in the outputs, not errors), 1 on a runtime failure (no server
 * reachable, an output not writable), 2 on a usage error. Never exits. */
#ifndef NS_CLI_BENCH_H
#define NS_CLI_BENCH_H

int ns_cli_bench(int argc, char **argv);

#endif
