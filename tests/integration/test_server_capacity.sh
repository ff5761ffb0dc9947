#!/usr/bin/env bash
# A request that can never fit in this server's KV pool is refused at once:
# 400 context_exceeds_capacity with the numbers and retryable false.
cd "$(dirname "$0")/../.." && source tests/integration/common.bash
start_server --kv-tokens 256 --page-size 16

ids=$(node -e 'console.log(JSON.stringify(Array.from({length:300},(_,i)=>100+i)))')
post /v1/completions "{\"prompt\":$ids,\"max_tokens\":8}"
[ "$STATUS" = 400 ] || fail "status $STATUS: $BODY_OUT"
[ "$(json_get "$BODY_OUT" '[j.error.code,j.error.retryable,j.error.prompt_tokens,j.error.pool_tokens].join()')" = \
  "context_exceeds_capacity,false,300,256" ] || fail "body: $BODY_OUT"
# without max_tokens a prompt that fits gets what is left of the pool
post /v1/completions '{"prompt":[100,101,102],"temperature":0,"ignore_eos":true}'
[ "$STATUS" = 200 ] || fail "fitting prompt: $STATUS $BODY_OUT"
[ "$(json_get "$BODY_OUT" 'j.usage.completion_tokens<=253 && j.choices[0].finish_reason')" = length ] ||
  fail "default max_tokens: $BODY_OUT"
health_ok
echo ok
