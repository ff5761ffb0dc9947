// robustness.test.mjs — the server stays up whatever it is sent: randomly
// mutated chat/completions requests (every field replaced by values of the
// wrong type, out of range, deeply nested, huge) and raw garbage bodies
// are answered with 200 or a well-formed 4xx, never a 5xx or a crash.
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { startServer } from './server.mjs';

let srv;
before(async () => {
  srv = await startServer();
});
after(async () => {
  const r = await srv?.stop();
  assert.equal(r?.code, 0, 'server exit status after SIGTERM');
});

function rng(seed) {
  return () => {
    seed = (seed + 0x6d2b79f5) | 0;
    let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

const weird = [
  null, true, false, 0, -1, 1, 2, 1.5, -1e300, 1e300, 2 ** 53, -(2 ** 63), '', 'x', '\u0000', '\ud7ff\ue000',
  '<tool_call>', '<think>', [], [1, 2], [[]], {}, { a: 1 }, { type: 'text', text: 'hi' }, { type: 'image_url' },
  'a'.repeat(5000), Array.from({ length: 40 }, () => 'x'), JSON.parse('[' .repeat(60) + ']'.repeat(60)),
];

const base = () => ({
  model: 'm',
  messages: [
    { role: 'system', content: 'sys' },
    { role: 'user', content: [{ type: 'text', text: 'a' }, { type: 'text', text: 'b' }] },
    { role: 'assistant', content: null, tool_calls: [{ id: 'c1', type: 'function', function: { name: 'f', arguments: '{}' } }] },
    { role: 'tool', tool_call_id: 'c1', content: 'r' },
  ],
  tools: [{ type: 'function', function: { name: 'f', parameters: { type: 'object' } } }],
  tool_choice: 'auto',
  max_tokens: 2,
  temperature: 0.5,
  top_p: 0.9,
  stop: ['\n\n'],
  seed: 1,
  logprobs: true,
  top_logprobs: 1,
  stream: false,
  stream_options: { include_usage: true },
  chat_template_kwargs: { enable_thinking: false },
  response_format: { type: 'text' },
});

// every path to a value inside o
function paths(o, pre = []) {
  const out = [pre];
  if (o && typeof o === 'object') for (const k of Object.keys(o)) out.push(...paths(o[k], [...pre, k]));
  return out;
}

function setPath(o, p, v) {
  if (p.length === 0) return v;
  let cur = o;
  for (const k of p.slice(0, -1)) cur = cur[k];
  cur[p.at(-1)] = v;
  return o;
}

function tame(b) {
  // keep generations short whatever the mutation did
  if (b && typeof b === 'object' && !Array.isArray(b)) {
    for (const k of ['max_tokens', 'max_completion_tokens'])
      if (typeof b[k] === 'number' && b[k] > 4) b[k] = 4;
    const unset = (v) => v === null || v === undefined; // null means "as many as fit"
    if (unset(b.max_tokens) && unset(b.max_completion_tokens)) b.max_tokens = 4;
  }
  return b;
}

async function check(p, body, label) {
  const r = await srv.post(p, body);
  assert.ok(r.status < 500, `${label}: status ${r.status}: ${r.text.slice(0, 300)}`);
  if (r.status >= 400) {
    assert.equal(typeof r.json?.error?.message, 'string', `${label}: ${r.text.slice(0, 300)}`);
    assert.ok('param' in r.json.error && 'code' in r.json.error && typeof r.json.error.type === 'string');
  } else if (!/"stream":true/.test(typeof body === 'string' ? body : JSON.stringify(body))) {
    assert.ok(r.json, `${label}: 200 without JSON`);
  }
}

test('randomly mutated requests never get a 5xx', async () => {
  const rand = rng(424242);
  const pick = (a) => a[Math.floor(rand() * a.length)];
  for (let i = 0; i < 250; i++) {
    let b = base();
    const n = 1 + Math.floor(rand() * 3);
    for (let k = 0; k < n; k++) b = setPath(b, pick(paths(b)), structuredClone(pick(weird)));
    b = tame(b);
    const p = pick(['/v1/chat/completions', '/v1/chat/completions', '/v1/completions', '/apply-template', '/tokenize']);
    if (p === '/v1/completions' && b && typeof b === 'object' && !Array.isArray(b) && !('prompt' in b)) b.prompt = pick(['hi', [1, 2], ...weird]);
    if (p === '/tokenize' && b && typeof b === 'object' && !Array.isArray(b)) b.content = pick(['hi', ...weird]);
    await check(p, JSON.stringify(b), `#${i} ${p} ${JSON.stringify(b).slice(0, 200)}`);
  }
  assert.ok(srv.alive());
});

test('garbage bodies', async () => {
  const rand = rng(7);
  for (let i = 0; i < 60; i++) {
    const len = Math.floor(rand() * 200);
    const bytes = Buffer.from(Array.from({ length: len }, () => Math.floor(rand() * 256)));
    const r = await fetch(srv.base + '/v1/chat/completions', { method: 'POST', body: bytes });
    assert.equal(r.status, 400);
    const j = await r.json();
    assert.equal(typeof j.error.message, 'string');
  }
  for (const s of ['{"messages":[{"role":"user","content":"\\ud800"}]}', '{"a":1e999}', '{"a":123456789012345678901234567890}', '{"messages":[]}x', '\ufeff{}']) {
    const r = await srv.post('/v1/chat/completions', s);
    assert.ok(r.status >= 400 && r.status < 500, s + ' -> ' + r.status);
  }
  assert.equal((await fetch(srv.base + '/health')).status, 200);
});
