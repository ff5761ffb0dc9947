#!/usr/bin/env bash
# --api-key: every endpoint but /health needs "Authorization: Bearer KEY";
# a missing or wrong key is a 401 in the OpenAI error shape.
cd "$(dirname "$0")/../.." && source tests/integration/common.bash
start_server --api-key s3cret-key

code() { curl -s -o "$TMP/resp" -w '%{http_code}' "$@"; }
[ "$(code "$BASE/health")" = 200 ] || fail "/health must not need the key"
[ "$(code "$BASE/v1/models")" = 401 ] || fail "no key: $(cat "$TMP/resp")"
[ "$(json_get "$(cat "$TMP/resp")" 'j.error.code+"|"+j.error.type')" = "invalid_api_key|invalid_request_error" ] ||
  fail "401 body: $(cat "$TMP/resp")"
[ "$(code -H 'Authorization: Bearer wrong' "$BASE/v1/models")" = 401 ] || fail "wrong key accepted"
[ "$(code -H 'Authorization: Bearer s3cret-ke' "$BASE/v1/models")" = 401 ] || fail "key prefix accepted"
[ "$(code -H 'Authorization: Bearer s3cret-key' "$BASE/v1/models")" = 200 ] || fail "right key refused"
[ "$(code -H 'Authorization: Bearer s3cret-key' -H 'Content-Type: application/json' -d '{"messages":[{"role":"user","content":"x"}],"max_tokens":2}' \
  "$BASE/v1/chat/completions")" = 200 ] || fail "chat with the key: $(cat "$TMP/resp")"
[ "$(code -d '{"content":"x"}' "$BASE/tokenize")" = 401 ] || fail "tokenize without the key"
# an unauthenticated client learns nothing about which paths exist
[ "$(code "$BASE/v1/no-such-thing")" = 401 ] || fail "unknown path without the key: $(cat "$TMP/resp")"
[ "$(code -H 'Authorization: Bearer s3cret-key' "$BASE/v1/no-such-thing")" = 404 ] || fail "unknown path with the key"
[ "$(code -X DELETE "$BASE/v1/models")" = 401 ] || fail "wrong method without the key"
[ "$(code -X DELETE -H 'Authorization: Bearer s3cret-key' "$BASE/v1/models")" = 405 ] || fail "wrong method with the key"
[ "$(code -X POST "$BASE/health")" = 405 ] || fail "/health is public: wrong method is 405"
echo ok
