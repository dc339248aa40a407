// A loopback TCP proxy that cuts chat streams mid-event, the way a dropped
// network leaves a client: used by the JS client suite and the browser test.

import net from 'node:net';

/**
 * A loopback TCP proxy in front of the test server that cuts the streams of
 * the first `cuts` chat messages (not replies, not re-attaches) a few bytes
 * after the end of the event holding `marker`: the client is left with a
 * broken stream mid-event, the way a dropped network leaves it.
 */
export async function cuttingProxy(targetUrl, { marker = '"task_init"', cuts = 1 } = {}) {
  const target = new URL(targetUrl);
  const state = { cut: 0, cutsLeft: cuts };
  const server = net.createServer((client) => {
    const upstream = net.connect(Number(target.port), target.hostname);
    let cut = false;
    let seen = Buffer.alloc(0);
    const close = () => {
      client.destroy();
      upstream.destroy();
    };
    client.on('data', (data) => {
      // Judged per request, not per connection: a browser sends its page
      // load and its chat messages over the same kept-alive connection.
      const head = data.toString('latin1');
      if (!cut && state.cutsLeft > 0 && head.startsWith('POST ') && head.includes('/api/v1/chat/stream') &&
          !head.includes('CONFIRM_ACTION') && !/last-event-id/i.test(head)) {
        state.cutsLeft -= 1;
        cut = true;
      }
      upstream.write(data);
    });
    upstream.on('data', (data) => {
      if (!cut) {
        client.write(data);
        return;
      }
      seen = Buffer.concat([seen, data]);
      const at = seen.indexOf(marker);
      const end = at >= 0 ? seen.indexOf('\n\n', at) : -1;
      if (end >= 0 && seen.length >= end + 40) {
        state.cut += 1;
        client.end(seen.subarray(0, end + 40), close);
        cut = false;
        upstream.removeAllListeners('data');
      }
    });
    client.on('error', close);
    upstream.on('error', close);
    client.on('close', close);
    upstream.on('end', () => client.end());
  });
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  return { url: `http://127.0.0.1:${server.address().port}`, state, close: () => server.close() };
}

