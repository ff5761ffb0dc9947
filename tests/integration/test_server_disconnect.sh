#!/usr/bin/env bash
# A client that disconnects cancels its generation (streaming and not), the
# server logs it, and other clients are unaffected.
cd "$(dirname "$0")/../.." && source tests/integration/common.bash
start_server

long='{"messages":[{"role":"user","content":"hi"}],"max_tokens":30000,"ignore_eos":true'
curl -sN --max-time 1 -H 'Content-Type: application/json' -d "$long,\"stream\":true}" "$BASE/v1/chat/completions" >/dev/null
curl -s --max-time 1 -H 'Content-Type: application/json' -d "$long}" "$BASE/v1/chat/completions" >/dev/null
# both generations must end long before 30000 tokens
for _ in $(seq 1 50); do
  n=$(grep -c 'finish=client-gone' "$LOG")
  [ "$n" -ge 2 ] && break
  sleep 0.1
done
[ "$(grep -c 'finish=client-gone' "$LOG")" -ge 2 ] || fail "disconnects were not noticed"
running=$(curl -s "$BASE/metrics" | sed -n 's/^nightshift_requests_running //p')
for _ in $(seq 1 50); do
  [ "$running" = 0 ] && break
  sleep 0.1
  running=$(curl -s "$BASE/metrics" | sed -n 's/^nightshift_requests_running //p')
done
[ "$running" = 0 ] || fail "requests still running after the clients left: $running"
gone=$(curl -s "$BASE/metrics" | sed -n 's/^nightshift_http_client_disconnects_total //p')
[ "${gone:-0}" -ge 2 ] || fail "disconnects not counted: $gone"
post /v1/chat/completions '{"messages":[{"role":"user","content":"hi"}],"max_tokens":4}'
[ "$STATUS" = 200 ] || fail "server unusable after disconnects: $STATUS"
echo ok
