#!/usr/bin/env bash
# Idle peers cannot exhaust the server (issue 11): 2000 connections that
# sent half a request are held open while /health and a chat request still
# answer; they are closed once the request deadline (--request-timeout)
# passes, also when they dribble a byte now and then; near
# --max-connections the connections waiting longest for a request make
# room for new ones. The times printed are for the reader; nothing asserts
# on them except as generous timeouts.
cd "$(dirname "$0")/../.." && source tests/integration/common.bash
N=2000

# hold PORT N MODE: opens N connections that each send half a request head.
# MODE=hold: prints "open=<still open>" after /health and a chat request
# answered (with their times), then closes its connections.
# MODE=reap: waits (up to 60 s) until the server closed all of them and
# prints "closed=<n> after=<ms>".
# MODE=dribble: one connection sends a header byte every 300 ms; prints
# "closed after=<ms> sent=<bytes>" when the server closes it (60 s max).
hold() {
  node - "$@" <<'EOF'
const net = require('net');
const [port, n, mode] = [+process.argv[2], +process.argv[3], process.argv[4]];
const half = 'POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Le';
const socks = [];
let closed = 0;
const t0 = Date.now();
function open(i) {
  return new Promise((res, rej) => {
    const s = net.connect(port, '127.0.0.1', () => { s.write(half); res(); });
    s.on('error', (e) => { if (!s.readyState || s.connecting) rej(e); });
    s.on('close', () => closed++);
    socks.push(s);
  });
}
async function timed(what, f) {
  const t = Date.now();
  const r = await f();
  console.log(`${what} ${r} in ${Date.now() - t} ms`);
  return r;
}
(async () => {
  if (mode === 'dribble') {
    const s = net.connect(port, '127.0.0.1');
    const text = 'GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ' + 'a'.repeat(4000);
    let sent = 0, done = false;
    const iv = setInterval(() => { if (!done && sent < text.length) s.write(text[sent++]); }, 300);
    s.on('error', () => {});
    s.on('close', () => { done = true; clearInterval(iv); console.log(`closed after=${Date.now() - t0} sent=${sent}`); process.exit(0); });
    setTimeout(() => { console.log('still open after 60 s'); process.exit(1); }, 60000);
    return;
  }
  for (let i = 0; i < n; i += 100) await Promise.all(Array.from({ length: Math.min(100, n - i) }, (_, k) => open(i + k)));
  console.log(`connected=${socks.length} in ${Date.now() - t0} ms`);
  if (mode === 'reap') {
    const t = Date.now();
    while (closed < n && Date.now() - t < 60000) await new Promise((r) => setTimeout(r, 50));
    console.log(`closed=${closed} after=${Date.now() - t}`);
    process.exit(0);
  }
  const base = `http://127.0.0.1:${port}`;
  const sig = () => AbortSignal.timeout(10000);
  await timed('health', async () => (await fetch(base + '/health', { signal: sig() })).status);
  await timed('chat', async () => {
    const r = await fetch(base + '/v1/chat/completions', {
      method: 'POST', signal: sig(), headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ messages: [{ role: 'user', content: 'hi' }], max_tokens: 4 }),
    });
    return r.status + ':' + (await r.json()).choices[0].finish_reason;
  });
  console.log(`open=${socks.length - closed}`);
  for (const s of socks) s.destroy();
  process.exit(0);
})().catch((e) => { console.log('error', e.message); process.exit(1); });
EOF
}

# 1. 2000 half-sent requests held (deadline 30 s): /health and chat answer.
start_server --max-connections 4096
out=$(hold "$PORT" $N hold) || fail "holding $N connections: $out"
echo "$out"
grep -q "^connected=$N " <<<"$out" || fail "could not open $N connections: $out"
grep -q '^health 200 in' <<<"$out" || fail "/health did not answer with $N idle connections: $out"
grep -q '^chat 200:length in' <<<"$out" || fail "chat did not answer with $N idle connections: $out"
grep -q "^open=$N\$" <<<"$out" || fail "the idle connections were not held: $out"
health_ok

# 2. --request-timeout 2: all of them are closed after the deadline.
start_server --max-connections 4096 --request-timeout 2
out=$(hold "$PORT" $N reap) || fail "reap: $out"
echo "$out"
grep -q "^closed=$N " <<<"$out" || fail "idle connections were not closed after --request-timeout: $out"
# ... the deadline is for the whole request: a byte every 300 ms does not
# keep a connection open
out=$(hold "$PORT" 1 dribble) || fail "a dribbling connection was never closed: $out"
echo "dribble: $out"
sent=$(sed -n 's/.*sent=\([0-9]*\).*/\1/p' <<<"$out")
[ "${sent:-0}" -lt 4000 ] || fail "the dribbling connection sent its whole head: $out"
health_ok

# 3. --max-connections 64 with 300 idle connections: the ones waiting
# longest make room, /health still answers, a warning says so.
start_server --max-connections 64
out=$(hold "$PORT" 300 hold) || fail "eviction: $out"
echo "$out"
grep -q '^health 200 in' <<<"$out" || fail "/health did not answer at the connection limit: $out"
grep -q '^chat 200:length in' <<<"$out" || fail "chat did not answer at the connection limit: $out"
grep -q 'connections open: closing the ones waiting longest' "$LOG" || fail "no warning about the connection limit"
health_ok
echo ok
