#!/usr/bin/env bash
# Half-close (issue 11): a client that shuts down its sending side after the
# request (shutdown(SHUT_WR)) still reads, so it gets its whole answer
# (non-streaming on HTTP/1.1: after an interim "100 Continue", the server's
# check that it is still there; streaming: every event and [DONE]). A
# client that closes its socket is still noticed at once and its
# generation cancelled.
cd "$(dirname "$0")/../.." && source tests/integration/common.bash
start_server

# raw MODE STREAM: one request over a raw socket; MODE half = shutdown(SHUT_WR)
# after the request, close = close the socket 200 ms later. Prints the
# status lines and, for a whole answer, the finish reason and [DONE].
raw() {
  node - "$PORT" "$@" <<'EOF'
const net = require('net');
const [port, mode, stream] = [+process.argv[2], process.argv[3], process.argv[4] === 'stream'];
const body = JSON.stringify({ messages: [{ role: 'user', content: 'hi' }], max_tokens: 40, ignore_eos: true, stream });
const s = net.connect(port, '127.0.0.1', () => {
  s.write(`POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n` +
          `Content-Length: ${Buffer.byteLength(body)}\r\nConnection: close\r\n\r\n${body}`);
  if (mode === 'half') s.end();
  else setTimeout(() => s.destroy(), 200);
});
let out = '';
s.on('data', (d) => (out += d));
s.on('error', (e) => console.log('socket error ' + e.code));
const timer = setTimeout(() => { console.log('no end after 60 s'); process.exit(1); }, 60000);
s.on('close', () => {
  clearTimeout(timer);
  for (const m of out.matchAll(/^HTTP\/1\.1 (\d+)/gm)) console.log('status ' + m[1]);
  const i = out.indexOf('\r\n\r\n', out.lastIndexOf('HTTP/1.1 '));
  const b = i < 0 ? '' : out.slice(i + 4);
  if (!stream && b) {
    const j = JSON.parse(b);
    console.log('finish ' + j.choices[0].finish_reason + ' tokens ' + j.usage.completion_tokens);
  }
  if (stream) {
    if (b.includes('data: [DONE]')) console.log('done');
    const last = [...b.matchAll(/"finish_reason":"(\w+)"/g)].pop();
    if (last) console.log('finish ' + last[1]);
  }
});
EOF
}

out=$(raw half whole)
echo "$out"
[ "$(tr '\n' ' ' <<<"$out")" = "status 100 status 200 finish length tokens 40 " ] ||
  fail "a half-closed non-streaming client did not get its whole answer: $out"
out=$(raw half stream)
echo "$out"
[ "$(tr '\n' ' ' <<<"$out")" = "status 200 done finish length " ] ||
  fail "a half-closed streaming client did not get its whole stream: $out"
n=$(grep -c 'finish=client-gone' "$LOG")
[ "$n" = 0 ] || fail "a half-closed client was taken for gone"

# a client that closes its socket is gone: both generations are cancelled
long() {
  node - "$PORT" "$1" <<'EOF'
const net = require('net');
const [port, stream] = [+process.argv[2], process.argv[3] === 'stream'];
const body = JSON.stringify({ messages: [{ role: 'user', content: 'hi' }], max_tokens: 30000, ignore_eos: true, stream });
const s = net.connect(port, '127.0.0.1', () => {
  s.write(`POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n` +
          `Content-Length: ${Buffer.byteLength(body)}\r\n\r\n${body}`);
  setTimeout(() => s.destroy(), 300);
});
s.on('error', () => {});
s.on('close', () => process.exit(0));
EOF
}
long whole
long stream
for _ in $(seq 1 500); do
  [ "$(grep -c 'finish=client-gone' "$LOG")" -ge 2 ] && break
  sleep 0.02
done
[ "$(grep -c 'finish=client-gone' "$LOG")" -ge 2 ] || fail "closed clients were not noticed: $(grep finish= "$LOG")"
health_ok
echo ok
