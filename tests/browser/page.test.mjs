// Real-browser test of the chat page served at `/`: Debian's chromium,
// headless, driven by playwright-core. Starts the chatgate binary itself
// (CHATGATE_BIN, default target/debug/chatgate) on a free loopback port.
// Saves screenshots of the confirmation card under target/ for humans.

import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { createInterface } from 'node:readline';
import { mkdirSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { dirname, join, resolve } from 'node:path';
import { chromium } from 'playwright-core';

const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), '..', '..');
const BIN = process.env.CHATGATE_BIN ?? join(ROOT, 'target', 'debug', 'chatgate');
const SHOTS = join(ROOT, 'target', 'screenshots');
const WAIT = 20_000;

let server;
let baseUrl;
let browser;

before(async () => {
  server = spawn(BIN, ['--bind', '127.0.0.1:0', '--step-delay-ms', '50', '--workers', '1'], {
    stdio: ['ignore', 'ignore', 'pipe'],
    env: { ...process.env, RUST_LOG: 'info' },
  });
  baseUrl = await new Promise((resolveUrl, reject) => {
    const timer = setTimeout(() => reject(new Error('chatgate did not report its address')), WAIT);
    server.once('error', reject);
    createInterface({ input: server.stderr }).on('line', (line) => {
      const found = line.match(/listening on (http:\/\/\S+)/);
      if (found) {
        clearTimeout(timer);
        resolveUrl(found[1]);
      }
    });
  });
  browser = await chromium.launch({
    executablePath: process.env.CHROMIUM_PATH ?? '/usr/bin/chromium',
    args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
      '--disable-background-networking', '--disable-component-update', '--disable-sync'],
  });
  mkdirSync(SHOTS, { recursive: true });
});

after(async () => {
  await browser?.close();
  server?.kill('SIGTERM');
});

async function openPage(viewport = { width: 1000, height: 800 }) {
  const page = await browser.newPage({ viewport });
  page.setDefaultTimeout(WAIT);
  const errors = [];
  page.on('pageerror', (err) => errors.push(err.message));
  await page.goto(baseUrl + '/');
  return { page, errors };
}

async function send(page, message) {
  await page.getByLabel('Message').fill(message);
  await page.getByRole('button', { name: 'Send' }).click();
}

test('a task shows a confirmation card; Confirm runs it to completion', async () => {
  const { page, errors } = await openPage();

  await send(page, 'create a report; then delete old drafts');
  const card = page.locator('section.card').first();
  await card.waitFor();

  assert.deepEqual(await card.locator('li').allTextContents().then((t) => t.map((s) => s.trim())),
    ['create a report', 'delete old drafts']);
  assert.match(await card.locator('.risk').textContent(), /high risk/);
  assert.match(await card.locator('.countdown').textContent(), /expires in \d+:\d\d/);
  await card.screenshot({ path: join(SHOTS, 'confirmation-card.png') });

  await card.getByRole('button', { name: 'Confirm' }).click();
  const done = page.locator('.outcome.completed');
  await done.waitFor();

  assert.match(await done.textContent(), /Completed: Completed 2 task/);
  assert.match(await card.locator('.decided').textContent(), /Decision: confirm/);
  assert.equal(await page.locator('.line', { hasText: 'tool_output' }).count(), 2);
  assert.deepEqual(errors, []);
  await page.close();
});

test('Modify with a text gives round 2 with the feedback; Confirm completes', async () => {
  const { page, errors } = await openPage();

  await send(page, 'write the summary');
  const first = page.locator('section.card').nth(0);
  await first.waitFor();
  await first.getByRole('button', { name: 'Modify' }).click();
  await first.getByLabel('What should change?').fill('add logging');
  await first.getByRole('button', { name: 'Send changes' }).click();
  const second = page.locator('section.card').nth(1);
  await second.waitFor();

  assert.match(await second.textContent(), /round 2/);
  assert.match(await second.locator('li').nth(1).textContent(), /Apply feedback: add logging/);
  await second.getByRole('button', { name: 'Confirm' }).click();
  await page.locator('.outcome.completed').waitFor();
  assert.match(await first.locator('.decided').textContent(), /Decision: modify/);
  assert.deepEqual(errors, []);
  await page.close();
});

test('at phone width the page works from the keyboard alone, and Cancel cancels', async () => {
  const { page, errors } = await openPage({ width: 375, height: 740 });

  await page.getByLabel('Message').focus();
  await page.keyboard.type('rm -rf build');
  await page.keyboard.press('Enter');
  const card = page.locator('section.card').first();
  await card.waitFor();
  await page.waitForFunction(() => document.activeElement?.textContent === 'Confirm');
  const width = await card.evaluate((node) => node.getBoundingClientRect().width);
  assert.ok(width <= 375, `card fits the phone width (${width}px)`);
  await card.screenshot({ path: join(SHOTS, 'confirmation-card-phone.png') });

  await page.keyboard.press('Tab'); // Modify
  await page.keyboard.press('Tab'); // Cancel
  await page.keyboard.press('Enter');
  const done = page.locator('.outcome.cancelled');
  await done.waitFor();

  assert.match(await done.textContent(), /Cancelled \(user\)/);
  assert.deepEqual(errors, []);
  await page.close();
});
