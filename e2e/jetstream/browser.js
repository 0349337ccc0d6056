// Two real browser pages (Debian's chromium, driven by playwright-core) on the Jetstream
// demo page of two replicas: an edit in one must appear in the other, both ways.
// Usage: NODE_PATH=<repo>/.tools/jetstream/node_modules \
//        node browser.js <page url 1> <page url 2> <screenshot dir> [<picture.png>]
// Prints one JSON line: {ok, steps: [...], screenshots: [...], picture} (or {ok: false,
// error}). <picture.png> is the docs' picture: both pages side by side, each captioned
// with its replica's address, rendered by the same browser.
'use strict';

const path = require('path');
const { chromium } = require('playwright-core');

const [url1, url2, shots, picture] = process.argv.slice(2);
const executablePath = process.env.CHROMIUM || '/usr/bin/chromium';
const TIMEOUT = 15000;

async function texts(page) {
  return page.$$eval('#items li .text', (els) => els.map((e) => e.textContent));
}

// The two screenshots side by side as one PNG, each under its caption ($PICTURE_CAPTIONS,
// a JSON list: which replica the page talks to), else the page's path (no token).
async function sideBySide(browser, shotPaths, urls, out) {
  const fs = require('fs');
  const captions = JSON.parse(process.env.PICTURE_CAPTIONS || 'null') ||
    urls.map((u) => new URL(u).pathname);
  const escape = (t) => String(t).replace(/[&<>]/g, (c) => ({ '&': '&amp;', '<': '&lt;', '>': '&gt;' })[c]);
  const cells = shotPaths.map((shot, i) => {
    const data = fs.readFileSync(shot).toString('base64');
    return `<figure><figcaption>${escape(captions[i])}</figcaption>` +
      `<img src="data:image/png;base64,${data}"></figure>`;
  });
  const page = await browser.newPage({ viewport: { width: 1640, height: 380 } });
  await page.setContent(
    '<style>body{margin:0;padding:12px;display:flex;gap:16px;background:#eee;' +
    'font:14px sans-serif}figure{margin:0}img{display:block;width:800px;' +
    'border:1px solid #999}figcaption{padding:0 0 6px}</style>' + cells.join(''));
  await page.screenshot({ path: out, fullPage: true });
  await page.close();
}

async function main() {
  const browser = await chromium.launch({
    executablePath,
    headless: true,
    args: [
      '--headless=new', '--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage',
      '--disable-background-networking', '--disable-extensions', '--no-first-run',
      '--disable-component-update', '--disable-sync', '--metrics-recording-only',
    ],
  });
  const steps = [];
  try {
    const context1 = await browser.newContext({ viewport: { width: 800, height: 340 } });
    const context2 = await browser.newContext({ viewport: { width: 800, height: 340 } });
    const p1 = await context1.newPage();
    const p2 = await context2.newPage();
    const errors = [];
    for (const p of [p1, p2]) {
      p.on('pageerror', (e) => errors.push(String(e)));
    }
    await p1.goto(url1);
    await p2.goto(url2);
    for (const p of [p1, p2]) {
      await p.waitForFunction(() => window.demo && window.demo.synced, null, { timeout: TIMEOUT });
    }
    steps.push('both pages synced');

    // The fleet is new for every run: fixed texts are unique and keep the picture stable.
    const first = 'added on page one';
    await p1.fill('#new-text', first);
    await p1.click('#add');
    await p2.waitForFunction(
      (t) => [...document.querySelectorAll('#items li .text')].some((e) => e.textContent === t),
      first, { timeout: TIMEOUT });
    steps.push('page two sees the item added on page one');

    const second = 'added on page two';
    await p2.fill('#new-text', second);
    await p2.click('#add');
    await p1.waitForFunction(
      (t) => [...document.querySelectorAll('#items li .text')].some((e) => e.textContent === t),
      second, { timeout: TIMEOUT });
    steps.push('page one sees the item added on page two');

    // Tick the first item on page two; page one shows it done.
    await p2.click(`#items li:has(.text:text-is("${first}")) .toggle`);
    await p1.waitForSelector(`#items li.done:has(.text:text-is("${first}"))`, { timeout: TIMEOUT });
    steps.push('page one sees the tick made on page two');

    const shotPaths = [path.join(shots, 'page1.png'), path.join(shots, 'page2.png')];
    await p1.screenshot({ path: shotPaths[0], fullPage: true });
    await p2.screenshot({ path: shotPaths[1], fullPage: true });
    if (picture) {
      await sideBySide(browser, shotPaths, [url1, url2], picture);
    }
    const result = {
      ok: errors.length === 0,
      steps,
      errors,
      page1: await texts(p1),
      page2: await texts(p2),
      screenshots: shotPaths,
      picture: picture || null,
    };
    process.stdout.write(JSON.stringify(result) + '\n');
  } finally {
    await browser.close();
  }
}

main().catch((e) => {
  process.stdout.write(JSON.stringify({ ok: false, error: String(e && e.stack || e) }) + '\n');
  process.exit(1);
});
