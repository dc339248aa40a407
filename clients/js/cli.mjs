#!/usr/bin/env node
// chatgate command line (Node 18+), the same flags and exit codes as the
// Python client:
//   node cli.mjs [--url URL] [--session ID] [--reply R ...] [--auto-confirm]
//                [--reject N ...] [--edit N=JSON ...] [--respond N=TEXT ...]
//                [--grant SCOPE:TTL[:N]] [--answer ID=VALUE ...] [--answer-text TEXT] [--skip]
//                [--json] [--wait] [--api-key KEY] "message"
// Exit codes: 0 completed, 2 cancelled, 1 error; a one-line reason on stderr.

import { parseArgs } from 'node:util';
import { createInterface } from 'node:readline/promises';
import {
  ASK_AGAIN, ChatGateClient, ChatGateError, everyTask, expects, formatChunk, grantedTools, grantOf,
  parseGrantFlag, parseReply, withPreviewsSeen,
} from './chatgate-client.mjs';

const DEFAULT_URL = 'http://127.0.0.1:8080';
/** Milliseconds the cancel sent on Ctrl-C may take. */
const CANCEL_TIMEOUT_MS = 2000;

const USAGE = `usage: cli.mjs [--url URL] [--session ID] [--api-key KEY] [--reply R]... [--auto-confirm]
              [--reject N]... [--edit N=JSON]... [--respond N=TEXT]... [--grant SCOPE:TTL[:N]]
              [--answer ID=VALUE]... [--answer-text TEXT] [--skip] [--json] [--wait] MESSAGE
       cli.mjs [--url URL] [--api-key KEY] (--inbox | --decide ID | --attach SESSION) [replies...]
       cli.mjs [--url URL] [--api-key KEY] (--grants | --revoke-grant ID)
  --inbox          list the pauses this key may decide (an approver's: every
                   namespace's), with a quorum's progress and whether this key
                   may approve each (and why not), then exit
  --grants         list the live grants this key may see, then exit
  --revoke-grant ID
                   revoke grant ID: exit 0 when revoked, 1 when there is none
  --decide ID      decide the listed pause ID (its confirmation_id): shown, then
                   asked on the terminal or answered by --reply/--auto-confirm/
                   --answer/--skip; exit 0 when taken, 1 when refused
  --decide N=DECISION,...
                   with a message: decide the first pause's tasks named on their
                   own first (1=approve,3=reject:why,2=respond:text,4=edit:{json};
                   a task by index or task_id); the others stay pending for the
                   replies that follow
  --attach SESSION follow the run of SESSION from its start (or its kept
                   outcome) to its end, answering its pauses as for a message
  --url URL        server base URL (default: $CHATGATE_URL or ${DEFAULT_URL})
  --session ID     session id (default: a new UUID, made by this client)
  --api-key KEY    bearer key (default: $CHATGATE_API_KEY)
  --reply R        scripted reply, one per round, in order: confirm, cancel,
                   modify:<text> (or modify alone: the same plan again). A reply
                   that is not among the offered options cancels the run, exit 1.
  --auto-confirm   confirm every round once the scripted replies are used up
  --reject N       with the first confirm: do not run task N (repeatable)
  --edit N=JSON    with the first confirm: run task N with these arguments
  --respond N=TEXT with the first confirm: do not run task N, use TEXT as its result
  --grant SCOPE:TTL[:N]
                   with the first confirm: also allow later calls of the pause's
                   tools without asking, in this session (session:30m) or every
                   session of the key (key:1h), at most N calls (default 100)
  --answer ID=VALUE
                   scripted answer to the question ID (or its header, as the
                   prompt shows it) of every question pause
                   (repeatable): an option's id or label (a,b for several), other
                   text, or a typed value; an answer that does not fit exits 1,
                   naming the question
  --answer-text TEXT
                   scripted answer to a question pause of one question
  --skip           decline every question pause (the run goes on without answers)
  --json           print raw chunks, one JSON per line
  --wait           without a terminal and with no reply left, wait for the
                   decision to come from elsewhere (another client, the page)
Without replies left, a terminal is asked (until the confirmation expires);
without a terminal (a script, stdin not a tty) the CLI says so, cancels the
pending confirmation and exits 1 at once (unless --wait), as it does when the
server refuses a scripted reply. Ctrl-C while a confirmation is pending cancels it on the
server before exiting.
Exit codes: 0 completed, 2 cancelled, 1 error.`;

/** A scripted reply that cannot work: the run is cancelled, exit 1. */
class ScriptError extends Error {}

async function main(argv) {
  let parsed;
  try {
    parsed = parseArgs({
      args: argv,
      allowPositionals: true,
      options: {
        url: { type: 'string', default: process.env.CHATGATE_URL ?? DEFAULT_URL },
        session: { type: 'string' },
        'api-key': { type: 'string', default: process.env.CHATGATE_API_KEY },
        reply: { type: 'string', multiple: true, default: [] },
        'auto-confirm': { type: 'boolean', default: false },
        reject: { type: 'string', multiple: true, default: [] },
        edit: { type: 'string', multiple: true, default: [] },
        respond: { type: 'string', multiple: true, default: [] },
        grant: { type: 'string' },
        answer: { type: 'string', multiple: true, default: [] },
        'answer-text': { type: 'string' },
        skip: { type: 'boolean', default: false },
        json: { type: 'boolean', default: false },
        wait: { type: 'boolean', default: false },
        inbox: { type: 'boolean', default: false },
        grants: { type: 'boolean', default: false },
        'revoke-grant': { type: 'string' },
        decide: { type: 'string' },
        attach: { type: 'string' },
        help: { type: 'boolean', short: 'h', default: false },
      },
    });
  } catch (err) {
    process.stderr.write(`${err.message}\n${USAGE}\n`);
    return 1;
  }
  const { values, positionals } = parsed;
  if (values.help) {
    process.stdout.write(`${USAGE}\n`);
    return 0;
  }
  // --decide N=DECISION,...: the first pause's tasks named, decided on
  // their own first (--decide ID is the listed pause's id).
  let decideFirst = null;
  if (values.decide !== undefined && values.decide.includes('=')) {
    try {
      decideFirst = parseTaskFlag(values.decide);
    } catch (err) {
      process.stderr.write(`--decide: ${err.message}\n${USAGE}\n`);
      return 1;
    }
    values.decide = undefined;
  }
  const approving = values.inbox || values.decide !== undefined || values.attach !== undefined
    || values.grants || values['revoke-grant'] !== undefined;
  if (positionals.length !== (approving ? 0 : 1)) {
    process.stderr.write(`expected exactly one MESSAGE (or --inbox, --decide ID, --attach SESSION, --grants, --revoke-grant ID)\n${USAGE}\n`);
    return 1;
  }
  // Following a run that may be decided elsewhere (its replayed pauses
  // were): with nothing scripted, wait rather than give up.
  if (values.attach !== undefined) values.wait = true;
  let planned;
  let scriptedAnswers;
  let granting = null;
  try {
    planned = plannedDecisions(values);
    scriptedAnswers = answersOf(values.answer);
    if (values.grant !== undefined) granting = parseGrantFlag(values.grant);
  } catch (err) {
    process.stderr.write(`${err.message}\n${USAGE}\n`);
    return 1;
  }
  // The scripted reply just sent (a confirm whose grant the server refuses
  // goes again without it).
  let lastReply = null;
  const withPlanned = (reply, chunk) => {
    lastReply = planReply(reply, chunk);
    return lastReply;
  };
  const planReply = (reply, chunk) => {
    // The per-task flags (with a decision for every task) and --grant go
    // with the first confirm.
    if (parseReply(reply)?.[0] !== 'confirm' || (planned.length === 0 && !granting)) return reply;
    const given = typeof reply === 'object' && reply !== null && !Array.isArray(reply)
      ? { ...reply } : { action: 'confirm' };
    if (planned.length > 0) {
      given.decisions = everyTask(planned, chunk);
      planned = [];
    }
    if (granting) {
      const tools = grantedTools(chunk);
      if (tools.length > 0) {
        given.grant = grantOf(granting.scope, tools, { ttl: granting.ttl, maxCalls: granting.maxCalls });
      } else {
        process.stderr.write('--grant: no task of this pause calls a tool; nothing granted\n');
      }
      granting = null;
    }
    return given;
  };
  const replies = [...values.reply];
  const interactive = Boolean(process.stdin.isTTY);
  const out = process.stdout;
  const client = new ChatGateClient(values.url, { apiKey: values['api-key'] });
  const sessionId = values.attach ?? values.session ?? globalThis.crypto.randomUUID();
  // The confirmation request waiting for a decision, if any, and its place
  // on the run's stream.
  let pending = null;
  let pendingAt = 0;
  let inContent = false;
  // A scripted reply was just sent: an error chunk now is its refusal.
  let scripted = false;

  const onChunk = (chunk) => {
    if (scripted && chunk.chunk_type === 'error'
      && ['invalid_grant', 'too_many_grants'].includes(chunk.metadata?.error_type)
      && lastReply && typeof lastReply === 'object' && lastReply.grant) {
      // A refused grant never cancels: the confirm goes again without it.
      process.stderr.write(`--grant was refused: ${chunk.chunk} (${chunk.metadata.error_type}); confirming without it\n`);
      const without = lastReply;
      lastReply = null;
      scripted = false;
      client.reply(sessionId, 'confirm', null, { confirmationId: pending?.confirmation_id, decisions: without.decisions })
        .then((ack) => {
          if (ack.chunk_type === 'error') {
            process.stderr.write(`the server refused the confirm without the grant too: ${ack.chunk} (${ack.metadata?.error_type})\n`);
          }
        })
        .catch((err) => process.stderr.write(`the confirm without the grant could not be sent: ${err.message}\n`));
    }
    if (scripted && chunk.chunk_type === 'error' && chunk.metadata?.error_type !== 'already_decided') {
      // The server refused what the script said (a task number or
      // arguments that do not fit): waiting on would ask nobody. (A
      // decision that stands, this reply's own after an unknown outcome
      // included, shows on the run's stream: that is no refusal.)
      throw new ScriptError(`the server refused the scripted reply: ${chunk.chunk} ` +
        `(${chunk.metadata?.error_type ?? 'error'})`);
    }
    scripted = false;
    if (['confirmation_request', 'input_request'].includes(chunk.chunk_type)) {
      pending = chunk.confirmation_data;
      pendingAt = chunk.sequence ?? 0;
    } else if ((chunk.chunk_type === 'confirmation_received' || chunk.finished)
      && (chunk.sequence ?? Infinity) > pendingAt) {
      // Only the run's own stream, past the pause, ends it: a refused
      // reply's one chunk (numbered on its own stream, from 1) does not.
      pending = null;
    }
    if (values.json) {
      out.write(`${JSON.stringify(chunk)}\n`);
    } else if (chunk.chunk_type === 'content') {
      out.write(chunk.chunk);
      inContent = true;
    } else {
      if (inContent) out.write('\n');
      inContent = false;
      out.write(`${formatChunk(chunk)}\n`);
    }
  };

  const onConfirmation = async (chunk, { signal } = {}) => {
    const data = chunk.confirmation_data ?? {};
    const options = data.options ?? ['confirm', 'modify', 'cancel'];
    if (decideFirst !== null) {
      const tasks = decideFirst;
      decideFirst = null;
      const ack = await client.decide(sessionId, tasks, { confirmationId: data.confirmation_id });
      out.write(`${values.json ? JSON.stringify(ack) : formatChunk(ack)}\n`);
      if (ack.chunk_type === 'error') {
        throw new ScriptError(`the server refused --decide: ${ack.chunk} (${ack.metadata?.error_type})`);
      }
      // Every task is decided: the run goes on by itself.
      if (ack.chunk_type === 'confirmation_received') return null;
    }
    if (replies.length > 0) {
      const reply = replies.shift();
      const answer = parseReply(reply);
      if (!answer || !options.includes(answer[0])) {
        throw new ScriptError(
          `scripted reply "${reply}" is not one of the offered options: ${options.join(', ')}`);
      }
      scripted = true;
      return withPlanned(reply, chunk);
    }
    if (values['auto-confirm']) {
      scripted = true;
      return withPlanned('confirm', chunk);
    }
    if (interactive) {
      const reply = await prompt(values.json ? process.stderr : out, data, options, signal);
      if (reply === null) return signal?.aborted ? ASK_AGAIN : null;
      return withPlanned(reply, chunk);
    }
    if (values.wait) {
      process.stderr.write(`waiting for a decision from elsewhere (session ${sessionId}, ` +
        `until ${data.expires_at ?? 'the timeout'})\n`);
      return null;
    }
    throw new ScriptError('a confirmation is waiting and nothing here can answer it: stdin is ' +
      'not a terminal and no --reply is left (script the answers with --reply or --auto-confirm, ' +
      'or --wait for a decision from elsewhere)');
  };

  const onQuestion = async (chunk, { signal } = {}) => {
    const data = chunk.confirmation_data ?? {};
    if (values.skip) {
      scripted = true;
      return 'skip';
    }
    if (scriptedAnswers) {
      scripted = true;
      return byQuestionId(scriptedAnswers, data.questions ?? []);
    }
    if (values['answer-text'] !== undefined) {
      scripted = true;
      return ['answer', values['answer-text']];
    }
    if (interactive) {
      const reply = await promptQuestions(values.json ? process.stderr : out, data, signal);
      return reply === null && signal?.aborted ? ASK_AGAIN : reply;
    }
    if (values.wait) {
      process.stderr.write(`waiting for an answer from elsewhere (session ${sessionId}, ` +
        `until ${data.expires_at ?? 'the timeout'})\n`);
      return null;
    }
    throw new ScriptError('questions are waiting and nothing here can answer them: stdin is ' +
      'not a terminal and no --answer, --answer-text or --skip was given (or --wait for an ' +
      'answer from elsewhere)');
  };

  // Ctrl-C: a pending confirmation is cancelled on the server first, so a
  // run this client gave up on cannot be confirmed from elsewhere later.
  let interrupting = null;
  const interrupt = () => {
    interrupting ??= (async () => {
      if (inContent) out.write('\n');
      if (pending) {
        const said = await cancelPending(client, sessionId, pending);
        process.stderr.write(`interrupted: ${said}\n`);
      } else {
        process.stderr.write('interrupted\n');
      }
      process.exit(2);
    })();
  };
  process.on('SIGINT', interrupt);
  // A reader that went away (`| head`) ends the CLI quietly, exit 1.
  out.on('error', (err) => {
    if (err.code === 'EPIPE') process.exit(1);
    throw err;
  });
  prompt.onInterrupt = interrupt;

  let result;
  try {
    if (values.inbox) return await listInbox(client, out);
    if (values.grants) return await listGrants(client, out);
    if (values['revoke-grant'] !== undefined) return await revokeGrant(client, values['revoke-grant'], out);
    if (values.decide !== undefined) return await decideListed(client, values.decide, onConfirmation, onQuestion, out);
    result = values.attach !== undefined
      ? await client.resume(sessionId, { onChunk, onConfirmation, onQuestion })
      : await client.run(positionals[0], { sessionId, onChunk, onConfirmation, onQuestion });
  } catch (err) {
    if (err instanceof ScriptError) {
      const said = pending ? `; ${await cancelPending(client, sessionId, pending)}` : '';
      process.stderr.write(`error: ${err.message}${said}\n`);
      return 1;
    }
    if (err instanceof ChatGateError) {
      process.stderr.write(`error: ${err.message}\n`);
      return 1;
    }
    throw err;
  }
  if (result.outcome === 'completed') {
    // A plan of which nothing ran because its tasks were rejected: as a cancel.
    const counts = result.final?.metadata ?? {};
    if (counts.tasks_completed === 0 && (counts.tasks_rejected > 0 || counts.tasks_denied > 0)) {
      process.stderr.write(`nothing ran: ${result.final.chunk}\n`);
      return 2;
    }
    return 0;
  }
  const kind = result.outcome === 'cancelled' ? 'cancelled' : 'error';
  // The reason line is for scripts; on one terminal the end was just shown.
  if (!(process.stdout.isTTY && process.stderr.isTTY && !values.json)) {
    process.stderr.write(`${kind}: ${result.reason}: ${result.final?.chunk ?? ''}\n`);
  }
  return result.exitCode;
}

/** --inbox: one entry per pending pause, its tasks under it. */
async function listInbox(client, out) {
  const items = await client.interactions({ limit: 500 });
  if (items.length === 0) out.write('nothing is waiting for a decision\n');
  for (const item of items) {
    const what = item.kind === 'question' ? item.title : item.summary;
    const risk = item.risk_level ? ` (${item.risk_level} risk)` : '';
    const minutes = Math.ceil((item.expires_in_seconds ?? 0) / 60);
    out.write(`${item.confirmation_id}  ${item.kind}${risk}  ${what}  session ${item.session_id}  from ${item.key}  expires in ${minutes} min\n`);
    if (item.required > 1 || item.approvers?.length) {
      const approvals = item.approvals ?? [];
      const by = item.approvers?.length ? ` of ${item.approvers.join(' and ')}` : '';
      const so = approvals.length ? `: ${approvals.join(', ')}` : '';
      out.write(`    needs ${item.required ?? 1}${by}; ${approvals.length} of ${item.required ?? 1} approved${so}\n`);
    }
    if (item.may_approve === false) out.write(`    you may not approve it: ${item.why_not}\n`);
    for (const task of item.tasks ?? []) {
      const runs = task.simulated ? 'simulated: no tool runs' : `${task.tool} ${task.args}`;
      out.write(`    ${task.index}. ${task.description}  (${task.risk_level} risk; ${runs})\n`);
    }
  }
  return 0;
}

/** --decide ID: the listed pause shown, decided as a run's would be. */
async function decideListed(client, confirmationId, onConfirmation, onQuestion, out) {
  const items = await client.interactions({ limit: 500 });
  const item = items.find((i) => i.confirmation_id === confirmationId);
  if (!item) {
    process.stderr.write(`error: no pause ${confirmationId} is waiting for this key (decided, expired, or another namespace's)\n`);
    return 1;
  }
  const question = item.kind === 'question';
  const chunk = {
    chunk_type: question ? 'input_request' : 'confirmation_request',
    chunk: question ? item.title : item.summary,
    session_id: item.session_id,
    confirmation_data: item.confirmation_data,
  };
  out.write(`${formatChunk(chunk)}\n`);
  const given = await (question ? onQuestion : onConfirmation)(chunk, {});
  if (given === null || given === undefined || given === ASK_AGAIN) return 1;
  let ack;
  if (question && typeof given === 'object' && !Array.isArray(given)) {
    ack = await client.reply(item.session_id, 'answer', null, { confirmationId, answers: given });
  } else {
    const [action, text, decisions, grant] = parseReply(given);
    const since = Date.now();
    ack = await client.reply(item.session_id, action, text, {
      confirmationId, decisions: withPreviewsSeen(decisions, chunk, action), grant,
    });
    if (grant && ack.chunk_type === 'confirmation_received') {
      out.write(`${formatChunk(ack)}\n`);
      out.write(`${await grantMade(client, item.session_id, since)}\n`);
      return 0;
    }
  }
  out.write(`${formatChunk(ack)}\n`);
  return ['confirmation_received', 'approval_recorded'].includes(ack.chunk_type) ? 0 : 1;
}

/** The grant a confirm just gave on `sessionId`, in words: the run keeps
 * it as it goes on, so it is looked for a few seconds. */
async function grantMade(client, sessionId, since) {
  for (let tries = 0; tries < 50; tries += 1) {
    const made = (await client.grants()).find(
      (g) => g.session_id === sessionId && Date.parse(g.created_at) >= since - 2000,
    );
    if (made) return describeGrant(made);
    await new Promise((resolve) => { setTimeout(resolve, 100); });
  }
  return 'the grant was not kept (the run\'s stream says why); later calls will be asked';
}

/** A grant in one line: what it allows, where, until when, how many calls. */
function describeGrant(g) {
  const where = g.scope === 'key' ? `every session of ${g.key}` : `session ${g.session_id}`;
  return `granted: ${g.tools.join(', ')} for ${where} until ${g.expires_at}, `
    + `${g.calls_left} of ${g.max_calls} call(s) left (grant ${g.id}, by ${g.granted_by})`;
}

/** --grants: the live grants this key may see, one a line. */
async function listGrants(client, out) {
  const grants = await client.grants();
  if (grants.length === 0) out.write('no live grants\n');
  for (const g of grants) out.write(`${describeGrant(g)}\n`);
  return 0;
}

/** --revoke-grant ID: 0 when revoked, 1 when there is no such grant here. */
async function revokeGrant(client, id, out) {
  if (await client.revokeGrant(id)) {
    out.write(`revoked grant ${id}\n`);
    return 0;
  }
  process.stderr.write(`error: no grant ${id} for this key (expired, spent, revoked, or another namespace's)\n`);
  return 1;
}

/**
 * `1=approve,3=reject:why,2=respond:text,4=edit:{"k":1}` (a task by its
 * index or task_id) as `taskDecisions` takes it; throws if malformed. A
 * reason or result may hold commas: a new task starts at `,<task>=`.
 */
function parseTaskFlag(text) {
  const tasks = {};
  for (const part of text.split(/,(?=\s*[\w.-]+=)/)) {
    const at = part.indexOf('=');
    const task = part.slice(0, at).trim();
    const given = part.slice(at + 1).trim();
    if (at < 0 || !task || !given) throw new Error(`expected TASK=DECISION[:TEXT], got "${part}"`);
    const colon = given.indexOf(':');
    const kind = colon < 0 ? given : given.slice(0, colon);
    const rest = colon < 0 ? '' : given.slice(colon + 1);
    if (!['approve', 'reject', 'edit', 'respond'].includes(kind)) {
      throw new Error(`task ${task}: "${kind}" is not approve, reject, edit or respond`);
    }
    if (kind === 'edit') {
      try {
        tasks[task] = ['edit', JSON.parse(rest)];
      } catch {
        throw new Error(`task ${task}: edit:JSON expects JSON arguments`);
      }
    } else if (kind === 'respond' && !rest) {
      throw new Error(`task ${task}: respond:TEXT expects the result`);
    } else {
      tasks[task] = rest ? [kind, rest] : kind;
    }
  }
  return tasks;
}

/** The decisions of --reject, --edit and --respond; throws if malformed. */
function plannedDecisions(values) {
  const planned = values.reject.map((n) => {
    if (!/^\d+$/.test(n.trim())) throw new Error(`--reject expects a task number, got "${n}"`);
    return { index: Number(n), decision: 'reject' };
  });
  for (const [flag, kind] of [['edit', 'edit'], ['respond', 'respond']]) {
    for (const given of values[flag]) {
      const at = given.indexOf('=');
      const index = given.slice(0, at).trim();
      if (at < 0 || !/^\d+$/.test(index)) {
        throw new Error(`--${flag} expects N=${kind === 'edit' ? 'JSON' : 'TEXT'}, got "${given}"`);
      }
      const value = given.slice(at + 1);
      if (kind === 'edit') {
        let args;
        try {
          args = JSON.parse(value);
        } catch {
          throw new Error(`--edit ${index}: the arguments are not JSON`);
        }
        planned.push({ index: Number(index), decision: 'edit', args });
      } else {
        planned.push({ index: Number(index), decision: 'respond', result: value });
      }
    }
  }
  return planned;
}

/** The answers of --answer ID=VALUE (null without any); throws if malformed. */
function answersOf(pairs) {
  if (pairs.length === 0) return null;
  const answers = {};
  for (const given of pairs) {
    const at = given.indexOf('=');
    if (at < 1 || !given.slice(0, at).trim()) throw new Error(`--answer expects ID=VALUE, got "${given}"`);
    answers[given.slice(0, at).trim()] = given.slice(at + 1);
  }
  return answers;
}

/** --answer pairs keyed by a question's id or its header (any case), as
 * the ids the server takes. */
function byQuestionId(answers, questions) {
  const named = {};
  for (const [key, value] of Object.entries(answers)) {
    const match = questions.find((q) => q.id === key)
      ?? questions.find((q) => (q.header ?? '').toLowerCase() === key.toLowerCase());
    named[match ? match.id : key] = value;
  }
  return named;
}

/** The id of the option `text` names: its number (1-based), its id or its
 * label, in any case; null for none. */
function optionNamed(options, text) {
  if (/^\d+$/.test(text)) {
    const n = Number(text);
    return n >= 1 && n <= options.length ? options[n - 1].id : null;
  }
  const lower = text.toLowerCase();
  const found = options.find((o) => String(o.id).toLowerCase() === lower || String(o.label ?? '').toLowerCase() === lower);
  return found ? found.id : null;
}

/** `text` as the value a question without options takes: [value, null],
 * or [null, what it expects]. */
function typed(question, text) {
  const schema = question.schema ?? {};
  const wrong = [null, `expects ${expects(question)}`];
  text = text.trim();
  if (schema.type === 'boolean') {
    const word = text.toLowerCase();
    if (['y', 'yes', 'true'].includes(word)) return [true, null];
    if (['n', 'no', 'false'].includes(word)) return [false, null];
    return wrong;
  }
  if (schema.type === 'integer' || schema.type === 'number') {
    const value = Number(text);
    if (!text || !Number.isFinite(value) || (schema.type === 'integer' && !Number.isInteger(value))) return wrong;
    if (value < (schema.minimum ?? value) || value > (schema.maximum ?? value)) return wrong;
    return [value, null];
  }
  if (!text) return wrong;
  if (text.length > (schema.maxLength ?? text.length) || text.length < (schema.minLength ?? 0)) return wrong;
  if (Array.isArray(schema.enum) && !schema.enum.includes(text)) return wrong;
  if (schema.pattern && !new RegExp(schema.pattern, 'u').test(text)) return wrong;
  return [text, null];
}

/** One question, asked until the answer fits: its value, undefined for an
 * optional one left empty, or null when the prompt gave up. */
async function askOne(ask, output, question) {
  const options = question.options ?? [];
  const hint = options.length
    ? `1-${options.length}${question.multi_select ? ', several as 1,3' : ''}${question.allow_other ? ', o for other' : ''}`
    : expects(question);
  for (;;) {
    const line = await ask(`  ${question.header || question.id} [${hint}]: `);
    if (line === null) return null;
    const text = line.trim();
    if (!text && !question.required) return undefined;
    if (!options.length) {
      const [value, wrong] = question.schema ? typed(question, text) : [text || null, 'expects a text'];
      if (value !== null) return value;
      output.write(`    ${wrong}\n`);
      continue;
    }
    if (question.allow_other && ['o', 'other'].includes(text.toLowerCase())) {
      const own = await ask('    your text: ');
      if (own === null) return null;
      if (own.trim()) return own.trim();
      continue;
    }
    const picks = text.split(',').map((p) => p.trim()).filter(Boolean);
    const chosen = picks.map((p) => optionNamed(options, p));
    if (picks.length > 0 && chosen.every((id) => id !== null) && (picks.length === 1 || question.multi_select)) {
      return question.multi_select ? chosen : chosen[0];
    }
    output.write(`    please answer ${hint}\n`);
  }
}

/** Asks a person on the terminal for the answers: the answers object,
 * 'skip', 'cancel', or null when the prompt gave up (as `prompt`). */
async function promptQuestions(output, data, interrupted) {
  const { ask, close } = terminal(output, data, interrupted);
  try {
    // A call a crash cut short: run it again, skip it, or cancel.
    while (data.kind === 'reconcile') {
      const line = await ask('run_again / skip / cancel? ');
      if (line === null) return null;
      const choice = line.trim().toLowerCase();
      if (['run_again', 'skip', 'cancel'].includes(choice)) return choice;
      output.write('please answer run_again, skip or cancel\n');
    }
    for (;;) {
      const line = await ask('answer / skip / cancel? [answer] ');
      if (line === null) break;
      const choice = line.trim().toLowerCase();
      if (['skip', 's'].includes(choice)) return 'skip';
      if (['cancel', 'c', 'x'].includes(choice)) return 'cancel';
      if (!['', 'answer', 'a'].includes(choice)) {
        output.write('please answer answer, skip or cancel\n');
        continue;
      }
      const answers = {};
      for (const question of data.questions ?? []) {
        const value = await askOne(ask, output, question);
        if (value === null) {
          break;
        }
        if (value !== undefined) answers[question.id] = value;
        if (question === data.questions.at(-1)) return answers;
      }
      break;
    }
    output.write(interrupted?.aborted
      ? '\nthe questions stopped waiting here (answered elsewhere, or their stream broke); following the run\n'
      : '\nno answer before the questions expired\n');
    return null;
  } finally {
    close();
  }
}

/** Asks about each task; returns the decisions, or null if the prompt gave up. */
async function decideTasks(ask, output, data) {
  const decisions = [];
  for (const task of data.tasks ?? []) {
    // What this task takes (older servers do not say: all of them).
    const takes = task.decisions ?? ['approve', 'reject', 'edit', 'respond'];
    const offered = ['yes', 'no', ...['edit', 'respond'].filter((d) => takes.includes(d))];
    for (;;) {
      const answer = await ask(`  task ${task.index}: ${task.description} -- run it? (${offered.join(' / ')}) `);
      if (answer === null) return null;
      const word = answer.trim().toLowerCase();
      if (['', 'y', 'yes'].includes(word)) break;
      if ((['e', 'edit'].includes(word) && !takes.includes('edit'))
        || (['r', 'respond'].includes(word) && !takes.includes('respond'))) {
        output.write(`    task ${task.index} calls no tool: there are no arguments to edit; answer ${offered.join(', ')}\n`);
        continue;
      }
      if (['n', 'no'].includes(word)) {
        const why = await ask('    why? (optional) ');
        if (why === null) return null;
        decisions.push(why.trim() ? { index: task.index, decision: 'reject', reason: why.trim() } : { index: task.index, decision: 'reject' });
        break;
      }
      if (['e', 'edit'].includes(word)) {
        const text = await ask(`    new arguments (JSON, now ${JSON.stringify(task.args)}): `);
        if (text === null) return null;
        try {
          decisions.push({ index: task.index, decision: 'edit', args: JSON.parse(text) });
          break;
        } catch {
          output.write('    not JSON; try again\n');
          continue;
        }
      }
      if (['r', 'respond'].includes(word)) {
        const text = await ask('    the result to use instead: ');
        if (text === null) return null;
        decisions.push({ index: task.index, decision: 'respond', result: text.trim() });
        break;
      }
      output.write(`    please answer ${offered.join(', ')}\n`);
    }
  }
  return decisions;
}

/** Sends cancel for `pending` with a short timeout; says what happened. */
async function cancelPending(client, sessionId, pending) {
  try {
    const ack = await Promise.race([
      client.reply(sessionId, 'cancel', null, { confirmationId: pending.confirmation_id }),
      new Promise((_, reject) => setTimeout(() => reject(new Error('no answer in time')), CANCEL_TIMEOUT_MS)),
    ]);
    if (ack.chunk_type === 'confirmation_received') return 'the pending confirmation was cancelled; nothing runs';
    return `could not cancel the pending confirmation (${ack.metadata?.error_type ?? ack.chunk})`;
  } catch (err) {
    return `could not cancel the pending confirmation (${err.message})`;
  }
}

/**
 * Asks a person on the terminal for one of `options`. Gives up (silent)
 * when the confirmation expires (the server has ended the run by then), or
 * when `interrupted` aborts (the pause stopped waiting for this terminal).
 */
async function prompt(output, data, options, interrupted) {
  const { ask, close } = terminal(output, data, interrupted);
  const last = !options.includes('modify');
  const shown = options.includes('confirm') ? [...options, 'decide'] : options;
  const question = `${shown.join(' / ')}?${last ? ' (last round)' : ''} `;
  const allowable = allowableTools(data, options);
  try {
    if (allowable.length) {
      output.write(`  (or allow: confirm, and allow ${allowable.join(', ')} for this session for 15 min without asking)\n`);
    }
    for (;;) {
      const line = await ask(question);
      if (line === null) {
        // Past its expiry it expired, whatever else the stream showed.
        const expired = !(Date.parse(data.expires_at ?? '') > Date.now());
        output.write(interrupted?.aborted && !expired
          ? '\nthe confirmation stopped waiting here (decided elsewhere, or its stream broke); following the run\n'
          : '\nno answer before the confirmation expired\n');
        return null;
      }
      const answer = line.trim().toLowerCase();
      if (answer === 'confirm') return 'confirm';
      if (['c', 'y', 'yes'].includes(answer)) {
        // A high-risk plan takes the whole word, as the page asks.
        if (data.risk_level === 'high') {
          output.write('this plan is high risk: type confirm to run it\n');
          continue;
        }
        return 'confirm';
      }
      if (['cancel', 'n', 'no', 'x'].includes(answer)) return 'cancel';
      if (allowable.length && ['allow', 'a'].includes(answer)) {
        return { action: 'confirm', grant: grantOf('session', allowable, { ttl: '15m' }) };
      }
      if (['decide', 'd'].includes(answer)) {
        const decisions = await decideTasks(ask, output, data);
        if (decisions === null) return null;
        return { action: 'confirm', decisions: everyTask(decisions, { confirmation_data: data }) };
      }
      if (!last && ['modify', 'm'].includes(answer)) {
        const text = await ask('what should change? (empty: ask again as is) ');
        if (text === null) return null;
        return ['modify', text.trim()];
      }
      output.write(`please answer ${options.join(', ')}\n`);
    }
  } finally {
    close();
  }
}

/** The tools "allow" may grant at the prompt ("yes, and don't ask again"):
 * the plan's real tools, when one person decides it and none is high risk
 * (a high risk tool is grantable only by its tools file: the server says). */
function allowableTools(data, options) {
  if (!options.includes('confirm') || (data.required ?? 1) > 1 || (data.approvers ?? []).length) return [];
  if ((data.tasks ?? []).some((t) => !t.simulated && t.risk_level === 'high')) return [];
  return grantedTools({ confirmation_data: data });
}

/** A terminal to ask on until the pause of `data` expires (and a second:
 * the server has ended the run by then) or `interrupted` aborts: `ask(text)`
 * resolves to the line, or null once it gave up. */
function terminal(output, data, interrupted) {
  const rl = createInterface({ input: process.stdin, output });
  rl.on('SIGINT', () => prompt.onInterrupt?.());
  const expires = Date.parse(data.expires_at ?? '');
  const expiry = new AbortController();
  const timer = Number.isFinite(expires)
    ? setTimeout(() => expiry.abort(), Math.max(0, expires - Date.now()) + 1000)
    : null;
  const signal = interrupted ? AbortSignal.any([expiry.signal, interrupted]) : expiry.signal;
  const ask = async (text) => {
    try {
      return await rl.question(text, { signal });
    } catch (err) {
      if (err?.name === 'AbortError') return null;
      throw err;
    }
  };
  const close = () => {
    if (timer) clearTimeout(timer);
    rl.close();
  };
  return { ask, close };
}

process.exitCode = await main(process.argv.slice(2));
