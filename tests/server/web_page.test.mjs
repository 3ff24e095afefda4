// The chat page in headless Chromium (Debian's binary, driven by playwright-core): it loads, a
// typed message streams a reply into the conversation, the live panel shows the placement, and
// a screenshot is saved (SCREENSHOT_DIR, default the working directory).
import { existsSync } from 'node:fs';
import path from 'node:path';
import { chromium } from 'playwright-core';
import { check, finish, fixture, startServer } from './harness.mjs';

const browserPath = process.env.CHROMIUM || ['/usr/bin/chromium', '/usr/bin/chromium-browser'].find(existsSync);
if (!browserPath) {
  console.error('Chromium is not installed: `apt-get install chromium` (tools/install-deps.sh does), or set CHROMIUM');
  process.exit(1);
}
const screenshot = path.join(process.env.SCREENSHOT_DIR || process.cwd(), 'web_page.png');

const server = await startServer(fixture('small-v2-Q4_K_M.gguf'), ['--ctx', '256']);
const browser = await chromium.launch({ executablePath: browserPath, args: ['--no-sandbox', '--disable-gpu'] });
try {
  const page = await browser.newPage({ viewport: { width: 1100, height: 700 } });
  const errors = [];
  page.on('pageerror', (e) => errors.push(e.message));
  await page.goto(server.base + '/');
  check((await page.title()) === 'tandem', 'the page loads', await page.title());

  await page.fill('#max_tokens', '24');
  await page.fill('#input', 'Tell me about the sea.');
  await page.press('#input', 'Enter');
  await page.waitForSelector('.msg.user');
  // The reply streams in, then the send button comes back.
  await page.waitForFunction(() => document.querySelector('.msg.assistant')?.textContent.length > 0, null,
                             { timeout: 30000 });
  await page.waitForFunction(() => !document.querySelector('#send').disabled, null, { timeout: 30000 });
  const reply = await page.textContent('.msg.assistant');
  check(reply.length > 0, 'a reply streamed into the page', JSON.stringify(reply));
  check(!(await page.$('.msg.error')), 'no error shown', await page.textContent('#log'));
  await page.waitForFunction(() => document.querySelector('#placement').textContent.includes('CPU'), null,
                             { timeout: 10000 });
  check((await page.textContent('#placement')).includes('CPU'), 'the live panel shows where the model runs');
  await page.screenshot({ path: screenshot });
  check(existsSync(screenshot), 'screenshot saved', screenshot);
  check(errors.length === 0, 'no JavaScript errors', errors.join('; '));
  console.log(`screenshot: ${screenshot}`);
} finally {
  await browser.close();
  await server.stop();
}
finish('web page');
