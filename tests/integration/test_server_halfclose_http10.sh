#!/usr/bin/env bash
# Half-close on HTTP/1.0 (issue 11): a client that sends an HTTP/1.0
# request and then shuts down its sending side (shutdown(SHUT_WR), as
# `nc -N` or an old script does) still reads, so it gets its whole answer:
# HTTP/1.0 has no interim response to check with, so its end of stream is
# not taken for a departure. Streaming on HTTP/1.0 likewise gets every event
# and [DONE]. A 1.0 client that closes its socket costs the server nothing
# but the work: the server stays up and serves the next request.
cd "$(dirname "$0")/../.." && source tests/integration/common.bash
command -v python3 >/dev/null || fail "python3 not found"
start_server

# raw MODE STREAM: one HTTP/1.0 request; MODE half = shutdown(SHUT_WR)
# right after it, close = close the socket 200 ms later.
raw() {
  python3 - "$PORT" "$@" <<'PY'
import json, re, socket, sys, time
port, mode, stream = int(sys.argv[1]), sys.argv[2], sys.argv[3] == 'stream'
body = json.dumps({'messages': [{'role': 'user', 'content': 'hi'}], 'max_tokens': 40,
                   'ignore_eos': True, 'stream': stream}).encode()
s = socket.create_connection(('127.0.0.1', port))
s.sendall(b'POST /v1/chat/completions HTTP/1.0\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n'
          b'Content-Length: %d\r\n\r\n' % len(body) + body)
if mode == 'half':
    s.shutdown(socket.SHUT_WR)
else:
    time.sleep(0.2)
    s.close()
    print('closed')
    sys.exit(0)
s.settimeout(30)
out = b''
try:
    while True:
        d = s.recv(65536)
        if not d:
            break
        out += d
except OSError as e:
    print('socket error', e)
text = out.decode('utf-8', 'replace')
for m in re.finditer(r'^HTTP/1\.[01] (\d+)', text, re.M):
    print('status', m.group(1))
b = text.split('\r\n\r\n', 1)[1] if '\r\n\r\n' in text else ''
if not stream and b:
    j = json.loads(b)
    print('finish', j['choices'][0]['finish_reason'], 'tokens', j['usage']['completion_tokens'])
if stream:
    if 'data: [DONE]' in b:
        print('done')
    fin = re.findall(r'"finish_reason":"(\w+)"', b)
    if fin:
        print('finish', fin[-1])
PY
}

out=$(raw half whole)
echo "$out"
[ "$(tr '\n' ' ' <<<"$out")" = "status 200 finish length tokens 40 " ] ||
  fail "a half-closed HTTP/1.0 client did not get its whole answer: $out"
out=$(raw half stream)
echo "$out"
[ "$(tr '\n' ' ' <<<"$out")" = "status 200 done finish length " ] ||
  fail "a half-closed HTTP/1.0 streaming client did not get its whole stream: $out"
grep -q 'finish=client-gone' "$LOG" && fail "a half-closed HTTP/1.0 client was taken for gone"
grep -q ' 499 ' "$LOG" && fail "a half-closed HTTP/1.0 client got 499"

# a 1.0 client that closes: the server finishes (or drops) the work and
# goes on serving
raw close whole >/dev/null
for _ in $(seq 1 250); do
  [ "$(grep -c 'finish=' "$LOG")" -ge 3 ] && break
  sleep 0.02
done
health_ok
out=$(raw half whole)
[ "$(tr '\n' ' ' <<<"$out")" = "status 200 finish length tokens 40 " ] || fail "after a closed client: $out"
echo ok
