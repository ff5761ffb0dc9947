/* cli_tokenize.h — `nightshift tokenize --model DIR [--add-special] [--jsonl]`.
 *
 * Reads all of stdin and prints the token ids as one JSON array on one line.
 * With --jsonl every input line is a JSON string and every output line is
 * the ids array for that string (blank input lines are skipped).
 * argv holds the options only (main.c strips "nightshift tokenize").
 * Returns the exit code — 0 ok, 1 runtime error, 2 usage error — after one
 * clear message on stderr; never exits itself.
 */
#ifndef NS_CLI_TOKENIZE_H
#define NS_CLI_TOKENIZE_H

int ns_cli_tokenize(int argc, char **argv);

#endif
