// concurrency.test.mjs — 200 mixed requests from 16 concurrent clients, a
// fifth of them abandoned mid-way (AbortController): the server must not
// crash, every completed response must be well formed, and once everyone
// is gone nothing may still be running.
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { APIUserAbortError } from 'openai';
import { sleep, startServer } from './server.mjs';

let srv;
before(async () => {
  srv = await startServer({ args: ['--max-running', '16'] });
});
after(async () => {
  const r = await srv?.stop();
  assert.equal(r?.code, 0, 'server exit status after SIGTERM');
});

// deterministic pseudo-random choices (mulberry32)
function rng(seed) {
  return () => {
    seed = (seed + 0x6d2b79f5) | 0;
    let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

const prompts = ['Hi', 'Write a story', 'List the files', 'What is 2+2?', 'Explain paging in one line'];

function checkUsage(u, maxTokens) {
  assert.equal(typeof u.prompt_tokens, 'number');
  assert.ok(u.completion_tokens >= 0 && u.completion_tokens <= maxTokens, JSON.stringify(u));
  assert.equal(u.total_tokens, u.prompt_tokens + u.completion_tokens);
  assert.ok(u.prompt_tokens_details.cached_tokens >= 0 && u.prompt_tokens_details.cached_tokens < u.prompt_tokens);
}

// (/health answered 503 while the model loaded: only later ones count)
const count5xx = (m) => Number(m.match(/^nightshift_http_responses_total\{class="5xx"\} (\d+)$/m)[1]);

// The client's stream iterator ends quietly when its request is aborted.
function cut(abort, finished, stats) {
  if (abort?.signal.aborted && !finished) {
    stats.aborted++;
    return true;
  }
  return false;
}

async function one(i, rand, stats) {
  const kind = Math.floor(rand() * 5);
  const maxTokens = 1 + Math.floor(rand() * 16);
  const abort = rand() < 0.2 ? new AbortController() : null;
  const content = prompts[Math.floor(rand() * prompts.length)] + ` #${i}`;
  const opts = abort ? { signal: abort.signal } : {};
  if (abort) setTimeout(() => abort.abort(), Math.floor(rand() * 300));
  const params = { model: 'm', max_tokens: maxTokens, temperature: rand() < 0.5 ? 0 : 0.9, seed: i };
  try {
    if (kind === 0) {
      const r = await srv.client.chat.completions.create({ ...params, messages: [{ role: 'user', content }] }, opts);
      assert.match(r.id, /^chatcmpl-/);
      assert.equal(r.choices[0].message.role, 'assistant');
      assert.equal(typeof r.choices[0].message.content, 'string');
      assert.ok(['stop', 'length'].includes(r.choices[0].finish_reason));
      checkUsage(r.usage, maxTokens);
    } else if (kind === 1) {
      const s = await srv.client.chat.completions.create(
        { ...params, messages: [{ role: 'user', content }], stream: true, stream_options: { include_usage: true } },
        opts,
      );
      const chunks = [];
      for await (const c of s) chunks.push(c);
      if (cut(abort, chunks.some((c) => c.choices[0]?.finish_reason), stats)) return;
      assert.equal(new Set(chunks.map((c) => c.id)).size, 1);
      assert.equal(chunks[0].choices[0].delta.role, 'assistant');
      assert.equal(chunks.filter((c) => c.choices[0]?.finish_reason).length, 1);
      checkUsage(chunks.at(-1).usage, maxTokens);
    } else if (kind === 2) {
      const r = await srv.client.completions.create({ ...params, prompt: content }, opts);
      assert.equal(typeof r.choices[0].text, 'string');
      checkUsage(r.usage, maxTokens);
    } else if (kind === 3) {
      const s = await srv.client.completions.create({ ...params, prompt: [9707, 1879, 11, 220], stream: true }, opts);
      let fin = 0;
      for await (const c of s) if (c.choices[0]?.finish_reason) fin++;
      if (cut(abort, fin > 0, stats)) return;
      assert.equal(fin, 1);
    } else {
      // an invalid request in the mix: a 400, never a crash
      await assert.rejects(
        srv.client.chat.completions.create({ ...params, messages: [{ role: 'user', content }], n: 3 }, opts),
        (e) => e instanceof APIUserAbortError || (e.status === 400 && e.error?.param === 'n'),
      );
    }
    stats.ok++;
  } catch (e) {
    if (abort && (e instanceof APIUserAbortError || e.name === 'AbortError')) {
      stats.aborted++;
      return;
    }
    throw e;
  }
}

test('200 mixed requests, 16 concurrent clients, random disconnects', async () => {
  const before5xx = count5xx(await fetch(srv.base + '/metrics').then((r) => r.text()));
  const rand = rng(20261129);
  const stats = { ok: 0, aborted: 0 };
  let next = 0;
  const workers = Array.from({ length: 16 }, async () => {
    while (next < 200) {
      const i = next++;
      await one(i, rand, stats);
    }
  });
  await Promise.all(workers);
  assert.equal(stats.ok + stats.aborted, 200);
  assert.ok(stats.aborted > 0, 'some requests should have been abandoned');
  assert.ok(srv.alive(), 'server died');
  assert.equal((await fetch(srv.base + '/health')).status, 200);
  // abandoned generations are cancelled: nothing keeps running
  let m = '';
  for (let k = 0; k < 100; k++) {
    m = await fetch(srv.base + '/metrics').then((r) => r.text());
    if (/^nightshift_requests_running 0$/m.test(m) && /^nightshift_requests_waiting 0$/m.test(m)) break;
    await sleep(100);
  }
  assert.match(m, /^nightshift_requests_running 0$/m);
  assert.match(m, /^nightshift_requests_waiting 0$/m);
  assert.equal(count5xx(m), before5xx, 'no request may end in a 5xx');
  // and the server still answers normally
  const r = await srv.client.chat.completions.create({ model: 'm', messages: [{ role: 'user', content: 'Hi' }], max_tokens: 2 });
  assert.equal(r.usage.completion_tokens, 2);
});
