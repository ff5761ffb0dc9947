#!/usr/bin/env bash
# Logs are safe by default (issue 11): a secret planted in a prompt never
# reaches the log at the default level (INFO), even when the prompt
# diverges from a cached one; a URL with %0d%0a and %1b in it yields one
# log line, with the control characters escaped (\x0d, \x0a, \x1b), so a
# request cannot forge log lines; every line of a generation carries its id.
set -u
cd "$(dirname "$0")/../.." && source tests/integration/common.bash
start_server --model "$NS_SHARED/models/tinystories-656k" --no-ssd-cache
SECRET="planted-secret-7f3a9c"
post /v1/completions "{\"prompt\":\"Once upon a time my password was $SECRET and\",\"max_tokens\":4}"
[ "$STATUS" = 200 ] || fail "completion: $STATUS $BODY_OUT"
post /v1/completions "{\"prompt\":\"Once upon a time my password was $SECRET but\",\"max_tokens\":4}"
[ "$STATUS" = 200 ] || fail "second completion: $STATUS $BODY_OUT"
curl -s -g -o /dev/null -H 'Content-Type: application/json' -d '{}' "$BASE/v1/x%0d%0aFAKE-LINE%1b[31m"
sleep 0.3
! grep -q "$SECRET" "$LOG" || fail "the planted secret is in the log"
grep -q "diverged from the cache at token" "$LOG" || fail "the divergence line is missing"
[ "$(grep -c 'FAKE-LINE' "$LOG")" = 1 ] || fail "the forged URL did not give exactly one line"
grep 'FAKE-LINE' "$LOG" | grep -qF '\x0d\x0aFAKE-LINE\x1b' || fail "control characters not escaped: $(grep FAKE-LINE "$LOG")"
! grep -q "$(printf '\r')" "$LOG" || fail "a raw CR in the log"
! grep -q "$(printf '\033')" "$LOG" || fail "a raw ESC in the log"
! grep -q '^FAKE-LINE' "$LOG" || fail "a forged line starts with the injected text"
grep -E 'INFO  \[cmpl-[A-Za-z0-9]+\] completion cmpl-' "$LOG" >/dev/null || fail "no request id on the completion line"
echo ok
