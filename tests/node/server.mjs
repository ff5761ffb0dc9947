// server.mjs — starts a real `nightshift serve` for a test file and stops it.
//
// The binary is $NS_BIN (default build/nightshift), the assets $NS_SHARED
// (default tests/fixtures: models/, goldens/), both relative to the
// repository root. The server listens on 127.0.0.1 with --port 0 and we read
// the port from its log, so parallel test files never race for a port.
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import OpenAI from 'openai';

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');
export const SHARED = path.resolve(root, process.env.NS_SHARED || 'tests/fixtures');
export const BIN = path.resolve(root, process.env.NS_BIN || 'build/nightshift');
export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

const live = new Set();
const cacheDirs = new Set();
process.on('exit', () => {
  for (const p of live) p.kill('SIGKILL');
  for (const d of cacheDirs) fs.rmSync(d, { recursive: true, force: true });
});

export async function startServer({ model = 'tiny-qwen3', args = [] } = {}) {
  // serve's default SSD cache tier is $XDG_CACHE_HOME/nightshift: each
  // server gets its own, so what another test (or an earlier run, or the
  // user's own server) left there never turns a cold request into a cached one
  const cacheHome = fs.mkdtempSync(path.join(os.tmpdir(), 'ns-node-cache-'));
  const proc = spawn(
    BIN,
    ['serve', '--host', '127.0.0.1', '--port', '0', '--threads', '2', '--model', path.join(SHARED, 'models', model), ...args],
    { env: { ...process.env, NS_LOG_LEVEL: 'info', XDG_CACHE_HOME: cacheHome }, stdio: ['ignore', 'ignore', 'pipe'] },
  );
  cacheDirs.add(cacheHome);
  proc.on('exit', () => {
    fs.rmSync(cacheHome, { recursive: true, force: true });
    cacheDirs.delete(cacheHome);
  });
  live.add(proc);
  let log = '';
  let exited = null;
  proc.on('exit', (code, sig) => {
    exited = { code, sig };
    live.delete(proc);
  });
  const port = await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error('server did not report its port:\n' + log)), 30000);
    proc.stderr.on('data', (d) => {
      log += d;
      const m = log.match(/listening on http:\/\/127\.0\.0\.1:(\d+)/);
      if (m) {
        clearTimeout(timer);
        resolve(Number(m[1]));
      }
    });
    proc.on('exit', (code) => {
      clearTimeout(timer);
      reject(new Error(`server exited (${code}) during start-up:\n${log}`));
    });
  });
  const base = `http://127.0.0.1:${port}`;
  for (let i = 0; ; i++) {
    try {
      const r = await fetch(base + '/health');
      if (r.status === 200) break;
    } catch {}
    if (i > 300 || exited) throw new Error('server not ready:\n' + log);
    await sleep(100);
  }
  const client = new OpenAI({ baseURL: base + '/v1', apiKey: 'unused', maxRetries: 0, timeout: 120000 });
  return {
    base,
    client,
    proc,
    log: () => log,
    alive: () => exited === null,
    async post(p, body) {
      const r = await fetch(base + p, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: typeof body === 'string' ? body : JSON.stringify(body),
      });
      const text = await r.text();
      let json = null;
      try {
        json = JSON.parse(text);
      } catch {}
      return { status: r.status, json, text };
    },
    async stop() {
      if (exited) return exited;
      const done = new Promise((r) => proc.on('exit', (code, sig) => r({ code, sig })));
      proc.kill('SIGTERM');
      const t = setTimeout(() => proc.kill('SIGKILL'), 15000);
      const res = await done;
      clearTimeout(t);
      return res;
    },
  };
}
