// browser.mjs — headless Chromium for the browser tests (dashboard, bench
// report): the Debian package's /usr/bin/chromium (scripts/setup installs
// it; $NS_CHROMIUM overrides), driven by the pinned playwright-core — no
// browser download. Screenshots are test artifacts: they go to
// $NS_TEST_ARTIFACTS, default build/test-artifacts/ (git-ignored), and
// their path is printed.
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { chromium } from 'playwright-core';

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');
export const ARTIFACTS = path.resolve(root, process.env.NS_TEST_ARTIFACTS || 'build/test-artifacts');
const EXE = process.env.NS_CHROMIUM || '/usr/bin/chromium';

export async function launch() {
  if (!fs.existsSync(EXE)) throw new Error(`${EXE} missing: run scripts/setup (Debian package chromium)`);
  // --no-sandbox: the suite may run as root, where Chromium's sandbox refuses to start
  return chromium.launch({ executablePath: EXE, args: ['--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage'] });
}

export async function screenshot(page, name) {
  fs.mkdirSync(ARTIFACTS, { recursive: true });
  const file = path.join(ARTIFACTS, name);
  await page.screenshot({ path: file, fullPage: true });
  console.log(`# screenshot: ${file}`);
  return file;
}
