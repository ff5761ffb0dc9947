// dashboard.test.mjs — GET /dashboard in a real browser (headless Chromium)
// while requests run: request rows appear (a prefilling one whose progress
// bar moves, a waiting one with its queue position, then decoding), KV usage
// per tier and the step charts are drawn; a screenshot is kept. Also the
// /v1/status document the page polls, and the API key rule (the page is
// open, its data is not).
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { launch, screenshot } from './browser.mjs';
import { sleep, startServer } from './server.mjs';

let srv, browser;
before(async () => {
  // small steps (16 tokens) so a long prompt prefills over many polls, and one
  // running slot so the next request waits in the queue
  srv = await startServer({ args: ['--max-batch-tokens', '16', '--max-running', '1', '--no-ssd-cache'] });
  browser = await launch();
});
after(async () => {
  await browser?.close();
  await srv?.stop();
});

const words = (n, tag) => `[${tag}]` + ' the cat sat on a mat and'.repeat(Math.ceil(n / 7));

function complete(prompt, maxTokens) {
  return fetch(srv.base + '/v1/completions', {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ prompt, max_tokens: maxTokens, temperature: 0, ignore_eos: true }),
  }).then((r) => r.json());
}

test('dashboard shows running requests, a moving prefill bar, the queue, KV tiers and step charts', async () => {
  const page = await browser.newPage({ viewport: { width: 1400, height: 900 } });
  const errors = [];
  page.on('pageerror', (e) => errors.push(String(e)));
  await page.goto(srv.base + '/dashboard?interval=120');
  await page.waitForSelector('#conn.ok', { timeout: 10000 });
  // a long prompt (many 16-token steps) and a second request that must wait
  const long = complete(words(5000, 'long'), 300);
  await sleep(50);
  const second = complete(words(200, 'second'), 8);

  const bar = page.locator('tr.req[data-state="prefilling"] progress.prefill').first();
  await bar.waitFor({ timeout: 15000 });
  const v1 = Number(await bar.getAttribute('value'));
  const max = Number(await bar.getAttribute('max'));
  assert.ok(max > 4000, `prefill total ${max}`);
  // the waiting request shows its place in the queue
  const waiting = page.locator('tr.req[data-state="waiting"]');
  await waiting.first().waitFor({ timeout: 10000 });
  assert.match(await waiting.first().innerText(), /queue #1/);
  let v2 = v1;
  for (let i = 0; i < 100 && v2 <= v1; i++) {
    await sleep(100);
    const b = page.locator('tr.req[data-state="prefilling"] progress.prefill').first();
    if ((await b.count()) === 0) break;
    v2 = Number(await b.getAttribute('value'));
  }
  assert.ok(v2 > v1, `the prefill bar moved: ${v1} -> ${v2} of ${max}`);
  // KV usage per tier: the device pool has pages held while a request runs
  const dev = page.locator('#tier-device .usage');
  assert.match(await dev.innerText(), /\d+ pages held, \d+ cached \/ \d+ pages/);
  assert.equal(await page.locator('#tier-ssd').getAttribute('data-enabled'), 'false');
  await screenshot(page, 'dashboard-running.png');
  // then decoding, with a rate
  const dec = page.locator('tr.req[data-state="decoding"]').first();
  await dec.waitFor({ timeout: 20000 });
  await page.waitForFunction(() => /\d/.test(document.querySelector('tr.req[data-state="decoding"] td.tps')?.textContent || ''), null, { timeout: 10000 });
  await Promise.all([long, second]);
  // after the steps the charts have series
  await page.waitForSelector('#chart-step path.series-mean', { timeout: 5000 });
  assert.ok((await page.locator('#chart-batch path.series-max').count()) === 1);
  await page.waitForSelector('#requests-empty:visible', { timeout: 5000 });
  await screenshot(page, 'dashboard-idle.png');
  assert.deepEqual(errors, []);
  await page.close();
});

test('/v1/status reports a cache break where a prompt diverged', async () => {
  const status = async () => (await fetch(srv.base + '/v1/status')).json();
  const before = (await status()).cache_breaks_total;
  const base = words(300, 'brk');
  await complete(base + ' alpha beta', 1);
  await complete(base + ' gamma delta', 1);
  // the engine publishes a snapshot every 100 ms: wait for the one after
  // both admissions (the first may break against earlier tests' prompts)
  let s = await status();
  for (let i = 0; i < 50 && s.cache_breaks_total < before + 2; i++) {
    await sleep(50);
    s = await status();
  }
  assert.equal(s.object, 'nightshift.status');
  assert.ok(s.cache_breaks_total >= before + 2, JSON.stringify(s.cache_breaks));
  const b = s.cache_breaks[0];
  // the second prompt shares the first one's text up to the new words
  assert.ok(b.diverged_at > 250 && b.diverged_at < b.prompt_tokens, JSON.stringify(b));
  assert.ok(b.cached_tokens <= b.diverged_at);
  assert.equal(b.cached_tokens_by_tier.device, b.cached_tokens);
  assert.ok(s.steps_per_second.length >= 1);
  assert.ok(s.kv.device.capacity_pages > 0);
});

test('with an API key the page loads but its data needs the key', async () => {
  const keyed = await startServer({ args: ['--api-key', 'sekrit', '--no-ssd-cache'] });
  try {
    assert.equal((await fetch(keyed.base + '/dashboard')).status, 200);
    assert.equal((await fetch(keyed.base + '/v1/status')).status, 401);
    const ok = await fetch(keyed.base + '/v1/status', { headers: { authorization: 'Bearer sekrit' } });
    assert.equal(ok.status, 200);
    const page = await browser.newPage();
    await page.goto(keyed.base + '/dashboard?interval=100');
    await page.waitForSelector('#key-form.show', { timeout: 5000 });
    assert.match(await page.locator('#conn').innerText(), /API key needed/);
    await page.fill('#key', 'sekrit');
    await page.click('#key-form button');
    await page.waitForSelector('#conn.ok', { timeout: 5000 });
    await page.close();
  } finally {
    await keyed.stop();
  }
});
