// What the conformance run and the race measurement share: the sidecar binary started
// as `serve` and configured by environment variables only, the hosted-context bridge it
// needs for `initialize`, the bearer token, and the client-side shim that adds that
// token to every request (the conformance runner cannot send a header of its own).

import crypto from 'node:crypto';
import http from 'node:http';
import net from 'node:net';
import { spawn } from 'node:child_process';

export const HOST = '127.0.0.1';
const SECRET = 'conformance-suite-secret-0123456789abcdef';
export const SUB = 'conformance-user';

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

export function freePort() {
  return new Promise((resolve, reject) => {
    const s = net.createServer();
    s.once('error', reject);
    s.listen(0, HOST, () => {
      const { port } = s.address();
      s.close(() => resolve(port));
    });
  });
}

const b64url = (v) => Buffer.from(typeof v === 'string' ? v : JSON.stringify(v)).toString('base64url');

/** An HS256 session token (no `type`) for `sub`, valid for two hours. */
export function token(sub = SUB) {
  const now = Math.floor(Date.now() / 1000);
  const signing = `${b64url({ alg: 'HS256', typ: 'JWT' })}.${b64url({ sub, iat: now, exp: now + 7200 })}`;
  const sig = crypto.createHmac('sha256', SECRET).update(signing).digest('base64url');
  return `${signing}.${sig}`;
}

/** The bridge: `GET /api/v1/hosted-context` answers an editor of vault `default`. */
export async function startBridge() {
  let lookups = 0;
  const server = http.createServer((req, res) => {
    if (req.method === 'GET' && req.url.split('?')[0] === '/api/v1/hosted-context') {
      lookups += 1;
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end(JSON.stringify({ allowed_vault_ids: ['default'], role: 'editor', scope: null }));
      return;
    }
    res.writeHead(404, { 'content-type': 'application/json' });
    res.end('{"error":"not found"}');
  });
  await new Promise((r) => server.listen(0, HOST, r));
  return {
    url: `http://${HOST}:${server.address().port}`,
    lookups: () => lookups,
    close: () => new Promise((r) => server.close(() => r())),
  };
}

// Hop-by-hop headers (RFC 9110 §7.6.1): each side of the shim frames its own connection.
const HOP = new Set(['connection', 'keep-alive', 'proxy-connection', 'transfer-encoding', 'te', 'trailer', 'upgrade']);

function endToEnd(rawHeaders) {
  const out = [];
  for (let i = 0; i < rawHeaders.length; i += 2) {
    if (!HOP.has(rawHeaders[i].toLowerCase())) out.push(rawHeaders[i], rawHeaders[i + 1]);
  }
  return out;
}

/**
 * The header-adding shim: an HTTP/1.1 proxy on loopback that forwards every request to
 * `target` (`http://host:port`) as it came (method, target, every end-to-end header,
 * `Host` and `Origin` included, the body streamed) with `Authorization: Bearer <token>`
 * added when the request has none, and passes the answer back as it comes (its head at
 * once, the body streamed). Each client connection gets one upstream connection of its
 * own, so connection reuse on the far side follows the client's.
 */
export async function startShim(target, bearer, listenPort = 0) {
  const { hostname, port } = new URL(target);
  const sockets = new Set();
  const server = http.createServer((req, res) => {
    const sock = req.socket;
    if (!sock.shimAgent) sock.shimAgent = new http.Agent({ keepAlive: true, maxSockets: 1 });
    const headers = endToEnd(req.rawHeaders);
    if (req.headers.authorization === undefined) headers.push('Authorization', `Bearer ${bearer}`);
    const up = http.request({ host: hostname, port: Number(port), method: req.method, path: req.url, headers, agent: sock.shimAgent });
    up.on('response', (answer) => {
      res.writeHead(answer.statusCode, answer.statusMessage, endToEnd(answer.rawHeaders));
      res.flushHeaders();
      answer.pipe(res);
      answer.on('error', () => res.destroy());
    });
    up.on('error', () => {
      if (!res.headersSent) {
        res.writeHead(502, { 'content-type': 'text/plain' });
        res.end('shim: the upstream failed');
      } else {
        res.destroy();
      }
    });
    res.on('close', () => {
      if (!res.writableFinished) up.destroy();
    });
    req.pipe(up);
  });
  server.on('connection', (s) => {
    sockets.add(s);
    s.on('close', () => {
      sockets.delete(s);
      s.shimAgent?.destroy();
    });
  });
  await new Promise((r) => server.listen(listenPort, HOST, r));
  return {
    url: `http://${HOST}:${server.address().port}/mcp`,
    close: () =>
      new Promise((r) => {
        for (const s of sockets) s.destroy();
        server.close(() => r());
      }),
  };
}

// ---- the sidecar: every setting this suite gives it, in one place --------------------------
function sidecarEnv({ listenPort, adminPort, gatewayUrl, bridgeUrl }) {
  return {
    KNOWTATION_SIDECAR_LISTEN__ADDRESS: `${HOST}:${listenPort}`,
    KNOWTATION_SIDECAR_ADMIN__ADDRESS: `${HOST}:${adminPort}`,
    KNOWTATION_SIDECAR_UPSTREAM__GATEWAY_URL: gatewayUrl,
    KNOWTATION_SIDECAR_UPSTREAM__BRIDGE_URL: bridgeUrl,
    KNOWTATION_SIDECAR_AUTH__JWT_SECRETS: SECRET,
    KNOWTATION_SIDECAR_LOG__LEVEL: 'warn',
    KNOWTATION_SIDECAR_LOG__ACCESS: 'none',
    // The reference server, unlike the gateway, has no per-user limit: the sidecar's
    // would only refuse the suite's requests.
    KNOWTATION_SIDECAR_RATE_LIMIT__PER_USER_PER_MINUTE: '0',
    KNOWTATION_SIDECAR_MCP__CALLS_PER_MINUTE: '1000000',
  };
}

/** Starts `binary serve` in front of `gatewayUrl` and waits for its `/live`; `extra`:
 * more `KNOWTATION_SIDECAR_*` settings. */
export async function startSidecar(binary, { gatewayUrl, bridgeUrl, extra = {} }) {
  const listenPort = await freePort();
  const adminPort = await freePort();
  const env = {};
  for (const [k, v] of Object.entries(process.env)) if (!/^KNOWTATION_SIDECAR_/i.test(k)) env[k] = v;
  Object.assign(env, sidecarEnv({ listenPort, adminPort, gatewayUrl, bridgeUrl }), extra);
  const child = spawn(binary, ['serve'], { env, stdio: ['ignore', 'pipe', 'pipe'] });
  let output = '';
  const keep = (c) => {
    output = (output + c.toString('utf8')).slice(-8000);
  };
  child.stdout.on('data', keep);
  child.stderr.on('data', keep);
  let exited = null;
  child.on('exit', (code, signal) => {
    exited = { code, signal };
  });
  child.on('error', (e) => {
    exited = { code: null, signal: null, error: e.message };
  });
  const deadline = Date.now() + 30_000;
  for (;;) {
    if (exited) {
      const hint = exited.code === 64 ? ' (configuration rejected: adapt sidecarEnv() in harness.mjs)' : '';
      throw new Error(`the sidecar exited before it was live: ${JSON.stringify(exited)}${hint}\n${output.trim()}`);
    }
    const live = await new Promise((resolve) => {
      const r = http.get({ host: HOST, port: adminPort, path: '/live', agent: false }, (a) => {
        a.resume();
        resolve(a.statusCode);
      });
      r.on('error', () => resolve(0));
      r.setTimeout(1000, () => r.destroy());
    });
    if (live === 200) break;
    if (Date.now() > deadline) throw new Error(`the sidecar's /live did not answer 200 within 30 s\n${output.trim()}`);
    await sleep(50);
  }
  return {
    url: `http://${HOST}:${listenPort}`,
    output: () => output,
    exited: () => exited,
    stop() {
      if (!exited) child.kill('SIGKILL');
    },
  };
}
