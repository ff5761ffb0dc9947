/* engine/sample.h — the engine's sampling interface. The sampler itself
 * (parameters, state, the reference semantics every backend matches) lives
 * below both the engine and the backends, in src/sample/sample.h; this
 * header only forwards to it for code that reaches sampling through the
 * engine. New code should include "sample/sample.h" directly. */
#ifndef NS_ENGINE_SAMPLE_H
#define NS_ENGINE_SAMPLE_H

#include "sample/sample.h"

#endif
