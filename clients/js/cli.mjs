#!/usr/bin/env node
// chatgate command line (Node 18+), the same flags and exit codes as the
// Python client:
//   node cli.mjs --url http://127.0.0.1:8080 [--session ID] [--reply R ...]
//                [--auto-confirm] [--json] [--api-key KEY] "message"
// Exit codes: 0 completed, 2 cancelled, 1 error; a one-line reason on stderr.

import { parseArgs } from 'node:util';
import { createInterface } from 'node:readline/promises';
import { ChatGateClient, ChatGateError, formatChunk } from './chatgate-client.mjs';

const USAGE = `usage: cli.mjs [--url URL] [--session ID] [--api-key KEY] [--reply R]... [--auto-confirm] [--json] MESSAGE
  --reply R        scripted reply, one per round, in order: confirm, cancel, modify:<text>
  --auto-confirm   confirm every round once the scripted replies are used up
  --json           print raw chunks, one JSON per line
Without replies left, a terminal is asked; otherwise the server's timeout decides.
Exit codes: 0 completed, 2 cancelled, 1 error.`;

async function main(argv) {
  let parsed;
  try {
    parsed = parseArgs({
      args: argv,
      allowPositionals: true,
      options: {
        url: { type: 'string', default: process.env.CHATGATE_URL ?? 'http://127.0.0.1:8080' },
        session: { type: 'string' },
        'api-key': { type: 'string', default: process.env.CHATGATE_API_KEY },
        reply: { type: 'string', multiple: true, default: [] },
        'auto-confirm': { type: 'boolean', default: false },
        json: { type: 'boolean', default: false },
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
  if (positionals.length !== 1) {
    process.stderr.write(`expected exactly one MESSAGE\n${USAGE}\n`);
    return 1;
  }
  const replies = [...values.reply];
  const interactive = Boolean(process.stdin.isTTY);
  const out = process.stdout;
  let inContent = false;

  const onChunk = (chunk) => {
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

  const onConfirmation = async () => {
    if (replies.length > 0) return replies.shift();
    if (values['auto-confirm']) return 'confirm';
    if (interactive) return prompt(values.json ? process.stderr : out);
    return null; // silent: the server's timeout decides
  };

  const client = new ChatGateClient(values.url, { apiKey: values['api-key'] });
  let result;
  try {
    result = await client.run(positionals[0], { sessionId: values.session, onChunk, onConfirmation });
  } catch (err) {
    if (err instanceof ChatGateError) {
      process.stderr.write(`error: ${err.message}\n`);
      return 1;
    }
    throw err;
  }
  if (result.outcome === 'completed') return 0;
  const kind = result.outcome === 'cancelled' ? 'cancelled' : 'error';
  process.stderr.write(`${kind}: ${result.reason}: ${result.final?.chunk ?? ''}\n`);
  return result.exitCode;
}

async function prompt(output) {
  const rl = createInterface({ input: process.stdin, output });
  try {
    for (;;) {
      const answer = (await rl.question('confirm / modify / cancel? ')).trim().toLowerCase();
      if (['confirm', 'c', 'y', 'yes'].includes(answer)) return 'confirm';
      if (['cancel', 'n', 'no', 'x'].includes(answer)) return 'cancel';
      if (['modify', 'm'].includes(answer)) {
        const text = (await rl.question('what should change? ')).trim();
        if (text) return ['modify', text];
      }
      output.write('please answer confirm, modify or cancel\n');
    }
  } finally {
    rl.close();
  }
}

process.exitCode = await main(process.argv.slice(2));
