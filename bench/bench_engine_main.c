/* bench_engine_main.c — standalone driver for `nightshift bench-engine`
 * (src/cli/cli_bench_engine.c), so the benchmark can be built and run on a
 * GPU machine without the rest of the CLI. Same flags as the subcommand;
 * like main.c it passes the options only (see src/cli/cli_common.h). */
#include "cli/cli_bench_engine.h"

int main(int argc, char **argv) { return ns_cli_bench_engine(argc - 1, argv + 1); }
