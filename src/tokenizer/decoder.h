/* decoder.h — tokenizer.json "decoder" components, batch and streaming.
 *
 * Supported types: Sequence, ByteLevel, Replace (String/Regex), ByteFallback,
 * Fuse, Strip, Metaspace; others are rejected with NS_ERR_UNSUPPORTED.
 * Sequences are flattened into a list of stages at parse time (equivalent to
 * tokenizers' nested decode_chain calls).
 *
 * ns_decoder_run is the reference: it reproduces tokenizers'
 * Decoder::decode(tokens) step by step (with no decoder the tokens are
 * joined with " ").
 *
 * ns_decstream does the same work incrementally. Stages before the first
 * fusing stage (ByteLevel or Fuse) see whole tokens; stages after it see the
 * fused text as a stream of whole characters. State kept between pushes:
 * ByteFallback's run of <0xXX> bytes (validity is decided on the whole run),
 * ByteLevel's incomplete UTF-8 tail (decoded lossily, like
 * String::from_utf8_lossy), Metaspace's token index, Strip's leading count and
 * held-back trailing characters. Configurations whose text-phase stages
 * cannot be streamed exactly (ByteLevel/ByteFallback after a Fuse, a
 * multi-character or regex Replace after a Fuse) report !streamable; callers
 * then decode everything at flush. Output is always whole UTF-8 characters.
 *
 * A parsed ns_decoder is immutable and thread-safe; a stream is owned by one
 * thread.
 */
#ifndef NS_DECODER_H
#define NS_DECODER_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

#include "tokenizer/pattern.h"
#include "tokenizer/tokutil.h"
#include "util/buf.h"
#include "util/status.h"

typedef struct ns_decoder ns_decoder;

/* Parses j (JSON null gives *out = NULL = join with spaces). *out is owned
 * by the caller (ns_decoder_free). */
ns_status ns_decoder_parse(const json_t *j, ns_decoder **out, ns_error *err);
void ns_decoder_free(ns_decoder *d);

/* Appends the decoding of the token strings to out. d may be NULL. */
ns_status ns_decoder_run(const ns_decoder *d, ns_rx_ctx *ctx, const ns_strlist *tokens, ns_buf *out, ns_error *err);

typedef struct ns_decstream ns_decstream;

/* Creates a stream for d (which may be NULL and must outlive the stream).
 * *out is owned by the caller (ns_decstream_free). */
ns_status ns_decstream_create(const ns_decoder *d, ns_decstream **out);
void ns_decstream_free(ns_decstream *s);
/* False when this decoder cannot be streamed exactly (see header comment). */
bool ns_decstream_streamable(const ns_decstream *s);
/* Feeds one token string; appends the newly completed text to out. */
ns_status ns_decstream_push(ns_decstream *s, const char *tok, size_t n, ns_buf *out);
/* End of stream: appends whatever was held back. */
ns_status ns_decstream_flush(ns_decstream *s, ns_buf *out);
/* Forgets all state, ready for a new stream (call after a flush). */
void ns_decstream_reset(ns_decstream *s);

#endif
