// chatgate client: a zero-dependency ES module for Node 18+ and browsers.
//
//   import { ChatGateClient } from './chatgate-client.mjs';
//   const client = new ChatGateClient('http://127.0.0.1:8080');
//   const result = await client.run('create a report; then email it', {
//     onChunk: (chunk) => console.log(chunk.chunk_type, chunk.chunk),
//     onConfirmation: async (chunk) => 'confirm', // or 'cancel', 'modify:<text>', ['modify', text], null
//     onQuestion: async (chunk) => ({ region: 'eu-west' }), // or 'skip', 'cancel', 'answer:<text>', null
//   });
//   console.log(result.outcome, result.final.chunk);
//
// It uses fetch, ReadableStream and TextDecoder only, with its own SSE parser.

export const STREAM_PATH = '/api/v1/chat/stream';
export const INBOX_PATH = '/api/v1/interactions';
export const RUNS_PATH = '/api/v1/runs';
export const GRANTS_PATH = '/api/v1/grants';
export const CONFIRM_PREFIX = 'CONFIRM_ACTION';

/**
 * Incremental SSE parser following the WHATWG rules. Feed it bytes
 * (Uint8Array) or strings in pieces of any size; it returns the events each
 * piece completed. UTF-8 is decoded in streaming mode (a character split
 * across reads waits for its last byte); LF, CRLF and CR end lines (a CR at
 * the end of one piece and an LF at the start of the next are one line end);
 * several `data:` lines join with "\n"; comments (`:` lines) are skipped.
 */
export class SSEParser {
  constructor() {
    this.decoder = new TextDecoder('utf-8');
    this.pending = '';
    this.skipLF = false;
    this.first = true;
    this.data = [];
    this.id = null;
    this.event = '';
    this.lastEventId = null;
    /** The reconnection time the server asked for (`retry:`), in ms. */
    this.retry = null;
  }

  /** @returns {{data: string, id: string|null, event: string}[]} */
  feed(piece) {
    let text = typeof piece === 'string' ? piece : this.decoder.decode(piece, { stream: true });
    if (this.first && text.length > 0) {
      this.first = false;
      if (text.charCodeAt(0) === 0xfeff) text = text.slice(1);
    }
    if (this.skipLF && text.startsWith('\n')) text = text.slice(1);
    this.skipLF = false;
    const events = [];
    const buf = this.pending + text;
    let start = 0;
    for (let i = 0; i < buf.length; i++) {
      const ch = buf[i];
      if (ch !== '\n' && ch !== '\r') continue;
      const line = buf.slice(start, i);
      if (ch === '\r') {
        if (i + 1 < buf.length) {
          if (buf[i + 1] === '\n') i++;
        } else {
          this.skipLF = true;
        }
      }
      const event = this.line(line);
      if (event) events.push(event);
      start = i + 1;
    }
    this.pending = buf.slice(start);
    return events;
  }

  line(line) {
    if (line === '') return this.dispatch();
    if (line.startsWith(':')) return null;
    const colon = line.indexOf(':');
    const field = colon === -1 ? line : line.slice(0, colon);
    let value = colon === -1 ? '' : line.slice(colon + 1);
    if (value.startsWith(' ')) value = value.slice(1);
    if (field === 'data') this.data.push(value);
    else if (field === 'id') {
      if (!value.includes('\0')) this.id = value;
    } else if (field === 'event') this.event = value;
    else if (field === 'retry' && /^\d+$/.test(value)) this.retry = Number(value);
    return null;
  }

  dispatch() {
    if (this.id !== null) this.lastEventId = this.id;
    let event = null;
    if (this.data.length > 0) {
      event = { data: this.data.join('\n'), id: this.id, event: this.event || 'message' };
    }
    this.data = [];
    this.event = '';
    this.id = null;
    return event;
  }
}

export class ChatGateError extends Error {}

/**
 * A stream ended before its final chunk: the connection broke or closed. The
 * run itself may live on; it can be re-attached.
 */
export class StreamBroken extends ChatGateError {
  constructor(message, retry = null) {
    super(message);
    /** Milliseconds the server asked to wait before coming back (its
     * `retry:` line when it suspended the run for a restart), or null. */
    this.retry = retry;
  }
}

/** Times a re-attach is tried, `retry:` apart, after the server said it
 * was restarting (a run suspended to a durable store). */
export const RESTART_ATTEMPTS = 30;
/** A reply refused with 503 and one of these was not taken (the server's
 * store or the replica holding the run was out of reach for a moment): it is
 * sent again, `Retry-After` apart, up to REPLY_ATTEMPTS times. A reply
 * whose outcome is not known (504 `outcome_unknown`, or a 502/504 of a
 * proxy in front) is sent again too: if the first was taken after all, the
 * server answers `already_decided`, and the run's stream shows the
 * decision that stands. */
export const RETRYABLE_REPLY_ERRORS = ['store_unavailable', 'owner_unavailable', 'shutting_down'];
export const UNKNOWN_OUTCOME_STATUSES = [502, 504];
export const REPLY_ATTEMPTS = 5;
/** Times `run()` asks `onQuestion` (or `onConfirmation`) again for one
 * pause after the server refused its answer as it stands (422). */
export const QUESTION_ATTEMPTS = 3;
/** What `onConfirmation` returns when it gave up asking because its
 * `signal` aborted: if the stream broke, the confirmation is asked again
 * once re-attached (if it still waits); if it was decided elsewhere or
 * ended, this is silence. */
export const ASK_AGAIN = Symbol('ask again');

/** Times `run()` re-attaches a broken stream without a chunk in between. */
export const DEFAULT_REATTACH_ATTEMPTS = 3;
/** Milliseconds before the first re-attach; the n-th waits n times this. */
export const REATTACH_BACKOFF_MS = 200;

/**
 * Normalises a reply to [action, text|null, decisions|null, grant|null], or
 * null for silence. A reply may be 'confirm', 'modify:<text>', ['modify',
 * text], or {action: 'confirm', decisions: [{index: 2, decision: 'reject'},
 * ...], grant: {scope: 'session', tools: ['deploy'], ttl: '30m'}}.
 */
export function parseReply(reply) {
  if (reply === null || reply === undefined) return null;
  if (typeof reply === 'object' && !Array.isArray(reply)) {
    return [String(reply.action ?? '').trim().toLowerCase(), reply.text ?? null, reply.decisions ?? null,
      reply.grant ?? null];
  }
  if (Array.isArray(reply)) return [String(reply[0]).trim().toLowerCase(), reply[1] ?? null];
  const text = String(reply);
  const colon = text.indexOf(':');
  if (colon === -1) return [text.trim().toLowerCase(), null];
  return [text.slice(0, colon).trim().toLowerCase(), text.slice(colon + 1)];
}

/** How a run ended. */
/**
 * Per-task decisions from an object of task (its index, or its `task_id`)
 * to a decision: 'approve', ['reject', 'why'], ['edit', {...args}],
 * ['respond', 'result'], or already one decision object (an array of
 * decision objects is taken as it is).
 */
export function taskDecisions(tasks) {
  if (Array.isArray(tasks)) return tasks;
  const carried = { reject: 'reason', edit: 'args', respond: 'result' };
  return Object.entries(tasks).map(([task, given]) => {
    const entry = /^\d+$/.test(task) ? { index: Number(task) } : { task_id: task };
    if (Array.isArray(given)) {
      entry.decision = given[0];
      if (given.length > 1 && given[1] !== null && given[1] !== undefined) entry[carried[given[0]] ?? 'reason'] = given[1];
    } else if (given !== null && typeof given === 'object') {
      Object.assign(entry, given);
    } else {
      entry.decision = String(given);
    }
    return entry;
  });
}

export class RunResult {
  constructor(final, chunks, status, sessionId) {
    this.final = final;
    this.chunks = chunks;
    this.status = status;
    this.sessionId = sessionId;
  }

  /** 'completed', 'cancelled' or 'error'. */
  get outcome() {
    const kind = this.final?.chunk_type;
    if (kind === 'completion') return 'completed';
    if (kind === 'cancelled') return 'cancelled';
    return 'error';
  }

  /** The cancel reason or error_type, when there is one. */
  get reason() {
    const meta = this.final?.metadata ?? {};
    return meta.reason ?? meta.error_type ?? null;
  }

  get exitCode() {
    return { completed: 0, cancelled: 2 }[this.outcome] ?? 1;
  }
}

export class ChatGateClient {
  /**
   * @param {string} baseUrl  e.g. 'http://127.0.0.1:8080', or '' for the page's own origin
   * @param {{apiKey?: string, fetch?: typeof fetch, reattachAttempts?: number}} [options]
   */
  constructor(baseUrl = '', { apiKey, fetch: fetchImpl, reattachAttempts = DEFAULT_REATTACH_ATTEMPTS } = {}) {
    this.baseUrl = baseUrl.replace(/\/+$/, '');
    this.apiKey = apiKey;
    this.fetch = fetchImpl ?? globalThis.fetch.bind(globalThis);
    this.reattachAttempts = reattachAttempts;
  }

  /**
   * Sends `message` and returns `{status, chunks}`, where `chunks` is an async
   * iterator of chunk objects that ends after the chunk with `finished: true`.
   * Error answers (4xx/5xx) are one `error` chunk. A stream that closes early
   * throws ChatGateError.
   */
  async stream(message, { sessionId, confirmationId, decisions, answers, grant, signal, lastEventId } = {}) {
    // The client names the session (a fresh UUID unless given), so every
    // request of it can be routed to the same replica (docs/operations.md).
    sessionId ??= globalThis.crypto?.randomUUID?.();
    const body = message === undefined ? {} : { message };
    if (sessionId !== undefined && sessionId !== null) body.session_id = sessionId;
    if (confirmationId !== undefined && confirmationId !== null) body.confirmation_id = confirmationId;
    if (decisions && decisions.length > 0) body.decisions = decisions;
    if (answers !== undefined && answers !== null) body.answers = answers;
    if (grant !== undefined && grant !== null) body.grant = grant;
    const headers = { 'Content-Type': 'application/json', Accept: 'text/event-stream' };
    // For load-balancer affinity only; percent-encoded, since a session id
    // may be any text and a header value must be ASCII.
    if (body.session_id) headers['X-Chatgate-Session'] = encodeURIComponent(body.session_id);
    if (this.apiKey) headers.Authorization = `Bearer ${this.apiKey}`;
    if (lastEventId !== undefined && lastEventId !== null) headers['Last-Event-ID'] = String(lastEventId);
    let response;
    try {
      response = await this.fetch(this.baseUrl + STREAM_PATH, {
        method: 'POST',
        headers,
        body: JSON.stringify(body),
        signal,
      });
    } catch (err) {
      if (err?.name === 'AbortError') throw err;
      const cause = err?.cause;
      const why = cause?.code ?? cause?.errors?.[0]?.code ?? cause?.message ?? err.message;
      throw new ChatGateError(`cannot reach ${this.baseUrl || 'the server'}: ${why}`);
    }
    return { status: response.status, chunks: readChunks(response), retryAfter: retryAfterMs(response) };
  }

  /**
   * Re-attaches to the run of `sessionId` after its stream broke: the server
   * replays every chunk after `lastEventId` (the `sequence` of the last chunk
   * received; 0 for all) that it still holds, then goes on live. A first
   * chunk with `metadata.gap` true means chunks in between were lost. With no
   * run to re-attach to, the stream is one `error` chunk (`no_such_run`).
   * Resolves to `{status, chunks}` like `stream()`.
   */
  attach(sessionId, lastEventId = 0, { signal, confirmationId } = {}) {
    return this.stream(undefined, { sessionId, lastEventId, signal, confirmationId });
  }

  /** GETs `path`: `{status, body}` (the JSON body). */
  async #getJson(path) {
    const headers = { Accept: 'application/json' };
    if (this.apiKey) headers.Authorization = `Bearer ${this.apiKey}`;
    let response;
    try {
      response = await this.fetch(this.baseUrl + path, { headers });
    } catch (err) {
      const cause = err?.cause;
      throw new ChatGateError(`cannot reach ${this.baseUrl || 'the server'}: ${cause?.code ?? cause?.message ?? err.message}`);
    }
    return { status: response.status, body: await response.json().catch(() => ({})) };
  }

  /**
   * The pending pauses this key may decide (`GET /api/v1/interactions`),
   * oldest expiry first: `session_id`, `confirmation_id`, `kind`,
   * `risk_level`, `tasks`, `expires_in_seconds`, `confirmation_data`, ...
   * Rejects with a ChatGateError when refused.
   */
  async interactions({ limit, after } = {}) {
    const query = new URLSearchParams();
    if (limit !== undefined) query.set('limit', String(limit));
    if (after !== undefined) query.set('after', after);
    const { status, body } = await this.#getJson(INBOX_PATH + (query.size ? `?${query}` : ''));
    if (status !== 200) throw new ChatGateError(`the inbox answered ${status}: ${body.message} (${body.error_type})`);
    return body.interactions ?? [];
  }

  /** How the session's latest run ended (`GET /api/v1/runs/ID`, for
   * `--keep-outcome`), or null when none is kept. */
  async outcome(sessionId) {
    const { status, body } = await this.#getJson(`${RUNS_PATH}/${encodeURIComponent(sessionId)}`);
    if (status === 404) return null;
    if (status !== 200) throw new ChatGateError(`the outcome answered ${status}: ${body.message} (${body.error_type})`);
    return body;
  }

  /**
   * Decides single tasks of the pending pause of `sessionId` and leaves the
   * others pending (`CONFIRM_ACTION:decide`): `decide(session, {1:
   * 'approve', 3: ['reject', 'why']})` (see `taskDecisions`). Resolves to
   * the reply's chunk: `decision_recorded` (`metadata.pending`: the tasks
   * still pending) or, once none is left, `confirmation_received`; an
   * `error` chunk when refused (409 `already_decided` for a task decided
   * before).
   */
  async decide(sessionId, tasks, { confirmationId } = {}) {
    return this.reply(sessionId, 'decide', null, { confirmationId, decisions: taskDecisions(tasks) });
  }

  /**
   * Answers the pending confirmation of `sessionId`. With 'confirm',
   * `decisions` may decide single tasks ({index, decision: 'approve' |
   * 'reject' | 'edit' | 'respond', reason?, args?, result?}); tasks not named
   * are approved. Resolves to the single chunk of the answer:
   * `confirmation_received` (its `metadata.decisions` says what was decided
   * per task), or an `error` chunk. With 'answer', `answers`
   * ({"<question id>": value}) or `text` answers questions.
   */
  async reply(sessionId, action, text = null, { confirmationId, decisions, answers, grant } = {}) {
    let message = `${CONFIRM_PREFIX}:${action}`;
    if (text !== null && text !== undefined) message += `:${text}`;
    for (let attempt = 1; ; attempt += 1) {
      const { status, chunks, retryAfter } = await this.stream(message, {
        sessionId, confirmationId, decisions, answers, grant,
      });
      let chunk = null;
      try {
        for await (const first of chunks) {
          chunk = first;
          break;
        }
      } catch (err) {
        // A proxy's own error page is not a stream of chunks.
        if (!UNKNOWN_OUTCOME_STATUSES.includes(status)) throw err;
      }
      const unknown = UNKNOWN_OUTCOME_STATUSES.includes(status);
      if (chunk === null) {
        if (!unknown) throw new ChatGateError('empty answer to a reply');
        chunk = {
          chunk: `the reply's outcome is not known (HTTP ${status})`, session_id: sessionId, finished: true,
          chunk_type: 'error', metadata: { error_type: 'outcome_unknown' }, confirmation_data: null,
          requires_response: false, stream_paused: false, sequence: 1,
        };
      }
      const retryable = unknown || (status === 503 && RETRYABLE_REPLY_ERRORS.includes(chunk.metadata?.error_type));
      if (!retryable || attempt >= REPLY_ATTEMPTS) return chunk;
      // Not taken, or not known: send the same reply again, when told to.
      await new Promise((resolve) => setTimeout(resolve, retryAfter));
    }
  }

  /**
   * Confirms the pending pause of `sessionId` (see `reply`); `grant` (see
   * `grantOf`) also allows later calls without asking, within its scope,
   * time and calls.
   */
  confirm(sessionId, { confirmationId, decisions, grant } = {}) {
    return this.reply(sessionId, 'confirm', null, { confirmationId, decisions, grant });
  }

  /** The live grants this key may see (`GET /api/v1/grants`; an
   * approver's: every namespace's), newest first. */
  async grants() {
    const { status, body } = await this.#getJson(GRANTS_PATH);
    if (status !== 200) throw new ChatGateError(`the grants answered ${status}: ${body.message} (${body.error_type})`);
    return body.grants ?? [];
  }

  /** Revokes a grant (`DELETE /api/v1/grants/ID`): true when revoked,
   * false when this key has no such grant. */
  async revokeGrant(grantId) {
    const headers = { Accept: 'application/json' };
    if (this.apiKey) headers.Authorization = `Bearer ${this.apiKey}`;
    let response;
    try {
      response = await this.fetch(`${this.baseUrl}${GRANTS_PATH}/${encodeURIComponent(grantId)}`, {
        method: 'DELETE', headers,
      });
    } catch (err) {
      const cause = err?.cause;
      throw new ChatGateError(`cannot reach ${this.baseUrl || 'the server'}: ${cause?.code ?? cause?.message ?? err.message}`);
    }
    await response.arrayBuffer().catch(() => null);
    if (response.status === 404) return false;
    if (response.status !== 204) throw new ChatGateError(`the revoke answered ${response.status}`);
    return true;
  }

  /**
   * Answers the pending questions of `sessionId`: `answers` maps question
   * ids to values (an option's id or label, a list of them for
   * multi-select, other text, a number or boolean for a typed question);
   * `text` answers a pause of one question. Resolves to the reply's chunk
   * (`metadata.answers` holds the answers as the run got them).
   */
  answer(sessionId, { answers, text, confirmationId } = {}) {
    if ((answers === undefined || answers === null) === (text === undefined || text === null)) {
      throw new TypeError('answer with answers or with text (one of them)');
    }
    return this.reply(sessionId, 'answer', text ?? null, { confirmationId, answers });
  }

  /** Declines to answer the pending questions of `sessionId`. */
  skip(sessionId, { confirmationId } = {}) {
    return this.reply(sessionId, 'skip', null, { confirmationId });
  }

  /**
   * Calls again, with its idempotency key, the task a crash cut short (a
   * `reconcile` pause); `skip` records it as not run.
   */
  runAgain(sessionId, { confirmationId } = {}) {
    return this.reply(sessionId, 'run_again', null, { confirmationId });
  }

  /**
   * Drives one run to its end. `onChunk(chunk)` sees every chunk;
   * `onConfirmation(chunk, { signal })` returns (or resolves to) the reply
   * for each confirmation request: 'confirm', 'cancel', 'modify:<text>',
   * ['modify', text], or null to stay silent (the server's timeout decides).
   * A refused reply is passed to `onChunk` and the run goes on. While it is
   * asked, the stream is read on: `signal` aborts as soon as the pause stops
   * waiting for this answer (decided elsewhere, ended, or its stream broke),
   * so a prompt can stop asking.
   *
   * If the stream breaks before its final chunk, the run is re-attached
   * (`Last-Event-ID`) up to `reattachAttempts` times in a row and goes on
   * where it broke; every chunk is still seen exactly once, but for a
   * confirmation request whose `onConfirmation` returned ASK_AGAIN because
   * its stream broke meanwhile: the re-attach shows it again, to be answered.
   *
   * `onQuestion(chunk, { signal })` is asked the same way for each
   * `input_request` (its `confirmation_data.questions`) and returns the
   * answers object ({"<question id>": value}), 'answer:<text>' or
   * ['answer', text] for a single question, 'skip', 'cancel', or null. An
   * answer the server refuses (422) is passed to `onChunk` and `onQuestion`
   * is asked again, up to QUESTION_ATTEMPTS times.
   */
  async run(message, { sessionId, onChunk, onConfirmation, onQuestion, signal } = {}) {
    // Named here, not by the server, so a broken stream can be re-attached.
    sessionId ??= globalThis.crypto?.randomUUID?.();
    const opened = await this.stream(message, { sessionId, signal });
    return this.#follow(opened, sessionId, { onChunk, onConfirmation, onQuestion, signal });
  }

  /**
   * Picks up the run of `sessionId` from its start (a page that was
   * reloaded, a CLI that restarted): replays what the server still holds,
   * a pending confirmation included, then follows it like `run()`. With no
   * run to pick up, the result's final chunk is the `no_such_run` error.
   */
  async resume(sessionId, { onChunk, onConfirmation, onQuestion, signal } = {}) {
    const opened = await this.attach(sessionId, 0, { signal });
    return this.#follow(opened, sessionId, { onChunk, onConfirmation, onQuestion, signal });
  }

  async #follow({ status, chunks }, sessionId, { onChunk, onConfirmation, onQuestion, signal }) {
    const seen = [];
    let final = null;
    let lastSeen = 0;
    let failures = 0;
    while (final === null) {
      const it = chunks[Symbol.asyncIterator]();
      // A read started while a confirmation was being answered.
      let ahead = null;
      try {
        for (;;) {
          const step = ahead ?? it.next();
          ahead = null;
          const { value: chunk, done } = await step;
          if (done) break;
          failures = 0;
          if (Number.isInteger(chunk.sequence)) {
            if (chunk.sequence <= lastSeen) continue; // seen before the break
            lastSeen = chunk.sequence;
          }
          seen.push(chunk);
          sessionId = chunk.session_id || sessionId;
          if (onChunk) await onChunk(chunk);
          if (chunk.finished) {
            final = chunk;
            await it.return?.();
            break;
          }
          const asker = { confirmation_request: onConfirmation, input_request: onQuestion }[chunk.chunk_type];
          if (asker) {
            // Whatever comes next on the stream (the decision, the end, a
            // break), the pause no longer waits for this answer.
            const interrupted = new AbortController();
            let broke = false;
            ahead = it.next();
            ahead.then(() => interrupted.abort(), () => { broke = true; interrupted.abort(); });
            const ask = (c) => asker(c, { signal: interrupted.signal });
            const again = chunk.chunk_type === 'input_request'
              ? await this.#answerQuestions(chunk, sessionId, onChunk, ask, interrupted.signal)
              : await this.#answer(chunk, sessionId, onChunk, ask, interrupted.signal);
            if (again && broke && Number.isInteger(chunk.sequence)) {
              // Given up on because the stream broke: the re-attach shows
              // this request again, to ask it if it still waits.
              lastSeen = Math.min(lastSeen, chunk.sequence - 1);
            }
          }
        }
      } catch (err) {
        if (!(err instanceof StreamBroken) || status !== 200) throw err;
        // A server that suspended the run for a restart said when to come
        // back (`retry:`), and may be unreachable for a while: keep trying.
        let restarting = err.retry !== null && err.retry !== undefined;
        let wait = restarting ? err.retry : null;
        let again = null;
        for (;;) {
          failures += 1;
          if (failures > (restarting ? RESTART_ATTEMPTS : this.reattachAttempts)) throw err;
          await new Promise((resolve) => setTimeout(resolve, wait ?? REATTACH_BACKOFF_MS * failures));
          try {
            again = await this.attach(sessionId, lastSeen, { signal });
          } catch (unreachable) {
            if (restarting && unreachable instanceof ChatGateError) continue;
            throw unreachable;
          }
          if (again.status === 503) {
            // Not ready yet: the server restarting, the store out of reach,
            // or the replica that held the run gone until another may take
            // it over (Retry-After says when). Worth waiting for, as after
            // a restart.
            restarting = true;
            wait = again.retryAfter;
            await again.chunks.return?.();
            continue;
          }
          break;
        }
        if (again.status !== 200) {
          let why = again.status;
          for await (const gone of again.chunks) why = gone.metadata?.error_type ?? why;
          throw new StreamBroken(`${err.message}; re-attach refused (${why})`);
        }
        chunks = again.chunks;
      }
    }
    return new RunResult(final, seen, status, sessionId);
  }

  /** Asks `onConfirmation` and sends its reply, asking again (a few
   * times) when the server refuses it as it stands (422: decisions or an
   * action that do not fit); whether it asked for ASK_AGAIN. */
  async #answer(chunk, sessionId, onChunk, onConfirmation, interrupted) {
    const confirmationId = chunk.confirmation_data?.confirmation_id;
    for (let attempt = 0; attempt < QUESTION_ATTEMPTS; attempt += 1) {
      const given = await onConfirmation(chunk);
      if (given === ASK_AGAIN) return true;
      const answer = parseReply(given);
      if (!answer) return false;
      const ack = await this.reply(sessionId, answer[0], answer[1], {
        confirmationId, decisions: withPreviewsSeen(answer[2], chunk, answer[0]), grant: answer[3],
      });
      // One approval of several: the run waits for the others.
      if (ack.chunk_type === 'approval_recorded' && onChunk) await onChunk(ack);
      if (ack.chunk_type !== 'error') return false;
      if (onChunk) await onChunk(ack);
      const refused = ack.metadata?.error_type;
      if (!['invalid_decision', 'invalid_confirm_action'].includes(refused) || interrupted.aborted) return false;
    }
    return false;
  }

  /** Asks `onQuestion` and sends its reply, asking again (a few times)
   * when the server refuses the answer; whether it asked for ASK_AGAIN. */
  async #answerQuestions(chunk, sessionId, onChunk, onQuestion, interrupted) {
    const confirmationId = chunk.confirmation_data?.confirmation_id;
    for (let attempt = 0; attempt < QUESTION_ATTEMPTS; attempt += 1) {
      const given = await onQuestion(chunk);
      if (given === ASK_AGAIN) return true;
      if (given === null || given === undefined) return false;
      let ack;
      if (typeof given === 'object' && !Array.isArray(given)) {
        ack = await this.reply(sessionId, 'answer', null, { confirmationId, answers: given });
      } else {
        const [action, text] = parseReply(given);
        ack = await this.reply(sessionId, action, text, { confirmationId });
      }
      if (ack.chunk_type !== 'error') return false;
      if (onChunk) await onChunk(ack);
      const refused = ack.metadata?.error_type;
      if (!['invalid_answer', 'invalid_confirm_action'].includes(refused) || interrupted.aborted) return false;
    }
    return false;
  }
}

/** Milliseconds a 503 asked to wait (`Retry-After`), within reason. */
function retryAfterMs(response, fallback = 1000, longest = 5000) {
  const seconds = Number(response.headers?.get?.('Retry-After'));
  return Number.isFinite(seconds) && seconds >= 0 ? Math.min(seconds * 1000, longest) : fallback;
}

async function* readChunks(response) {
  if (!response.body) throw new ChatGateError('response has no body');
  const reader = response.body.getReader();
  const parser = new SSEParser();
  try {
    for (;;) {
      let read;
      try {
        read = await reader.read();
      } catch (err) {
        if (err?.name === 'AbortError') throw err;
        throw new StreamBroken(`stream broke: ${err.message}`);
      }
      if (read.done) throw new StreamBroken('stream closed before its final chunk', parser.retry);
      for (const event of parser.feed(read.value)) {
        let chunk;
        try {
          chunk = JSON.parse(event.data);
        } catch {
          throw new ChatGateError(`not a JSON chunk: ${event.data.slice(0, 200)}`);
        }
        yield chunk;
        if (chunk.finished) return;
      }
    }
  } finally {
    reader.cancel().catch(() => {});
  }
}

/** How many characters of a task's arguments are shown before the rest is
 * cut (and counted): what is approved must be visible, and a screen is finite. */
export const ARGS_SHOWN = 2000;

/** A task's arguments on one line: all of them, or the first ARGS_SHOWN
 * characters and how many more there are. */
export function formatArgs(args) {
  const text = JSON.stringify(args ?? {});
  if (text.length <= ARGS_SHOWN) return text;
  return `${text.slice(0, ARGS_SHOWN)} … (${text.length - ARGS_SHOWN} more characters; --json shows them all)`;
}

/** What a question without options takes, in a few words. */
export function expects(question) {
  const schema = question.schema ?? {};
  const kind = schema.type ?? 'text';
  const bounds = [];
  if ('minimum' in schema || 'maximum' in schema) bounds.push(`${schema.minimum ?? ''}..${schema.maximum ?? ''}`);
  if (Array.isArray(schema.enum)) bounds.push(`one of ${schema.enum.join(', ')}`);
  if ('maxLength' in schema) bounds.push(`at most ${schema.maxLength} characters`);
  if (kind === 'boolean') bounds.push('yes or no');
  return bounds.length ? `${kind} ${bounds.join(', ')}` : kind;
}

/** One question as lines: its text, then its numbered options. */
export function formatQuestion(question, n) {
  const required = question.required ? '' : ' (optional)';
  const lines = [`  ${n}. [${question.header || question.id}] ${question.question}${required}`];
  const options = question.options ?? [];
  options.forEach((option, i) => {
    const about = option.description ? `  (${option.description})` : '';
    lines.push(`     ${i + 1}) ${option.label}${about}`);
  });
  if (options.length && question.allow_other) lines.push('     o) other: a text of your own');
  if (options.length && question.multi_select) lines.push('     (several: 1,3)');
  if (!options.length) lines.push(`     (${expects(question)})`);
  return lines;
}

/** One chunk as readable text (several lines for a confirmation request). */
/** Most characters of a task's preview a terminal shows; the rest is counted. */
export const PREVIEW_SHOWN = 4000;

/** A task's preview (what its call would do) as lines, or none. */
export function formatPreview(preview) {
  if (!preview) return [];
  const body = preview.body ?? '';
  const lines = [`     ${preview.ok ? 'preview' : 'preview (failed)'}:${preview.truncated ? ' (cut by the server)' : ''}`];
  for (const line of body.slice(0, PREVIEW_SHOWN).split('\n')) {
    if (line !== '' || lines.length === 1) lines.push(`     | ${line}`);
  }
  if (body.length > PREVIEW_SHOWN) lines.push(`     | ... ${body.length - PREVIEW_SHOWN} more characters`);
  return lines;
}

/** `decisions` naming the previews `chunk` showed (#43): with confirm or
 * decide every approve of a previewed task carries its `preview_digest`,
 * and a confirm approves the previewed tasks it does not name, naming
 * theirs. The server refuses a digest that is not the task's current
 * preview (409 `preview_stale`). */
export function withPreviewsSeen(decisions, chunk, action) {
  if (action !== 'confirm' && action !== 'decide') return decisions;
  const tasks = chunk?.confirmation_data?.tasks ?? [];
  const digests = new Map(tasks.filter((t) => t.preview && (t.state ?? 'pending') === 'pending')
    .map((t) => [t.index, t.preview.digest]));
  if (digests.size === 0) return decisions;
  const ids = new Map(tasks.filter((t) => t.task_id).map((t) => [t.task_id, t.index]));
  const out = (decisions ?? []).map((d) => ({ ...d }));
  const named = new Set();
  for (const d of out) {
    const index = d.index ?? ids.get(d.task_id);
    named.add(index);
    if (d.decision === 'approve' && digests.has(index) && d.preview_digest === undefined) {
      d.preview_digest = digests.get(index);
    }
  }
  if (action === 'confirm') {
    for (const [index, digest] of digests) {
      if (!named.has(index)) out.push({ index, decision: 'approve', preview_digest: digest });
    }
  }
  return out;
}

export function formatChunk(chunk, now = Date.now()) {
  const kind = chunk.chunk_type ?? '?';
  if (kind === 'content') return chunk.chunk;
  const lines = [`[${kind}] ${chunk.chunk ?? ''}`];
  const data = chunk.confirmation_data;
  if (kind === 'confirmation_request' && data) {
    for (const task of data.tasks ?? []) {
      const risk = task.risk_level ? `, ${task.risk_level} risk` : '';
      const tool = task.simulated ? 'simulated: no tool runs' : task.tool;
      lines.push(`  ${task.index}. ${task.description}  (${tool}${risk})${approvedByText(task.approved_by)}`);
      lines.push(`     args: ${formatArgs(task.args)}`);
      lines.push(...formatPreview(task.preview));
    }
    const left = Math.max(0, Math.round((Date.parse(data.expires_at) - now) / 1000));
    lines.push(`  risk: ${data.risk_level} · round ${data.confirmation_round} · expires ${data.expires_at}` +
      (Number.isFinite(left) ? ` (in ${left}s)` : ''));
  }
  if (kind === 'input_request' && data) {
    (data.questions ?? []).forEach((question, i) => lines.push(...formatQuestion(question, i + 1)));
    if (data.kind === 'reconcile') {
      lines.push(`  ${data.message}`);
      lines.push(`  task ${data.task?.index}: ${data.task?.tool} ${JSON.stringify(data.task?.args)} · key ${data.idempotency_key}`);
    }
    const left = Math.max(0, Math.round((Date.parse(data.expires_at) - now) / 1000));
    const options = (data.options ?? ['answer', 'skip', 'cancel']).join(' / ');
    lines.push(`  ${options} · expires ${data.expires_at}` + (Number.isFinite(left) ? ` (in ${left}s)` : ''));
  }
  const meta = chunk.metadata ?? {};
  if (kind === 'approval_recorded' && meta.required) {
    const left = meta.required - (meta.approvals ?? []).length;
    const groups = meta.approvers ?? [];
    lines.push(`  waiting for ${left} more approval${left === 1 ? '' : 's'}` +
      (groups.length ? ` (${groups.join(', ')})` : ''));
  }
  if (kind === 'confirmation_received' && meta.approved_by) lines.push(`  approved by: ${meta.approved_by.join(', ')}`);
  if (kind === 'confirmation_received' && meta.answers !== undefined) {
    lines.push(`  answers: ${JSON.stringify(meta.answers)}`);
  }
  if ((kind === 'cancelled' || kind === 'error') && (meta.reason || meta.error_type)) {
    lines[0] += `  (${meta.reason ?? meta.error_type})`;
  }
  if (kind === 'tool_output' && meta.simulated) lines[0] += '  (simulated: no tool ran)';
  if (kind === 'tool_output' && meta.approved_by) {
    const by = meta.approved_by;
    lines[0] += `  (ran without asking: ${by.rule !== undefined ? `rule ${by.rule}` : `grant ${by.grant}`})`;
  }
  if (kind === 'tool_output' && meta.error_type === 'denied_by_rule') lines[0] += `  (denied by rule ${meta.rule})`;
  return lines.join('\n');
}

/** What allowed a task without a person, for a task line (or ''). */
export function approvedByText(approvedBy) {
  if (!approvedBy) return '';
  if (approvedBy.rule !== undefined) return `  [allowed by rule ${approvedBy.rule}; runs unless you reject it]`;
  return `  [allowed by grant ${approvedBy.grant}; runs unless you reject it]`;
}

/**
 * A confirm's grant: `grantOf('session', ['deploy'], { ttl: '30m', maxCalls:
 * 10 })` allows later calls of those tools (of tasks approved in the pause)
 * without asking, in this session ('key': every session of the key), for
 * `ttl`, at most `maxCalls` times; `args` are rule matchers.
 */
export function grantOf(scope, tools, { ttl, maxCalls, args } = {}) {
  const grant = { scope, tools: [...tools] };
  if (ttl !== undefined) grant.ttl = ttl;
  if (maxCalls !== undefined) grant.max_calls = maxCalls;
  if (args !== undefined) grant.args = args;
  return grant;
}

/** `SCOPE:TTL[:N]` (`session:30m`, `key:1h:10`) as {scope, ttl, maxCalls};
 * throws a TypeError if malformed. */
export function parseGrantFlag(text) {
  const parts = String(text).split(':');
  if (![2, 3].includes(parts.length) || !['session', 'key'].includes(parts[0]) || !parts[1]) {
    throw new TypeError(`--grant expects session:TTL[:N] or key:TTL[:N], got ${JSON.stringify(text)}`);
  }
  if (parts.length === 3 && !/^\d+$/.test(parts[2])) throw new TypeError(`--grant ${text}: N is a number of calls`);
  return { scope: parts[0], ttl: parts[1], maxCalls: parts.length === 3 ? Number(parts[2]) : undefined };
}

/** The tools a grant on this pause may name: those of its tasks that call a
 * real tool, in order, once each. */
export function grantedTools(chunk) {
  const tools = [];
  for (const task of chunk.confirmation_data?.tasks ?? []) {
    if (!task.simulated && task.tool && !tools.includes(task.tool)) tools.push(task.tool);
  }
  return tools;
}

/** `decisions` with an `approve` for every task of the pause they do not
 * name, in task order (a server with --explicit-decisions takes a decision
 * for every task). */
export function everyTask(decisions, chunk) {
  const named = new Map(decisions.map((d) => [d.index, d]));
  const full = (chunk.confirmation_data?.tasks ?? []).map((task) => {
    const given = named.get(task.index);
    named.delete(task.index);
    return given ?? { index: task.index, decision: 'approve' };
  });
  return [...full, ...named.values()];
}
