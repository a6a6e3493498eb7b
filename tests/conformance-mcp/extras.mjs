// Scenarios of this suite's own, beside the conformance package's: paths through the
// sidecar that the package's server scenarios do not take. Each returns checks in the
// runner's format (`{id, name, description, status, errorMessage}`) and is run, like the
// package's, once directly and once through the sidecar.
//
// - resources-templates-list: the third list the sidecar rewrites (besides tools/list and
//   resources/list), at protocol 2025-11-25, whose answer stream starts with a priming
//   event.
// - sse-resume-2025-11-25: what the package's server-sse-polling scenario means to test,
//   at the protocol version that enables it (the package sends `2025-03-26`, at which the
//   SDK sends no priming event and offers no stream to close): a priming event first,
//   with an id and a retry field; the stream closed before the answer; the answer
//   replayed on `GET` with `Last-Event-ID`.
// - standalone-request-after-head: a server-to-client request on the standalone `GET`
//   stream, sent once its response head has reached the client (race.mjs measures what
//   happens when the client does not wait for it).

import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { CreateMessageRequestSchema } from '@modelcontextprotocol/sdk/types.js';

const PROTOCOL = '2025-11-25';

function check(id, description, ok, errorMessage, details) {
  return {
    id,
    name: id,
    description,
    status: ok ? 'SUCCESS' : 'FAILURE',
    timestamp: new Date().toISOString(),
    ...(ok ? {} : { errorMessage }),
    ...(details ? { details } : {}),
  };
}

async function connect(url, options = {}) {
  const client = new Client({ name: 'conformance-extras', version: '1.0.0' }, { capabilities: { sampling: {}, elicitation: {} } });
  const transport = new StreamableHTTPClientTransport(new URL(url), options);
  await client.connect(transport);
  return { client, transport };
}

/** Parses SSE text into events `{id, retry, data}` (RFC: fields per line, blank line ends). */
function sseEvents(text) {
  const out = [];
  for (const block of text.split(/\r?\n\r?\n/)) {
    if (!block.trim()) continue;
    const e = { id: undefined, retry: undefined, data: [] };
    for (const line of block.split(/\r?\n/)) {
      const i = line.indexOf(':');
      const field = i < 0 ? line : line.slice(0, i);
      const value = i < 0 ? '' : line.slice(i + 1).replace(/^ /, '');
      if (field === 'id') e.id = value;
      else if (field === 'retry') e.retry = value;
      else if (field === 'data') e.data.push(value);
    }
    out.push({ ...e, data: e.data.join('\n') });
  }
  return out;
}

/** Reads `response`'s body until `done(text)` or `ms` passed; the text read. */
async function readUntil(response, done, ms) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let text = '';
  const timer = setTimeout(() => reader.cancel().catch(() => {}), ms);
  try {
    for (;;) {
      const { value, done: end } = await reader.read();
      if (end) break;
      text += decoder.decode(value, { stream: true });
      if (done(text)) break;
    }
  } catch {
    // cancelled at the deadline
  } finally {
    clearTimeout(timer);
    reader.cancel().catch(() => {});
  }
  return text;
}

async function templatesList(url) {
  const id = 'resources-templates-list';
  const description = 'resources/templates/list answers the server\'s templates (protocol 2025-11-25)';
  try {
    const { client } = await connect(url);
    const r = await client.listResourceTemplates();
    await client.close();
    const names = (r.resourceTemplates ?? []).map((t) => t.uriTemplate);
    return [check(id, description, names.includes('test://template/{id}/data'), `templates: ${JSON.stringify(names)}`)];
  } catch (e) {
    return [check(id, description, false, `Failed: ${e.message}`)];
  }
}

async function sseResume(url) {
  const checks = [];
  try {
    const { client, transport } = await connect(url);
    const session = transport.sessionId;
    const headers = {
      'content-type': 'application/json',
      accept: 'application/json, text/event-stream',
      'mcp-session-id': session,
      'mcp-protocol-version': PROTOCOL,
    };
    const post = await fetch(url, {
      method: 'POST',
      headers,
      body: JSON.stringify({ jsonrpc: '2.0', id: 41, method: 'tools/call', params: { name: 'test_reconnection', arguments: {} } }),
    });
    const text = post.ok ? await readUntil(post, () => false, 5000) : await post.text();
    const events = post.ok ? sseEvents(text) : [];
    const first = events[0];
    const answered = events.some((e) => e.data.includes('"id":41'));
    checks.push(
      check(
        'sse-priming-event',
        'The POST stream starts with a priming event: an id and empty data',
        post.ok && first && first.id && first.data === '',
        `status ${post.status}, first event ${JSON.stringify(first ?? null)}, body ${JSON.stringify(text.slice(0, 200))}`,
      ),
    );
    checks.push(
      check('sse-retry-field', 'The priming event carries a retry field', Boolean(first?.retry), `first event ${JSON.stringify(first ?? null)}`),
    );
    checks.push(
      check('sse-closed-before-answer', 'The server closes the POST stream before the answer', post.ok && !answered, `events ${JSON.stringify(events)}`),
    );
    const last = [...events].reverse().find((e) => e.id)?.id;
    let resumed = false;
    let detail = 'no event id to resume from';
    if (last) {
      const get = await fetch(url, { method: 'GET', headers: { ...headers, accept: 'text/event-stream', 'last-event-id': last } });
      const replay = get.ok ? await readUntil(get, (t) => t.includes('"id":41'), 5000) : await get.text();
      resumed = get.ok && sseEvents(replay).some((e) => e.data.includes('"id":41') && e.data.includes('"result"'));
      detail = `GET status ${get.status}, body ${JSON.stringify(replay.slice(0, 200))}`;
    }
    checks.push(check('sse-resumed', 'GET with Last-Event-ID replays the answer', resumed, detail));
    await client.close();
  } catch (e) {
    checks.push(check('sse-resume-error', 'The resumption scenario ran', false, `Failed: ${e.message}`));
  }
  return checks;
}

async function standaloneAfterHead(url) {
  const id = 'standalone-request-after-head';
  const description = 'A server-to-client request on the standalone GET stream, once its head has come, reaches the client';
  try {
    let head = null;
    const holding = async (u, init = {}) => {
      const rpc = typeof init.body === 'string' ? JSON.parse(init.body).method : undefined;
      if (rpc === 'tools/call' && head) await head;
      const p = fetch(u, init);
      if ((init.method ?? 'GET') === 'GET') head = p.then(() => {}, () => {});
      return p;
    };
    const { client, transport } = await connect(url, { fetch: holding });
    let asked = false;
    client.setRequestHandler(CreateMessageRequestSchema, async () => {
      asked = true;
      return { role: 'assistant', content: { type: 'text', text: 'ok' }, model: 'extras', stopReason: 'endTurn' };
    });
    const r = await client.callTool({ name: 'standalone_sampling', arguments: { timeoutMs: 5000 } });
    await transport.terminateSession().catch(() => {});
    await client.close();
    const text = r.content?.[0]?.text;
    return [check(id, description, asked && text === 'answered', `the client was ${asked ? '' : 'not '}asked; the tool said ${JSON.stringify(text)}`)];
  } catch (e) {
    return [check(id, description, false, `Failed: ${e.message}`)];
  }
}

/** name -> run(url) */
export const EXTRAS = {
  '+resources-templates-list': templatesList,
  '+sse-resume-2025-11-25': sseResume,
  '+standalone-request-after-head': standaloneAfterHead,
};
