// How long the official TypeScript MCP client takes to receive one large tool result
// (a single SSE event of many megabytes) straight from an MCP server and through the
// sidecar, in the same run. Run by hand, never by CI:
//
//   (cd tests/parity && npm ci)          # the MCP SDK, pinned for the parity suite
//   cargo build --release
//   node benches/large_event.mjs target/release/knowtation-sidecar [MB] [rounds]
//
// It starts, in this process, an MCP server on the SDK (one `large_result` tool whose
// text is MB megabytes, default 40) and a hosted-context bridge, then the sidecar binary
// in front of them, and times `tools/call` with the SDK's own client (streamable HTTP),
// alternating direct and through the sidecar for `rounds` rounds (default 3). It prints
// each time and the medians. The client reads the answer as a fetch client does, so
// the number and size of the pieces the body arrives in shows in its time.

import http from 'node:http';
import net from 'node:net';
import crypto from 'node:crypto';
import path from 'node:path';
import { spawn } from 'node:child_process';
import { createRequire } from 'node:module';
import { pathToFileURL, fileURLToPath } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
const parity = path.join(here, '..', 'tests', 'parity');
const require = createRequire(path.join(parity, 'package.json'));
const sdk = async (p) => import(pathToFileURL(require.resolve(`@modelcontextprotocol/sdk/${p}`)).href);

const { McpServer } = await sdk('server/mcp.js');
const { StreamableHTTPServerTransport } = await sdk('server/streamableHttp.js');
const { Client } = await sdk('client/index.js');
const { StreamableHTTPClientTransport } = await sdk('client/streamableHttp.js');

const [binary, mbArg, roundsArg] = process.argv.slice(2);
if (!binary) {
  console.error('usage: node benches/large_event.mjs <sidecar binary> [MB] [rounds]');
  process.exit(2);
}
const MB = Number(mbArg ?? 40);
const ROUNDS = Number(roundsArg ?? 3);
const HOST = '127.0.0.1';
const SECRET = 'large-event-bench-secret-0123456789abcdef';
const TEXT = 'x'.repeat(MB * 1024 * 1024);

function listen(server) {
  return new Promise((resolve) => server.listen(0, HOST, () => resolve(server.address().port)));
}

function freePort() {
  return new Promise((resolve) => {
    const s = net.createServer();
    s.listen(0, HOST, () => {
      const { port } = s.address();
      s.close(() => resolve(port));
    });
  });
}

function b64url(value) {
  return Buffer.from(value).toString('base64url');
}

function token(sub) {
  const head = b64url(JSON.stringify({ alg: 'HS256', typ: 'JWT' }));
  const exp = Math.floor(Date.now() / 1000) + 3600;
  const body = b64url(JSON.stringify({ sub, exp, type: 'mcp_access', scopes: ['vault:write'] }));
  const sig = crypto.createHmac('sha256', SECRET).update(`${head}.${body}`).digest('base64url');
  return `${head}.${body}.${sig}`;
}

function readBody(req) {
  return new Promise((resolve) => {
    const chunks = [];
    req.on('data', (c) => chunks.push(c));
    req.on('end', () => resolve(Buffer.concat(chunks)));
  });
}

// The MCP server: one transport and server per session, as the gateway keeps them.
const sessions = new Map();
const gateway = http.createServer(async (req, res) => {
  const body = req.method === 'POST' ? JSON.parse((await readBody(req)).toString() || '{}') : undefined;
  const id = req.headers['mcp-session-id'];
  let transport = id ? sessions.get(id) : undefined;
  if (!transport) {
    transport = new StreamableHTTPServerTransport({
      sessionIdGenerator: () => crypto.randomUUID(),
      onsessioninitialized: (sid) => sessions.set(sid, transport),
    });
    const server = new McpServer({ name: 'large-event-bench', version: '0.0.0' });
    server.registerTool('large_result', { description: 'A large text result.' }, async () => ({
      content: [{ type: 'text', text: TEXT }],
    }));
    await server.connect(transport);
  }
  await transport.handleRequest(req, res, body);
});
const bridge = http.createServer((req, res) => {
  const body = JSON.stringify({ allowed_vault_ids: ['default'], role: 'editor', scope: null });
  res.writeHead(200, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) });
  res.end(body);
});
const gatewayPort = await listen(gateway);
const bridgePort = await listen(bridge);

const [listenPort, adminPort] = [await freePort(), await freePort()];
const sidecar = spawn(binary, ['serve'], {
  stdio: ['ignore', 'ignore', 'inherit'],
  env: {
    ...process.env,
    KNOWTATION_SIDECAR_LISTEN__ADDRESS: `${HOST}:${listenPort}`,
    KNOWTATION_SIDECAR_ADMIN__ADDRESS: `${HOST}:${adminPort}`,
    KNOWTATION_SIDECAR_UPSTREAM__GATEWAY_URL: `http://${HOST}:${gatewayPort}`,
    KNOWTATION_SIDECAR_UPSTREAM__BRIDGE_URL: `http://${HOST}:${bridgePort}`,
    KNOWTATION_SIDECAR_AUTH__JWT_SECRETS: SECRET,
    KNOWTATION_SIDECAR_LOG__LEVEL: 'warn',
  },
});
for (let i = 0; ; i++) {
  const ready = await fetch(`http://${HOST}:${adminPort}/ready`).then((r) => r.status === 200, () => false);
  if (ready) break;
  if (i > 200) throw new Error('the sidecar did not become ready');
  await new Promise((r) => setTimeout(r, 50));
}

async function timeCall(port) {
  const transport = new StreamableHTTPClientTransport(new URL(`http://${HOST}:${port}/mcp`), {
    requestInit: { headers: { authorization: `Bearer ${token('bench-user')}` } },
  });
  const client = new Client({ name: 'large-event-bench', version: '0.0.0' });
  await client.connect(transport);
  const started = process.hrtime.bigint();
  const result = await client.callTool({ name: 'large_result', arguments: {} }, undefined, {
    timeout: 600_000,
  });
  const seconds = Number(process.hrtime.bigint() - started) / 1e9;
  if (result.content[0].text.length !== TEXT.length) throw new Error('a short result');
  await client.close();
  return seconds;
}

const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
const direct = [];
const through = [];
for (let round = 0; round < ROUNDS; round++) {
  direct.push(await timeCall(gatewayPort));
  through.push(await timeCall(listenPort));
  console.log(`round ${round + 1}: direct ${direct.at(-1).toFixed(2)} s, through the sidecar ${through.at(-1).toFixed(2)} s`);
}
console.log(`${MB} MB result, median of ${ROUNDS}: direct ${median(direct).toFixed(2)} s, through the sidecar ${median(through).toFixed(2)} s`);
sidecar.kill('SIGTERM');
gateway.close();
bridge.close();
process.exit(0);
