/* cli_bench_engine.h — `nightshift bench-engine`: engine throughput with no
 * HTTP in the way.
 *
 * Measures prefill throughput at several prompt lengths and decode
 * throughput at several batch sizes and contexts, plus the device's own
 * ceilings in the same run (copy bandwidth, bf16 GEMM rate), and prints
 * every figure also as a fraction of its roofline. Works on --device cuda
 * (the target) and cpu. Usage: see ns_cli_bench_engine's --help.
 */
#ifndef NS_CLI_BENCH_ENGINE_H
#define NS_CLI_BENCH_ENGINE_H

/* Runs the benchmark; returns the process exit code (never exits). argv
 * holds the options only, as for every subcommand (cli_common.h). This
 * file and its .c use nothing from cli_common.c: the GPU test build links
 * them without the rest of the CLI. */
int ns_cli_bench_engine(int argc, char **argv);

#endif
