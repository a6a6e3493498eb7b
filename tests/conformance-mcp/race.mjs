// The standalone-stream race, measured directly and through the sidecar (README.md, "The
// standalone GET stream"). Each try is one MCP client session on the SDK's own client, as
// the conformance runner makes them: `initialize`, `notifications/initialized` (whose 202
// makes the client open the `GET /mcp` stream, without waiting for it), then at once a
// call of a tool that sends `sampling/createMessage` or `elicitation/create` on the
// standalone stream. The SDK server drops such a message when no standalone stream is
// open yet: the try is lost when the request never reaches the client.
//
//   bash tests/conformance-mcp/run.sh race [tries]
//   node tests/conformance-mcp/race.mjs <sidecar binary> [tries]     (Node 22)
//
// Knobs (environment): RACE_MODE=after-head makes the client wait for the GET stream's
// response head before it calls the tool: no try may be lost then, unless a hop answers
// that head before the server has opened the stream. RACE_LOSS_MS (default 1000): how
// long the server waits for the client's answer before it counts the request lost.
// RACE_THREADS: the sidecar's `runtime.threads`. RACE_VERBOSE=1: each lost try's
// requests as the client sent them and as the server received them (connection numbers
// at the server; "new" marks a connection's first request).
//
// The client talks to both targets itself (it sends the token): no shim. The server runs
// in a process of its own and reports each request's arrival over IPC; times are
// `performance.timeOrigin + performance.now()` in each process.

import path from 'node:path';
import { fork } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { CreateMessageRequestSchema, ElicitRequestSchema } from '@modelcontextprotocol/sdk/types.js';
import { startBridge, startSidecar, token } from './harness.mjs';

const binary = process.argv[2] || process.env.SIDECAR_BIN;
const tries = Number(process.argv[3] || process.env.RACE_TRIES || 100);
const mode = process.env.RACE_MODE || 'sdk';
const lossMs = Number(process.env.RACE_LOSS_MS || 1000);
if (!binary || !['sdk', 'after-head'].includes(mode)) {
  console.error('usage: [RACE_MODE=sdk|after-head] node race.mjs <sidecar binary> [tries]');
  process.exit(2);
}

const events = [];
const record = (e) => events.push(e);

/** One session: whether the server's request reached the client, and the timings. */
async function once(url, i) {
  const sent = [];
  let getHead = null;
  // Records when the client sends each request; in `after-head` mode, holds the tool call
  // until the GET stream's response head has come.
  const recordingFetch = async (u, init = {}) => {
    const method = init.method ?? 'GET';
    let rpc;
    try {
      rpc = init.body ? JSON.parse(init.body).method ?? 'response' : undefined;
    } catch {
      rpc = '?';
    }
    if (mode === 'after-head' && rpc === 'tools/call' && getHead) await getHead;
    sent.push({ method, rpc, at: performance.timeOrigin + performance.now() });
    const p = fetch(u, init);
    if (method === 'GET') {
      getHead = p.then(
        () => sent.push({ method: 'GET-head', at: performance.timeOrigin + performance.now() }),
        () => {},
      );
    }
    return p;
  };
  const client = new Client({ name: 'race', version: '1.0.0' }, { capabilities: { sampling: {}, elicitation: {} } });
  let asked = false;
  client.setRequestHandler(CreateMessageRequestSchema, async () => {
    asked = true;
    return { role: 'assistant', content: { type: 'text', text: 'ok' }, model: 'race', stopReason: 'endTurn' };
  });
  client.setRequestHandler(ElicitRequestSchema, async () => {
    asked = true;
    return { action: 'accept', content: { username: 'race', email: 'race@example.com' } };
  });
  const transport = new StreamableHTTPClientTransport(new URL(url), {
    fetch: recordingFetch,
    requestInit: { headers: { Authorization: `Bearer ${bearer}` } },
  });
  await client.connect(transport);
  const session = transport.sessionId;
  const tool = i % 2 === 0 ? 'standalone_sampling' : 'standalone_elicitation';
  const result = await client.callTool({ name: tool, arguments: { timeoutMs: lossMs } });
  const text = result.content?.[0]?.text;
  await transport.terminateSession().catch(() => {});
  await client.close();
  // The server's records come over IPC, not with its answers: wait for the last one.
  const until = performance.now() + 2000;
  while (!events.some((e) => e.session === session && e.method === 'DELETE') && performance.now() < until) {
    await new Promise((r) => setTimeout(r, 1));
  }
  const at = (pred) => events.find((e) => e.session === session && pred(e))?.at;
  const get = sent.find((s) => s.method === 'GET');
  const call = sent.find((s) => s.rpc === 'tools/call');
  const head = sent.find((s) => s.method === 'GET-head');
  const serverGet = at((e) => e.kind === 'http' && e.method === 'GET');
  const serverCall = at((e) => e.kind === 'http' && e.rpc === 'tools/call');
  const mine = events.filter((e) => e.session === session && e.kind === 'http');
  return {
    trace: mine.map((e) => `${e.method} ${e.rpc ?? ''} conn ${e.socket}${e.nth === 1 ? ' (new)' : ''} +${(e.at - sent[0].at).toFixed(2)} ms`),
    sent: sent.map((s) => `${s.method} ${s.rpc ?? ''} +${(s.at - sent[0].at).toFixed(2)} ms`),
    lost: !asked,
    text,
    clientGetFirst: get && call ? get.at <= call.at : null,
    serverGetFirst: serverGet !== undefined && serverCall !== undefined ? serverGet <= serverCall : serverGet !== undefined,
    // Client send to arrival at the server, for each of the two requests.
    getLatency: get && serverGet !== undefined ? serverGet - get.at : null,
    callLatency: call && serverCall !== undefined ? serverCall - call.at : null,
    // From the GET's arrival at the server to its response head at the client.
    headLatency: head && serverGet !== undefined ? head.at - serverGet : null,
  };
}

function describe(name, results) {
  const n = results.length;
  const lost = results.filter((r) => r.lost).length;
  const inverted = results.filter((r) => r.clientGetFirst && !r.serverGetFirst).length;
  const lostInverted = results.filter((r) => r.lost && !r.serverGetFirst).length;
  const med = (xs) => {
    const s = xs.filter((x) => x !== null).sort((a, b) => a - b);
    return s.length ? s[Math.floor(s.length / 2)] : NaN;
  };
  const p90 = (xs) => {
    const s = xs.filter((x) => x !== null).sort((a, b) => a - b);
    return s.length ? s[Math.floor(s.length * 0.9)] : NaN;
  };
  const ms = (x) => `${x.toFixed(2)} ms`;
  if (process.env.RACE_VERBOSE === '1') {
    for (const r of results.filter((x) => x.lost)) {
      console.log(`  ${name} lost: client sent ${r.sent.join(', ')}; the server got ${r.trace.join(', ')}`);
    }
  }
  console.log(
    `${name.padEnd(8)} lost ${lost}/${n}; the GET reached the server after the tool call in ${inverted} of the ` +
      `${results.filter((r) => r.clientGetFirst).length} tries where the client sent it first (${lostInverted} of the ${lost} lost); ` +
      `client to server: GET median ${ms(med(results.map((r) => r.getLatency)))} (p90 ${ms(p90(results.map((r) => r.getLatency)))}), ` +
      `tool call median ${ms(med(results.map((r) => r.callLatency)))} (p90 ${ms(p90(results.map((r) => r.callLatency)))}); ` +
      `server to client, the GET's response head: median ${ms(med(results.map((r) => r.headLatency)))} (p90 ${ms(p90(results.map((r) => r.headLatency)))})`,
  );
  return lost;
}

// The server runs in a process of its own, as a gateway does: in the client's process
// its event loop would order the two requests by the client's turns.
const server = fork(path.join(path.dirname(fileURLToPath(import.meta.url)), 'server.mjs'), ['0'], { stdio: 'inherit' });
const reference = await new Promise((resolve, reject) => {
  server.once('error', reject);
  server.on('message', (e) => {
    if (e.kind === 'listening') resolve({ url: e.url, close: async () => server.disconnect() });
    else record(e);
  });
});
const bridge = await startBridge();
const extra = process.env.RACE_THREADS ? { KNOWTATION_SIDECAR_RUNTIME__THREADS: process.env.RACE_THREADS } : {};
const sidecar = await startSidecar(path.resolve(binary), { gatewayUrl: new URL(reference.url).origin, bridgeUrl: bridge.url, extra });
process.on('exit', () => sidecar.stop());
// This client sends the token itself: no shim between it and either target.
const bearer = token();
const direct = { url: reference.url };
const through = { url: `${sidecar.url}/mcp` };
console.log(
  `race: ${tries} sessions each way, mode ${mode}, a request counts as lost after ${lossMs} ms` +
    (process.env.RACE_THREADS ? `, the sidecar on ${process.env.RACE_THREADS} runtime thread(s)` : ''),
);
const results = { direct: [], sidecar: [] };
// Interleaved, so that both see the same machine load.
for (let i = 0; i < tries; i += 1) {
  results.direct.push(await once(direct.url, i));
  results.sidecar.push(await once(through.url, i));
}
describe('direct', results.direct);
describe('sidecar', results.sidecar);
sidecar.stop();
await reference.close();
await bridge.close();
process.exit(0);
