// Parity suite driver: the sidecar binary in front of a gateway stand-in built on the
// gateway's real libraries (see README.md).
//
//   node tests/parity/run.mjs <path-to-sidecar-binary>   # the suite
//   node tests/parity/run.mjs --self-check               # hostile shapes straight to the stand-in
//   PARITY_HOP=nginx node tests/parity/run.mjs <binary>  # the suite through nginx as a decoding hop
//   PARITY_HOP=decode node tests/parity/run.mjs <binary> # through a hop that decodes the path raw
//
// Knobs (environment): PARITY_SEED (generator seed), PARITY_CASES (generated cases),
// PARITY_ONLY (comma-separated case labels, e.g. `f3,g1207`), PARITY_VERBOSE=1 (print the
// request and answer of failing cases), PARITY_MAX_LINES (most failing cases listed),
// PARITY_HOP (`decode`, or an nginx binary, to put between the sidecar and the stand-in: see
// startDecodeHop and startHop).

import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import zlib from 'node:zlib';
import { spawn } from 'node:child_process';
import jwt from 'jsonwebtoken';
import { startStandin, CANARY, LEAK } from './standin.mjs';

const HOST = '127.0.0.1';
const SECRET = 'parity-suite-secret-0123456789abcdef';
const SUB_A = 'parity-user-a';
const SUB_B = 'parity-user-b';
// Users of the session section only, so that its sessions and evictions are its own.
const SUB_C = 'parity-user-c';
const SUB_D = 'parity-user-d';
// The user of the event-stream section, whose sessions have an event store at the stand-in.
const SUB_E = 'parity-user-e';
// The stand-in's per-user cap, the gateway's default and the sidecar's.
const MAX_SESSIONS_PER_USER = 8;
const DEFAULT_SEED = 20260117;
const DEFAULT_CASES = 3000;
const REQUEST_TIMEOUT_MS = 8000;
const MAX_DETAIL_LINES = Number(process.env.PARITY_MAX_LINES || 14);
const ACCEPT = 'application/json, text/event-stream';
const PROTOCOL_VERSION = '2025-06-18';
const UNKNOWN_SESSION = '7d0c1a3e-5b7f-4c2e-9a1d-0f3e2b4c6d8a';

// ---- the sidecar's configuration: every setting the suite gives it, in one place -------
function sidecarEnv({ listenPort, adminPort, standin }) {
  return {
    KNOWTATION_SIDECAR_LISTEN__ADDRESS: `${HOST}:${listenPort}`,
    KNOWTATION_SIDECAR_ADMIN__ADDRESS: `${HOST}:${adminPort}`,
    KNOWTATION_SIDECAR_UPSTREAM__GATEWAY_URL: standin.gatewayUrl,
    KNOWTATION_SIDECAR_UPSTREAM__CANISTER_URL: standin.canisterUrl,
    KNOWTATION_SIDECAR_UPSTREAM__BRIDGE_URL: standin.bridgeUrl,
    KNOWTATION_SIDECAR_AUTH__JWT_SECRETS: SECRET,
    KNOWTATION_SIDECAR_AUTH__REQUIRE_EXP: 'false',
    KNOWTATION_SIDECAR_LOG__LEVEL: 'warn',
    KNOWTATION_SIDECAR_RATE_LIMIT__PER_USER_PER_MINUTE: '0',
    KNOWTATION_SIDECAR_MCP__CALLS_PER_MINUTE: '1000000',
  };
}

// The second sidecar, behind a load balancer that the suite plays from BALANCER: it trusts
// one hop in front of it, and only from that address (see forwardedCases()).
const BALANCER = '127.0.0.5';
function balancerEnv() {
  return {
    KNOWTATION_SIDECAR_FORWARDED__TRUSTED_HOPS: '1',
    KNOWTATION_SIDECAR_FORWARDED__TRUSTED_PROXIES: BALANCER,
  };
}

// ---- small helpers ----------------------------------------------------------------------
const hasOwn = (o, k) => Object.prototype.hasOwnProperty.call(o, k);
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const tick = () => new Promise((r) => setImmediate(r));

function freePort() {
  return new Promise((resolve, reject) => {
    const s = net.createServer();
    s.once('error', reject);
    s.listen(0, HOST, () => {
      const { port } = s.address();
      s.close(() => resolve(port));
    });
  });
}

function token(sub) {
  return jwt.sign({ sub }, SECRET, { algorithm: 'HS256', expiresIn: '2h' });
}

function short(text, n = 160) {
  const s = String(text).replace(/[\u0000-\u001f\u007f-\u009f]/g, (c) => `\\x${c.charCodeAt(0).toString(16).padStart(2, '0')}`);
  return s.length > n ? `${s.slice(0, n)}…` : s;
}

// Deterministic PRNG (mulberry32) and a per-case seed derived from (seed, index).
function mulberry32(a) {
  return () => {
    a |= 0;
    a = (a + 0x6d2b79f5) | 0;
    let t = Math.imul(a ^ (a >>> 15), 1 | a);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}
function caseRng(seed, index) {
  let h = (seed ^ Math.imul(index + 1, 0x9e3779b1)) >>> 0;
  h = Math.imul(h ^ (h >>> 16), 0x85ebca6b) >>> 0;
  h = Math.imul(h ^ (h >>> 13), 0xc2b2ae35) >>> 0;
  const next = mulberry32(h ^ (h >>> 16));
  const r = {
    next,
    chance: (p) => next() < p,
    int: (lo, hi) => lo + Math.floor(next() * (hi - lo + 1)),
    pick: (arr) => arr[Math.floor(next() * arr.length)],
    weighted: (pairs) => {
      const total = pairs.reduce((s, [w]) => s + w, 0);
      let x = next() * total;
      for (const [w, v] of pairs) {
        if ((x -= w) < 0) return v;
      }
      return pairs[pairs.length - 1][1];
    },
  };
  return r;
}

// ---- body encodings ---------------------------------------------------------------------

// UTF-7 (RFC 2152) with a caller-chosen set of characters forced into base64 runs.
function utf7(text, force = (ch) => ch === '_') {
  let out = '';
  const chars = [...text];
  for (let i = 0; i < chars.length; ) {
    const ch = chars[i];
    const code = ch.codePointAt(0);
    if (ch === '+') {
      out += '+-';
      i += 1;
    } else if (code < 0x80 && !force(ch, i)) {
      out += ch;
      i += 1;
    } else {
      let run = '';
      while (i < chars.length && chars[i] !== '+' && (chars[i].codePointAt(0) >= 0x80 || force(chars[i], i))) {
        run += chars[i];
        i += 1;
      }
      const le = Buffer.from(run, 'utf16le');
      const be = Buffer.alloc(le.length);
      for (let j = 0; j < le.length; j += 2) {
        be[j] = le[j + 1];
        be[j + 1] = le[j];
      }
      out += `+${be.toString('base64').replace(/=+$/, '')}-`;
    }
  }
  return Buffer.from(out, 'latin1');
}

function utf16(text, bigEndian) {
  const le = Buffer.from(text, 'utf16le');
  if (!bigEndian) return le;
  const be = Buffer.alloc(le.length);
  for (let j = 0; j < le.length; j += 2) {
    be[j] = le[j + 1];
    be[j + 1] = le[j];
  }
  return be;
}

const BOM = {
  'utf-8': Buffer.from([0xef, 0xbb, 0xbf]),
  'utf-16le': Buffer.from([0xff, 0xfe]),
  'utf-16be': Buffer.from([0xfe, 0xff]),
};

/** Text → bytes in `charset` ('utf-8', 'utf-7', 'utf-16le', 'utf-16be'), optional BOM. */
function encodeText(input, charset, { bom = false, force } = {}) {
  const text = RT(input);
  let bytes;
  switch (charset) {
    case 'utf-7':
      bytes = utf7(text, force);
      break;
    case 'utf-16le':
      bytes = utf16(text, false);
      break;
    case 'utf-16be':
      bytes = utf16(text, true);
      break;
    default:
      bytes = Buffer.from(text, 'utf8');
  }
  if (bom && BOM[charset]) bytes = Buffer.concat([BOM[charset], bytes]);
  return bytes;
}

function compress(bytes, coding) {
  switch (coding) {
    case 'gzip':
      return zlib.gzipSync(bytes);
    case 'deflate':
      return zlib.deflateSync(bytes);
    case 'deflate-raw':
      return zlib.deflateRawSync(bytes);
    case 'br':
      return zlib.brotliCompressSync(bytes);
    default:
      return bytes;
  }
}

// ---- raw HTTP/1.1 ------------------------------------------------------------------------

function dechunk(buf) {
  const parts = [];
  let i = 0;
  while (i < buf.length) {
    const eol = buf.indexOf('\r\n', i);
    if (eol < 0) break;
    const size = parseInt(buf.subarray(i, eol).toString('latin1').split(';')[0], 16);
    if (!Number.isFinite(size) || size === 0) break;
    parts.push(buf.subarray(eol + 2, eol + 2 + size));
    i = eol + 2 + size + 2;
  }
  return Buffer.concat(parts);
}

/**
 * Sends one request with exactly the given head and body bytes, `Connection: close`, and
 * reads the answer to the end; from the loopback address `from` when given, with `host`
 * as the `Host` when given.
 * @param {number} port
 * @param {{method: string, target: string, headers: [string, string][], body?: Buffer|null, chunked?: boolean, from?: string, host?: string, until?: (body: Buffer) => boolean, timeoutMs?: number}} req
 */
function send(port, req) {
  return new Promise((resolve) => {
    const head = [`${req.method} ${req.target} HTTP/1.1`, `Host: ${req.host ?? `${HOST}:${port}`}`];
    for (const [k, v] of req.headers) head.push(`${k}: ${v}`);
    const body = req.body ?? null;
    if (body && req.chunked) head.push('Transfer-Encoding: chunked');
    else if (body) head.push(`Content-Length: ${body.length}`);
    head.push('Connection: close', '', '');
    let payload = Buffer.from(head.join('\r\n'), 'utf8');
    if (body && req.chunked) {
      const half = Math.max(1, Math.floor(body.length / 2));
      const pieces = [body.subarray(0, half), body.subarray(half)].filter((p) => p.length);
      const framed = pieces.flatMap((p) => [Buffer.from(`${p.length.toString(16)}\r\n`), p, Buffer.from('\r\n')]);
      payload = Buffer.concat([payload, ...framed, Buffer.from('0\r\n\r\n')]);
    } else if (body) {
      payload = Buffer.concat([payload, body]);
    }
    const chunks = [];
    let done = false;
    const sock = net.connect({ port, host: HOST, ...(req.from ? { localAddress: req.from } : {}) });
    const finish = (error) => {
      if (done) return;
      done = true;
      clearTimeout(timer);
      sock.destroy();
      const raw = Buffer.concat(chunks);
      const end = raw.indexOf('\r\n\r\n');
      if (end < 0) return resolve({ status: 0, headers: {}, body: Buffer.alloc(0), error: error || 'no response head' });
      const lines = raw.subarray(0, end).toString('latin1').split('\r\n');
      const status = Number(lines[0].split(' ')[1]) || 0;
      const headers = {};
      for (const line of lines.slice(1)) {
        const c = line.indexOf(':');
        if (c > 0) headers[line.slice(0, c).trim().toLowerCase()] = line.slice(c + 1).trim();
      }
      let rbody = raw.subarray(end + 4);
      if (/chunked/i.test(headers['transfer-encoding'] || '')) rbody = dechunk(rbody);
      resolve({ status, headers, body: rbody, error });
    };
    const timer = setTimeout(() => finish('timeout'), req.timeoutMs ?? REQUEST_TIMEOUT_MS);
    // A server may keep the connection open despite `Connection: close` (the SDK's SSE
    // answers say `Connection: keep-alive`), so the answer ends where its framing says.
    const complete = () => {
      const raw = Buffer.concat(chunks);
      const end = raw.indexOf('\r\n\r\n');
      if (end < 0) return false;
      const head = raw.subarray(0, end).toString('latin1');
      const status = Number(head.split(' ')[1]) || 0;
      if (status >= 100 && status < 200) {
        chunks.splice(0, chunks.length, raw.subarray(end + 4));
        return complete();
      }
      if (req.method === 'HEAD' || status === 204 || status === 304) return true;
      const rest = raw.subarray(end + 4);
      if (/\r\ntransfer-encoding:[^\r]*chunked/i.test(head)) return rest.includes('\r\n0\r\n\r\n') || rest.subarray(0, 5).toString('latin1') === '0\r\n\r\n';
      const cl = /\r\ncontent-length:\s*(\d+)/i.exec(head);
      if (cl) return rest.length >= Number(cl[1]);
      return false;
    };
    // `req.until(body)`: an answer that stays open (an event stream) is done once the body
    // read so far satisfies it.
    const enough = () => {
      if (!req.until) return false;
      const raw = Buffer.concat(chunks);
      const end = raw.indexOf('\r\n\r\n');
      if (end < 0) return false;
      const rest = raw.subarray(end + 4);
      return req.until(/\r\ntransfer-encoding:[^\r]*chunked/i.test(raw.subarray(0, end).toString('latin1')) ? dechunk(rest) : rest);
    };
    sock.on('data', (c) => {
      chunks.push(c);
      if (complete() || enough()) finish();
    });
    sock.on('end', () => finish());
    sock.on('close', () => finish());
    sock.on('error', (e) => finish(e.code || String(e)));
    sock.write(payload);
  });
}

function sseMessages(body) {
  const out = [];
  for (const line of body.toString('utf8').split('\n')) {
    if (line.startsWith('data: ')) {
      try {
        out.push(JSON.parse(line.slice(6)));
      } catch {
        /* not JSON */
      }
    }
  }
  return out;
}

// ---- JSON text with full control over keys, escapes and spacing -------------------------

/** A JSON string literal; `esc(ch, i)` says which characters to write as \uXXXX. */
function str(s, esc = () => false, upperHex = false) {
  let out = '"';
  let i = 0;
  for (const ch of s) {
    for (let k = 0; k < ch.length; k += 1) {
      const unit = ch.charCodeAt(k);
      const c = ch.length === 1 ? ch : String.fromCharCode(unit);
      let hex = unit.toString(16).padStart(4, '0');
      if (upperHex) hex = hex.toUpperCase();
      if (c === '"') out += '\\"';
      else if (c === '\\') out += '\\\\';
      else if (unit < 0x20 || (unit >= 0xd800 && unit <= 0xdfff) || esc(c, i)) out += `\\u${hex}`;
      else out += c;
    }
    i += 1;
  }
  return `${out}"`;
}

// Nodes: {o: [[keyLiteral, node], ...]} | {a: [node, ...]} | {r: 'raw JSON text'}
const O = (...entries) => ({ o: entries });
const A = (...items) => ({ a: items });
const R = (text) => ({ r: text });
const K = (k) => str(k);
const V = (v) => R(JSON.stringify(v));

function render(node, ws = () => '') {
  if (node.r !== undefined) return node.r;
  if (node.a) return `[${ws()}${node.a.map((n) => render(n, ws)).join(`${ws()},${ws()}`)}${ws()}]`;
  return `{${ws()}${node.o.map(([k, v]) => `${k}${ws()}:${ws()}${render(v, ws)}`).join(`${ws()},${ws()}`)}${ws()}}`;
}

const call = (name, { id = 1, args = { path: 'a.md' } } = {}) =>
  O([K('jsonrpc'), V('2.0')], [K('id'), typeof id === 'string' && id.startsWith('raw:') ? R(id.slice(4)) : V(id)], [K('method'), V('tools/call')], [K('params'), O([K('name'), V(name)], [K('arguments'), V(args)])]);
const GSS = 'get_section_source';
const gssText = (id = 1) => render(call(GSS, { id }));

// The three body-free views: the sidecar answers each view's tool (and its REST route,
// where it has one) itself, so the fixed list runs once per view.
const VIEWS = [
  { tool: GSS, words: ['section', 'source'], rest: true },
  { tool: 'get_note_outline', words: ['note', 'outline'], rest: true },
  { tool: 'get_document_tree', words: ['document', 'tree'], rest: false },
];
const VIEW_TOOLS = VIEWS.map((v) => v.tool);
const fullwidth = (s) => [...s].map((c) => (/[a-z_]/.test(c) ? String.fromCharCode(c.charCodeAt(0) + 0xfee0) : c)).join('');
const allEscaped = (s) => str(s, () => true).slice(1, -1);

/**
 * The text of a case written for `get_section_source` (its tool name, REST route and
 * resource URIs, in every spelling the cases use: cased, escaped, split by a tab, a
 * lookalike) rewritten for another view. Throws when a spelling is left, so that no case
 * of the list silently stays about the section source.
 */
function retargeter(view) {
  if (view.tool === GSS) return (text) => text;
  const [a, b] = view.words;
  const like = (src, dst) => {
    if (src === src.toUpperCase()) return dst.toUpperCase();
    if (src[0] === src[0].toUpperCase()) return dst[0].toUpperCase() + dst.slice(1);
    return dst;
  };
  const hex = (c) => c.charCodeAt(0).toString(16);
  const pairs = [
    [fullwidth(GSS), fullwidth(view.tool)],
    [allEscaped(GSS), allEscaped(view.tool)],
    ['%73ection-source', `%${hex(a[0])}${a.slice(1)}-${b}`],
    ['sec\\ttion-source', `${a.slice(0, 3)}\\t${a.slice(3)}-${b}`],
  ];
  return (text) => {
    let out = text;
    for (const [from, to] of pairs) out = out.split(from).join(to);
    out = out.replace(/(section)(_|-|\\u005f|%2d|\\u002d|-\\t|\\n-\\r)(source)/gi, (_m, w1, sep, w2) => `${like(w1, a)}${sep}${like(w2, b)}`);
    if (/section|[_-]source|%73ection|\\u0073\\u0065\\u0063/i.test(out)) throw new Error(`a case keeps a section-source spelling for ${view.tool}: ${short(out, 200)}`);
    return out;
  };
}

// The rewrite applied to the text of the cases being built (the identity but while the
// fixed list is built for another view than the section source).
let RT = (text) => text;
RT.tag = null;

// ---- cases -------------------------------------------------------------------------------
//
// A case is a plan; `materialize(plan, ctx)` turns it into bytes once the session ids and
// tokens of the run are known.
//   plan = { label, desc, kind: 'mcp'|'rest'|'raw', method, target, user, session,
//            headers: [[k, v]...] (extra), accept, ct (string|null|string[]), body: Buffer|null,
//            chunked, control }

function mcpPlan(desc, body, opts = {}) {
  return {
    desc: RT.tag ? `${desc} [${RT.tag}]` : desc,
    kind: 'mcp',
    method: opts.method || 'POST',
    target: opts.target || '/mcp',
    user: opts.user || 'a',
    session: opts.session || 'a',
    accept: opts.accept === undefined ? ACCEPT : opts.accept,
    ct: opts.ct === undefined ? 'application/json' : opts.ct,
    headers: opts.headers || [],
    body: Buffer.isBuffer(body) ? body : Buffer.from(RT(body), 'utf8'),
    coding: opts.coding || null,
    chunked: !!opts.chunked,
    control: opts.control || null,
  };
}

function restPlan(desc, target, opts = {}) {
  return {
    desc: RT.tag ? `${desc} [${RT.tag}]` : desc,
    kind: 'rest',
    method: opts.method || 'GET',
    target: RT(target),
    user: opts.user === undefined ? 'a' : opts.user,
    session: 'none',
    accept: 'application/json',
    ct: null,
    headers: opts.headers || [],
    body: null,
    coding: null,
    chunked: false,
    control: opts.control || null,
  };
}

function sessionHeaders(spec, ctx) {
  const own = ctx.sessions.a;
  switch (spec) {
    case 'a':
      return [['Mcp-Session-Id', own]];
    case 'b':
      return [['Mcp-Session-Id', ctx.sessions.b]];
    case 'none':
      return [];
    case 'unknown':
      return [['Mcp-Session-Id', UNKNOWN_SESSION]];
    case 'repeated':
      return [['Mcp-Session-Id', own], ['Mcp-Session-Id', own]];
    case 'repeated-unknown-first':
      return [['Mcp-Session-Id', UNKNOWN_SESSION], ['Mcp-Session-Id', own]];
    case 'repeated-own-first':
      return [['Mcp-Session-Id', own], ['Mcp-Session-Id', UNKNOWN_SESSION]];
    case 'listed':
      return [['Mcp-Session-Id', `${own}, ${own}`]];
    case 'padded':
      return [['Mcp-Session-Id', ` \t${own}\t `]];
    case 'upper':
      return [['Mcp-Session-Id', own.toUpperCase()]];
    case 'lower-name':
      return [['mcp-session-id', own]];
    case 'empty':
      return [['Mcp-Session-Id', '']];
    default:
      return [['Mcp-Session-Id', spec]];
  }
}

function materialize(plan, ctx) {
  const headers = [];
  if (plan.user && ctx.tokens[plan.user]) headers.push(['Authorization', `Bearer ${ctx.tokens[plan.user]}`]);
  if (plan.accept) headers.push(['Accept', plan.accept]);
  if (plan.kind === 'mcp') {
    for (const ct of plan.ct === null ? [] : Array.isArray(plan.ct) ? plan.ct : [plan.ct]) headers.push(['Content-Type', ct]);
    if (plan.coding) headers.push(['Content-Encoding', plan.coding]);
    headers.push(...sessionHeaders(plan.session, ctx));
  }
  headers.push(...plan.headers);
  return { method: plan.method, target: plan.target, headers, body: plan.body, chunked: plan.chunked };
}

// ---- the fixed list of known-hostile shapes --------------------------------------------

/** The fixed list: the hostile shapes, once per view (REST shapes for views with a route). */
function fixedCases() {
  const all = [];
  for (const view of VIEWS) {
    RT = retargeter(view);
    RT.tag = view.tool === GSS ? null : view.tool;
    try {
      all.push(...fixedCasesFor().filter((p) => view.rest || p.kind !== 'rest'));
    } finally {
      RT = (text) => text;
      RT.tag = null;
    }
  }
  return all.map((p, i) => ({ ...p, label: `f${i}` }));
}

/** The hostile shapes, written for `get_section_source` and rewritten by `RT`. */
function fixedCasesFor() {
  const L = [];
  const add = (p) => L.push(p);
  const ARGS = '{"path":"a.md"}';
  const envelope = (params, id = '1') => `{"jsonrpc":"2.0","id":${id},"method":"tools/call","params":${params}}`;

  // Controls: prove the pipeline is live (a call is forwarded and dispatched; the sidecar
  // answers its own surfaces).
  add(mcpPlan('control: tools/call search is forwarded and dispatched', render(call('search', { args: { query: 'x' } })), { control: 'dispatch:tools/call:search' }));
  add(mcpPlan('control: tools/list is forwarded and dispatched', '{"jsonrpc":"2.0","id":2,"method":"tools/list"}', { control: 'dispatch:tools/list' }));
  add(mcpPlan('control: plain get_section_source is answered by the sidecar', gssText(), { control: 'answered-mcp' }));
  add(restPlan('control: REST section-source answered by the sidecar', '/api/v1/section-source?path=a.md', { control: 'answered-rest' }));
  add(restPlan('control: another REST route passes through', '/api/v1/notes?x=1', { control: 'forwarded' }));

  // Resources (§6 ACL): the stand-in offers section sources as a resource template too,
  // as a gateway version could; the lists hide them, so no read may reach it. The WHATWG
  // URL parser the SDK matches with drops tab, LF and CR, trims C0 and spaces, lowercases
  // the scheme and resolves dot segments (`%2e` too).
  const read = (uri, id = '1') => `{"jsonrpc":"2.0","id":${id},"method":"resources/read","params":{"uri":${JSON.stringify(uri)}}}`;
  add(mcpPlan('control: an ordinary resource read is forwarded and dispatched', read('knowtation://hosted/vault/a.md'), { control: 'dispatch:resources/read' }));
  for (const [desc, uri] of [
    ['section-source resource read', 'knowtation://hosted/section-source/a.md'],
    ['section-source resource read, scheme in capitals', 'KNOWTATION://hosted/section-source/a.md'],
    ['section-source resource read, a tab in the name', 'knowtation://hosted/section-\\tsource/a.md'],
    ['section-source resource read, a tab splitting a word', 'knowtation://hosted/sec\\ttion-source/a.md'],
    ['section-source resource read, LF and CR in the name', 'knowtation://hosted/section\\n-\\rsource/a.md'],
    ['section-source resource read, leading space and C0', ' \\u0001knowtation://hosted/section-source/a.md'],
    ['section-source resource read, through a dot-dot segment', 'knowtation://hosted/vault/../section-source/a.md'],
    ['section-source resource read, through %2e%2e', 'knowtation://hosted/vault/%2e%2e/section-source/a.md'],
    ['section-source resource read, escaped hyphen', 'knowtation://hosted/section%2Dsource/a.md'],
  ]) {
    // The uris above are JSON string contents: their escapes are JSON's.
    add(mcpPlan(desc, `{"jsonrpc":"2.0","id":1,"method":"resources/read","params":{"uri":"${uri}"}}`));
  }
  add(mcpPlan('section-source resource read, \\u escapes in the JSON string', '{"jsonrpc":"2.0","id":1,"method":"resources/read","params":{"uri":"knowtation://hosted/section\\u002dsource/a.md"}}'));
  add(mcpPlan('section-source resource read as a notification', '{"jsonrpc":"2.0","method":"resources/read","params":{"uri":"knowtation://hosted/section-source/a.md"}}'));
  add(mcpPlan('section-source resource read in a batch', `[${read('knowtation://hosted/vault/a.md', '7')},${read('knowtation://hosted/section-source/a.md', '8')}]`));
  add(mcpPlan('section-source resource read, uri under __proto__', '{"jsonrpc":"2.0","id":1,"method":"resources/read","params":{"__proto__":{"uri":"knowtation://hosted/section-source/a.md"}}}'));
  // Task-augmented requests (`params.task`): the gateway declares no task support, so the
  // SDK refuses them before any handler runs; the sidecar must answer as it does. An
  // invalid `_meta` makes the whole message invalid (400).
  const gssWith = (extra) => `{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"get_section_source","arguments":{"path":"a.md"},${extra}}}`;
  for (const task of ['{"ttl":60000}', '{}', '{"x":1}', '{"ttl":-1.5}', '"str"', 'null', '5', '[]', '{"ttl":"x"}', '{"ttl":null}', '{"ttl":[1]}']) {
    add(mcpPlan(`get_section_source asking for a task ${task}`, gssWith(`"task":${task}`), { control: 'same-as-sdk' }));
  }
  add(mcpPlan('section-source resource read asking for a task', '{"jsonrpc":"2.0","id":3,"method":"resources/read","params":{"uri":"knowtation://hosted/section-source/a.md","task":{"ttl":1}}}', { control: 'same-as-sdk' }));
  for (const meta of ['5', 'null', '"m"', '[]', '{"progressToken":1.5}', '{"progressToken":null}', '{"progressToken":9007199254740992}', '{"io.modelcontextprotocol/related-task":{"taskId":1}}', '{"io.modelcontextprotocol/related-task":5}']) {
    add(mcpPlan(`get_section_source with _meta ${meta}`, gssWith(`"_meta":${meta}`), { control: 'same-as-sdk' }));
  }
  for (const meta of ['{}', '{"progressToken":"t"}', '{"progressToken":7}', '{"io.modelcontextprotocol/related-task":{"taskId":"t"},"other":1}']) {
    add(mcpPlan(`get_section_source with a valid _meta ${meta}`, gssWith(`"_meta":${meta}`), { control: 'answered-mcp' }));
  }
  add(mcpPlan('section-source resource read, repeated uri key', '{"jsonrpc":"2.0","id":1,"method":"resources/read","params":{"uri":"knowtation://hosted/vault/a.md","uri":"knowtation://hosted/section-source/a.md"}}'));

  // initialize without an id: the SDK opens a session for it and answers 202, without
  // the session id the sidecar learns sessions from.
  const INIT_PARAMS = '"params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"p","version":"1"}}';
  add(mcpPlan('initialize as a notification', `{"jsonrpc":"2.0","method":"initialize",${INIT_PARAMS}}`, { session: 'none' }));
  add(mcpPlan('initialize with a null id', `{"jsonrpc":"2.0","id":null,"method":"initialize",${INIT_PARAMS}}`, { session: 'none' }));
  add(mcpPlan('initialize as a notification in a batch', `[{"jsonrpc":"2.0","method":"initialize",${INIT_PARAMS}}]`, { session: 'none' }));

  // Bodies on other methods: only a POST body is read (§6).
  for (const method of ['GET', 'DELETE', 'PUT', 'PATCH']) {
    add(mcpPlan(`${method} /mcp with a tools/call body`, gssText(), { method, session: 'unknown' }));
  }
  add(mcpPlan('GET /MCP/ with a tools/call body', gssText(), { method: 'GET', target: '/MCP/', session: 'unknown' }));
  add(mcpPlan('GET /mcp with a chunked tools/call body', gssText(), { method: 'GET', session: 'unknown', chunked: true }));

  // Prototype keys.
  const proto = envelope(`{"__proto__":{"name":"get_section_source"},"arguments":${ARGS}}`);
  add(mcpPlan('__proto__ carries params.name', proto));
  add(mcpPlan('\\u005f_proto__ carries params.name', envelope(`{"\\u005f_proto__":{"name":"get_section_source"},"arguments":${ARGS}}`)));
  add(mcpPlan('__pr\\u006fto__ (escaped o) carries params.name', envelope(`{"__pr\\u006fto__":{"name":"get_section_source"},"arguments":${ARGS}}`)));
  add(mcpPlan('all-escaped __proto__ carries params.name', envelope(`{${str('__proto__', () => true)}:{"name":"get_section_source"},"arguments":${ARGS}}`)));
  add(mcpPlan('__proto__ carries name and arguments', envelope(`{"__proto__":{"name":"get_section_source","arguments":${ARGS}}}`)));
  add(mcpPlan('__proto__ name under an own decoy name', envelope(`{"name":"search","__proto__":{"name":"get_section_source"},"arguments":{"query":"x","path":"a.md"}}`)));
  add(mcpPlan('__proto__ after arguments', envelope(`{"arguments":${ARGS},"__proto__":{"name":"get_section_source"}}`)));
  add(mcpPlan('__proto__ nested twice', envelope(`{"__proto__":{"__proto__":{"name":"get_section_source"}},"arguments":${ARGS}}`)));
  add(mcpPlan('__proto__ nested twice, escaped inner', envelope(`{"__proto__":{"\\u005f_proto__":{"name":"get_section_source","arguments":${ARGS}}}}`)));
  add(mcpPlan('top-level __proto__ carries params', `{"jsonrpc":"2.0","id":1,"method":"tools/call","__proto__":{"params":{"name":"get_section_source","arguments":${ARGS}}}}`));
  add(mcpPlan('top-level __proto__ carries method and params', `{"jsonrpc":"2.0","id":1,"__proto__":{"method":"tools/call","params":{"name":"get_section_source","arguments":${ARGS}}}}`));
  add(mcpPlan('arguments.__proto__ carries path (named call)', envelope(`{"name":"get_section_source","arguments":{"__proto__":{"path":"a.md"}}}`)));
  add(mcpPlan('__proto__ call inside a batch', `[${proto}]`));
  add(mcpPlan('__proto__ call inside a batch after a search call', `[${render(call('search', { id: 7, args: { query: 'x' } }))},${proto.replace('"id":1', '"id":8')}]`));
  add(mcpPlan('__proto__ call inside a nested batch', `[[${proto}]]`));
  add(mcpPlan('__proto__ with a 1e400 number alongside', envelope(`{"__proto__":{"name":"get_section_source"},"arguments":{"path":"a.md","n":1e400}}`)));

  // Charsets (body-parser decodes any utf-* charset iconv-lite knows; the last charset
  // parameter wins; quoted strings hide parameters from naive parsers).
  const u7 = (ct, desc) => add(mcpPlan(desc, encodeText(gssText(), 'utf-7'), { ct }));
  u7('application/json; charset=utf-8; charset=utf-7', 'UTF-7 body, charset=utf-8 then charset=utf-7');
  u7('application/json; x="; charset=utf-8"; charset=utf-7', 'UTF-7 body, charset=utf-8 hidden in a quoted parameter');
  u7('application/json; charset=utf-7', 'UTF-7 body, charset=utf-7');
  u7('application/json; charset="utf-7"', 'UTF-7 body, charset="utf-7" (quoted)');
  u7('application/json;CHARSET=UTF-7', 'UTF-7 body, CHARSET=UTF-7');
  u7(['application/json; charset=utf-7', 'application/json'], 'UTF-7 body, two Content-Type headers (utf-7 first)');
  add(mcpPlan('UTF-8 body, two Content-Type headers (utf-7 last)', gssText(), { ct: ['application/json', 'application/json; charset=utf-7'] }));
  add(mcpPlan('UTF-7 with every letter encoded', encodeText(gssText(), 'utf-7', { force: (ch) => /[a-z_]/.test(ch) }), { ct: 'application/json; charset=utf-7' }));
  for (const [cs, bom, ct] of [
    ['utf-16le', true, 'application/json; charset=utf-16le'],
    ['utf-16le', false, 'application/json; charset=utf-16le'],
    ['utf-16be', true, 'application/json; charset=utf-16be'],
    ['utf-16be', false, 'application/json; charset=utf-16be'],
    ['utf-16le', true, 'application/json; charset=utf-16'],
    ['utf-16be', true, 'application/json; charset=utf-16'],
    ['utf-16le', false, 'application/json; charset=utf-16'],
    ['utf-16le', true, 'application/json; charset=ucs-2'],
    ['utf-16le', true, 'application/json'],
    ['utf-8', true, 'application/json'],
    ['utf-8', true, 'application/json; charset=utf-8'],
  ]) {
    add(mcpPlan(`${cs.toUpperCase()}${bom ? ' with BOM' : ' without BOM'} under ${ct}`, encodeText(gssText(), cs, { bom }), { ct }));
  }
  add(mcpPlan('UTF-16LE, the name made a __proto__ key', encodeText(proto, 'utf-16le', { bom: true }), { ct: 'application/json; charset=utf-16le' }));

  // Content-Encoding (body-parser inflates gzip and deflate, any case).
  for (const coding of ['gzip', 'deflate', 'GZIP', 'Deflate']) {
    add(mcpPlan(`Content-Encoding: ${coding}`, compress(Buffer.from(RT(gssText())), coding.toLowerCase()), { coding }));
  }
  add(mcpPlan('Content-Encoding: gzip of a UTF-7 body under charset=utf-7', compress(encodeText(gssText(), 'utf-7'), 'gzip'), { coding: 'gzip', ct: 'application/json; charset=utf-7' }));
  add(mcpPlan('Content-Encoding: gzip of a __proto__ call', compress(Buffer.from(RT(proto)), 'gzip'), { coding: 'gzip' }));
  add(mcpPlan('Content-Encoding: br', compress(Buffer.from(RT(gssText())), 'br'), { coding: 'br' }));
  add(mcpPlan('Content-Encoding: x-gzip', compress(Buffer.from(RT(gssText())), 'gzip'), { coding: 'x-gzip' }));
  add(mcpPlan('Content-Encoding: identity', gssText(), { coding: 'identity' }));
  add(mcpPlan('Transfer-Encoding: chunked', gssText(), { chunked: true }));
  add(mcpPlan('Transfer-Encoding: chunked + gzip', compress(Buffer.from(RT(gssText())), 'gzip'), { chunked: true, coding: 'gzip' }));

  // Duplicate keys (JavaScript keeps the last).
  add(mcpPlan('duplicate name: x then get_section_source', envelope(`{"name":"x","name":"get_section_source","arguments":${ARGS}}`)));
  add(mcpPlan('duplicate name: get_section_source then x', envelope(`{"name":"get_section_source","name":"x","arguments":${ARGS}}`)));
  add(mcpPlan('duplicate name: search then escaped get_section_source', envelope(`{"name":"search","\\u006eame":"get_section_source","arguments":{"query":"q","path":"a.md"}}`)));
  add(mcpPlan('duplicate method: ping then tools/call', `{"jsonrpc":"2.0","id":1,"method":"ping","method":"tools/call","params":{"name":"get_section_source","arguments":${ARGS}}}`));
  add(mcpPlan('duplicate method: tools/call then ping', `{"jsonrpc":"2.0","id":1,"method":"tools/call","method":"ping","params":{"name":"get_section_source","arguments":${ARGS}}}`));
  add(mcpPlan('duplicate params: search then get_section_source', `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"search","arguments":{"query":"q"}},"params":{"name":"get_section_source","arguments":${ARGS}}}`));
  add(mcpPlan('duplicate arguments', envelope(`{"name":"get_section_source","arguments":{"path":1},"arguments":${ARGS}}`)));

  // Escapes.
  add(mcpPlan('\\u0067et_section_source', envelope(`{"name":"\\u0067et_section_source","arguments":${ARGS}}`)));
  add(mcpPlan('get\\u005Fsection\\u005Fsource (upper hex)', envelope(`{"name":"get\\u005Fsection\\u005Fsource","arguments":${ARGS}}`)));
  add(mcpPlan('fully escaped name', envelope(`{"name":${str(GSS, () => true)},"arguments":${ARGS}}`)));
  add(mcpPlan('escaped method tools\\/call', `{"jsonrpc":"2.0","id":1,"method":"tools\\/call","params":{"name":"get_section_source","arguments":${ARGS}}}`));
  add(mcpPlan('escaped method tools\\u002fcall', `{"jsonrpc":"2.0","id":1,"method":"tools\\u002fcall","params":{"name":"get_section_source","arguments":${ARGS}}}`));
  add(mcpPlan('escaped key "n\\u0061me"', envelope(`{"n\\u0061me":"get_section_source","arguments":${ARGS}}`)));
  add(mcpPlan('escaped key "p\\u0061rams"', `{"jsonrpc":"2.0","id":1,"method":"tools/call","p\\u0061rams":{"name":"get_section_source","arguments":${ARGS}}}`));

  // Lookalike, cased and padded names and methods (the SDK looks tools up exactly).
  for (const name of ['Get_Section_Source', 'GET_SECTION_SOURCE', ' get_section_source', 'get_section_source ', 'get_section_source\u0000', 'get_section_source\n', '\ufeffget_section_source', 'get_section_source\u200b', 'ｇｅｔ＿ｓｅｃｔｉｏｎ＿ｓｏｕｒｃｅ', 'g\u0435t_section_source', 'get-section-source', 'get_section_source\ud800']) {
    add(mcpPlan(`lookalike name ${JSON.stringify(name)}`, envelope(`{"name":${str(name)},"arguments":${ARGS}}`)));
  }
  for (const method of ['tools/call ', 'TOOLS/CALL', 'Tools/Call', 'tools/call\u0000', ' tools/call', 'tools//call']) {
    add(mcpPlan(`lookalike method ${JSON.stringify(method)}`, `{"jsonrpc":"2.0","id":1,"method":${str(method)},"params":{"name":"get_section_source","arguments":${ARGS}}}`));
  }

  // Batches.
  const gss2 = gssText(2);
  const search3 = render(call('search', { id: 3, args: { query: 'q' } }));
  add(mcpPlan('batch [call]', `[${gssText()}]`));
  add(mcpPlan('batch [search, call]', `[${search3},${gss2}]`));
  add(mcpPlan('batch [notification, call]', `[{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":1,"progress":1}},${gss2}]`));
  add(mcpPlan('batch [call, call]', `[${gssText(1)},${gss2}]`));
  add(mcpPlan('batch [{}, call]', `[{},${gss2}]`));
  add(mcpPlan('nested batch [[call]]', `[[${gssText()}]]`));
  add(mcpPlan('nested batch [search, [call]]', `[${search3},[${gss2}]]`));
  add(mcpPlan('batch [initialize, call] without a session', `[{"jsonrpc":"2.0","id":9,"method":"initialize","params":{"protocolVersion":"${PROTOCOL_VERSION}","capabilities":{},"clientInfo":{"name":"p","version":"1"}}},${gss2}]`, { session: 'none' }));

  // Mcp-Method / Mcp-Name headers disagreeing with the body.
  add(mcpPlan('Mcp-Method: tools/list on a call', gssText(), { headers: [['Mcp-Method', 'tools/list']] }));
  add(mcpPlan('Mcp-Name: search on a get_section_source call', gssText(), { headers: [['Mcp-Method', 'tools/call'], ['Mcp-Name', 'search']] }));
  add(mcpPlan('Mcp-Name: get_section_source on a search call', render(call('search', { args: { query: 'x' } })), { headers: [['Mcp-Method', 'tools/call'], ['Mcp-Name', GSS]] }));
  add(mcpPlan('Mcp-Name: get_section_source on a __proto__ call', proto, { headers: [['Mcp-Method', 'tools/call'], ['Mcp-Name', GSS]] }));
  add(mcpPlan('Mcp-Method twice', gssText(), { headers: [['Mcp-Method', 'tools/list'], ['Mcp-Method', 'tools/call']] }));

  // Odd ids.
  for (const id of ['1.5', '1.0', '1e3', '-0', '0', '-1', '9007199254740991', '9007199254740993', '1e400', '-1e400', '"1"', '""', 'null', '{}', '[]', 'true', '1E2', '0.1e1']) {
    add(mcpPlan(`id ${id}`, render(call(GSS, { id: `raw:${id}` }))));
  }
  add(mcpPlan('id 1e400 on a __proto__ call', envelope(`{"__proto__":{"name":"get_section_source"},"arguments":${ARGS}}`, '1e400')));

  // Numbers like 1e400 elsewhere.
  add(mcpPlan('1e400 in arguments', envelope(`{"name":"get_section_source","arguments":{"path":"a.md","n":1e400}}`)));
  add(mcpPlan('1e400 in _meta', envelope(`{"name":"get_section_source","arguments":${ARGS},"_meta":{"progressToken":1e400}}`)));
  add(mcpPlan('-1e400 in params', envelope(`{"name":"get_section_source","arguments":${ARGS},"x":-1e400}`)));
  add(mcpPlan('1e400 in a search call', envelope(`{"name":"search","arguments":{"query":"q","n":1e400}}`)));

  // Session id variants.
  for (const s of ['none', 'unknown', 'b', 'repeated', 'repeated-unknown-first', 'repeated-own-first', 'listed', 'padded', 'upper', 'lower-name', 'empty']) {
    add(mcpPlan(`session ${s}`, gssText(), { session: s }));
    add(mcpPlan(`session ${s}, __proto__ call`, proto, { session: s }));
  }
  add(mcpPlan('user b presenting user a\'s session', gssText(), { user: 'b', session: 'a' }));

  // Paths the gateway routes to its /mcp router.
  for (const target of ['/MCP', '/mcp/', '/Mcp/', '/mcp?x=1', '/mcp/?', '/.netlify/functions/gateway/mcp', '/.netlify/functions/gateway/MCP/', '/mcp#frag', `http://${HOST}/mcp`, '/mcp%2f', '//mcp', '/%6dcp', '/mcp;x', '/mcp/x',
    // What a decoding hop (nginx with a URI in proxy_pass) turns into the mount.
    '/mcp%2F', '/x%2F..%2Fmcp', '/.netlify/functions/gateway%2Fmcp', '/mcp%252F', '/mcp%5C', '/mcp%23x', '/mcp%20',
    // Decoded into `//user@host/mcp#`, which url.parse (Express's fallback for a path
    // holding `#` or whitespace) reads as an authority and the path `/mcp`.
    '/%2Fa@b/mcp%23', '/%5Cu:p@h%5Cmcp%20', '/.netlify/functions/gateway%2F%2Fa@b/mcp%23']) {
    add(mcpPlan(`POST ${target}`, gssText(), { target }));
    add(mcpPlan(`POST ${target}, __proto__ call`, proto, { target }));
  }

  // Headers the SDK checks.
  add(mcpPlan('Accept: */*', gssText(), { accept: '*/*' }));
  add(mcpPlan('no Accept', gssText(), { accept: null }));
  add(mcpPlan('Content-Type: text/plain', gssText(), { ct: 'text/plain' }));
  add(mcpPlan('Content-Type: text/plain; x=application/json', gssText(), { ct: 'text/plain; x=application/json' }));
  add(mcpPlan('no Content-Type', gssText(), { ct: null }));
  add(mcpPlan('Content-Type: APPLICATION/JSON', gssText(), { ct: 'APPLICATION/JSON' }));
  add(mcpPlan('Content-Type: application/json;charset=utf-8', gssText(), { ct: 'application/json;charset=utf-8' }));
  add(mcpPlan('MCP-Protocol-Version: 1999-01-01', gssText(), { headers: [['MCP-Protocol-Version', '1999-01-01']] }));
  add(mcpPlan('JSON with spaces and newlines', render(call(GSS), () => ' \n\t')));
  add(mcpPlan('deeply nested argument (200)', envelope(`{"name":"get_section_source","arguments":{"path":"a.md","d":${'['.repeat(200)}${']'.repeat(200)}}}`)));
  add(mcpPlan('deeply nested argument (200) in a __proto__ call', envelope(`{"__proto__":{"name":"get_section_source"},"arguments":{"path":"a.md","d":${'['.repeat(200)}${']'.repeat(200)}}}`)));

  // REST route variants (GET and HEAD).
  const rest = [
    '/api/v1/section-source?path=a.md',
    '/API/V1/SECTION-SOURCE?path=a.md',
    '/Api/V1/Section-Source?path=a.md',
    '/api/v1/section-source/?path=a.md',
    '/api/v1/section-source//?path=a.md',
    '//api/v1/section-source?path=a.md',
    '/api//v1/section-source?path=a.md',
    '/api/v1/section-source%2F?path=a.md',
    '/api/v1%2Fsection-source?path=a.md',
    '/%61pi/v1/section-source?path=a.md',
    '/api/v1/section%2Dsource?path=a.md',
    '/api/v1/%73ection-source?path=a.md',
    '/api/v1/./section-source?path=a.md',
    '/api/v1/x/../section-source?path=a.md',
    '/api/v1/section-source/.?path=a.md',
    '/.netlify/functions/gateway/api/v1/section-source?path=a.md',
    '/.netlify/functions/gateway/.netlify/functions/gateway/api/v1/section-source?path=a.md',
    '/.NETLIFY/functions/gateway/api/v1/section-source?path=a.md',
    '/.netlify/functions/gateway//api/v1/section-source?path=a.md',
    '/api/v1/section-source;x=1?path=a.md',
    '/api/v1/section-source?path=a.md&path=b.md',
    '/api/v1/section-source?%70ath=a.md',
    '/api/v1/section-source?path[]=a.md',
    '/api/v1/section-source',
    '/api/v1/section-source?',
    '/api/v1/section-source#x',
    '/api/v1/section-source?path=a.md#x',
    `http://${HOST}/api/v1/section-source?path=a.md`,
    '/api/v1/section-source%20?path=a.md',
    // What a decoding hop (nginx with a URI in proxy_pass) turns into the route.
    '/api/v1/x%2F..%2Fsection-source?path=a.md',
    '/api%2Fv1%2Fsection-source?path=a.md',
    '/.netlify/functions/gateway%2Fapi%2Fv1%2Fsection-source?path=a.md',
    '/api/v1%252Fsection-source?path=a.md',
    '/api%5Cv1%5Csection-source?path=a.md',
    '/api/v1/section-source%23x?path=a.md',
    // Decoded into `//user@host/api/v1/section-source?path=a.md#`, routed as the REST
    // route by url.parse.
    '/%2Fa@b/api/v1/section-source%3Fpath=a.md%23',
    '/%5Ca@b/api/v1/section-source%3Fpath=a.md%23',
    '/%2F%20a@b/api/v1/section-source%23?path=a.md',
  ];
  for (const t of rest) {
    add(restPlan(`GET ${t}`, t));
    add(restPlan(`HEAD ${t}`, t, { method: 'HEAD' }));
  }
  add(restPlan('GET section-source without a token', '/api/v1/section-source?path=a.md', { user: null }));

  return L;
}

// ---- the seeded generator --------------------------------------------------------------

const LOOKALIKE_NAME = [
  (s, r) => s.replace(/[a-z]/g, (c) => (r.chance(0.3) ? c.toUpperCase() : c)),
  (s) => s.toUpperCase(),
  (s, r) => `${r.pick([' ', '\t', '\u0000', '\u200b', '\u00a0', '\ufeff', '\n'])}${s}`,
  (s, r) => `${s}${r.pick([' ', '\t', '\u0000', '\u200b', '\u00a0', '\ufeff', '\n', '\ud800', '/'])}`,
  (s, r) => s.replace(/[a-z_]/g, (c) => (r.chance(0.3) ? String.fromCharCode(c.charCodeAt(0) + 0xfee0) : c)),
  (s) => s.replace('e', '\u0435'),
  (s) => s.replace(/_/g, '-'),
  (s) => s.slice(0, -1),
  (s) => `${s}s`,
];
const LOOKALIKE_METHOD = ['tools/call ', ' tools/call', 'TOOLS/CALL', 'Tools/Call', 'tools/call\u0000', 'tools//call', 'tools\\call', 'tools/call/', 'tools/Call'];
const IDS = ['1', '2', '0', '-0', '1.0', '1.5', '1e3', '1e400', '-1e400', '9007199254740993', '"x"', '"1"', '""', 'null', '{}', '[]', 'true', '1E2', '123456789012345678901234567890'];
const CONTENT_TYPES = [
  // [weight, header value(s), charset body-parser uses]
  [60, 'application/json', 'utf-8'],
  [4, 'application/json; charset=utf-8', 'utf-8'],
  [2, 'application/json;charset=UTF-8', 'utf-8'],
  [2, 'APPLICATION/JSON', 'utf-8'],
  [4, 'application/json; charset=utf-7', 'utf-7'],
  [4, 'application/json; charset=utf-8; charset=utf-7', 'utf-7'],
  [4, 'application/json; x="; charset=utf-8"; charset=utf-7', 'utf-7'],
  [2, 'application/json; charset="utf-7"', 'utf-7'],
  [2, ['application/json; charset=utf-7', 'application/json'], 'utf-7'],
  [2, ['application/json', 'application/json; charset=utf-7'], 'utf-8'],
  [3, 'application/json; charset=utf-16le', 'utf-16le'],
  [3, 'application/json; charset=utf-16be', 'utf-16be'],
  [2, 'application/json; charset=utf-16', 'utf-16'],
  [1, 'text/plain', 'none'],
  [1, 'text/plain; x=application/json', 'none'],
  [1, null, 'none'],
];
const CODINGS = [[80, null], [6, 'gzip'], [6, 'deflate'], [2, 'GZIP'], [2, 'br'], [2, 'x-gzip'], [2, 'identity']];
const SESSIONS = [[80, 'a'], [3, 'none'], [3, 'unknown'], [3, 'b'], [2, 'repeated'], [2, 'repeated-unknown-first'], [2, 'listed'], [2, 'padded'], [1, 'upper'], [1, 'empty'], [1, 'repeated-own-first']];
const MCP_TARGETS = [[85, '/mcp'], [3, '/MCP'], [3, '/mcp/'], [2, '/.netlify/functions/gateway/mcp'], [2, '/.netlify/functions/gateway/Mcp/'], [2, '/mcp?x=1'], [1, `http://${HOST}/mcp`], [1, '//mcp'], [1, '/mcp;x']];

function genName(r) {
  const base = r.weighted([[50, GSS], [12, 'get_note_outline'], [10, 'get_document_tree'], [15, 'search'], [13, 'get_note']]);
  if (VIEW_TOOLS.includes(base) && r.chance(0.15)) return r.pick(LOOKALIKE_NAME)(base, r);
  return base;
}

function keyLit(r, key, escProb = 0.15) {
  if (!r.chance(escProb)) return str(key);
  const p = r.next();
  return str(key, () => r.chance(p), r.chance(0.5));
}

function valLit(r, value, escProb = 0.15) {
  if (typeof value !== 'string' || !r.chance(escProb)) return R(str(value));
  const p = r.next();
  return R(str(value, () => r.chance(p), r.chance(0.5)));
}

/** Wraps `entries` (the fields to hide) in __proto__ objects, depth 1–3. */
function protoWrap(r, entries) {
  let node = O(...entries);
  const depth = r.weighted([[75, 1], [18, 2], [7, 3]]);
  for (let d = 1; d < depth; d += 1) node = O([keyLit(r, '__proto__', 0.3), node]);
  return [keyLit(r, '__proto__', 0.3), node];
}

function shuffle(r, arr) {
  for (let i = arr.length - 1; i > 0; i -= 1) {
    const j = Math.floor(r.next() * (i + 1));
    [arr[i], arr[j]] = [arr[j], arr[i]];
  }
  return arr;
}

/** One JSON-RPC message (as a node) and a description of what was done to it. */
function genMessage(r, idText) {
  const notes = [];
  const kind = r.weighted([[62, 'call'], [8, 'tools/list'], [8, 'notification'], [5, 'ping'], [3, 'initialize'], [4, 'response'], [10, 'odd-method']]);
  const idEntry = [keyLit(r, 'id'), R(idText)];
  const jsonrpc = [keyLit(r, 'jsonrpc'), valLit(r, '2.0', 0.05)];
  if (kind === 'tools/list') return { node: O(jsonrpc, idEntry, [keyLit(r, 'method'), valLit(r, 'tools/list')]), notes: ['tools/list'] };
  if (kind === 'ping') return { node: O(jsonrpc, idEntry, [keyLit(r, 'method'), V('ping')]), notes: ['ping'] };
  if (kind === 'notification') return { node: O(jsonrpc, [keyLit(r, 'method'), valLit(r, 'notifications/initialized')]), notes: ['notification'] };
  if (kind === 'response') return { node: O(jsonrpc, idEntry, [K('result'), V({})]), notes: ['response'] };
  if (kind === 'initialize') {
    return {
      node: O(jsonrpc, idEntry, [keyLit(r, 'method'), V('initialize')], [K('params'), V({ protocolVersion: PROTOCOL_VERSION, capabilities: {}, clientInfo: { name: 'parity', version: '1' } })]),
      notes: ['initialize'],
    };
  }
  // tools/call (or a lookalike method)
  const method = kind === 'odd-method' ? r.pick(LOOKALIKE_METHOD) : 'tools/call';
  if (kind === 'odd-method') notes.push(`method ${JSON.stringify(method)}`);
  const name = genName(r);
  notes.push(`name ${JSON.stringify(name)}`);
  const argsValue = name === 'search' ? { query: 'q', path: 'a.md' } : { path: 'a.md' };
  let argsNode = V(argsValue);
  if (r.chance(0.08)) {
    argsNode = O([K('path'), V('a.md')], [K('n'), R(r.pick(['1e400', '-1e400', '1e-400', '1.7976931348623157e309']))]);
    notes.push('huge number in arguments');
  }
  if (r.chance(0.06)) {
    argsNode = O(protoWrap(r, [[K('path'), V('a.md')]]));
    notes.push('arguments.__proto__');
  }
  let nameEntries = [[keyLit(r, 'name'), valLit(r, name)]];
  if (r.chance(0.12)) {
    const decoy = r.pick(['search', 'x', 'get_note', ...VIEW_TOOLS]);
    nameEntries = r.chance(0.5) ? [[keyLit(r, 'name'), V(decoy)], ...nameEntries] : [...nameEntries, [keyLit(r, 'name'), V(decoy)]];
    notes.push(`duplicate name with ${decoy}`);
  }
  let paramsEntries;
  const protoMode = r.weighted([[70, 'none'], [14, 'name'], [8, 'name+args'], [4, 'decoy'], [4, 'params']]);
  if (protoMode === 'name') paramsEntries = [protoWrap(r, nameEntries), [keyLit(r, 'arguments'), argsNode]];
  else if (protoMode === 'name+args') paramsEntries = [protoWrap(r, [...nameEntries, [keyLit(r, 'arguments'), argsNode]])];
  else if (protoMode === 'decoy') paramsEntries = [[K('name'), V('search')], protoWrap(r, nameEntries), [keyLit(r, 'arguments'), V({ query: 'q', path: 'a.md' })]];
  else paramsEntries = [...nameEntries, [keyLit(r, 'arguments'), argsNode]];
  if (protoMode !== 'none') notes.push(`__proto__ (${protoMode})`);
  if (r.chance(0.06)) {
    paramsEntries.push([K('_meta'), O([K('progressToken'), R(r.pick(['1e400', '7', '"t"']))])]);
    notes.push('_meta');
  }
  if (r.chance(0.5)) shuffle(r, paramsEntries);
  const paramsNode = O(...paramsEntries);
  const entries = [jsonrpc, idEntry, [keyLit(r, 'method'), valLit(r, method)]];
  if (protoMode === 'params') {
    entries.push(protoWrap(r, [[keyLit(r, 'params'), paramsNode]]));
  } else if (r.chance(0.05)) {
    entries.push([K('params'), O([K('name'), V('search')], [K('arguments'), V({ query: 'q' })])], [keyLit(r, 'params'), paramsNode]);
    notes.push('duplicate params');
  } else {
    entries.push([keyLit(r, 'params'), paramsNode]);
  }
  if (r.chance(0.04)) {
    entries.splice(1, 0, [K('method'), V('ping')]);
    notes.push('duplicate method (ping first)');
  }
  if (r.chance(0.4)) shuffle(r, entries);
  return { node: O(...entries), notes };
}

function genMcp(r) {
  const notes = [];
  let nextId = 1;
  const idText = () => {
    if (r.chance(0.15)) {
      const id = r.pick(IDS);
      notes.push(`id ${id}`);
      return id;
    }
    return String(nextId++);
  };
  const main = genMessage(r, idText());
  notes.push(...main.notes);
  let node = main.node;
  if (r.chance(0.2)) {
    const items = [node];
    const extra = r.int(0, 3);
    for (let i = 0; i < extra; i += 1) items.push(genMessage(r, String(100 + i)).node);
    shuffle(r, items);
    node = A(...items);
    notes.push(`batch of ${items.length}`);
    if (r.chance(0.2)) {
      node = A(node);
      notes.push('nested');
    }
  }
  const spacing = r.chance(0.15) ? () => r.pick(['', ' ', '\n', '\t', '\r\n', '  ']) : () => '';
  let text = render(node, spacing);
  const [, ct, charset] = r.weighted(CONTENT_TYPES.map((e) => [e[0], e]));
  const bom = r.chance(0.08);
  let body;
  if (charset === 'utf-7') {
    const p = r.next();
    body = encodeText(text, 'utf-7', { force: (ch) => ch === '_' || (/[a-z]/.test(ch) && r.chance(p * 0.3)) });
  } else if (charset === 'utf-16') {
    body = encodeText(text, r.chance(0.5) ? 'utf-16le' : 'utf-16be', { bom: true });
  } else if (charset === 'none') {
    body = encodeText(text, 'utf-8', { bom });
  } else {
    body = encodeText(text, charset, { bom });
  }
  if (ct !== 'application/json') notes.push(`CT ${JSON.stringify(ct)}`);
  if (bom && charset !== 'utf-7' && charset !== 'utf-16') notes.push('BOM');
  const coding = r.weighted(CODINGS);
  if (coding) {
    body = compress(body, coding.toLowerCase() === 'x-gzip' ? 'gzip' : coding.toLowerCase());
    notes.push(`CE ${coding}`);
  }
  const chunked = r.chance(0.08);
  if (chunked) notes.push('chunked');
  const session = r.weighted(SESSIONS);
  if (session !== 'a') notes.push(`session ${session}`);
  const target = r.weighted(MCP_TARGETS);
  if (target !== '/mcp') notes.push(`POST ${target}`);
  const headers = [];
  if (r.chance(0.1)) {
    const m = r.pick(['tools/call', 'tools/list', 'TOOLS/CALL', 'ping']);
    headers.push(['Mcp-Method', m]);
    let h = `Mcp-Method ${m}`;
    if (r.chance(0.7)) {
      const n = r.pick([...VIEW_TOOLS, 'search', 'Get_Section_Source', 'Get_Note_Outline', 'x']);
      headers.push(['Mcp-Name', n]);
      h += ` Mcp-Name ${n}`;
    }
    notes.push(h);
  }
  if (r.chance(0.08)) {
    const v = r.pick([PROTOCOL_VERSION, '2025-03-26', '1999-01-01', '']);
    headers.push(['MCP-Protocol-Version', v]);
    notes.push(`MCP-Protocol-Version ${JSON.stringify(v)}`);
  }
  const accept = r.chance(0.04) ? r.pick(['*/*', 'application/json', 'text/event-stream, application/json', 'application/json;q=0, text/event-stream;q=0']) : ACCEPT;
  if (accept !== ACCEPT) notes.push(`Accept ${accept}`);
  const user = r.chance(0.03) ? 'b' : 'a';
  if (user === 'b') notes.push('as user b');
  return { ...mcpPlan(notes.join(', '), body, { ct, coding, chunked, session, target, headers, accept, user }) };
}

function genRest(r) {
  const notes = [];
  const segs = ['api', 'v1', r.pick(['section-source', 'note-outline'])].map((seg) => {
    let out = '';
    const flip = r.chance(0.3);
    const pct = r.chance(0.25);
    for (const ch of seg) {
      let c = flip && r.chance(0.4) ? ch.toUpperCase() : ch;
      if (pct && r.chance(0.3)) {
        const hex = c.charCodeAt(0).toString(16);
        c = `%${r.chance(0.5) ? hex.toUpperCase() : hex}`;
      }
      out += c;
    }
    return out;
  });
  let path = '';
  for (const seg of segs) {
    const sep = r.weighted([[90, '/'], [4, '//'], [3, '/./'], [3, '/x/../']]);
    path += sep + seg;
  }
  if (r.chance(0.2)) path += r.pick(['/', '//', '/.', ';x=1', '%2F', '%20', '.']);
  const prefixes = r.weighted([[75, 0], [18, 1], [7, 2]]);
  for (let i = 0; i < prefixes; i += 1) path = (r.chance(0.1) ? '/.netlify/functions/Gateway' : '/.netlify/functions/gateway') + path;
  if (r.chance(0.04)) path = `http://${HOST}${path}`;
  const query = r.weighted([[70, '?path=a.md'], [5, ''], [5, '?'], [5, '?%70ath=a.md'], [5, '?path=a.md&path=b.md'], [5, '?path[]=a.md'], [5, '?path=a.md#x']]);
  path += query;
  const method = r.chance(0.3) ? 'HEAD' : 'GET';
  const user = r.chance(0.05) ? null : 'a';
  notes.push(`${method} ${path}`);
  if (!user) notes.push('no token');
  return restPlan(notes.join(', '), path, { method, user });
}

function generatedCase(seed, index) {
  const r = caseRng(seed, index);
  const plan = r.chance(0.85) ? genMcp(r) : genRest(r);
  return { ...plan, label: `g${index}` };
}

// ---- what the sidecar classified, read from the bytes it forwarded ---------------------

function classifyOne(m) {
  if (!m || typeof m !== 'object' || Array.isArray(m)) return { method: undefined, name: undefined };
  const method = hasOwn(m, 'method') ? m.method : undefined;
  let name;
  if (hasOwn(m, 'params') && m.params && typeof m.params === 'object' && !Array.isArray(m.params) && hasOwn(m.params, 'name')) {
    name = m.params.name;
  }
  return { method, name };
}

function hasProtoKey(v) {
  if (!v || typeof v !== 'object') return false;
  if (Array.isArray(v)) return v.some(hasProtoKey);
  for (const k of Object.keys(v)) {
    if (k === '__proto__') return true;
    if (hasProtoKey(v[k])) return true;
  }
  return false;
}

/** The first whitespace byte outside a string, or -1. */
function looseWhitespace(text) {
  let inString = false;
  for (let i = 0; i < text.length; i += 1) {
    const c = text[i];
    if (inString) {
      if (c === '\\') i += 1;
      else if (c === '"') inString = false;
    } else if (c === '"') inString = true;
    else if (c === ' ' || c === '\t' || c === '\n' || c === '\r') return i;
  }
  return -1;
}

const utf8Strict = new TextDecoder('utf-8', { fatal: true, ignoreBOM: true });

/** Checks the gateway-side records of one case; returns problem strings. */
function checkRecords(recs) {
  const problems = [];
  for (const rec of recs) {
    if (rec.overlap) problems.push('two requests were in the stand-in at once (records may be misattributed)');
    const forwardedMcpPost = rec.mcp && rec.method === 'POST';
    // Only a POST body is read and re-serialized by the sidecar (§6): any other body on
    // the MCP router is bytes nobody classified.
    if (rec.mcpRoute && rec.method !== 'POST' && rec.body && rec.body.length) {
      problems.push(`a ${rec.method} body the sidecar never read reached the MCP router (${short(rec.target, 60)})`);
    }
    if (!forwardedMcpPost) {
      if (rec.dispatched.length) problems.push(`SDK dispatched ${rec.dispatched.length} message(s) for ${rec.method} ${short(rec.target, 60)}`);
      continue;
    }
    const where = `forwarded POST ${short(rec.target, 60)}`;
    const ctValues = [];
    for (let i = 0; i < rec.rawHeaders.length; i += 2) {
      if (rec.rawHeaders[i].toLowerCase() === 'content-type') ctValues.push(rec.rawHeaders[i + 1]);
    }
    if (ctValues.length !== 1 || ctValues[0] !== 'application/json') problems.push(`${where}: Content-Type ${short(JSON.stringify(ctValues), 80)}, not exactly application/json`);
    if (hasOwn(rec.headers, 'content-encoding')) problems.push(`${where}: Content-Encoding ${short(rec.headers['content-encoding'], 40)} forwarded`);
    const body = rec.body;
    if (!body) {
      problems.push(`${where}: no body reached the stand-in (${rec.error ? short(rec.error, 60) : 'unread'})`);
      continue;
    }
    let text = null;
    if (body.length >= 3 && body[0] === 0xef && body[1] === 0xbb && body[2] === 0xbf) problems.push(`${where}: body starts with a UTF-8 BOM`);
    try {
      text = utf8Strict.decode(body);
    } catch {
      problems.push(`${where}: body is not valid UTF-8`);
    }
    let parsed;
    let parsedOk = false;
    if (text !== null) {
      const ws = looseWhitespace(text);
      if (ws >= 0) problems.push(`${where}: body is not compact (whitespace at byte ${ws})`);
      try {
        parsed = JSON.parse(text);
        parsedOk = true;
      } catch (e) {
        problems.push(`${where}: body is not JSON (${short(e.message, 60)})`);
      }
    }
    if (parsedOk && hasProtoKey(parsed)) problems.push(`${where}: body holds a __proto__ key`);
    const d = rec.dispatched;
    if (!d.length) continue;
    if (!parsedOk) {
      problems.push(`${where}: SDK dispatched ${d.length} message(s) from a body that is not strict JSON`);
      continue;
    }
    const cls = Array.isArray(parsed) ? parsed.map(classifyOne) : [classifyOne(parsed)];
    if (d.length !== cls.length) {
      problems.push(`${where}: SDK dispatched ${d.length} message(s), the forwarded body holds ${cls.length}`);
      continue;
    }
    d.forEach((e, i) => {
      const c = cls[i];
      if (e.kind === 'notification' && e.method === 'initialize') {
        problems.push(`${where}: message ${i}: the SDK opened a session for an initialize notification, answered without its id`);
      }
      if (e.method !== c.method) {
        problems.push(`${where}: message ${i}: SDK dispatched method ${short(JSON.stringify(e.method), 40)}, classified ${short(JSON.stringify(c.method), 40)}`);
      } else if (e.method === 'tools/call' && e.toolName !== undefined && e.toolName !== c.name) {
        problems.push(`${where}: message ${i}: SDK dispatched tool ${short(JSON.stringify(e.toolName), 40)}, classified ${short(JSON.stringify(c.name), 40)}`);
      }
    });
  }
  return problems;
}

// ---- running ---------------------------------------------------------------------------

async function settle(standin) {
  await tick();
  for (let i = 0; i < 100 && standin.state.requests.some((r) => r.status === null); i += 1) await sleep(2);
  await tick();
}

const INIT_BODY = JSON.stringify({
  jsonrpc: '2.0',
  id: 0,
  method: 'initialize',
  params: { protocolVersion: PROTOCOL_VERSION, capabilities: {}, clientInfo: { name: 'parity-suite', version: '1.0.0' } },
});

async function initSession(port, tok) {
  const base = [['Authorization', `Bearer ${tok}`], ['Accept', ACCEPT], ['Content-Type', 'application/json']];
  const res = await send(port, { method: 'POST', target: '/mcp', headers: base, body: Buffer.from(INIT_BODY) });
  const sid = res.headers['mcp-session-id'];
  if (res.status !== 200 || !sid) throw new Error(`initialize failed: status ${res.status} ${short(res.body.toString('utf8'), 200)}`);
  const note = await send(port, {
    method: 'POST',
    target: '/mcp',
    headers: [...base, ['Mcp-Session-Id', sid], ['MCP-Protocol-Version', PROTOCOL_VERSION]],
    body: Buffer.from('{"jsonrpc":"2.0","method":"notifications/initialized"}'),
  });
  if (note.status !== 202) throw new Error(`notifications/initialized failed: status ${note.status}`);
  return sid;
}

function makeRunner(standin, port) {
  const ctx = { tokens: { a: token(SUB_A), b: token(SUB_B), c: token(SUB_C), d: token(SUB_D) }, sessions: { a: null, b: null } };
  return {
    ctx,
    async ensureSessions() {
      if (!ctx.sessions.a || standin.sessionOwner(ctx.sessions.a) !== SUB_A) ctx.sessions.a = await initSession(port, ctx.tokens.a);
      if (!ctx.sessions.b || standin.sessionOwner(ctx.sessions.b) !== SUB_B) ctx.sessions.b = await initSession(port, ctx.tokens.b);
      await settle(standin);
      standin.takeRequests();
    },
    async run(plan) {
      if (plan.kind === 'mcp') await this.ensureSessions();
      standin.takeRequests();
      const before = { ...standin.state.counters };
      const canisterBefore = standin.state.canisterHits;
      const req = materialize(plan, ctx);
      const res = await send(port, req);
      await settle(standin);
      const recs = standin.takeRequests();
      const after = standin.state.counters;
      return { req, res, recs, toolRuns: after.tool - before.tool, restRuns: after.rest - before.rest, resourceRuns: after.resource - before.resource, canisterHits: standin.state.canisterHits - canisterBefore };
    },
  };
}

function controlProblems(plan, out) {
  const p = [];
  const body = out.res.body.toString('utf8');
  switch (plan.control) {
    case 'dispatch:tools/call:search': {
      const d = out.recs.flatMap((r) => r.dispatched);
      if (out.res.status !== 200 || d.length !== 1 || d[0].method !== 'tools/call' || d[0].toolName !== 'search') {
        p.push(`control failed: status ${out.res.status}, dispatched ${short(JSON.stringify(d.map((e) => [e.method, e.toolName])), 80)}`);
      }
      break;
    }
    case 'dispatch:resources/read': {
      const d = out.recs.flatMap((r) => r.dispatched);
      const msgs = sseMessages(out.res.body);
      if (out.res.status !== 200 || d.length !== 1 || d[0].method !== 'resources/read' || !msgs.some((m) => m.result?.contents)) {
        p.push(`control failed: status ${out.res.status}, dispatched ${d.length}, ${short(body, 100)}`);
      }
      break;
    }
    case 'dispatch:tools/list': {
      const d = out.recs.flatMap((r) => r.dispatched);
      if (out.res.status !== 200 || d.length !== 1 || d[0].method !== 'tools/list') p.push(`control failed: status ${out.res.status}, dispatched ${d.length}`);
      break;
    }
    case 'answered-mcp': {
      const msgs = sseMessages(out.res.body);
      if (out.res.status !== 200 || out.recs.length || !msgs.some((m) => m.result)) p.push(`control failed: status ${out.res.status}, forwarded ${out.recs.length}, ${short(body, 100)}`);
      break;
    }
    case 'same-as-sdk': {
      // Answered by the sidecar exactly as the SDK answered the same bytes directly.
      const ref = out.reference;
      const messages = (r) => (String(r.headers['content-type'] || '').includes('text/event-stream') ? sseMessages(r.body) : [r.body.toString('utf8')]);
      const got = JSON.stringify(messages(out.res));
      const want = ref ? JSON.stringify(messages(ref.res)) : '(no reference)';
      if (out.recs.length || !ref || out.res.status !== ref.res.status || got !== want) {
        p.push(`not the SDK's answer: status ${out.res.status} (SDK ${ref?.res.status}), forwarded ${out.recs.length}, ${short(got, 200)} vs ${short(want, 200)}`);
      }
      break;
    }
    case 'answered-rest':
      if (out.res.status !== 200 || out.recs.length || !body.startsWith('{"schema":"knowtation.')) p.push(`control failed: status ${out.res.status}, forwarded ${out.recs.length}, ${short(body, 100)}`);
      break;
    case 'forwarded':
      if (out.recs.length !== 1) p.push(`control failed: ${out.recs.length} request(s) reached the stand-in`);
      break;
    default:
  }
  return p;
}

function caseProblems(plan, out) {
  const problems = [];
  if (out.res.error) problems.push(`no complete answer from the sidecar (${out.res.error})`);
  if (out.toolRuns) problems.push(`a view's tool ran in the stand-in (${out.toolRuns}x)`);
  if (out.restRuns) problems.push(`a view's REST route ran in the stand-in (${out.restRuns}x)`);
  if (out.resourceRuns) problems.push(`a view's resource was read in the stand-in (${out.resourceRuns}x)`);
  if (out.res.body.includes(CANARY)) problems.push('the answer carries the note body canary');
  problems.push(...checkRecords(out.recs));
  if (plan.control) problems.push(...controlProblems(plan, out));
  return problems;
}

function tally(stats, out) {
  const k = out.res.error ? 'none' : String(out.res.status);
  stats.status[k] = (stats.status[k] || 0) + 1;
  if (out.recs.length) stats.forwarded += 1;
  const d = out.recs.flatMap((r) => r.dispatched);
  if (d.length) stats.dispatched += 1;
  if (d.some((e) => e.method === 'tools/call' && e.toolName !== undefined)) stats.toolCalls += 1;
}

function describeExchange(out) {
  const lines = [];
  const body = out.req.body ? out.req.body : Buffer.alloc(0);
  lines.push(`    > ${out.req.method} ${short(out.req.target, 100)} ${short(JSON.stringify(out.req.headers.filter(([k]) => k !== 'Authorization')), 200)}`);
  if (body.length) lines.push(`    > body ${short(body.toString('latin1'), 220)}`);
  lines.push(`    < ${out.res.status} ${short(out.res.body.toString('utf8'), 200)}`);
  for (const rec of out.recs) {
    lines.push(`    gateway saw ${rec.method} ${short(rec.target, 80)} ${rec.body ? short(rec.body.toString('latin1'), 160) : ''} -> ${rec.status}; dispatched ${short(JSON.stringify(rec.dispatched.map((e) => [e.method, e.toolName])), 120)}`);
  }
  return lines;
}

// ---- sessions the sidecar and the gateway agree on (§6) -----------------------------------
//
// The stand-in keeps sessions by the gateway's rules (standin.mjs): a POST on an id that is
// not a live session of its caller evicts the caller's least recently active session at
// the cap and gets the SDK's 400 `Server not initialized`. Through the sidecar a session
// must be alive at both or at neither:
//   - a call on an id its caller does not hold never reaches the stand-in's MCP router and
//     is answered 404 `Session not found` (DELETE: the gateway's 200 `{"ok":true}`);
//   - after 9 initializes of one user the session the stand-in evicted is 404 for every
//     call, `get_section_source` included, and the 8 others work, although the sidecar's
//     own answers made its order of use differ from the stand-in's;
//   - after a stand-in restart every old session is 404 for every call once it has made
//     one forwarded call, and initializing again works.
// Each step is a case `s<n>`; the generic checks of every case apply too.

const PING = '{"jsonrpc":"2.0","id":41,"method":"ping"}';
const SESSION_NOT_FOUND_BODY = '{"jsonrpc":"2.0","error":{"code":-32600,"message":"Session not found"}}';

const sessionCall = {
  ping: (user, session) => mcpPlan('ping', PING, { user, session }),
  list: (user, session) => mcpPlan('tools/list', '{"jsonrpc":"2.0","id":42,"method":"tools/list"}', { user, session }),
  search: (user, session) => mcpPlan('tools/call search', render(call('search', { id: 43, args: { query: 'x' } })), { user, session }),
  gss: (user, session) => mcpPlan('tools/call get_section_source', gssText(44), { user, session }),
  note: (user, session) => mcpPlan('a notification', '{"jsonrpc":"2.0","method":"notifications/initialized"}', { user, session }),
  batch: (user, session) => mcpPlan('a batch of two pings', `[${PING},{"jsonrpc":"2.0","id":45,"method":"ping"}]`, { user, session }),
  get: (user, session) => mcpPlan('GET', '', { user, session, method: 'GET', ct: null, accept: 'text/event-stream' }),
  delete: (user, session) => mcpPlan('DELETE', '', { user, session, method: 'DELETE', ct: null, accept: null }),
};

/** Problems unless the answer is the sidecar's 404 `Session not found` and nothing reached the MCP router. */
function notFoundProblems(out, what) {
  const p = [];
  const routed = out.recs.filter((r) => r.mcpRoute).length;
  if (routed) p.push(`${what}: ${routed} request(s) reached the stand-in's MCP router`);
  const want = what.startsWith('DELETE') ? [200, '{"ok":true}'] : [404, SESSION_NOT_FOUND_BODY];
  const body = out.res.body.toString('utf8');
  if (out.res.status !== want[0] || body !== want[1]) {
    p.push(`${what}: answered ${out.res.status} ${short(body, 120)}, not ${want[0]} ${want[1]}`);
  }
  return p;
}

/** Problems unless the call worked: a forwarded ping answered by the SDK, or the tool answered by the sidecar. */
function worksProblems(kind, out, what) {
  const p = [];
  const msgs = sseMessages(out.res.body);
  const forwarded = out.recs.filter((r) => r.mcp).length;
  if (out.res.status !== 200 || !msgs.some((m) => m.result)) p.push(`${what}: answered ${out.res.status} ${short(out.res.body.toString('utf8'), 120)}`);
  if (kind === 'ping' && forwarded !== 1) p.push(`${what}: reached the stand-in ${forwarded} time(s), not once`);
  if (kind === 'gss' && out.recs.length) p.push(`${what}: reached the stand-in ${out.recs.length} time(s)`);
  return p;
}

async function initializeThrough(runner, user) {
  const out = await runner.run(mcpPlan('initialize', INIT_BODY, { user, session: 'none' }));
  return { out, id: out.res.headers['mcp-session-id'] };
}

async function sessionSection(runner, standin, record) {
  let n = 0;
  const step = async (desc, plan, check) => {
    n += 1;
    const out = await runner.run(plan);
    const labelled = { ...plan, label: `s${n}`, desc };
    record(labelled, out, [...caseProblems(labelled, out), ...check(out)]);
    return out;
  };
  const fail = (desc, problem) => {
    n += 1;
    record({ label: `s${n}`, desc }, null, [problem]);
  };
  const kinds = ['ping', 'list', 'search', 'gss', 'note', 'batch', 'get', 'delete'];

  // 1. Ids the caller does not hold: unknown, another user's, none.
  await runner.ensureSessions();
  const holders = { unknown: UNKNOWN_SESSION, "user a's session": runner.ctx.sessions.a, none: 'none' };
  const openedBefore = standin.state.opened;
  for (const [whose, id] of Object.entries(holders)) {
    for (const k of kinds) {
      const plan = sessionCall[k]('c', id);
      const what = `${plan.desc} on ${whose}`;
      await step(`user c: ${what} never reaches the MCP router`, plan, (out) => notFoundProblems(out, what));
    }
  }
  if (standin.state.opened !== openedBefore) fail('no transport was opened for those calls', `the stand-in opened ${standin.state.opened - openedBefore} transport(s)`);

  // 2. The eviction at the cap is the stand-in's: 9 initializes of user c, with calls
  // reaching the stand-in on c0 and c1 and calls the sidecar answers itself on c2 and c3,
  // so that the stand-in's least recently active session (c2) is not the sidecar's own
  // least recently used one (c4).
  const c = [];
  for (let i = 0; i < MAX_SESSIONS_PER_USER; i += 1) {
    const { out, id } = await initializeThrough(runner, 'c');
    if (!id) fail(`initialize c${i}`, `no session: ${out.res.status} ${short(out.res.body.toString('utf8'), 120)}`);
    c.push(id);
  }
  for (const i of [0, 1]) await step(`c${i}: ping reaches the stand-in`, sessionCall.ping('c', c[i]), (out) => worksProblems('ping', out, `c${i} ping`));
  for (const i of [2, 3]) await step(`c${i}: get_section_source is the sidecar's`, sessionCall.gss('c', c[i]), (out) => worksProblems('gss', out, `c${i} get_section_source`));
  const ninth = await initializeThrough(runner, 'c');
  c.push(ninth.id);
  if (standin.sessionOwner(c[2]) !== undefined || standin.sessionsOf(SUB_C).length !== MAX_SESSIONS_PER_USER) {
    fail('the stand-in evicted c2 at the ninth initialize', `the stand-in holds ${standin.sessionsOf(SUB_C).length} sessions of user c, c2 ${standin.sessionOwner(c[2]) ? 'among them' : 'not'}`);
  }
  for (const k of ['gss', 'ping', 'list', 'search', 'get']) {
    const plan = sessionCall[k]('c', c[2]);
    await step(`c2, evicted by the stand-in: ${plan.desc} is 404`, plan, (out) => notFoundProblems(out, `c2 ${plan.desc}`));
  }
  for (const [i, id] of c.entries()) {
    if (i === 2) continue;
    await step(`c${i}: get_section_source still works`, sessionCall.gss('c', id), (out) => worksProblems('gss', out, `c${i} get_section_source`));
    await step(`c${i}: ping still reaches the stand-in`, sessionCall.ping('c', id), (out) => worksProblems('ping', out, `c${i} ping`));
  }

  // 3. A stand-in restart: every old session, of users c and d, dies on its first
  // forwarded call and stays dead for every call; initializing again works.
  const d = [];
  for (let i = 0; i < 3; i += 1) d.push((await initializeThrough(runner, 'd')).id);
  await step('d2: ping reaches the stand-in', sessionCall.ping('d', d[2]), (out) => worksProblems('ping', out, 'd2 ping'));
  standin.restart();
  const old = [...d.map((id, i) => ['d', `d${i}`, id]), ...c.flatMap((id, i) => (i === 2 ? [] : [['c', `c${i}`, id]]))];
  for (const [user, name, id] of old) {
    await step(`${name} after the restart: its first forwarded call is 404`, sessionCall.ping(user, id), (out) => {
      const p = [];
      if (out.res.status !== 404 || out.res.body.toString('utf8') !== SESSION_NOT_FOUND_BODY) p.push(`${name}: answered ${out.res.status} ${short(out.res.body.toString('utf8'), 120)}`);
      return p;
    });
    for (const k of ['gss', 'ping', 'list', 'get']) {
      const plan = sessionCall[k](user, id);
      await step(`${name} after the restart: ${plan.desc} is 404`, plan, (out) => notFoundProblems(out, `${name} ${plan.desc}`));
    }
  }
  for (const user of ['c', 'd']) {
    const { id } = await initializeThrough(runner, user);
    await step(`user ${user} initializes again: ping works`, sessionCall.ping(user, id ?? 'none'), (out) => worksProblems('ping', out, `new ${user} ping`));
    await step(`user ${user} initializes again: get_section_source works`, sessionCall.gss(user, id ?? 'none'), (out) => worksProblems('gss', out, `new ${user} get_section_source`));
  }
  return n;
}

// ---- the client the gateway is told about ------------------------------------------------
//
// The gateway trusts one proxy hop (`trust proxy` = 1): Express takes `req.ip` from the last
// `X-Forwarded-For` entry, `req.protocol` from `X-Forwarded-Proto` and `req.hostname` from
// `X-Forwarded-Host`, and the OAuth routes' rate limits (express-rate-limit, key =
// `req.ip`) key on that address. Each case is a `POST /register` sent through a sidecar and,
// as the reference, straight to the stand-in as the gateway would get it without the
// sidecar; the client Express read (address, scheme, host, rate-limit key) must be the
// same, and the expected one. Two topologies: clients straight at the sidecar (the
// suite's sidecar, default configuration), and the sidecar behind a load balancer that the
// suite plays from BALANCER, appending the client it saw to `X-Forwarded-For` and setting
// the scheme and host (a second sidecar, balancerEnv()). Clients connect from distinct
// loopback addresses. A client that claims headers is compared with the same client
// claiming nothing: what it claims must change nothing.

const REGISTER_BODY = Buffer.from('{"redirect_uris":["https://client.example/cb"]}');
const CLAIMS = [
  ['X-Forwarded-For', '6.6.6.6'],
  ['X-Forwarded-Proto', 'https'],
  ['X-Forwarded-Host', 'forged.example'],
  ['Forwarded', 'for=6.6.6.6;proto=https;host=forged.example'],
];

function forwardedCases() {
  const honest = (from, host = 'hub.example') => ({ from, host, headers: [] });
  const lb = (xff, host = 'hub.example') => ({
    from: BALANCER,
    host,
    headers: [['X-Forwarded-For', xff], ['X-Forwarded-Proto', 'https'], ['X-Forwarded-Host', host]],
  });
  const cases = [
    { label: 'x1', via: 'direct', desc: 'a client straight at the sidecar is its own address', send: honest('127.0.0.2'), reference: honest('127.0.0.2'), expect: ['127.0.0.2', 'http', 'hub.example', '127.0.0.2'] },
    { label: 'x2', via: 'direct', desc: 'another client straight at the sidecar has a bucket of its own', send: honest('127.0.0.3'), reference: honest('127.0.0.3'), expect: ['127.0.0.3', 'http', 'hub.example', '127.0.0.3'], otherBucketThan: 'x1' },
    { label: 'x3', via: 'direct', desc: 'a client claiming X-Forwarded-For/-Proto/-Host and Forwarded is told as itself', send: { ...honest('127.0.0.2'), headers: CLAIMS }, reference: honest('127.0.0.2'), expect: ['127.0.0.2', 'http', 'hub.example', '127.0.0.2'], sameBucketAs: 'x1' },
    { label: 'x4', via: 'direct', desc: 'a client claiming other addresses stays in its bucket', send: { ...honest('127.0.0.2'), headers: [['X-Forwarded-For', '7.7.7.7'], ['X-Forwarded-For', '8.8.8.8, 9.9.9.9']] }, reference: honest('127.0.0.2'), expect: ['127.0.0.2', 'http', 'hub.example', '127.0.0.2'], sameBucketAs: 'x1' },
    { label: 'x5', via: 'balancer', desc: 'behind a balancer: the client it saw, its scheme and host', send: lb('198.51.100.1'), reference: lb('198.51.100.1'), expect: ['198.51.100.1', 'https', 'hub.example', '198.51.100.1'] },
    { label: 'x6', via: 'balancer', desc: 'another client behind the balancer has a bucket of its own', send: lb('198.51.100.2'), reference: lb('198.51.100.2'), expect: ['198.51.100.2', 'https', 'hub.example', '198.51.100.2'], otherBucketThan: 'x5' },
    { label: 'x7', via: 'balancer', desc: "a client's own X-Forwarded-For before the balancer's entry decides nothing", send: lb('6.6.6.6, 198.51.100.1'), reference: lb('6.6.6.6, 198.51.100.1'), expect: ['198.51.100.1', 'https', 'hub.example', '198.51.100.1'], sameBucketAs: 'x5' },
    { label: 'x8', via: 'balancer', desc: 'an IPv6 client behind the balancer (keyed by its /56)', send: lb('2001:db8::7'), reference: lb('2001:db8::7'), expect: ['2001:db8::7', 'https', 'hub.example', '2001:db8::/56'] },
    { label: 'x9', via: 'balancer', desc: 'a client going around the balancer is told as itself', send: { ...honest('127.0.0.6'), headers: CLAIMS.concat([['X-Forwarded-For', '198.51.100.1']]) }, reference: honest('127.0.0.6'), expect: ['127.0.0.6', 'http', 'hub.example', '127.0.0.6'], otherBucketThan: 'x5' },
  ];
  return cases;
}

/** Sends one `POST /register` and returns Express's reading of the client, or a problem. */
async function registerOnce(standin, port, spec) {
  standin.takeRequests();
  const res = await send(port, {
    method: 'POST',
    target: '/register',
    from: spec.from,
    host: spec.host,
    headers: [['Content-Type', 'application/json'], ...spec.headers],
    body: REGISTER_BODY,
  });
  await settle(standin);
  const recs = standin.takeRequests().filter((r) => r.target === '/register');
  if (res.status !== 201) return { problem: `status ${res.status} ${short(res.body.toString('utf8'), 100)}` };
  if (recs.length !== 1) return { problem: `${recs.length} requests reached /register` };
  const c = recs[0].client;
  return { seen: [c.ip, c.protocol, c.hostname, c.rateLimit?.key], xff: recs[0].headers['x-forwarded-for'] };
}

async function runForwarded(standin, ports, only) {
  const results = [];
  const keys = new Map();
  const directPort = Number(new URL(standin.gatewayUrl).port);
  for (const plan of forwardedCases()) {
    if (only && !only.has(plan.label)) continue;
    const problems = [];
    const through = await registerOnce(standin, ports[plan.via], plan.send);
    const reference = await registerOnce(standin, directPort, plan.reference);
    const names = ['req.ip', 'req.protocol', 'req.hostname', 'rate-limit key'];
    if (through.problem) problems.push(`through the sidecar: ${through.problem}`);
    if (reference.problem) problems.push(`straight to the stand-in: ${reference.problem}`);
    if (!problems.length) {
      names.forEach((name, i) => {
        if (through.seen[i] !== reference.seen[i]) problems.push(`${name}: ${JSON.stringify(through.seen[i])} through the sidecar, ${JSON.stringify(reference.seen[i])} without it (X-Forwarded-For sent: ${short(JSON.stringify(through.xff), 60)})`);
        else if (through.seen[i] !== plan.expect[i]) problems.push(`${name}: ${JSON.stringify(through.seen[i])}, expected ${JSON.stringify(plan.expect[i])}`);
      });
      keys.set(plan.label, through.seen[3]);
      if (plan.sameBucketAs && keys.has(plan.sameBucketAs) && keys.get(plan.sameBucketAs) !== through.seen[3]) problems.push(`rate-limit key ${JSON.stringify(through.seen[3])}: a bucket other than ${plan.sameBucketAs}'s (${JSON.stringify(keys.get(plan.sameBucketAs))})`);
      if (plan.otherBucketThan && keys.get(plan.otherBucketThan) === through.seen[3]) problems.push(`rate-limit key ${JSON.stringify(through.seen[3])}: the same bucket as ${plan.otherBucketThan}`);
    }
    results.push({ plan, problems });
  }
  return results;
}

// ---- event streams from a gateway with an event store ------------------------------------

/** The events of an event-stream body as a client reads them (HTML standard): field names in order, type, id, retry, data. */
function sseEvents(body) {
  let text = body.toString('utf8');
  if (text.startsWith('\uFEFF')) text = text.slice(1);
  const lines = text.split(/\r\n|\r|\n/);
  lines.pop(); // an unfinished line is no line
  const events = [];
  let cur = null;
  for (const line of lines) {
    if (line === '') {
      if (cur) events.push(cur);
      cur = null;
      continue;
    }
    cur = cur || { fields: [], event: '', id: undefined, retry: undefined, data: null };
    if (line.startsWith(':')) {
      cur.fields.push(':');
      continue;
    }
    const c = line.indexOf(':');
    const name = c < 0 ? line : line.slice(0, c);
    let value = c < 0 ? '' : line.slice(c + 1);
    if (value.startsWith(' ')) value = value.slice(1);
    cur.fields.push(name);
    if (name === 'data') cur.data = cur.data === null ? value : `${cur.data}\n${value}`;
    else if (name === 'event') cur.event = value;
    else if (name === 'id') cur.id = value;
    else if (name === 'retry') cur.retry = value;
  }
  return events;
}

const mentionsSectionSource = (entry) => /section-source|section_source|note-outline|note_outline|document-tree|document_tree/.test(JSON.stringify(entry).toLowerCase());

/** The SDK's list answer as the sidecar must rewrite it (the default policy lets every role see the tool, which the stand-in lists). */
function rewrittenList(message) {
  if (!message || typeof message !== 'object' || !message.result) return message;
  const result = { ...message.result };
  for (const key of ['resources', 'resourceTemplates']) if (Array.isArray(result[key])) result[key] = result[key].filter((e) => !mentionsSectionSource(e));
  return { ...message, result };
}

const STREAM_VERSIONS = ['2025-11-25', '2025-06-18', '2025-03-26', '2024-11-05'];
const LIST_METHODS = ['tools/list', 'resources/list', 'resources/templates/list'];

async function initializeAt(port, tok, version) {
  const base = [['Authorization', `Bearer ${tok}`], ['Accept', ACCEPT], ['Content-Type', 'application/json']];
  const body = JSON.stringify({ jsonrpc: '2.0', id: 0, method: 'initialize', params: { protocolVersion: version, capabilities: {}, clientInfo: { name: 'parity-suite', version: '1.0.0' } } });
  const res = await send(port, { method: 'POST', target: '/mcp', headers: base, body: Buffer.from(body) });
  const sid = res.headers['mcp-session-id'];
  if (res.status !== 200 || !sid) throw new Error(`initialize (${version}) failed: status ${res.status} ${short(res.body.toString('utf8'), 200)}`);
  const note = await send(port, { method: 'POST', target: '/mcp', headers: [...base, ['Mcp-Session-Id', sid], ['MCP-Protocol-Version', version]], body: Buffer.from('{"jsonrpc":"2.0","method":"notifications/initialized"}') });
  if (note.status !== 202) throw new Error(`notifications/initialized (${version}) failed: status ${note.status}`);
  return sid;
}

/** Problems unless the sidecar's stream has the stand-in's events, field for field, and each message is the stand-in's rewritten. */
function streamProblems(got, want, what) {
  const p = [];
  if (got.status !== 200 || want.status !== 200) return [`${what}: answered ${got.status} ${short(got.body.toString('utf8'), 120)} (stand-in ${want.status})`];
  const [g, w] = [sseEvents(got.body), sseEvents(want.body)];
  if (g.length !== w.length) return [`${what}: ${g.length} events, the stand-in's answer has ${w.length}`];
  for (const [i, [ge, we]] of g.map((e, j) => [e, w[j]]).entries()) {
    if (ge.fields.join(',') !== we.fields.join(',')) p.push(`${what}: event ${i} has the fields ${ge.fields}, not ${we.fields}`);
    if (ge.event !== we.event || ge.retry !== we.retry || (ge.id === undefined) !== (we.id === undefined)) p.push(`${what}: event ${i} type/id/retry differ`);
    if (!we.data) {
      if (ge.data !== we.data) p.push(`${what}: event ${i} data ${JSON.stringify(ge.data)}, not ${JSON.stringify(we.data)}`);
      continue;
    }
    let gm;
    try {
      gm = JSON.parse(ge.data);
    } catch {
      p.push(`${what}: event ${i} data is not JSON`);
      continue;
    }
    const wm = rewrittenList(JSON.parse(we.data));
    if (JSON.stringify(gm) !== JSON.stringify(wm)) p.push(`${what}: event ${i} is ${short(JSON.stringify(gm), 120)}, not ${short(JSON.stringify(wm), 120)}`);
  }
  return p;
}

/**
 * Event streams (labels e1…): for each protocol version the door accepts, a session of
 * user e (whose transports have an event store) through the sidecar and one straight to
 * the stand-in; each list method in both; the sidecar's stream must have the stand-in's
 * events field for field (the priming event under 2025-11-25, every `event`, `id` and
 * `retry`), each message the stand-in's with section sources removed. Under 2025-11-25,
 * a `GET` with the `Last-Event-ID` of each list stream's priming event replays its answer
 * through the sidecar: the stand-in must see the header unchanged, and the replayed
 * answer must be rewritten as the answer itself was.
 */
async function streamSection(standin, port, record) {
  let n = 0;
  const directPort = Number(new URL(standin.gatewayUrl).port);
  const tok = token(SUB_E);
  const check = (desc, out, problems) => {
    n += 1;
    record({ label: `e${n}`, desc }, out, problems);
  };
  for (const version of STREAM_VERSIONS) {
    let via;
    let direct;
    try {
      via = await initializeAt(port, tok, version);
      direct = await initializeAt(directPort, tok, version);
    } catch (e) {
      check(`initialize ${version} through the sidecar and straight`, null, [e.message]);
      continue;
    }
    for (const [i, method] of LIST_METHODS.entries()) {
      const req = (sid) => ({
        method: 'POST',
        target: '/mcp',
        headers: [['Authorization', `Bearer ${tok}`], ['Accept', ACCEPT], ['Content-Type', 'application/json'], ['Mcp-Session-Id', sid], ['MCP-Protocol-Version', version]],
        body: Buffer.from(JSON.stringify({ jsonrpc: '2.0', id: 70 + i, method })),
      });
      standin.takeRequests();
      const got = await send(port, req(via));
      const want = await send(directPort, req(direct));
      await settle(standin);
      standin.takeRequests();
      const out = { req: req(via), res: got, recs: [] };
      const problems = streamProblems(got, want, `${version} ${method}`);
      const events = got.status === 200 ? sseEvents(got.body) : [];
      const primed = events.length > 1 && events[0].data === '' && events[0].id !== undefined;
      if (version >= '2025-11-25' && got.status === 200 && !primed) problems.push(`${version} ${method}: no priming event first`);
      check(`${version} ${method}: the stand-in's stream, rewritten`, out, problems);
      if (version < '2025-11-25') continue;
      const replayDesc = `${version} ${method}: GET with Last-Event-ID replays it rewritten`;
      if (!primed) {
        check(replayDesc, out, ['no priming event to resume from']);
        continue;
      }
      // Resume from the priming event: the answer is replayed from the stand-in's store.
      const resume = {
        method: 'GET',
        target: '/mcp',
        headers: [['Authorization', `Bearer ${tok}`], ['Accept', 'text/event-stream'], ['Mcp-Session-Id', via], ['MCP-Protocol-Version', version], ['Last-Event-ID', events[0].id]],
        until: (body) => sseEvents(body).some((e) => e.data),
        timeoutMs: 3000,
      };
      const replay = await send(port, resume);
      await settle(standin);
      const recs = standin.takeRequests();
      const rp = [];
      const seen = recs.filter((r) => r.method === 'GET').map((r) => r.headers['last-event-id']);
      if (seen.length !== 1 || seen[0] !== events[0].id) rp.push(`the stand-in saw Last-Event-ID ${JSON.stringify(seen)}, not ${JSON.stringify(events[0].id)}`);
      const replayed = replay.status === 200 ? sseEvents(replay.body).filter((e) => e.data) : [];
      if (replay.status !== 200 || replayed.length !== 1) rp.push(`the replay answered ${replay.status} with ${replayed.length} message(s): ${short(replay.body.toString('utf8'), 160)}`);
      else {
        const m = JSON.parse(replayed[0].data);
        const wanted = rewrittenList(JSON.parse(sseEvents(want.body).filter((e) => e.data)[0].data));
        if (JSON.stringify(m) !== JSON.stringify(wanted)) rp.push(`the replay is ${short(JSON.stringify(m), 140)}, not ${short(JSON.stringify(wanted), 140)}`);
        if (replayed[0].id !== events[1]?.id) rp.push(`the replayed event's id ${replayed[0].id} is not the answer's ${events[1]?.id}`);
      }
      check(replayDesc, { req: resume, res: replay, recs }, rp);
    }
  }
  return n;
}

// ---- Origin: the SDK's own DNS-rebinding refusal -----------------------------------------

/**
 * Origin cases (labels o1…): a request with an `Origin` the sidecar does not allow (it is
 * configured with none) gets the answer the SDK's DNS-rebinding protection gives, status,
 * content type and body, compared with the stand-in's `/parity/rebinding`; nothing
 * reaches the stand-in's MCP router. The stand-in's transport allows only
 * `https://allowed.example`, which the sidecar does not.
 */
async function originSection(standin, port, record) {
  let n = 0;
  const directPort = Number(new URL(standin.gatewayUrl).port);
  const sid = await initializeAt(port, token(SUB_E), '2025-11-25');
  const cases = [
    ['POST initialize', 'POST', [['Origin', 'http://evil.example.com']], INIT_BODY],
    ['POST ping in a session', 'POST', [['Origin', 'http://evil.example.com'], ['Mcp-Session-Id', sid]], PING],
    ['GET in a session', 'GET', [['Origin', 'http://evil.example.com'], ['Mcp-Session-Id', sid]], null],
    ['DELETE in a session', 'DELETE', [['Origin', 'http://evil.example.com'], ['Mcp-Session-Id', sid]], null],
    ['Origin null', 'POST', [['Origin', 'null']], PING],
    ['two Origin headers', 'POST', [['Origin', 'https://allowed.example'], ['Origin', 'http://evil.example.com']], PING],
    ['an Origin that is not one', 'POST', [['Origin', 'https://evil.example.com/path']], PING],
  ];
  for (const [desc, method, extra, body] of cases) {
    const req = (host) => ({
      method,
      target: host === 'sidecar' ? '/mcp' : '/parity/rebinding',
      headers: [['Authorization', `Bearer ${token(SUB_E)}`], ['Accept', ACCEPT], ...(body ? [['Content-Type', 'application/json']] : []), ...extra],
      body: body ? Buffer.from(body) : null,
    });
    standin.takeRequests();
    const got = await send(port, req('sidecar'));
    await settle(standin);
    const recs = standin.takeRequests();
    const want = await send(directPort, req('stand-in'));
    await settle(standin);
    standin.takeRequests();
    const p = [];
    if (recs.length) p.push(`${recs.length} request(s) reached the stand-in`);
    for (const [what, g, w] of [['status', got.status, want.status], ['content type', got.headers['content-type'], want.headers['content-type']], ['body', got.body.toString('utf8'), want.body.toString('utf8')]]) {
      if (g !== w) p.push(`${what}: ${short(String(g), 120)}, the SDK's: ${short(String(w), 120)}`);
    }
    if (want.status !== 403) p.push(`the SDK answered ${want.status}: the comparison is void`);
    n += 1;
    record({ label: `o${n}`, desc: `${desc}: the SDK's refusal, nothing forwarded` }, { req: req('sidecar'), res: got, recs }, p);
  }
  return n;
}

// ---- what passes through, sanitized ------------------------------------------------------

/**
 * Sanitize cases (labels l1…): the stand-in's `get_note`, `relate`, `daily-brief` prompt
 * and note resource answer as the gateway's hosted MCP server does on a failed upstream
 * fetch (`Upstream <status>: <body>` in a tool error envelope, a prompt message and a
 * thrown `McpError`) and with the note store's absolute paths, each carrying `LEAK`,
 * framed by the SDK itself. Each is sent through the sidecar and straight to the
 * stand-in: the stand-in's answer must carry the canary (else the case is void), the
 * sidecar's must not, and must be exactly the stand-in's with the upstream text cut after
 * `Upstream <status>` and each absolute path replaced by the path asked for or dropped.
 */
async function leakSection(standin, port, record) {
  const SUB_L = 'parity-user-l';
  const version = '2025-06-18';
  const directPort = Number(new URL(standin.gatewayUrl).port);
  const sids = { sidecar: await initializeAt(port, token(SUB_L), version), direct: await initializeAt(directPort, token(SUB_L), version) };
  const tool = (id, name, path) => ({ jsonrpc: '2.0', id, method: 'tools/call', params: { name, arguments: { path } } });
  const cut = (text) => text.replace(/(Upstream \d{3}):[\s\S]*$/, '$1');
  const toolText = (m) => JSON.parse(m.result.content[0].text);
  const cases = [
    ['get_note, an upstream failure', tool(1, 'get_note', 'leak/a.md'), (m) => ({ ...m, result: { ...m.result, content: [{ type: 'text', text: JSON.stringify({ error: 'Upstream 500', code: 'UPSTREAM_ERROR' }) }] } })],
    ['get_note, the note store\'s path', tool(2, 'get_note', 'abs/a.md'), (m) => ({ ...m, result: { content: [{ type: 'text', text: JSON.stringify({ ...toolText(m), path: 'abs/a.md' }) }] } })],
    ['relate, an upstream failure', tool(3, 'relate', 'leak/a.md'), (m) => ({ ...m, result: { ...m.result, content: [{ type: 'text', text: JSON.stringify({ error: 'Upstream 502', code: 'UPSTREAM_ERROR' }) }] } })],
    ['relate, the note store\'s paths', tool(4, 'relate', 'abs/a.md'), (m) => ({ ...m, result: { content: [{ type: 'text', text: JSON.stringify({ path: 'abs/a.md', related: [{ score: 1, title: 'B' }, { path: 'c.md', score: 0.5 }] }) }] } })],
    ['a prompt, an upstream failure', { jsonrpc: '2.0', id: 5, method: 'prompts/get', params: { name: 'daily-brief' } }, (m) => ({ ...m, result: { ...m.result, messages: m.result.messages.map((x) => ({ ...x, content: { ...x.content, text: cut(x.content.text) } })) } })],
    ['resources/read, an upstream failure', { jsonrpc: '2.0', id: 6, method: 'resources/read', params: { uri: 'knowtation://hosted/vault/leak/a.md' } }, (m) => ({ ...m, error: { ...m.error, message: cut(m.error.message) } })],
  ];
  const batch = [tool(7, 'get_note', 'leak/b.md'), tool(8, 'relate', 'abs/b.md')];
  cases.push(['a batch of both', batch, null]);
  let n = 0;
  for (const [desc, message, expect] of cases) {
    const req = (host) => ({
      method: 'POST',
      target: '/mcp',
      headers: [['Authorization', `Bearer ${token(SUB_L)}`], ['Accept', ACCEPT], ['Content-Type', 'application/json'], ['Mcp-Session-Id', sids[host]], ['MCP-Protocol-Version', version]],
      body: Buffer.from(JSON.stringify(message)),
    });
    standin.takeRequests();
    const got = await send(port, req('sidecar'));
    await settle(standin);
    const recs = standin.takeRequests();
    const want = await send(directPort, req('direct'));
    await settle(standin);
    standin.takeRequests();
    const p = [];
    const gotText = got.body.toString('utf8');
    if (!want.body.toString('utf8').includes(LEAK)) p.push(`the stand-in's answer carries no canary: the case is void (${short(want.body.toString('utf8'), 160)})`);
    if (gotText.includes(LEAK) || gotText.includes('/srv/') || gotText.includes('/Users/')) p.push(`the canary reached the client: ${short(gotText, 200)}`);
    if (got.status !== want.status) p.push(`status ${got.status}, the stand-in's ${want.status}`);
    if (!recs.length) p.push('nothing reached the stand-in');
    const mine = sseMessages(got.body);
    const theirs = sseMessages(want.body);
    if (mine.length !== theirs.length || mine.length === 0) p.push(`${mine.length} message(s), the stand-in's ${theirs.length}`);
    else if (expect) {
      const w = JSON.stringify(expect(theirs[0]));
      if (JSON.stringify(mine[0]) !== w) p.push(`answer ${short(JSON.stringify(mine[0]), 200)}, expected ${short(w, 200)}`);
    } else {
      const byId = Object.fromEntries([].concat(...mine).map((m) => [m.id, m]));
      if (JSON.stringify(toolText(byId[7])) !== JSON.stringify({ error: 'Upstream 500', code: 'UPSTREAM_ERROR' })) p.push(`batch get_note: ${short(JSON.stringify(byId[7]), 160)}`);
      if (toolText(byId[8] ?? { result: { content: [{ text: '{}' }] } }).path !== 'abs/b.md') p.push(`batch relate: ${short(JSON.stringify(byId[8]), 160)}`);
    }
    n += 1;
    record({ label: `l${n}`, desc: `${desc}: sanitized on the way, nothing of the canary through` }, { req: req('sidecar'), res: got, recs }, p);
  }
  return n;
}

// ---- the sidecar process -----------------------------------------------------------------

/**
 * PARITY_HOP=decode: a hop that decodes every escape in the path of each request (up to
 * the first raw `?`) and forwards the result raw, `#`, `?`, `\` and whitespace included,
 * as a Netlify function is reported to see its path; headers and body pass unchanged.
 * The stand-in's Express then reads such a path through url.parse. Each answer goes back
 * with `Connection: close`, so every request the sidecar sends takes a connection of its
 * own and is decoded. Returns the URL to use as the sidecar's gateway and a stop function.
 */
async function startDecodeHop(gatewayUrl) {
  const upstreamPort = Number(new URL(gatewayUrl).port);
  const decodePath = (target) => {
    const q = target.indexOf('?');
    const p = q < 0 ? target : target.slice(0, q);
    const bytes = [];
    for (let i = 0; i < p.length; i += 1) {
      const hex = p.slice(i + 1, i + 3);
      if (p[i] === '%' && /^[0-9A-Fa-f]{2}$/.test(hex)) {
        bytes.push(parseInt(hex, 16));
        i += 2;
      } else {
        bytes.push(p.charCodeAt(i) & 0xff);
      }
    }
    return Buffer.concat([Buffer.from(bytes), Buffer.from(q < 0 ? '' : target.slice(q), 'latin1')]);
  };
  const server = net.createServer((client) => {
    let head = Buffer.alloc(0);
    let upstream = null;
    client.on('error', () => upstream?.destroy());
    client.on('data', (chunk) => {
      if (upstream) {
        upstream.write(chunk);
        return;
      }
      head = Buffer.concat([head, chunk]);
      const end = head.indexOf('\r\n\r\n');
      if (end < 0) return;
      const lineEnd = head.indexOf('\r\n');
      const line = head.subarray(0, lineEnd).toString('latin1');
      const [method, target, version] = line.split(' ');
      const decoded = Buffer.concat([Buffer.from(`${method} `, 'latin1'), decodePath(target ?? ''), Buffer.from(` ${version}`, 'latin1')]);
      upstream = net.connect(upstreamPort, HOST);
      upstream.write(Buffer.concat([decoded, head.subarray(lineEnd)]));
      let answerHead = Buffer.alloc(0);
      let headSent = false;
      upstream.on('data', (data) => {
        if (headSent) {
          client.write(data);
          return;
        }
        answerHead = Buffer.concat([answerHead, data]);
        const at = answerHead.indexOf('\r\n\r\n');
        if (at < 0) return;
        const lines = answerHead.subarray(0, at).toString('latin1').split('\r\n').filter((l) => !/^connection\s*:/i.test(l));
        lines.push('Connection: close');
        client.write(Buffer.concat([Buffer.from(lines.join('\r\n'), 'latin1'), answerHead.subarray(at)]));
        headSent = true;
      });
      upstream.on('end', () => client.end());
      upstream.on('error', () => client.destroy());
      client.on('end', () => upstream.end());
    });
  });
  await new Promise((resolve) => server.listen(0, HOST, resolve));
  return {
    url: `http://${HOST}:${server.address().port}`,
    stop: () => server.close(),
  };
}

/**
 * PARITY_HOP: nginx between the sidecar and the stand-in, with a URI in `proxy_pass`, so
 * that it forwards the path it decoded (`%2F` included) and normalized (slashes merged,
 * dot segments removed) instead of the bytes it received. A hop like that can turn a path
 * the gateway would not route into its route; every check after a case stays the same.
 * Returns the URL to use as the sidecar's gateway and a stop function.
 */
async function startHop(nginx, gatewayUrl) {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'parity-hop-'));
  const port = await freePort();
  const up = new URL(gatewayUrl).host;
  fs.writeFileSync(
    path.join(dir, 'nginx.conf'),
    `daemon off; pid ${dir}/nginx.pid; error_log ${dir}/error.log;
events { worker_connections 256; }
http {
  access_log off;
  client_body_temp_path ${dir}/body; proxy_temp_path ${dir}/proxy;
  fastcgi_temp_path ${dir}/fastcgi; uwsgi_temp_path ${dir}/uwsgi; scgi_temp_path ${dir}/scgi;
  client_max_body_size 20m;
  server {
    listen ${HOST}:${port};
    location / {
      proxy_pass http://${up}/;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_set_header Host $http_host;
      proxy_buffering off;
    }
  }
}
`,
  );
  const child = spawn(nginx, ['-p', dir, '-c', path.join(dir, 'nginx.conf')], { stdio: ['ignore', 'ignore', 'pipe'] });
  let failed = null;
  child.on('error', (e) => {
    failed = e.message;
  });
  child.on('exit', (code) => {
    failed = failed || `nginx exited (${code}): ${fs.existsSync(path.join(dir, 'error.log')) ? fs.readFileSync(path.join(dir, 'error.log'), 'utf8').slice(-400) : ''}`;
  });
  const deadline = Date.now() + 10_000;
  for (;;) {
    if (failed) throw new Error(`the decoding hop did not start: ${failed}`);
    const r = await send(port, { method: 'GET', target: '/parity-hop-probe', headers: [] }).catch(() => null);
    if (r && r.status) break;
    if (Date.now() > deadline) throw new Error('the decoding hop did not answer within 10 s');
    await sleep(50);
  }
  return {
    url: `http://${HOST}:${port}`,
    stop: () => {
      child.kill('SIGTERM');
      fs.rmSync(dir, { recursive: true, force: true });
    },
  };
}

async function startSidecar(binary, standin, extraEnv = {}) {
  const listenPort = await freePort();
  const adminPort = await freePort();
  const env = {};
  for (const [k, v] of Object.entries(process.env)) if (!/^KNOWTATION_SIDECAR_/i.test(k)) env[k] = v;
  Object.assign(env, sidecarEnv({ listenPort, adminPort, standin }), extraEnv);
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
      const hint = exited.code === 64 ? ' (configuration rejected: adapt sidecarEnv() in run.mjs)' : '';
      throw new Error(`the sidecar exited before it was live: ${JSON.stringify(exited)}${hint}\n${output.trim()}`);
    }
    const live = await send(adminPort, { method: 'GET', target: '/live', headers: [] });
    if (live.status === 200) break;
    if (Date.now() > deadline) throw new Error(`the sidecar's /live did not answer 200 within 30 s\n${output.trim()}`);
    await sleep(50);
  }
  return {
    port: listenPort,
    output: () => output,
    exited: () => exited,
    stop() {
      if (!exited) child.kill('SIGKILL');
    },
  };
}

// ---- modes -------------------------------------------------------------------------------

async function selfCheck() {
  const standin = await startStandin({ secret: SECRET, host: HOST });
  const port = Number(new URL(standin.gatewayUrl).port);
  const runner = makeRunner(standin, port);
  const verbose = process.env.PARITY_VERBOSE === '1';
  try {
    const cases = fixedCases().filter((c) => !c.control);
    let runs = 0;
    console.log(`self-check: ${cases.length} hostile shapes sent straight to the gateway stand-in (no sidecar)`);
    for (const plan of cases) {
      const out = await runner.run(plan);
      const d = out.recs.flatMap((r) => r.dispatched).filter((e) => e.method === 'tools/call').map((e) => e.toolName);
      const ran = out.toolRuns > 0 || out.restRuns > 0 || out.resourceRuns > 0;
      if (ran) runs += 1;
      if (ran || verbose) {
        const what = out.toolRuns ? 'RUNS the tool' : out.restRuns ? 'RUNS the REST route' : out.resourceRuns ? 'READS the resource' : 'does not run';
        const dispatched = d.length ? `; SDK looked up ${JSON.stringify(d)}` : '';
        console.log(`  ${plan.label.padEnd(5)} ${what.padEnd(19)} ${plan.desc} (status ${out.res.status}${dispatched})`);
      }
    }
    console.log(`${runs} of ${cases.length} hostile shapes run a view (tool, REST route or resource) in the real libraries`);
  } finally {
    await standin.close();
  }
}

async function suite(binary) {
  const t0 = Date.now();
  const seed = process.env.PARITY_SEED !== undefined && process.env.PARITY_SEED !== '' ? Number(process.env.PARITY_SEED) >>> 0 : DEFAULT_SEED;
  const count = process.env.PARITY_CASES ? Math.max(0, Number(process.env.PARITY_CASES) | 0) : DEFAULT_CASES;
  const only = process.env.PARITY_ONLY ? new Set(process.env.PARITY_ONLY.split(',').map((s) => s.trim())) : null;
  const verbose = process.env.PARITY_VERBOSE === '1';
  console.log(`parity: seed ${seed} (PARITY_SEED), ${count} generated cases (PARITY_CASES)`);
  const hopBinary = process.env.PARITY_HOP || '';
  if (hopBinary === 'decode') console.log('parity: through a decoding hop (PARITY_HOP=decode: the path decoded and forwarded raw)');
  else if (hopBinary) console.log(`parity: through a decoding hop (PARITY_HOP=${hopBinary}: nginx, proxy_pass with a URI)`);

  const standin = await startStandin({ secret: SECRET, host: HOST, eventStoreUsers: [SUB_E] });
  let sidecar = null;
  let behindBalancer = null;
  let hop = null;
  let forwardedRun = 0;
  const stop = () => {
    sidecar?.stop();
    behindBalancer?.stop();
    hop?.stop();
  };
  process.on('exit', stop);
  for (const sig of ['SIGINT', 'SIGTERM']) {
    process.on(sig, () => {
      stop();
      process.exit(130);
    });
  }
  let passed = 0;
  let sessionCount = 0;
  let streamCount = 0;
  let originCount = 0;
  let leakCount = 0;
  const failures = [];
  const stats = { forwarded: 0, dispatched: 0, toolCalls: 0, status: {} };
  try {
    if (hopBinary === 'decode') hop = await startDecodeHop(standin.gatewayUrl);
    else if (hopBinary) hop = await startHop(hopBinary, standin.gatewayUrl);
    sidecar = await startSidecar(binary, hop ? { ...standin, gatewayUrl: hop.url } : standin);
    const runner = makeRunner(standin, sidecar.port);
    // The same bytes sent straight to the stand-in, for the 'same-as-sdk' control.
    const direct = makeRunner(standin, Number(new URL(standin.gatewayUrl).port));
    const fixed = fixedCases();
    const plans = function* () {
      for (const p of fixed) yield p;
      for (let i = 0; i < count; i += 1) yield generatedCase(seed, i);
    };
    for (const plan of plans()) {
      if (only && !only.has(plan.label)) continue;
      const out = await runner.run(plan);
      if (plan.control === 'same-as-sdk') out.reference = await direct.run(plan);
      const problems = caseProblems(plan, out);
      if (sidecar.exited()) problems.push(`the sidecar exited: ${JSON.stringify(sidecar.exited())}`);
      if (problems.length) failures.push({ plan, problems, out });
      else passed += 1;
      tally(stats, out);
      if (only && verbose) {
        console.log(`  ${plan.label} ${plan.desc}: ${problems.length ? 'FAIL' : 'pass'}`);
        for (const l of describeExchange(out)) console.log(l);
      }
      if (sidecar.exited()) break;
    }
    if ((!only || [...only].some((l) => /^s\d+$/.test(l))) && !sidecar.exited()) {
      sessionCount = await sessionSection(runner, standin, (plan, out, problems) => {
        if (only && !only.has(plan.label)) return;
        if (sidecar.exited()) problems.push(`the sidecar exited: ${JSON.stringify(sidecar.exited())}`);
        if (problems.length) failures.push({ plan, problems, out });
        else passed += 1;
        if (out) tally(stats, out);
        if (only && verbose) {
          console.log(`  ${plan.label} ${plan.desc}: ${problems.length ? 'FAIL' : 'pass'}`);
          if (out) for (const l of describeExchange(out)) console.log(l);
        }
      });
    }
    const extra = (prefix) => !only || [...only].some((l) => new RegExp(`^${prefix}\\d+$`).test(l));
    const section = (plan, out, problems) => {
      if (only && !only.has(plan.label)) return;
      if (sidecar.exited()) problems.push(`the sidecar exited: ${JSON.stringify(sidecar.exited())}`);
      if (problems.length) failures.push({ plan, problems, out });
      else passed += 1;
      if (only && verbose) {
        console.log(`  ${plan.label} ${plan.desc}: ${problems.length ? 'FAIL' : 'pass'}`);
        if (out) for (const l of describeExchange(out)) console.log(l);
      }
    };
    if (extra('e') && !sidecar.exited()) streamCount = await streamSection(standin, sidecar.port, section);
    if (extra('o') && !sidecar.exited()) originCount = await originSection(standin, sidecar.port, section);
    if (extra('l') && !sidecar.exited()) leakCount = await leakSection(standin, sidecar.port, section);
    if (standin.state.orphanDispatches) failures.push({ plan: { label: '-', desc: 'stand-in' }, problems: [`${standin.state.orphanDispatches} SDK dispatch(es) outside any recorded request`], out: null });

    // The client the gateway is told about, in both topologies (forwardedCases()).
    const wanted = forwardedCases().filter((c) => !only || only.has(c.label));
    if (wanted.length) {
      if (wanted.some((c) => c.via === 'balancer')) {
        behindBalancer = await startSidecar(binary, hop ? { ...standin, gatewayUrl: hop.url } : standin, balancerEnv());
      }
      const ports = { direct: sidecar.port, balancer: behindBalancer?.port };
      for (const { plan, problems } of await runForwarded(standin, ports, only)) {
        if (behindBalancer?.exited()) problems.push(`the second sidecar exited: ${JSON.stringify(behindBalancer.exited())}`);
        if (problems.length) failures.push({ plan, problems, out: null });
        else passed += 1;
        forwardedRun += 1;
        if (only && verbose) console.log(`  ${plan.label} ${plan.desc}: ${problems.length ? `FAIL: ${problems.join('; ')}` : 'pass'}`);
      }
    }
  } catch (e) {
    console.error(`parity: setup failed: ${e.message}`);
    stop();
    await standin.close();
    console.log(`${passed} passed, ${failures.length + 1} failed`);
    process.exit(2);
  }
  stop();
  await standin.close();

  const elapsed = ((Date.now() - t0) / 1000).toFixed(1);
  if (failures.length) {
    console.log(`failures (${failures.length}):`);
    let lines = 0;
    for (const f of failures) {
      if (lines >= MAX_DETAIL_LINES) {
        console.log(`  … ${failures.length - failures.indexOf(f)} more (PARITY_ONLY=<label> to run one)`);
        break;
      }
      console.log(`  ${f.plan.label} ${short(f.plan.desc, 110)}: ${short(f.problems[0], 150)}${f.problems.length > 1 ? ` (+${f.problems.length - 1} more)` : ''}`);
      lines += 1;
      if (verbose && f.out) for (const l of [...f.problems.slice(1).map((x) => `    ! ${short(x, 200)}`), ...describeExchange(f.out)]) console.log(l);
    }
  }
  const families = new Map();
  for (const f of failures) {
    const key = f.problems[0].replace(/\(\d+x\)/, '').replace(/forwarded POST \S+/, 'forwarded POST').replace(/message \d+/, 'message').replace(/".*?"/g, '…').slice(0, 90);
    families.set(key, (families.get(key) || 0) + 1);
  }
  if (families.size) {
    console.log('failure kinds:');
    for (const [k, n] of [...families].sort((a, b) => b[1] - a[1]).slice(0, 5)) console.log(`  ${String(n).padStart(5)}  ${k}`);
  }
  const statusText = Object.entries(stats.status).sort().map(([k, n]) => `${k}: ${n}`).join(', ');
  console.log(`sidecar answers by status: ${statusText}`);
  console.log(`forwarded to the stand-in: ${stats.forwarded} cases; the SDK dispatched messages in ${stats.dispatched}, tools/call with a tool name in ${stats.toolCalls}`);
  console.log(`forwarded: ${forwardedRun} cases of the client the gateway is told about (address, scheme, host, rate-limit bucket), direct and behind a balancer`);
  console.log(`cases run: ${passed + failures.length} (fixed ${only ? 'filtered' : fixedCases().length}, generated ${only ? 'filtered' : count}, sessions ${only ? 'filtered' : sessionCount}, event streams ${only ? 'filtered' : streamCount}, origins ${only ? 'filtered' : originCount}, sanitized ${only ? 'filtered' : leakCount}, forwarded ${forwardedRun}); elapsed ${elapsed} s; seed ${seed}`);
  console.log(`${passed} passed, ${failures.length} failed`);
  // A run that checked less than it was asked to proves less than it says: every fixed and
  // generated case at least (the sections add more), or, filtered, at least one case.
  const ran = passed + failures.length;
  const least = only ? 1 : fixedCases().length + count;
  if (ran < least) console.log(`parity: only ${ran} cases ran, fewer than ${least}`);
  process.exitCode = failures.length || ran < least ? 1 : 0;
}

const argv = process.argv.slice(2);
if (argv.includes('--self-check')) {
  selfCheck().catch((e) => {
    console.error(e);
    process.exit(2);
  });
} else if (argv.length !== 1 || argv[0].startsWith('-')) {
  console.error('usage: node tests/parity/run.mjs <path-to-sidecar-binary> | --self-check');
  process.exit(2);
} else {
  suite(argv[0]).catch((e) => {
    console.error(e);
    process.exit(2);
  });
}
