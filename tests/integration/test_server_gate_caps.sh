#!/usr/bin/env bash
# Connection caps answered by the gate (issue 11): past
# --max-connections-per-peer a client address gets 429 too_many_connections
# in the JSON error shape (not a silent close), and a slot freed by a
# closed connection is usable again; at --max-connections with every
# connection busy (nothing waiting for a request that could make room) a
# new connection gets 503 too_many_connections; the server keeps serving.
cd "$(dirname "$0")/../.." && source tests/integration/common.bash
command -v python3 >/dev/null || fail "python3 not found"

caps() {
  python3 - "$PORT" "$1" <<'PY'
import json, socket, sys, time
port, mode = int(sys.argv[1]), sys.argv[2]
def reply(s, timeout=10):
    s.settimeout(timeout)
    out = b''
    try:
        while True:
            d = s.recv(65536)
            if not d:
                break
            out += d
    except OSError:
        pass
    h, _, b = out.partition(b'\r\n\r\n')
    status = h.split(b' ')[1].decode() if b' ' in h else 'none'
    try:
        code = json.loads(b)['error']['code']
    except (ValueError, KeyError, TypeError):
        code = 'notjson'
    return status + ' ' + code
def stream_req(n):
    body = json.dumps({'messages': [{'role': 'user', 'content': 'hi'}], 'max_tokens': n,
                       'ignore_eos': True, 'stream': True}).encode()
    return (b'POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n'
            b'Content-Length: %d\r\n\r\n' % len(body) + body)
if mode == 'peer':
    held = [socket.create_connection(('127.0.0.1', port)) for _ in range(3)]
    for s in held:
        s.sendall(b'GET /health HTTP/1.1\r\nHo')   # waiting for the rest of the head
    time.sleep(0.3)
    extra = socket.create_connection(('127.0.0.1', port))
    print('4th:', reply(extra))
    held[0].close()
    time.sleep(0.3)
    again = socket.create_connection(('127.0.0.1', port))
    again.sendall(b'GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n')
    r = reply(again)
    print('after a close:', r.split(' ')[0])
else:
    busy = []
    for _ in range(16):
        # one at a time, each answering (its response started) before the
        # next: near the cap, connections still sending their request are
        # the ones closed to make room
        s = socket.create_connection(('127.0.0.1', port))
        s.sendall(stream_req(100000))
        s.settimeout(20)
        s.recv(1)
        busy.append(s)
    extra = socket.create_connection(('127.0.0.1', port))
    print('17th:', reply(extra))
    for s in busy:
        s.close()
PY
}

start_server --max-connections-per-peer 3
out=$(caps peer) || fail "peer cap: $out"
echo "$out"
grep -q '^4th: 429 too_many_connections$' <<<"$out" || fail "the 4th connection of a peer was not refused with 429: $out"
grep -q '^after a close: 200$' <<<"$out" || fail "a freed slot was not usable: $out"
health_ok

start_server --max-connections 16 --max-running 16
out=$(caps total) || fail "total cap: $out"
echo "$out"
grep -q '^17th: 503 too_many_connections$' <<<"$out" || fail "a connection past --max-connections was not refused with 503: $out"
for _ in $(seq 1 100); do
  [ "$(curl -s -o /dev/null -w '%{http_code}' "$BASE/health")" = 200 ] && break
  sleep 0.1
done
health_ok
echo ok
