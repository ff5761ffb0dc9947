#!/usr/bin/env bash
# SIGTERM / SIGINT: the server stops accepting, lets a running stream
# finish (within --shutdown-timeout), and exits 0; a second signal or the
# timeout cancels what is still running.
cd "$(dirname "$0")/../.." && source tests/integration/common.bash

# 1. SIGTERM while a short stream runs: the stream completes, exit 0.
start_server --shutdown-timeout 20
curl -sN -H 'Content-Type: application/json' -d '{"messages":[{"role":"user","content":"hi"}],"max_tokens":40,"stream":true}' \
  "$BASE/v1/chat/completions" >"$TMP/s1" &
CURL=$!
sleep 0.3
kill -TERM "$SERVER_PID"
wait "$CURL"
wait "$SERVER_PID"; rc=$?
[ $rc -eq 0 ] || fail "exit status $rc after SIGTERM"
grep -q 'data: \[DONE\]' "$TMP/s1" || fail "the running stream was cut: $(tail -c 300 "$TMP/s1")"
grep -q 'SIGTERM received' "$LOG" || fail "no shutdown log line"
curl -s -o /dev/null --max-time 2 "$BASE/health" && fail "still answering after exit"

# 2. SIGINT with a long generation and a short timeout: it is cancelled.
start_server --shutdown-timeout 1
curl -sN -H 'Content-Type: application/json' -d '{"messages":[{"role":"user","content":"hi"}],"max_tokens":30000,"ignore_eos":true,"stream":true}' \
  "$BASE/v1/chat/completions" >"$TMP/s2" &
CURL=$!
sleep 0.5
start=$(date +%s)
kill -INT "$SERVER_PID"
wait "$SERVER_PID"; rc=$?
wait "$CURL"
[ $rc -eq 0 ] || fail "exit status $rc after SIGINT"
[ $(( $(date +%s) - start )) -le 10 ] || fail "shutdown took too long"
grep -q '"error"' "$TMP/s2" || fail "a cancelled stream should end with an error event: $(tail -c 300 "$TMP/s2")"
echo ok
