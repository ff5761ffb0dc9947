/* cli_eval.h — `nightshift eval`: one forward over given token ids, printing
 * per-position argmax, the last position's top-K logits and logsumexp, and
 * each next prompt token's log-probability, as one JSON object. */
#ifndef NS_CLI_EVAL_H
#define NS_CLI_EVAL_H
int ns_cli_eval(int argc, char **argv);
#endif
