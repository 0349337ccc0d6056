// A screenshot of one local HTML file in headless Chromium (Debian's, driven by
// playwright-core, as e2e/jetstream/browser.js).
// Usage: NODE_PATH=<repo>/.tools/jetstream/node_modules CHROMIUM=/usr/bin/chromium \
//        node browser_shot.js <page.html> <out.png> <width>
// Prints one JSON line: {ok, width, height} (or {ok: false, error}).
'use strict';

const { chromium } = require('playwright-core');

const [html, out, width] = process.argv.slice(2);

async function main() {
  const browser = await chromium.launch({
    executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
    headless: true,
    args: ['--headless=new', '--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage',
      '--disable-background-networking', '--disable-extensions', '--no-first-run'],
  });
  try {
    const page = await browser.newPage({ viewport: { width: Number(width), height: 400 } });
    const errors = [];
    page.on('pageerror', (e) => errors.push(String(e)));
    await page.goto('file://' + html);
    await page.screenshot({ path: out, fullPage: true });
    const size = await page.evaluate(() => [document.body.scrollWidth, document.body.scrollHeight]);
    process.stdout.write(JSON.stringify({ ok: errors.length === 0, errors, width: size[0],
      height: size[1] }) + '\n');
  } finally {
    await browser.close();
  }
}

main().catch((e) => {
  process.stdout.write(JSON.stringify({ ok: false, error: String(e && e.stack || e) }) + '\n');
  process.exit(1);
});
