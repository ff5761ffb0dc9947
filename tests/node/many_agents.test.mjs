// many_agents.test.mjs — several agents on one server, over HTTP with the
// official openai client:
// - pressure: a KV pool for ~1.5 of three concurrent long requests; all
//   three complete with 200 (none aborted: the pool running dry pauses the
//   newest, which resumes later) and each output is token-identical to the
//   same request run alone;
// - two requests without max_tokens stream at the same time;
// - head-of-line: a 10-token request's first token arrives before a long
//   prompt that started prefilling first gets its own (fair prefill).
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { startServer } from './server.mjs';

function ids(n, seed) {
  const a = [1];
  let x = seed;
  for (let i = 1; i < n; i++) {
    x = (x * 1103515245 + 12345) % 2147483648;
    a.push(3 + ((x >> 8) % 2000));
  }
  return a;
}

async function complete(client, prompt, maxTokens) {
  const r = await client.completions.create({
    model: 'm',
    prompt,
    max_tokens: maxTokens,
    temperature: 0,
    ignore_eos: true,
    return_token_ids: true,
  });
  return r;
}

test('pressure: 3 long requests in a pool for 1.5 all complete, identical to solo runs', async () => {
  // tinystories-656k (context 512); each request needs 150 + 150 tokens;
  // the pool holds 480 = 1.6 requests
  const srv = await startServer({ model: 'tinystories-656k', args: ['--kv-tokens', '480', '--page-size', '16', '--no-ssd-cache'] });
  try {
    const prompts = [ids(150, 11), ids(150, 12), ids(150, 13)];
    const solo = [];
    for (const p of prompts) solo.push((await complete(srv.client, p, 150)).choices[0].token_ids);
    const together = await Promise.all(prompts.map((p) => complete(srv.client, p, 150)));
    for (let i = 0; i < 3; i++) {
      assert.equal(together[i].choices[0].finish_reason, 'length');
      assert.deepEqual(together[i].choices[0].token_ids, solo[i], `request ${i} differs from its solo run`);
    }
    const metrics = await (await fetch(srv.base + '/metrics')).text();
    assert.match(srv.log(), /paused \(KV pool full\)/, 'the pool never ran dry: the test proves nothing');
    assert.match(srv.log(), /resumed after pause/);
    assert.doesNotMatch(metrics, /nightshift_requests_cancelled_total [1-9]/);
  } finally {
    await srv.stop();
  }
});

test('two requests without max_tokens stream at the same time', async () => {
  const srv = await startServer({ model: 'tinystories-656k', args: ['--kv-tokens', '768', '--no-ssd-cache'] });
  try {
    const first = [null, null];
    const done = [null, null];
    const t0 = Date.now();
    await Promise.all(
      [0, 1].map(async (i) => {
        const stream = await srv.client.completions.create({
          model: 'm',
          prompt: ids(20, 40 + i),
          temperature: 0,
          ignore_eos: true,
          stream: true,
        });
        for await (const chunk of stream) {
          if (first[i] === null && chunk.choices?.[0]?.text !== undefined) first[i] = Date.now() - t0;
        }
        done[i] = Date.now() - t0;
      }),
    );
    assert.ok(first[0] < done[1] && first[1] < done[0], `one ran after the other: first ${first}, done ${done}`);
  } finally {
    await srv.stop();
  }
});

test('a short prompt is not stuck behind a long prefill', async () => {
  const srv = await startServer({ args: ['--no-ssd-cache'] });
  try {
    const t0 = Date.now();
    let longFirst = null;
    const long = (async () => {
      const stream = await srv.client.completions.create({
        model: 'm',
        prompt: ids(6000, 77),
        max_tokens: 2,
        stream: true,
      });
      for await (const chunk of stream) if (longFirst === null && chunk.choices?.length) longFirst = Date.now() - t0;
    })();
    await new Promise((r) => setTimeout(r, 300)); // the long prompt is prefilling now
    const ts = Date.now();
    const short = await srv.client.completions.create({ model: 'm', prompt: ids(10, 5), max_tokens: 1 });
    const shortFirst = Date.now() - t0;
    const shortLatency = Date.now() - ts;
    await long;
    console.log(`# short request answered ${shortLatency} ms after submit; long prompt's first token at ${longFirst} ms`);
    assert.equal(short.choices.length, 1);
    assert.ok(shortFirst < longFirst, `the short request (${shortFirst} ms) waited for the long prefill (${longFirst} ms)`);
  } finally {
    await srv.stop();
  }
});
