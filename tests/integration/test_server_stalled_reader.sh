#!/usr/bin/env bash
# A stream whose client stops reading (issue 11) never holds a thread: its
# tokens queue up to --stream-buffer (the socket's send queue counted);
# past that the generation is cancelled (logged once) and its thread ends;
# what was produced is still delivered when the client reads on (the
# stream then ends without [DONE]). Meanwhile another stream is served in
# full and /health answers.
cd "$(dirname "$0")/../.." && source tests/integration/common.bash
command -v python3 >/dev/null || fail "python3 not found"
start_server --stream-buffer 16K --timeout 30

threads() { ls "/proc/$SERVER_PID/task" | wc -l; }
# a warm-up stream, so every thread the server keeps is running
curl -sN -H 'Content-Type: application/json' \
  -d '{"messages":[{"role":"user","content":"hi"}],"max_tokens":4,"stream":true}' "$BASE/v1/chat/completions" >/dev/null
sleep 0.3
base=$(threads)

python3 - "$PORT" "$SERVER_PID" "$base" "$LOG" <<'PY' || fail "stalled reader"
import json, os, socket, sys, time
port, pid, base, log = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4]
def req(n, stream=True):
    body = json.dumps({'messages': [{'role': 'user', 'content': 'hi'}], 'max_tokens': n,
                       'ignore_eos': True, 'stream': stream}).encode()
    return (b'POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n'
            b'Content-Length: %d\r\n\r\n' % len(body) + body)
def threads():
    return len(os.listdir('/proc/%s/task' % pid))
def logged(what):
    with open(log, errors='replace') as f:
        return f.read().count(what)

# the stalled client: a small receive buffer, and it never reads
a = socket.socket()
a.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
a.connect(('127.0.0.1', port))
a.sendall(req(30000))
t0 = time.time()
while logged('stopped reading its stream') == 0:
    if time.time() - t0 > 15:
        print('FAIL: no cancellation within 15 s; threads', threads(), 'base', base); sys.exit(1)
    time.sleep(0.05)
print('cancelled after %.1f s' % (time.time() - t0))
# its thread ends; what was produced waits for the client
t1 = time.time()
while threads() > base and time.time() - t1 < 5:
    time.sleep(0.05)
print('threads', threads(), 'base', base)
if threads() > base:
    print('FAIL: the stalled stream still holds a thread'); sys.exit(1)
try:
    peek = a.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
except BlockingIOError:
    peek = b''
if not peek:
    print('FAIL: nothing was delivered to the stalled client'); sys.exit(1)

# another stream is served in full meanwhile
b = socket.create_connection(('127.0.0.1', port))
b.sendall(req(30))
b.settimeout(20)
got = b''
while b'data: [DONE]' not in got:
    d = b.recv(65536)
    if not d:
        break
    got += d
if b'data: [DONE]' not in got:
    print('FAIL: a second stream was not served while the first one stalled'); sys.exit(1)
b.close()
print('second stream complete')

# the stalled client reads at last: what was produced, then the end
# without [DONE] (the generation was cancelled)
a.settimeout(20)
data = b''
try:
    while True:
        d = a.recv(1 << 20)
        if not d:
            break
        data += d
except OSError as e:
    print('read ended with', e)
print('stalled client read', len(data), 'bytes')
if not data.startswith(b'HTTP/1.1 200') or b'"delta"' not in data:
    print('FAIL: the stalled client did not get its stream'); sys.exit(1)
if b'data: [DONE]' in data:
    print('FAIL: a cancelled stream ended with [DONE]'); sys.exit(1)
if logged('stopped reading its stream') != 1:
    print('FAIL: the warning was not logged exactly once'); sys.exit(1)
PY
# the generation was cancelled, not run to max_tokens
grep -q 'generated=30000' "$LOG" && fail "the stalled stream generated all its tokens"
health_ok
echo ok
