#!/usr/bin/env bash
# While draining after SIGTERM the server keeps listening: /health answers
# 503 {"status":"shutting_down"} (it used to refuse connections), other
# routes 503 shutting_down; the running stream is not disturbed, and once
# it is gone the server exits 0.
cd "$(dirname "$0")/../.." && source tests/integration/common.bash
start_server --shutdown-timeout 60
curl -sN -H 'Content-Type: application/json' \
  -d '{"messages":[{"role":"user","content":"hi"}],"max_tokens":30000,"ignore_eos":true,"stream":true}' \
  "$BASE/v1/chat/completions" >"$TMP/stream" &
CURL=$!
for _ in $(seq 1 500); do grep -q '"content"' "$TMP/stream" 2>/dev/null && break; sleep 0.02; done
grep -q '"content"' "$TMP/stream" || fail "the stream did not start"
kill -TERM "$SERVER_PID"
for _ in $(seq 1 500); do grep -q 'SIGTERM received' "$LOG" && break; sleep 0.02; done

st=$(curl -s --max-time 10 -o "$TMP/h" -w '%{http_code}' "$BASE/health")
[ "$st" = 503 ] || fail "/health while draining: status $st: $(cat "$TMP/h")"
[ "$(json_get "$(cat "$TMP/h")" 'j.status')" = shutting_down ] || fail "/health while draining: $(cat "$TMP/h")"
st=$(curl -s --max-time 10 -o "$TMP/h" -w '%{http_code}' "$BASE/v1/health")
[ "$st" = 503 ] || fail "/v1/health while draining: status $st"
post /v1/chat/completions '{"messages":[{"role":"user","content":"hi"}],"max_tokens":2}'
[ "$STATUS" = 503 ] || fail "chat while draining: status $STATUS: $BODY_OUT"
[ "$(json_get "$BODY_OUT" 'j.error.code')" = shutting_down ] || fail "chat while draining: $BODY_OUT"
st=$(curl -s --max-time 10 -o "$TMP/h" -w '%{http_code}' "$BASE/v1/models")
[ "$st" = 503 ] || fail "/v1/models while draining: status $st"
kill -0 "$SERVER_PID" || fail "the server exited while a stream was running"
n=$(wc -c <"$TMP/stream")
sleep 0.3
[ "$(wc -c <"$TMP/stream")" -gt "$n" ] || fail "the running stream stopped while draining"

kill "$CURL" # the last request goes away: the drain ends
wait "$CURL" 2>/dev/null
wait "$SERVER_PID"
rc=$?
[ $rc -eq 0 ] || fail "exit status $rc after the drain"
curl -s -o /dev/null --max-time 2 "$BASE/health" && fail "still answering after exit"
echo ok
