#!/usr/bin/env bash
# Waiting requests survive a short --timeout (issue 11): with --timeout 5
# and --max-running 1, a stream and a non-streaming request wait in the
# queue behind a long generation for longer than 5 s and then complete.
# The waiting stream gets a keep-alive comment every min(15, 5/3) s, so a
# client that gives up after 4 s without a byte (curl --speed-time 4) keeps
# reading; the non-streaming request waits on a suspended connection, which
# never times out.
cd "$(dirname "$0")/../.." && source tests/integration/common.bash
start_server --timeout 5 --max-running 1
H='Content-Type: application/json'

curl -sN -H "$H" -d '{"prompt":"hi","max_tokens":30000,"ignore_eos":true,"stream":true}' \
  "$BASE/v1/completions" >"$TMP/long" &
LONG=$!
for _ in $(seq 1 500); do grep -q '"text"' "$TMP/long" 2>/dev/null && break; sleep 0.02; done
grep -q '"text"' "$TMP/long" || fail "the long generation did not start"

curl -sN --speed-limit 1 --speed-time 4 -H "$H" \
  -d '{"messages":[{"role":"user","content":"hi"}],"max_tokens":4,"stream":true}' \
  "$BASE/v1/chat/completions" >"$TMP/queued_stream" &
QS=$!
curl -s --max-time 120 -H "$H" -d '{"messages":[{"role":"user","content":"hi"}],"max_tokens":4}' \
  "$BASE/v1/chat/completions" >"$TMP/queued_whole" &
QW=$!

# wait until the stream has waited longer than --timeout: 4 comments at
# least 5/3 s apart
for _ in $(seq 1 3000); do
  [ "$(grep -c '^: waiting, queue position' "$TMP/queued_stream")" -ge 4 ] && break
  kill -0 "$QS" 2>/dev/null || break
  sleep 0.02
done
n=$(grep -c '^: waiting, queue position' "$TMP/queued_stream")
echo "keep-alive comments while queued: $n"
[ "$n" -ge 4 ] || fail "the queued stream got $n waiting comments: $(head -c 300 "$TMP/queued_stream")"
grep -q '"content":"[^"]' "$TMP/queued_stream" && fail "the queued stream ran before the long one ended"

kill "$LONG" # the long generation's client leaves; the queue moves
wait "$LONG" 2>/dev/null
wait "$QS"
rc=$?
[ $rc -eq 0 ] || fail "the queued stream ended with curl status $rc: $(tail -c 300 "$TMP/queued_stream")"
grep -q '^data: \[DONE\]' "$TMP/queued_stream" || fail "the queued stream did not complete: $(tail -c 300 "$TMP/queued_stream")"
grep -q '"finish_reason":"length"' "$TMP/queued_stream" || fail "no finish_reason in the queued stream"
wait "$QW" || fail "the queued non-streaming request failed"
[ "$(json_get "$(cat "$TMP/queued_whole")" 'j.choices[0].finish_reason')" = length ] ||
  fail "the queued non-streaming request: $(head -c 300 "$TMP/queued_whole")"
health_ok
echo ok
