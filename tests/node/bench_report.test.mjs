// bench_report.test.mjs — the HTML report of `nightshift bench` opened from
// a file in headless Chromium, with the network cut off (it must be
// self-contained): for two servers of the same model the charts' SVG
// elements and the confidence intervals are there; against a server with
// other weights the identity gate's failure and the withheld ratios are
// shown, not hidden. Screenshots are kept as test artifacts.
import assert from 'node:assert/strict';
import { execFile, spawn } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { after, before, test } from 'node:test';
import { promisify } from 'node:util';
import { launch, screenshot } from './browser.mjs';
import { BIN, SHARED, sleep, startServer } from './server.mjs';

const run = promisify(execFile);
let a, b, c, browser, dir;
before(async () => {
  const cfg = path.join(SHARED, 'models', 'tiny-qwen3', 'config.json');
  [a, b, c] = await Promise.all([
    startServer({ args: ['--no-ssd-cache'] }),
    startServer({ args: ['--no-ssd-cache'] }),
    startDummy(cfg),
  ]);
  browser = await launch();
  dir = fs.mkdtempSync(path.join(os.tmpdir(), 'ns-bench-report-'));
});
after(async () => {
  await browser?.close();
  await Promise.all([a?.stop(), b?.stop(), c?.stop()]);
  if (dir) fs.rmSync(dir, { recursive: true, force: true });
});

// startServer always names a --model; this one has the same shape and
// tokenizer with other (random) weights, so its greedy outputs differ
async function startDummy(cfg) {
  const proc = spawn(BIN, ['serve', '--host', '127.0.0.1', '--port', '0', '--threads', '2', '--no-ssd-cache',
    '--dummy-weights', cfg], { stdio: ['ignore', 'ignore', 'pipe'] });
  let log = '';
  proc.stderr.on('data', (d) => (log += d));
  for (let i = 0; i < 300; i++) {
    const m = log.match(/listening on http:\/\/127\.0\.0\.1:(\d+)/);
    if (m) {
      const base = `http://127.0.0.1:${m[1]}`;
      try {
        if ((await fetch(base + '/health')).status === 200)
          return { base, stop: async () => { proc.kill('SIGKILL'); } };
      } catch {}
    }
    if (proc.exitCode !== null) break;
    await sleep(100);
  }
  proc.kill('SIGKILL');
  throw new Error('the --dummy-weights server did not start:\n' + log);
}

async function bench(urls, scenario, name, extra = []) {
  const html = path.join(dir, name + '.html'), json = path.join(dir, name + '.json');
  const args = ['bench', ...urls.flatMap((u) => ['--url', u]), '--scenario', scenario, '--blocks', '5', '--seed', '9',
    '--json', json, '--html', html, ...extra];
  await run(BIN, args, { timeout: 60000 });
  return { html, json: JSON.parse(fs.readFileSync(json, 'utf8')) };
}

// a page that may not fetch anything: every request other than the file fails the test
async function openOffline(file) {
  const ctx = await browser.newContext({ viewport: { width: 1200, height: 900 } });
  const outside = [];
  await ctx.route('**/*', (route) => {
    const u = route.request().url();
    if (u.startsWith('file://')) return route.continue();
    outside.push(u);
    return route.abort();
  });
  const page = await ctx.newPage();
  await page.goto('file://' + file);
  return { page, ctx, outside };
}

test('report of two identical servers: charts, intervals, identity pass', async () => {
  const r = await bench([a.base, b.base], 'cold-ttft-1k', 'same', ['--requests', '1']);
  assert.equal(r.json.identity.verdict, 'pass');
  const { page, ctx, outside } = await openOffline(r.html);
  assert.equal(await page.locator('#identity').getAttribute('data-verdict'), 'pass');
  // one per-block chart per metric, each with both servers' points
  assert.equal(await page.locator('svg.chart-metric').count(), r.json.metrics.length);
  assert.equal(await page.locator('svg.chart-metric[data-metric="ttft_s"] circle.point').count(), 10);
  assert.equal(await page.locator('svg.chart-metric polyline.series').count(), 2 * r.json.metrics.length);
  // the forest plot: an interval and an estimate per compared metric
  assert.equal(await page.locator('#forest line.ci').count(), 2);
  assert.equal(await page.locator('#forest circle.est').count(), 2);
  const row = await page.locator('#comparison tr', { hasText: 'ttft_s' }).innerText();
  const m = r.json.comparison.metrics.find((x) => x.name === 'ttft_s');
  // the table prints the JSON's ratio and bounds (%.4g)
  const g = (x) => String(Number(x.toPrecision(4)));
  assert.ok(row.includes(g(m.ratio)) && row.includes(g(m.ci_lo)) && row.includes(g(m.ci_hi)), row + ' vs ' + JSON.stringify(m));
  assert.equal(await page.locator('.withheld').count(), 0);
  assert.match(await page.locator('#provenance').innerText(), /commit/);
  // provenance under every figure: date, this binary's commit, machine, command
  const provs = await page.locator('figure .prov').allInnerTexts();
  assert.equal(provs.length, r.json.metrics.length);
  for (const p of provs) {
    assert.ok(p.includes(r.json.provenance.date) && /commit/.test(p) && p.includes('--scenario cold-ttft-1k'), p);
    assert.ok(p.includes(r.json.provenance.machine.cpu_model), p);
  }
  await screenshot(page, 'bench-report-same.png');
  assert.deepEqual(outside, []);
  await ctx.close();
});

test('report against other weights: the gate fails and every ratio is shown as withheld', async () => {
  const r = await bench([a.base, c.base], 'decode-1', 'other', ['--max-tokens', '8']);
  assert.equal(r.json.identity.verdict, 'fail');
  const { page, ctx, outside } = await openOffline(r.html);
  assert.equal(await page.locator('#identity').getAttribute('data-verdict'), 'fail');
  assert.match(await page.locator('#identity').innerText(), /greedy outputs differ/);
  assert.match(await page.locator('#comparison-withheld').innerText(), /identity gate failed/);
  const rows = page.locator('#comparison td.withheld');
  assert.equal(await rows.count(), r.json.comparison.metrics.length);
  assert.equal(await page.locator('#forest text.withheld').count(), r.json.comparison.metrics.length);
  assert.equal(await page.locator('#forest circle.est').count(), 0);
  // the per-block charts still show what each server measured
  assert.ok((await page.locator('svg.chart-metric circle.point').count()) > 0);
  await screenshot(page, 'bench-report-withheld.png');
  assert.deepEqual(outside, []);
  await ctx.close();
});
