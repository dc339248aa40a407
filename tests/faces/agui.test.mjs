// The AG-UI face (#45) checked by AG-UI's own schemas: every event of a
// full interrupt / resume cycle parses with @ag-ui/core's EventSchema
// (a discriminated union over every event type), every input we send with its
// RunAgentInputSchema, the capabilities with AgentCapabilitiesSchema.
// Starts the chatgate binary itself (CHATGATE_BIN, default
// target/debug/chatgate) on a free loopback port.

import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { createInterface } from 'node:readline';
import { join, resolve, dirname } from 'node:path';
import { fileURLToPath } from 'node:url';
import {
  AgentCapabilitiesSchema,
  EventSchema,
  RunAgentInputSchema,
} from '@ag-ui/core/schemas';

const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), '..', '..');
const BIN = process.env.CHATGATE_BIN ?? join(ROOT, 'target', 'debug', 'chatgate');
const WAIT = 20_000;

let server;
let baseUrl;

before(async () => {
  server = spawn(BIN, ['--bind', '127.0.0.1:0', '--workers', '1', '--step-delay', '0ms'], {
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
});

after(() => server?.kill('SIGTERM'));

/** Runs the agent with `input` (checked by RunAgentInputSchema first): its events, each checked. */
async function run(input) {
  RunAgentInputSchema.parse(input);
  const response = await fetch(`${baseUrl}/api/v1/agui`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', accept: 'text/event-stream' },
    body: JSON.stringify(input),
    signal: AbortSignal.timeout(WAIT),
  });
  assert.equal(response.status, 200);
  assert.match(response.headers.get('content-type'), /^text\/event-stream/);
  const events = (await response.text())
    .split('\n')
    .filter((line) => line.startsWith('data: '))
    .map((line) => JSON.parse(line.slice(6)));
  for (const event of events) EventSchema.parse(event);
  assert.equal(events[0].type, 'RUN_STARTED');
  assert.equal(events[0].runId, input.runId);
  return events;
}

const input = (threadId, runId, text) => ({
  threadId,
  runId,
  state: {},
  tools: [],
  context: [],
  forwardedProps: {},
  messages: [{ id: `${runId}-u`, role: 'user', content: text }],
});

const resume = (threadId, runId, entries) => ({
  threadId,
  runId,
  tools: [],
  context: [],
  messages: [],
  resume: entries,
});

function interruptsOf(events) {
  const last = events.at(-1);
  assert.equal(last.type, 'RUN_FINISHED', JSON.stringify(events));
  assert.equal(last.outcome.type, 'interrupt');
  return last.outcome.interrupts;
}

test('an approval cycle: interrupts, a resume with an approve and a reject, success', async () => {
  const first = await run(input('agui-1', 'r1', 'create a report; email it'));
  const interrupts = interruptsOf(first);
  assert.equal(interrupts.length, 2);
  for (const interrupt of interrupts) {
    assert.equal(interrupt.reason, 'tool_approval');
    assert.equal(interrupt.toolCallId, interrupt.id);
    assert.ok(interrupt.responseSchema.oneOf, 'the task decision schema');
    assert.ok(Date.parse(interrupt.expiresAt) > Date.now());
    assert.ok(interrupt.metadata.confirmation_id);
  }
  const starts = first.filter((e) => e.type === 'TOOL_CALL_START').map((e) => e.toolCallId);
  assert.deepEqual(starts, interrupts.map((i) => i.id));

  const second = await run(resume('agui-1', 'r2', [
    { interruptId: interrupts[0].id, status: 'resolved', payload: { approved: true } },
    { interruptId: interrupts[1].id, status: 'resolved', payload: { decision: 'reject', reason: 'not now' } },
  ]));
  const last = second.at(-1);
  assert.equal(last.type, 'RUN_FINISHED', JSON.stringify(second));
  assert.deepEqual(last.outcome, { type: 'success' });
  const results = second.filter((e) => e.type === 'TOOL_CALL_RESULT');
  assert.deepEqual(results.map((r) => r.toolCallId), interrupts.map((i) => i.id));
  assert.equal(results[1].content, 'rejected: not now');

  // The same resume again: decided, told as a RUN_ERROR with chatgate's error_type.
  const again = await run(resume('agui-1', 'r3', [
    { interruptId: interrupts[0].id, status: 'resolved', payload: { approved: true } },
  ]));
  assert.equal(again.at(-1).type, 'RUN_ERROR');
  assert.equal(again.at(-1).code, 'already_decided');
});

test('a question cycle, then a cancelled plan', async () => {
  const asked = interruptsOf(await run(input('agui-2', 'r1', 'ask n: how many copies? [integer 1..9]; print {n} copies')));
  assert.equal(asked[0].reason, 'question');
  assert.equal(asked[0].responseSchema.type, 'integer');
  const plan = interruptsOf(await run(resume('agui-2', 'r2', [
    { interruptId: asked[0].id, status: 'resolved', payload: 3 },
  ])));
  assert.equal(plan[0].metadata.args.step, 'print 3 copies');
  const cancelled = await run(resume('agui-2', 'r3', [{ interruptId: plan[0].id, status: 'cancelled' }]));
  assert.deepEqual(cancelled.at(-1).outcome, { type: 'cancelled' });
});

test('the capabilities parse as AgentCapabilities', async () => {
  const response = await fetch(`${baseUrl}/api/v1/agui/capabilities`);
  assert.equal(response.status, 200);
  const capabilities = AgentCapabilitiesSchema.parse(await response.json());
  assert.equal(capabilities.humanInTheLoop.interrupts, true);
  assert.equal(capabilities.humanInTheLoop.approveWithEdits, true);
});
