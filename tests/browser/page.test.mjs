// Real-browser test of the chat page served at `/`: Debian's chromium,
// headless, driven by playwright-core. Starts the chatgate binary itself
// (CHATGATE_BIN, default target/debug/chatgate) on a free loopback port.
// Saves screenshots of the confirmation card under target/ for humans.

import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { createHmac } from 'node:crypto';
import { createInterface } from 'node:readline';
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { fileURLToPath } from 'node:url';
import { dirname, join, resolve } from 'node:path';
import { chromium } from 'playwright-core';
import { cuttingProxy } from '../../clients/js/test/cutting-proxy.mjs';

const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), '..', '..');
const BIN = process.env.CHATGATE_BIN ?? join(ROOT, 'target', 'debug', 'chatgate');
const SHOTS = join(ROOT, 'target', 'screenshots');
const WAIT = 20_000;

let server;
let baseUrl;
let browser;
// A `note` tool (examples/tools/write_note.py into this directory): the
// steps that start with "note" run it, and their arguments can be edited.
const DIR = mkdtempSync(join(tmpdir(), 'chatgate-page-'));
const NOTES = join(DIR, 'notes');

before(async () => {
  const tools = join(DIR, 'tools.toml');
  writeFileSync(tools, `[[tool]]
name = "note"
description = "Append a note"
risk = "low"
command = ["python3", ${JSON.stringify(join(ROOT, 'examples', 'tools', 'write_note.py'))}, ${JSON.stringify(NOTES)}]
timeout_secs = 10
parameters = { type = "object", properties = { step = { type = "string" } }, required = ["step"] }

[[tool]]
name = "show"
description = "Shows what it would change first"
risk = "low"
command = ["true"]
preview = ["sh", "-c", "printf 'line one\\nline two\\n'"]
parameters = { type = "object" }
`);
  ({ server, url: baseUrl } = await startServer(['--step-delay', '50ms', '--max-rounds', '2', '--tools', tools]));
  browser = await chromium.launch({
    executablePath: process.env.CHROMIUM_PATH ?? '/usr/bin/chromium',
    args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
      '--disable-background-networking', '--disable-component-update', '--disable-sync'],
  });
  mkdirSync(SHOTS, { recursive: true });
});

/** Starts chatgate on a free loopback port with `args`; its process and URL. */
async function startServer(args) {
  const proc = spawn(BIN, ['--bind', '127.0.0.1:0', '--workers', '1', ...args], {
    stdio: ['ignore', 'ignore', 'pipe'],
    env: { ...process.env, RUST_LOG: 'info' },
  });
  const url = await new Promise((resolveUrl, reject) => {
    const timer = setTimeout(() => reject(new Error('chatgate did not report its address')), WAIT);
    proc.once('error', reject);
    createInterface({ input: proc.stderr }).on('line', (line) => {
      const found = line.match(/listening on (http:\/\/\S+)/);
      if (found) {
        clearTimeout(timer);
        resolveUrl(found[1]);
      }
    });
  });
  return { server: proc, url };
}

after(async () => {
  await browser?.close();
  server?.kill('SIGTERM');
  rmSync(DIR, { recursive: true, force: true });
});

async function openPage(viewport = { width: 1000, height: 800 }, url = baseUrl) {
  const page = await browser.newPage({ viewport });
  page.setDefaultTimeout(WAIT);
  const errors = [];
  page.on('pageerror', (err) => errors.push(err.message));
  await page.goto(url + '/');
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

  assert.deepEqual(await card.locator('li label span').allTextContents(),
    ['create a report', 'delete old drafts']);
  assert.match(await card.locator('.meta .risk').textContent(), /high risk/);
  assert.match(await card.locator('.countdown').textContent(), /expires in \d+:\d\d/);
  await card.screenshot({ path: join(SHOTS, 'confirmation-card.png') });

  await card.getByRole('button', { name: 'Confirm' }).click();
  const done = page.locator('.outcome.completed');
  await done.waitFor();

  assert.equal(await done.textContent(), '✓ Completed 2 task(s).');
  assert.match(await card.locator('.decided').textContent(), /Decision: confirm/);
  assert.equal(await page.locator('.line b', { hasText: 'Result' }).count(), 2);
  const text = await page.locator('#log').textContent();
  for (const raw of ['task_init', 'tool_output', 'confirmation_received']) {
    assert.ok(!text.includes(raw), `no raw chunk type ${raw} on the page`);
  }
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
  // Round 2 is the last (--max-rounds 2): confirm or cancel only, and said so.
  assert.match(await second.textContent(), /last round: confirm or cancel/);
  assert.equal(await second.getByRole('button', { name: 'Modify' }).count(), 0);
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
  // High risk: focus is on the plan, not on Confirm.
  await page.waitForFunction(() => document.activeElement?.tagName === 'H2');
  const width = await card.evaluate((node) => node.getBoundingClientRect().width);
  assert.ok(width <= 375, `card fits the phone width (${width}px)`);
  const placeholder = await page.getByLabel('Message').evaluate((node) => node.scrollWidth <= node.clientWidth);
  assert.ok(placeholder, 'the placeholder is not cut');
  await card.screenshot({ path: join(SHOTS, 'confirmation-card-phone.png') });

  // Past the task's box and arguments, then Confirm and Modify, to Cancel.
  for (let i = 0; i < 10; i++) {
    await page.keyboard.press('Tab');
    if (await page.evaluate(() => document.activeElement?.textContent === 'Cancel')) break;
  }
  await page.keyboard.press('Enter');
  const done = page.locator('.outcome.cancelled');
  await done.waitFor();

  assert.match(await done.textContent(), /Cancelled \(you cancelled\)/);
  assert.equal(await card.getByRole('button', { name: 'Confirm (high risk)' }).evaluate((b) => b.classList.contains('primary')), false,
    'a cancelled card does not keep a blue Confirm');
  assert.deepEqual(errors, []);
  await page.close();
});

test('an empty page says what to try', async () => {
  const { page, errors } = await openPage();
  assert.match(await page.locator('.intro').textContent(), /create a report; then email it/);
  assert.deepEqual(errors, []);
  await page.close();
});

test('one Enter confirms a low-risk plan but never a high-risk one', async () => {
  const { page, errors } = await openPage();

  await send(page, 'write a note');
  const low = page.locator('section.card').first();
  await low.waitFor();
  await page.waitForFunction(() => document.activeElement?.textContent === 'Confirm');
  await page.keyboard.press('Escape');
  await low.getByRole('button', { name: 'Cancel' }).click();
  await page.locator('.outcome.cancelled').waitFor();

  await send(page, 'drop the table');
  const high = page.locator('section.card').nth(1);
  await high.waitFor();
  await page.keyboard.press('Enter');
  await page.waitForTimeout(300);

  assert.equal(await high.locator('.decided').count(), 0, 'Enter decided nothing');
  await high.getByRole('button', { name: 'Confirm (high risk)' }).click();
  await page.locator('.outcome.completed').waitFor();
  assert.deepEqual(errors, []);
  await page.close();
});

test('sending a message while a plan waits warns first, then supersedes it', async () => {
  const { page, errors } = await openPage();
  await send(page, 'first plan');
  const card = page.locator('section.card').first();
  await card.waitFor();

  await send(page, 'second plan');
  const hint = page.locator('#composer-hint');
  assert.match(await hint.textContent(), /cancels it/);
  assert.equal(await page.locator('.msg.user').count(), 1, 'not sent yet');
  await page.getByRole('button', { name: 'Send' }).click();

  await page.locator('.outcome.cancelled').waitFor();
  assert.match(await page.locator('.outcome.cancelled').textContent(), /a new message replaced it/);
  await page.locator('section.card').nth(1).waitFor();
  assert.equal(await page.locator('.msg.user').count(), 2);
  assert.deepEqual(errors, []);
  await page.close();
});

test('a reload finds the pending confirmation again and it can be confirmed', async () => {
  const { page, errors } = await openPage();
  await send(page, 'survive a reload');
  const before = page.locator('section.card').first();
  await before.waitFor();
  const session = await page.locator('#session').textContent();

  await page.reload();
  const card = page.locator('section.card').first();
  await card.waitFor();

  assert.equal(await page.locator('#session').textContent(), session, 'same session after reload');
  assert.match(await card.textContent(), /survive a reload/);
  await card.getByRole('button', { name: 'Confirm' }).click();
  await page.locator('.outcome.completed').waitFor();
  assert.deepEqual(errors, []);
  await page.close();
});

test('a dropped stream is re-attached and the card still decides the run', async () => {
  const proxy = await cuttingProxy(baseUrl);
  try {
    const { page, errors } = await openPage(undefined, proxy.url);
    await send(page, 'cross a broken network; then finish');
    const card = page.locator('section.card').first();
    await card.waitFor();

    assert.equal(proxy.state.cut, 1, 'the proxy cut the first stream');
    await card.getByRole('button', { name: 'Confirm' }).click();
    await page.locator('.outcome.completed').waitFor();
    assert.equal(await page.locator('.outcome.error').count(), 0);
    assert.deepEqual(errors, []);
    await page.close();
  } finally {
    proxy.close();
  }
});

test('the end of a run stays in view above the composer', async () => {
  const { page, errors } = await openPage({ width: 1200, height: 700 });
  for (let i = 0; i < 3; i++) {
    await send(page, `step ${i}; this will fail`);
    const card = page.locator('section.card').nth(i);
    await card.waitFor();
    await card.getByRole('button', { name: 'Confirm' }).click();
    await page.locator('.outcome.error').nth(i).waitFor();
  }
  await page.waitForTimeout(200);

  const last = await page.locator('.outcome.error').last().boundingBox();
  const composer = await page.locator('#composer').boundingBox();
  assert.ok(last.y + last.height <= composer.y, `the last line (${last.y + last.height}) is above the composer (${composer.y})`);
  assert.ok(last.y >= 0);
  await page.screenshot({ path: join(SHOTS, 'end-in-view.png') });
  assert.deepEqual(errors, []);
  await page.close();
});

test('each task shows its tool and its own risk, and Confirm says the risk of what will run', async () => {
  const { page, errors } = await openPage({ width: 390, height: 844 });
  await send(page, 'note the plan; then delete old drafts');
  const card = page.locator('section.card').first();
  await card.waitFor();

  const items = card.locator('ol > li');
  assert.deepEqual(await items.nth(0).locator('.task-meta').textContent(), 'tool: notelow risk');
  // No declared tool runs it: the card says so.
  assert.deepEqual(await items.nth(1).locator('.task-meta').textContent(), 'simulated: no tool runshigh risk');
  assert.ok(await items.nth(0).locator('.task-meta .tool').isVisible(), 'visible without hovering');
  const confirm = card.locator('.actions button').first();
  assert.equal(await confirm.textContent(), 'Confirm (high risk)');
  await card.getByLabel('Run task 2').uncheck();
  assert.equal(await confirm.textContent(), 'Confirm');
  await card.getByLabel('Run task 1').uncheck();
  assert.equal(await confirm.textContent(), 'Confirm (runs nothing)');
  await card.getByLabel('Run task 2').check();
  assert.equal(await confirm.textContent(), 'Confirm (high risk)');
  await card.getByRole('button', { name: 'Cancel' }).click();
  await page.locator('.outcome.cancelled').waitFor();
  assert.deepEqual(errors, []);
  await page.close();
});

test('every task shows what it runs, long arguments collapsed with what is hidden counted', async () => {
  const { page, errors } = await openPage();
  const long = 'x'.repeat(2100) + 'HIDDENPART';
  await send(page, `look around; ${long}`);
  const card = page.locator('section.card').first();
  await card.waitFor();

  // Shown without a click: the short task whole, the long one cut.
  assert.match(await card.getByLabel('What task 1 runs').textContent(), /"step": "look around"/);
  const view = card.getByLabel('What task 2 runs');
  assert.equal((await view.textContent()).length, 2000);
  assert.doesNotMatch(await view.textContent(), /HIDDENPART/);
  const more = card.getByRole('button', { name: /show all \(\d+ more characters\)/ });
  const hidden = Number((await more.textContent()).match(/\d+/)[0]);
  assert.equal(hidden, JSON.stringify({ step: long }, null, 1).length - 2000);
  await more.click();
  assert.match(await view.textContent(), /HIDDENPART/);
  await card.getByRole('button', { name: 'Cancel' }).click();
  await page.locator('.outcome.cancelled').waitFor();
  assert.deepEqual(errors, []);
  await page.close();
});

test('a task can be left out and another run with edited arguments', async () => {
  const { page, errors } = await openPage();
  await send(page, 'first; second; note third');
  const card = page.locator('section.card').first();
  await card.waitFor();

  await card.getByLabel('Run task 2').uncheck();
  await card.locator('li').nth(2).getByRole('button', { name: 'edit arguments' }).click();
  await card.getByLabel('Arguments of task 3').fill('{"step": "third, edited"}');
  await card.getByRole('button', { name: 'Confirm' }).click();
  await page.locator('.outcome.completed').waitFor();

  const results = await page.locator('.line', { hasText: 'Result' }).allTextContents();
  assert.equal(results.length, 3);
  assert.match(results[1], /skipped/);
  assert.match(await card.locator('li').nth(1).textContent(), /\(reject\)/);
  assert.match(await card.locator('li').nth(2).textContent(), /\(edit\)/);
  // What ran is what was edited.
  assert.match(readFileSync(join(NOTES, 'notes.txt'), 'utf8'), /third, edited/);
  assert.deepEqual(errors, []);
  await page.close();
});

test('a task with a preview shows it in monospace, and Confirm sends the digest it showed', async () => {
  const { page, errors } = await openPage();
  await send(page, 'show it');
  const card = page.locator('section.card').first();
  await card.waitFor();
  const body = card.getByLabel('Preview of task 1');
  assert.equal(await body.textContent(), 'line one\nline two\n');
  assert.match(await body.evaluate((e) => getComputedStyle(e).fontFamily), /monospace/);
  assert.match(await card.locator('.preview-label').textContent(), /Preview: what it would do/);
  await card.screenshot({ path: join(SHOTS, 'preview-card.png') });
  // The confirm names the digest it showed; the server takes it (a wrong
  // one is 409 preview_stale) and the run completes.
  const sent = page.waitForRequest((req) => req.method() === 'POST' && (req.postData() ?? '').includes('CONFIRM_ACTION:confirm'));
  await card.getByRole('button', { name: 'Confirm' }).click();
  const body2 = JSON.parse((await sent).postData());
  assert.match(body2.decisions[0].preview_digest, /^[0-9a-f]{64}$/);
  await page.locator('.outcome.completed').waitFor();
  assert.deepEqual(errors, []);
  await page.close();
});

test('a task decided now runs at once, and Confirm decides the rest', async () => {
  const { page, errors } = await openPage();
  await send(page, 'note one now; note two later');
  const card = page.locator('section.card').first();
  await card.waitFor();

  await card.getByRole('button', { name: 'Decide task 1 now' }).click();
  await card.locator('li').nth(0).locator('.task-decided').waitFor();
  assert.match(await card.locator('li').nth(0).textContent(), /\(decided: approve\)/);
  // It ran while the card still waits for task 2.
  await page.locator('.line', { hasText: 'Waiting for a decision on task(s) 2' }).waitFor();
  assert.match(readFileSync(join(NOTES, 'notes.txt'), 'utf8'), /note one now/);
  assert.equal(await page.locator('.outcome').count(), 0);

  await card.getByRole('button', { name: 'Confirm' }).click();
  await page.locator('.outcome.completed').waitFor();
  assert.match(readFileSync(join(NOTES, 'notes.txt'), 'utf8'), /note two later/);
  assert.deepEqual(errors, []);
  await page.close();
});

test('a question card: one choice, several, other text and a typed value; the answers show on the decided card', async () => {
  const { page, errors } = await openPage();

  await send(page, 'ask region: which region? eu-west | us-east; ask checks: which checks? [multi] lint | test | fuzz; '
    + 'ask owner: who signs off? ana | bo; ask n: how many replicas? [integer 1..9]; '
    + 'ship {n} to {region} after {checks} for {owner}');
  const card = page.getByRole('region', { name: 'Questions' });
  await card.waitFor();
  assert.match(await card.locator('.countdown').textContent(), /expires in \d+:\d\d/);
  assert.equal(await card.locator('fieldset').count(), 4);
  await card.screenshot({ path: join(SHOTS, 'question-card.png') });

  // Keyboard: the first option has the focus; arrows move between radios.
  assert.equal(await page.evaluate(() => document.activeElement.value), 'eu-west');
  await page.keyboard.press('ArrowDown');
  await card.getByRole('checkbox', { name: 'lint' }).check();
  await card.getByRole('checkbox', { name: 'fuzz' }).check();
  await card.getByLabel('Other answer to owner').fill('Cy');
  await card.getByRole('spinbutton').fill('3');
  await card.getByRole('button', { name: 'Answer' }).click();
  const plan = page.getByRole('region', { name: 'Confirmation request' });
  await plan.waitFor();

  assert.deepEqual(await plan.locator('li label span').allTextContents(), ['ship 3 to us-east after lint, fuzz for Cy']);
  assert.match(await card.locator('.decided').textContent(), /Decision: answer/);
  assert.deepEqual(await card.getByRole('list', { name: 'Answers' }).locator('li').allTextContents(),
    ['region: us-east', 'checks: lint, fuzz', 'owner: Cy', 'n: 3'], 'in the questions\' order');
  await plan.getByRole('button', { name: 'Confirm' }).click();
  await page.locator('.outcome.completed').waitFor();
  assert.deepEqual(errors, []);
  await page.close();
});

test('an answer that does not fit is shown on the card, which still answers', async () => {
  const { page, errors } = await openPage();

  await send(page, 'ask region: which region? eu-west | us-east; ask n: how many? [integer 1..9]; go to {region} {n} times');
  const card = page.getByRole('region', { name: 'Questions' });
  await card.waitFor();
  await card.getByRole('button', { name: 'Answer' }).click();
  await card.locator('.hint', { hasText: 'question `region` is required' }).waitFor();
  await card.getByRole('radio', { name: 'eu-west' }).check();
  await card.getByRole('spinbutton').fill('12');
  await card.getByRole('button', { name: 'Answer' }).click();
  await card.locator('.hint', { hasText: 'question `n`' }).waitFor();
  assert.equal(await card.getByRole('button', { name: 'Answer' }).isEnabled(), true);
  await card.getByRole('spinbutton').fill('2');
  // Enter in a field answers.
  await card.getByRole('spinbutton').press('Enter');
  const plan = page.getByRole('region', { name: 'Confirmation request' });
  await plan.waitFor();

  assert.deepEqual(await plan.locator('li label span').allTextContents(), ['go to eu-west 2 times']);
  assert.deepEqual(errors, []);
  await page.close();
});

test('Skip on a question card drops the steps that needed the answer', async () => {
  const { page, errors } = await openPage();

  await send(page, 'ask region: which region? eu-west | us-east; build; deploy to {region}');
  const card = page.getByRole('region', { name: 'Questions' });
  await card.waitFor();
  await card.getByRole('button', { name: 'Skip' }).click();
  const plan = page.getByRole('region', { name: 'Confirmation request' });
  await plan.waitFor();

  assert.deepEqual(await plan.locator('li label span').allTextContents(), ['build']);
  assert.match(await card.locator('.decided').textContent(), /Decision: skip/);
  assert.match(await page.locator('#log').textContent(), /Dropped 1 step\(s\) that needed an answer/);
  await plan.getByRole('button', { name: 'Cancel' }).click();
  await page.locator('.outcome.cancelled').waitFor();
  assert.deepEqual(errors, []);
  await page.close();
});

/** An agent with `key`: starts a run on `session`, reads it to its pause, and leaves. */
async function agentLeavesAPause(url, key, session, message) {
  const response = await fetch(url + '/api/v1/chat/stream', {
    method: 'POST',
    headers: { 'Content-Type': 'application/json', Authorization: 'Bearer ' + key },
    body: JSON.stringify({ message, session_id: session }),
  });
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let text = '';
  while (!text.includes('"stream_paused":true')) {
    const { value, done } = await reader.read();
    assert.ok(!done, 'the run paused');
    text += decoder.decode(value);
  }
  await reader.cancel();
}

/** What the agent with `key` reads when it comes back to `session`: up to
 * `until` (or the end of the stream). */
async function agentReadsItsRun(url, key, session, until = null) {
  const response = await fetch(url + '/api/v1/chat/stream', {
    method: 'POST',
    headers: { 'Content-Type': 'application/json', Authorization: 'Bearer ' + key, 'Last-Event-ID': '0' },
    body: JSON.stringify({ session_id: session }),
  });
  assert.equal(response.status, 200);
  if (!until) return response.text();
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let text = '';
  while (!text.includes(until)) {
    const { value, done } = await reader.read();
    assert.ok(!done, `the stream showed ${until}: ${text}`);
    text += decoder.decode(value);
  }
  await reader.cancel();
  return text;
}

test('allowing the tool for this session runs the next note without a card; the inbox revokes the grant', async () => {
  const { page, errors } = await openPage();
  await send(page, 'note granted one');
  const card = page.locator('section.card').first();
  await card.waitFor();
  assert.match(await card.locator('.grant-offer').textContent(), /Allow note for this session for .*at most/);
  await card.getByLabel('Allow these tools for this session').check();
  // Calls beside the time, as the CLIs' --grant SCOPE:TTL:N.
  await card.getByLabel('At most how many calls').selectOption('10');
  await card.getByRole('button', { name: 'Confirm' }).click();
  await page.locator('.outcome.completed').first().waitFor();

  await send(page, 'note granted two');
  await page.locator('.outcome.completed').nth(1).waitFor();
  assert.equal(await page.locator('section.card').count(), 1, 'the second note was not asked');
  assert.match(await page.locator('#log').textContent(), /ran without asking|grant/);

  await page.evaluate(() => { location.hash = '#inbox'; });
  const grant = page.locator('#grants-list .grant', { hasText: 'note for session' });
  await grant.waitFor();
  assert.match(await grant.textContent(), /9 of 10 calls left/);
  await grant.getByRole('button', { name: /Revoke/ }).click();
  await page.locator('#grants-status', { hasText: 'No live grants.' }).waitFor();
  assert.deepEqual(errors, []);
  await page.close();
});

test('an approver finds an agent\'s pending run in the inbox and confirms it; the run completes', async () => {
  const keyed = await startServer(['--step-delay', '0', '--api-key', 'agent-key-0001',
    '--approver-key', 'approver-key-01', '--keep-alive', '50ms']);
  try {
    await agentLeavesAPause(keyed.url, 'agent-key-0001', 'nightly-report', 'write the report; email it');
    await agentLeavesAPause(keyed.url, 'agent-key-0001', 'pick-region', 'ask region: which region? eu | us; deploy to {region}');
    const page = await browser.newPage({ viewport: { width: 1000, height: 900 } });
    page.setDefaultTimeout(WAIT);
    const errors = [];
    page.on('pageerror', (err) => errors.push(err.message));
    await page.addInitScript(() => sessionStorage.setItem('chatgate-key', 'approver-key-01'));
    await page.goto(keyed.url + '/#inbox');

    const report = page.locator('.inbox-item', { hasText: 'nightly-report' });
    await report.waitFor();
    const listed = await report.textContent();
    assert.match(listed, /Approval low risk Confirm the plan of 2 task\(s\)\? · session nightly-report · from key-1 · expires in \d+ min/);
    // Each task at a glance: its risk, its text, what runs it.
    assert.match(listed, /low risk write the report simulated: no tool runs/);
    assert.match(listed, /low risk email it simulated: no tool runs/);
    await page.screenshot({ path: join(SHOTS, 'inbox.png') });
    // An approver's key starts no runs: no composer over the cards.
    assert.equal(await page.locator('#composer').isVisible(), false);
    await report.getByRole('button', { name: 'Open' }).click();
    // The card takes the focus of the button it replaced.
    assert.equal(await page.evaluate(() => document.activeElement.tagName), 'H2');
    await report.getByRole('button', { name: 'Confirm' }).click();
    await report.locator('.decided', { hasText: 'Decision: confirm' }).waitFor();
    // The approver sees how the run it decided ended.
    await report.locator('.run-end', { hasText: 'Run ended: completion: Completed 2 task(s).' }).waitFor();
    const question = page.locator('.inbox-item', { hasText: 'pick-region' });
    await question.getByRole('button', { name: 'Open' }).click();
    await question.getByRole('radio', { name: 'us' }).check();
    await question.getByRole('button', { name: 'Answer' }).click();
    await question.locator('.decided', { hasText: 'Decision: answer' }).waitFor();

    const run = await agentReadsItsRun(keyed.url, 'agent-key-0001', 'nightly-report');
    assert.match(run, /"chunk_type":"confirmation_received"/);
    assert.match(run, /"chunk_type":"completion"/);
    const asked = await agentReadsItsRun(keyed.url, 'agent-key-0001', 'pick-region', '"description":"deploy to us"');
    assert.match(asked, /"answers":\{"region":"us"\}/, 'the plan the answer made waits now');
    assert.deepEqual(errors, []);
    await page.close();
  } finally {
    keyed.server.kill('SIGTERM');
  }
});

test('a deploy that needs two approvals: the first approver is told it waits for one more', async () => {
  const tools = join(DIR, 'quorum.toml');
  writeFileSync(tools, `[[tool]]
name = "deploy"
description = "Deploy"
risk = "high"
approvals = 2
command = ["true"]
parameters = { type = "object", properties = { step = { type = "string" } } }
`);
  const keys = join(DIR, 'quorum-keys.txt');
  writeFileSync(keys, 'agent-key-0009 label=ci-bot\napprover lead-key-0009 label=lead-1\napprover lead-key-0010 label=lead-2\n');
  const keyed = await startServer(['--step-delay', '0', '--tools', tools, '--api-keys-file', keys, '--keep-alive', '50ms']);
  try {
    await agentLeavesAPause(keyed.url, 'agent-key-0009', 'prod-deploy', 'deploy web');
    const page = await browser.newPage({ viewport: { width: 1000, height: 900 } });
    page.setDefaultTimeout(WAIT);
    const errors = [];
    page.on('pageerror', (err) => errors.push(err.message));
    await page.addInitScript(() => sessionStorage.setItem('chatgate-key', 'lead-key-0009'));
    await page.goto(keyed.url + '/#inbox');
    const item = page.locator('.inbox-item', { hasText: 'prod-deploy' });
    await item.waitFor();
    assert.match(await item.textContent(), /from ci-bot/);
    assert.match(await item.textContent(), /0 of 2 approvals/);
    await item.getByRole('button', { name: 'Open' }).click();
    await item.getByRole('button', { name: /Confirm/ }).waitFor();
    // Two people approve what it runs: no edit nor respond (always 422), no grant offer.
    assert.equal(await item.getByRole('button', { name: 'edit arguments' }).count(), 0);
    assert.equal(await item.getByRole('button', { name: 'respond instead' }).count(), 0);
    assert.equal(await item.locator('.grant-offer').count(), 0);
    await item.getByRole('button', { name: /Confirm/ }).click();
    await item.locator('.hint', { hasText: 'waiting for 1 more approval' }).waitFor();
    assert.equal(await item.getByRole('button', { name: /Confirm/ }).isVisible(), false,
      'this label approved: no second Confirm for it');
    // Loaded again, the page knows it from the server: no Confirm, and why.
    await page.reload();
    const again = page.locator('.inbox-item', { hasText: 'prod-deploy' });
    await again.waitFor();
    assert.match(await again.textContent(), /1 of 2 approvals \(lead-1\)/);
    assert.match(await again.textContent(), /you cannot confirm: lead-1 approved it already/);
    await again.getByRole('button', { name: 'Open' }).click();
    await again.locator('.hint', { hasText: 'You cannot confirm' }).waitFor();
    assert.equal(await again.getByRole('button', { name: /Confirm/ }).isVisible(), false);
    assert.equal(await again.getByRole('button', { name: 'Cancel' }).isVisible(), true);
    assert.deepEqual(errors, []);
    await page.close();
  } finally {
    keyed.server.kill('SIGTERM');
  }
});

test('a decide_url (#session=ID) opens that session\'s pending card at once', async () => {
  const keyed = await startServer(['--step-delay', '0', '--api-key', 'agent-key-0002',
    '--approver-key', 'approver-key-02', '--keep-alive', '50ms']);
  try {
    await agentLeavesAPause(keyed.url, 'agent-key-0002', 'linked run', 'rotate the keys');
    const page = await browser.newPage();
    page.setDefaultTimeout(WAIT);
    await page.addInitScript(() => sessionStorage.setItem('chatgate-key', 'approver-key-02'));
    await page.goto(keyed.url + '/#session=' + encodeURIComponent('linked run'));

    const card = page.getByRole('region', { name: 'Confirmation request' });
    await card.waitFor();
    assert.deepEqual(await card.locator('li label span').allTextContents(), ['rotate the keys']);
    await card.getByRole('button', { name: 'Cancel' }).click();
    await card.locator('.decided', { hasText: 'Decision: cancel' }).waitFor();
    const run = await agentReadsItsRun(keyed.url, 'agent-key-0002', 'linked run');
    assert.match(run, /"reason":"user"/);
    await page.close();
  } finally {
    keyed.server.kill('SIGTERM');
  }
});

/** A decision link's path, signed as chatgate signs it (docs/operations.md). */
function linkPath(secret, confirmationId, label) {
  const expires = Date.now() + 600_000;
  const mac = createHmac('sha256', secret)
    .update(`chatgate-link-v1:${confirmationId}.${label}.${expires}`)
    .digest('hex')
    .slice(0, 32);
  return `/d/${confirmationId}.${label}.${expires}.${mac}`;
}

test('a decision link opens a page that works without JavaScript on a phone and decides once', async () => {
  const secret = 'a-link-secret-for-the-browser-test-0001';
  const keys = join(DIR, 'link-keys.txt');
  writeFileSync(keys, 'agent-key-0011 label=ci-bot\napprover lead-key-0011 label=lead-1\n');
  const keyed = await startServer(['--step-delay', '0', '--api-keys-file', keys, '--keep-alive', '50ms',
    '--public-url', 'https://gate.example', '--link-secret', secret]);
  try {
    const response = await fetch(keyed.url + '/api/v1/chat/stream', {
      method: 'POST',
      headers: { 'Content-Type': 'application/json', Authorization: 'Bearer agent-key-0011' },
      body: JSON.stringify({ message: 'rotate the keys; restart the api', session_id: 'linked' }),
    });
    const reader = response.body.getReader();
    let text = '';
    while (!text.includes('"stream_paused":true')) {
      const { value, done } = await reader.read();
      assert.ok(!done, 'the run paused');
      text += new TextDecoder().decode(value);
    }
    await reader.cancel();
    const id = text.match(/"confirmation_id":"([0-9a-f-]{36})"/)[1];
    const context = await browser.newContext({ javaScriptEnabled: false, viewport: { width: 390, height: 844 } });
    const page = await context.newPage();
    page.setDefaultTimeout(WAIT);
    await page.goto(keyed.url + linkPath(secret, id, 'lead-1'));
    await page.getByRole('heading', { name: /Confirm the plan/ }).waitFor();
    assert.match(await page.textContent('body'), /rotate the keys/);
    assert.match(await page.textContent('body'), /You decide as lead-1/);
    const width = await page.evaluate(() => document.documentElement.scrollWidth).catch(() => null);
    // Without JavaScript evaluate still runs (Playwright's own); nothing spills sideways.
    if (width !== null) assert.ok(width <= 390, `page width ${width}`);
    await page.screenshot({ path: join(SHOTS, 'decision-link-phone.png'), fullPage: true });
    await page.getByRole('button', { name: 'Confirm' }).click();
    await page.getByRole('heading', { name: 'Confirmed' }).waitFor();
    // The same link again: decided, by whom.
    await page.goto(keyed.url + linkPath(secret, id, 'lead-1'));
    await page.getByRole('heading', { name: 'Already decided' }).waitFor();
    assert.match(await page.textContent('body'), /confirm by lead-1/);
    await context.close();
  } finally {
    keyed.server.kill('SIGTERM');
  }
});

test('a call cut short by kill -9 is put to a person: its card on the page runs it again', async () => {
  // A `mark` tool that notes its idempotency key, then sleeps while `slow`
  // is there; its server is killed mid-call and started again (SQLite).
  const dir = mkdtempSync(join(tmpdir(), 'chatgate-reconcile-'));
  const starts = join(dir, 'starts');
  const slow = join(dir, 'slow');
  const tools = join(dir, 'tools.toml');
  writeFileSync(tools, `[[tool]]
name = "mark"
description = "Marks"
risk = "low"
command = ["sh", "-c", "echo \\"$CHATGATE_IDEMPOTENCY_KEY\\" >> ${starts}; if [ -f ${slow} ]; then sleep 30; fi; echo marked"]
parameters = { type = "object" }
`);
  const args = ['--store', 'sqlite:' + join(dir, 'runs.db'), '--step-delay', '0', '--tools', tools];
  const lines = () => { try { return readFileSync(starts, 'utf8').split('\n').filter(Boolean); } catch { return []; } };
  const post = (url, body) => fetch(url + '/api/v1/chat/stream', {
    method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify(body),
  });
  const readUntil = async (response, needle) => {
    const reader = response.body.getReader();
    let text = '';
    while (!text.includes(needle)) {
      const { value, done } = await reader.read();
      if (done) break;
      text += new TextDecoder().decode(value);
    }
    return { reader, text };
  };
  writeFileSync(slow, '');
  const first = await startServer(args);
  let second;
  try {
    const opened = await readUntil(await post(first.url, { message: 'mark it', session_id: 'cut' }), 'confirmation_request');
    assert.match(opened.text, /confirmation_request/);
    const confirmed = await post(first.url, { message: 'CONFIRM_ACTION:confirm', session_id: 'cut' });
    assert.equal(confirmed.status, 200);
    const deadline = Date.now() + WAIT;
    while (lines().length < 1) {
      assert.ok(Date.now() < deadline, 'mark never started');
      await new Promise((r) => setTimeout(r, 20));
    }
    const exited = new Promise((r) => first.server.once('exit', r));
    first.server.kill('SIGKILL');
    await exited;
    opened.reader.cancel().catch(() => {});
    rmSync(slow);
    second = await startServer(args);

    // The page opened on the session (a webhook's decide_url) shows the card.
    const { page, errors } = await openPage(undefined, second.url);
    await page.goto(second.url + '/#session=cut');
    const item = page.locator('.inbox-item', { hasText: 'Did it run?' });
    await item.waitFor();
    const card = item.locator('section.card');
    await card.waitFor();
    const key = lines()[0];
    assert.match(await card.textContent(), new RegExp(`task 1: mark · key ${key}`));
    assert.match(await card.textContent(), /may have taken effect/);
    await card.screenshot({ path: join(SHOTS, 'reconcile-card.png') });
    await card.getByRole('button', { name: 'Run again' }).click();
    const ended = item.locator('.run-end');
    await ended.waitFor();

    assert.match(await ended.textContent(), /Run ended: completion/);
    assert.match(await card.locator('.decided').textContent(), /Decision: run_again/);
    assert.deepEqual(lines(), [key, key], 'run again once, with the same key');
    assert.deepEqual(errors, []);
    await page.close();
  } finally {
    first.server.kill('SIGKILL');
    second?.server.kill('SIGTERM');
    rmSync(dir, { recursive: true, force: true });
  }
});

