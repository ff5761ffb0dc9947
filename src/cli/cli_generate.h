/* cli_generate.h — `nightshift generate`: prompt in, streamed text (or the
 * generated ids as one JSON array with --ids) out. */
#ifndef NS_CLI_GENERATE_H
#define NS_CLI_GENERATE_H
int ns_cli_generate(int argc, char **argv);
#endif
