// The built-in chat page (GET /) in a real browser: Debian's Chromium, headless, driven by
// playwright-core. A reply streams in and grows, Stop ends the generation on the server too, the
// settings reach the request, API errors show in the chat, reasoning folds into a block, model
// text stays text, the Experts panel reads /metrics, the page asks for the API key on 401 and then
// uses the stored one, and --no-webui gives 404.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, mkdirSync } from 'node:fs';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { chromium } from 'playwright-core';
import { startCoordinator } from './lib/coordinator.mjs';

const CHROMIUM = process.env.MOE_CHROMIUM || '/usr/bin/chromium';
const ARTIFACTS = process.env.MOE_ARTIFACT_DIR;
let browser;

before(async () => {
  assert.ok(existsSync(CHROMIUM), `${CHROMIUM} is missing (scripts/setup installs chromium)`);
  browser = await chromium.launch({ executablePath: CHROMIUM, args: ['--no-sandbox'] });
});
after(async () => { await browser?.close(); });

// A page that records script errors and CSP violations (a wrong hash would block the script).
async function openPage(url) {
  const page = await browser.newPage({ viewport: { width: 1280, height: 800 } });
  const problems = [];
  page.on('pageerror', (e) => problems.push(`pageerror: ${e.message}`));
  page.on('console', (m) => {
    if (m.type() === 'error' && !/Failed to load resource/.test(m.text())) {
      problems.push(`console: ${m.text()}`);
    }
  });
  await page.goto(url);
  return { page, problems };
}

// The text of the last assistant message: reasoning and content.
const replyLength = (page) => page.locator('.msg.assistant').last().evaluate((e) =>
  (e.querySelector('.content')?.textContent.length ?? 0) +
  (e.querySelector('.reasoning-text')?.textContent.length ?? 0));

async function metric(baseUrl, name, headers = {}) {
  const text = await (await fetch(`${baseUrl}/metrics`, { headers })).text();
  const m = new RegExp(`^${name} (\\S+)$`, 'm').exec(text);
  return m ? Number(m[1]) : NaN;
}

async function waitFor(what, f, ms = 20000) {
  const end = Date.now() + ms;
  for (;;) {
    const v = await f();
    if (v) return v;
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await sleep(50);
  }
}

// Sends `text` with max_tokens `n` and waits for the reply to finish.
async function chatShort(page, text, n = 8) {
  await page.fill('#max-tokens', String(n));
  await page.fill('#prompt', text);
  await page.press('#prompt', 'Enter');
  const reply = page.locator('.msg.assistant').last();
  await waitFor('a finished reply', async () =>
    (await reply.getAttribute('data-state')) === 'done');
  return reply;
}

test('the page streams a reply, Stop ends it on the server, settings and errors work',
  { timeout: 180000 }, async () => {
    // A context the greedy reply cannot fill before the test stops it: the tiny model writes
    // ~600 tokens/s on two cores, so -c 2048 could end the reply by length before Stop.
    const c = await startCoordinator({ ctx: 16384 });
    try {
      // The page and its headers: no key needed, a strict CSP, no sniffing, no caching.
      const res = await fetch(`${c.baseUrl}/`);
      assert.equal(res.status, 200);
      assert.equal(res.headers.get('content-type'), 'text/html; charset=utf-8');
      const csp = res.headers.get('content-security-policy');
      assert.match(csp, /default-src 'none'/);
      assert.match(csp, /connect-src 'self'/);
      assert.match(csp, /script-src 'sha256-[A-Za-z0-9+/]{43}='/);
      assert.doesNotMatch(csp, /unsafe/);
      assert.equal(res.headers.get('x-content-type-options'), 'nosniff');
      assert.equal(res.headers.get('cache-control'), 'no-cache');
      assert.match(await res.text(), /<title>moe-runtime chat<\/title>/);
      assert.equal((await fetch(`${c.baseUrl}/index.html`)).status, 200);
      // The server's own origin may call the API; another is still refused.
      const probe = (origin) => fetch(`${c.baseUrl}/v1/models`, { headers: { Origin: origin } });
      assert.equal((await probe(c.baseUrl)).status, 200);
      assert.equal((await probe('http://evil.example')).status, 403);

      const { page, problems } = await openPage(`${c.baseUrl}/`);
      assert.equal(await page.title(), 'moe-runtime chat');
      await waitFor('the model name', async () => (await page.textContent('#model')).length > 0);

      // Greedy (temperature 0), no token limit: the tiny random model runs on for seconds.
      await page.fill('#temperature', '0');
      await page.fill('#system', 'You are a test.');
      await page.fill('#prompt', 'Tell me a long story.');
      await page.click('#send');
      assert.equal(await page.isDisabled('#send'), true);
      const lengths = new Set();
      await waitFor('the reply to grow', async () => {
        const n = await replyLength(page);
        if (n > 0) lengths.add(n);
        return lengths.size >= 2;
      });
      assert.equal(await metric(c.baseUrl, 'moe_requests_running'), 1);

      await page.click('#stop');
      const reply = page.locator('.msg.assistant').last();
      await waitFor('the stopped state', async () =>
        (await reply.getAttribute('data-state')) === 'stopped');
      assert.equal(await page.isDisabled('#stop'), true);
      assert.equal(await page.isEnabled('#send'), true);
      await waitFor('no running request', async () =>
        (await metric(c.baseUrl, 'moe_requests_running')) === 0, 10000);
      const slots = await (await fetch(`${c.baseUrl}/slots`)).json();
      assert.equal(slots[0].is_processing, false);
      const stoppedAt = await replyLength(page);
      await sleep(800);
      assert.equal(await replyLength(page), stoppedAt, 'the text grew after Stop');
      assert.match(await reply.locator('.meta').textContent(), /stopped/);

      // The Experts panel: per-layer rows from /metrics; no GPU on this machine.
      await waitFor('the experts table', async () =>
        (await page.locator('#experts-body tr').count()) > 0, 10000);
      assert.match(await page.textContent('#experts-body'), /no GPU/);
      assert.notEqual(await page.textContent('#generated'), '–');

      // A second turn with max_tokens 8 ends by length, after the history of the first.
      const second = await chatShort(page, 'And then?', 8);
      assert.match(await second.locator('.meta').textContent(), /^8 tokens .*length$/);
      assert.equal(await page.locator('.msg.user').count(), 2);
      if (ARTIFACTS) {
        mkdirSync(ARTIFACTS, { recursive: true });
        await page.screenshot({ path: join(ARTIFACTS, 'webui.png') });
      }

      // An API error shows in the chat and gives the text back.
      await page.fill('#top-p', '7');
      await page.fill('#prompt', 'Bad settings');
      await page.click('#send');
      await waitFor('the error message', async () =>
        (await page.locator('.msg.error').count()) > 0);
      assert.match(await page.locator('.msg.error').last().textContent(), /top_p/);
      assert.equal(await page.inputValue('#prompt'), 'Bad settings');
      await page.fill('#top-p', '');

      // New chat empties the list.
      await page.click('#new-chat');
      assert.equal(await page.locator('.msg').count(), 0);

      // Reasoning goes into a folded "Reasoning" block, and an error event inside a stream shows
      // in the chat (a canned stream: the tiny model writes no <think>).
      const chunk = (delta, finish = null) =>
        `data: ${JSON.stringify({ choices: [{ index: 0, delta, finish_reason: finish }] })}\n\n`;
      await page.route('**/v1/chat/completions', (route) => route.fulfill({
        status: 200, contentType: 'text/event-stream',
        body: chunk({ role: 'assistant', reasoning_content: 'Let me <b>think</b>.' }) +
              chunk({ reasoning_content: ' Done.' }) + chunk({ content: 'The <i>answer</i>.' }) +
              chunk({}, 'stop') + 'data: {"choices":[],"usage":{"completion_tokens":3}}\n\n' +
              'data: [DONE]\n\n',
      }));
      const canned = await chatShort(page, 'Think first');
      const details = canned.locator('details.reasoning');
      assert.equal(await details.isVisible(), true);
      assert.equal(await details.getAttribute('open'), null);
      assert.equal(await details.locator('summary').textContent(), 'Reasoning');
      assert.equal(await canned.locator('.reasoning-text').textContent(),
        'Let me <b>think</b>. Done.');
      assert.equal(await canned.locator('.content').textContent(), 'The <i>answer</i>.');
      assert.equal(await canned.locator('b, i').count(), 0);  // text, never markup
      assert.match(await canned.locator('.meta').textContent(), /^3 tokens .*stop$/);
      await page.unroute('**/v1/chat/completions');
      await page.route('**/v1/chat/completions', (route) => route.fulfill({
        status: 200, contentType: 'text/event-stream',
        body: chunk({ content: 'Half' }) + 'data: {"error":{"message":"worker died"}}\n\n',
      }));
      await page.fill('#prompt', 'Fail midway');
      await page.click('#send');
      await waitFor('the stream error', async () => (await page.locator('.msg.error').count()) > 0);
      assert.match(await page.locator('.msg.error').last().textContent(), /worker died/);
      await page.unroute('**/v1/chat/completions');

      // The settings survive a reload (localStorage).
      await page.reload();
      assert.equal(await page.inputValue('#temperature'), '0');
      assert.equal(await page.inputValue('#system'), 'You are a test.');
      assert.deepEqual(problems, []);
      await page.close();
    } finally {
      await c.stop();
    }
  });

test('with --api-key the page asks for the key, stores it and chats', { timeout: 120000 },
  async () => {
    const c = await startCoordinator({ args: ['--api-key', 'secret'] });
    try {
      assert.equal((await fetch(`${c.baseUrl}/`)).status, 200);  // the page itself is open
      assert.equal((await fetch(`${c.baseUrl}/v1/models`)).status, 401);

      const { page, problems } = await openPage(`${c.baseUrl}/`);
      await page.waitForSelector('#key-dialog[open]', { timeout: 10000 });
      assert.match(await page.textContent('#key-reason'), /API key/);
      await page.fill('#key-input', 'secret');
      await page.click('#key-save');
      await waitFor('the model name', async () => (await page.textContent('#model')).length > 0);
      await chatShort(page, 'Hello', 6);
      await waitFor('the experts table', async () =>
        (await page.locator('#experts-body tr').count()) > 0, 10000);

      // A reload uses the stored key: no question, and the chat works.
      await page.reload();
      await waitFor('the model name', async () => (await page.textContent('#model')).length > 0);
      assert.equal(await page.locator('#key-dialog[open]').count(), 0);
      assert.equal(await page.inputValue('#api-key'), 'secret');
      const reply = await chatShort(page, 'Hello again', 6);
      assert.match(await reply.locator('.meta').textContent(), /^6 tokens/);

      // A wrong stored key: the next call asks again, and the retry goes through.
      await page.evaluate(() => localStorage.setItem('moe-webui-api-key', 'wrong'));
      await page.fill('#prompt', 'Third');
      await page.click('#send');
      await page.waitForSelector('#key-dialog[open]', { timeout: 10000 });
      assert.match(await page.textContent('#key-reason'), /invalid API key/);
      await page.fill('#key-input', 'secret');
      await page.press('#key-input', 'Enter');
      const retried = page.locator('.msg.assistant').last();
      await waitFor('the retried reply', async () =>
        (await retried.getAttribute('data-state')) === 'done');
      assert.equal(await page.locator('.msg.error').count(), 0);
      assert.deepEqual(problems, []);
      await page.close();
    } finally {
      await c.stop();
    }
  });

test('--no-webui: GET / is 404', { timeout: 60000 }, async () => {
  const c = await startCoordinator({ args: ['--no-webui'] });
  try {
    assert.equal((await fetch(`${c.baseUrl}/`)).status, 404);
    assert.equal((await fetch(`${c.baseUrl}/index.html`)).status, 404);
    assert.equal((await fetch(`${c.baseUrl}/health`)).status, 200);
    // Without the page there is no same-origin caller to admit.
    const res = await fetch(`${c.baseUrl}/v1/models`, { headers: { Origin: c.baseUrl } });
    assert.equal(res.status, 403);
  } finally {
    await c.stop();
  }
});
