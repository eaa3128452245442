// The first page after signing in, as a browser with an empty cache gets it: the bytes on the wire (each response's
// encoded length, headers included; the live streams, which do not end, are left out) and the time from navigation
// to an interactive page (hydrated: `html[data-hydrated]`); then the same page again, with the cache that the first
// visit filled. The browser test (portal.mjs) checks it with its signed-in session; run alone, it measures a
// server binary (the demo, signed in with the link `serve` prints) and prints the median of several visits:
//
//   node server/tests/browser/first-page.mjs --tessera target/demo/tessera [--site target/site/pkg] [--runs 5]
//
// Needs Chromium (CHROMIUM, default /usr/bin/chromium) and `npm ci --prefix server/tests/browser`.
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import readline from 'node:readline';
import { fileURLToPath } from 'node:url';

// One visit pair in a fresh context of `browser` (with `contextOptions`, e.g. a signed-in storage state).
export async function firstPage(browser, contextOptions, base) {
  const context = await browser.newContext({ viewport: { width: 1280, height: 800 }, ...contextOptions });
  try {
    const page = await context.newPage();
    const cdp = await context.newCDPSession(page);
    await cdp.send('Network.enable');
    let bytes = 0;
    const assets = {};
    cdp.on('Network.loadingFinished', (e) => { bytes += e.encodedDataLength; });
    cdp.on('Network.responseReceived', (e) => {
      const name = new URL(e.response.url).pathname;
      if (!name.startsWith('/pkg/') || assets[name]) return;
      const h = Object.fromEntries(Object.entries(e.response.headers).map(([k, v]) => [k.toLowerCase(), v]));
      assets[name] = `${e.response.status} ${h['content-encoding'] || 'identity'} ${h['cache-control'] || ''}`.trim();
    });
    const visit = async () => {
      bytes = 0;
      const t0 = Date.now();
      await page.goto(`${base}/`);
      await page.locator('html[data-hydrated]').waitFor({ state: 'attached' });
      const ms = Date.now() - t0;
      await page.waitForTimeout(1500);
      return { bytes, ms };
    };
    const first = await visit();
    const firstAssets = { ...assets };
    const again = await visit();
    return {
      first_bytes: first.bytes,
      first_interactive_ms: first.ms,
      again_bytes: again.bytes,
      again_interactive_ms: again.ms,
      assets: firstAssets,
    };
  } finally {
    await context.close();
  }
}

// A loopback port nobody listens on now.
export async function freePort() {
  return new Promise((resolve, reject) => {
    const s = net.createServer();
    s.listen(0, '127.0.0.1', () => {
      const { port } = s.address();
      s.close(() => resolve(port));
    });
    s.on('error', reject);
  });
}

// The repository's root, and `--name value` of this process's arguments.
export const repoRoot = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../..');
export function arg(name, fallback) {
  const i = process.argv.indexOf(name);
  return i >= 2 ? process.argv[i + 1] : fallback;
}

async function main() {
  const root = repoRoot;
  const tessera = path.resolve(root, arg('--tessera', 'target/demo/tessera'));
  const site = arg('--site', '');
  const runs = Number(arg('--runs', '5'));
  const { chromium } = await import('playwright-core');
  const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'tessera-first-page-'));
  const port = await freePort();
  const base = `http://127.0.0.1:${port}`;
  const env = { ...process.env };
  for (const k of ['TESSERA_LOG', 'RUST_LOG', 'TESSERA_BOOTSTRAP_TOKEN', 'TESSERA_BOOTSTRAP_PASSWORD']) delete env[k];
  if (site) env.TESSERA_SITE_DIR = path.resolve(root, site);
  const server = spawn(tessera, ['serve', '--demo', '--listen', `127.0.0.1:${port}`, '--data-dir', path.join(tmp, 'data')], {
    stdio: ['ignore', 'pipe', 'inherit'],
    env,
  });
  process.on('exit', () => { try { server.kill('SIGTERM'); } catch { /* gone */ } });
  const link = await new Promise((resolve, reject) => {
    readline.createInterface({ input: server.stdout }).on('line', (line) => {
      const m = line.trim().match(/^as admin\s+(\S+)$/);
      if (m) resolve(m[1]);
    });
    server.once('exit', (code) => reject(new Error(`tessera exited (${code})`)));
  });
  const browser = await chromium.launch({
    executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
    args: ['--headless', '--no-sandbox', '--disable-gpu', '--no-first-run', '--disable-background-networking'],
  });
  try {
    const signIn = await browser.newContext();
    const page = await signIn.newPage();
    await page.goto(link);
    await page.waitForURL(`${base}/`);
    const storageState = await signIn.storageState();
    await signIn.close();
    const all = [];
    for (let i = 0; i < runs; i += 1) all.push(await firstPage(browser, { storageState }, base));
    const median = (k) => all.map((r) => r[k]).sort((a, b) => a - b)[Math.floor(all.length / 2)];
    const summary = {
      tessera,
      runs,
      first_bytes: median('first_bytes'),
      first_interactive_ms: median('first_interactive_ms'),
      again_bytes: median('again_bytes'),
      again_interactive_ms: median('again_interactive_ms'),
      first_interactive_ms_all: all.map((r) => r.first_interactive_ms),
      assets: all[0].assets,
    };
    console.log(JSON.stringify(summary, null, 2));
  } finally {
    await browser.close();
    server.kill('SIGTERM');
  }
}

if (process.argv[1] && path.resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  main().catch((e) => {
    console.error(e);
    process.exit(1);
  });
}
