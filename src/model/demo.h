/* demo.h — the built-in demo model: used when no --model is given, so
 * every path (CLI, server, tests) can run on a fresh machine with no
 * download. Its weights are random (deterministic from NS_DEMO_SEED) and
 * it says so at start-up; its tokenizer is plain byte-level (one token per
 * byte plus a few specials), generated in memory. */
#ifndef NS_DEMO_H
#define NS_DEMO_H

#include "model/model.h"

#define NS_DEMO_SEED 20261129ULL

void ns_demo_config(ns_model_config *cfg);
/* tokenizer.json / tokenizer_config.json texts for the demo tokenizer
 * (static strings, built on first use; not thread-safe on first call —
 * call once at start-up). */
const char *ns_demo_tokenizer_json(void);
/* The demo tokenizer.json widened to n_vocab ids (if more than its own):
 * ids past the specials decode to filler pieces " t<id>", so a model with
 * random weights and a real vocabulary size (--dummy-weights) streams text
 * for every token. Malloc'd (free()); NULL when out of memory. */
char *ns_demo_tokenizer_json_n(int32_t n_vocab);
const char *ns_demo_tokenizer_config_json(void);

#endif
