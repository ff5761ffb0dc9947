/* cli_serve.h — `nightshift serve`: the OpenAI-compatible HTTP server.
 *
 * First checks --model synchronously (config, safetensors headers against
 * what the loader expects, tokenizer) and fails with exit code 1 before
 * opening any port if the directory is unusable. Then starts listening
 * (GET /health answers 503 while the model loads), loads backend + model +
 * chat template on a loader thread, starts the scheduler, then serves
 * until SIGINT/SIGTERM. Shutdown
 * is graceful: stop accepting, let running requests finish (up to
 * --shutdown-timeout seconds; a second signal cuts it short), cancel the
 * rest, join every thread, free everything. Returns the exit code (0 ok,
 * 1 runtime failure, 2 usage); never exits.
 */
#ifndef NS_CLI_SERVE_H
#define NS_CLI_SERVE_H

int ns_cli_serve(int argc, char **argv);

#endif
