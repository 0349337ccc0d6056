// Two real browser pages (Debian's chromium, driven by playwright-core) on the Jetstream
// demo page of two replicas: an edit in one must appear in the other, both ways.
// Usage: NODE_PATH=<repo>/.tools/jetstream/node_modules \
//        node browser.js <page url 1> <page url 2> <screenshot dir>
// Prints one JSON line: {ok, steps: [...], screenshots: [...]} (or {ok: false, error}).
'use strict';

const path = require('path');
const { chromium } = require('playwright-core');

const [url1, url2, shots] = process.argv.slice(2);
const executablePath = process.env.CHROMIUM || '/usr/bin/chromium';
const TIMEOUT = 15000;

async function texts(page) {
  return page.$$eval('#items li .text', (els) => els.map((e) => e.textContent));
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
    const context1 = await browser.newContext({ viewport: { width: 800, height: 600 } });
    const context2 = await browser.newContext({ viewport: { width: 800, height: 600 } });
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

    const first = 'from page one ' + Date.now();
    await p1.fill('#new-text', first);
    await p1.click('#add');
    await p2.waitForFunction(
      (t) => [...document.querySelectorAll('#items li .text')].some((e) => e.textContent === t),
      first, { timeout: TIMEOUT });
    steps.push('page two sees the item added on page one');

    const second = 'from page two ' + Date.now();
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
    const result = {
      ok: errors.length === 0,
      steps,
      errors,
      page1: await texts(p1),
      page2: await texts(p2),
      screenshots: shotPaths,
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
