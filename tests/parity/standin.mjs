// A stand-in for the Knowtation hub gateway (aaronrene/knowtation, hub/gateway), written
// for this suite. It is not the gateway's code: it reproduces only the wiring that decides
// how a request is parsed and routed, on the same libraries and versions:
//
//   - Express 4 with `trust proxy` = 1, the Netlify-prefix rewrite, `express.json` (10 MB)
//     for every route, the REST routes `GET /api/v1/section-source` and
//     `GET /api/v1/note-outline` (as a gateway version could serve), an Express router
//     mounted with `app.use('/mcp', …)`, a catch-all, an error handler answering
//     `{"error": <message>, "code": …}`;
//   - on /mcp: the bearer JWT read with jsonwebtoken (`Bearer ` prefix, claim `sub`), and
//     the gateway's session rules: a session belongs to the `sub` that opened it; a user
//     holds at most 8, and when a POST finds no live session of its own caller under its
//     `Mcp-Session-Id` (absent, unknown, another user's) the gateway takes it for a new
//     session: the caller's least recently active session is evicted if the caller
//     holds 8, the hosted context is looked up, and a new transport is handed the
//     request, so that anything but `initialize` gets the SDK's own 400 `Server not
//     initialized` from a transport nobody initialized. A POST or GET on a live own
//     session marks it active; a GET on any other is 404 `Session not found`; a DELETE
//     ends only the caller's own session and always answers 200 `{"ok":true}`. One
//     `StreamableHTTPServerTransport` and one `McpServer` per session (SDK 1.27.1, zod 4
//     input schemas), given the body Express parsed. `restart()` forgets every session
//     and transport, as a gateway restart does;
//   - the OAuth routes (`/register`, `/token`, `/authorize`, `/revoke` and their metadata)
//     from the SDK's own `mcpAuthRouter`, mounted at the root with express-rate-limit's
//     validations off as the gateway mounts them, over a stub provider: their rate
//     limits key on `req.ip`, which `trust proxy` = 1 takes from the last
//     `X-Forwarded-For` entry;
//   - a hosted-context bridge and a canister, each a tiny HTTP server;
//   - for the users in `eventStoreUsers`, each session's transport keeps its events in an
//     event store (`EventStore` below, with `retryInterval` 1000), as a gateway built
//     for resumable streams would: the SDK then starts every answer stream of protocol
//     2025-11-25 with a priming event (`id`, `retry`, empty data), gives every message
//     event an `id`, and answers a `GET` with `Last-Event-ID` by replaying what followed;
//   - `get_note`, `relate`, a `daily-brief` prompt and the note resource template answering
//     as the gateway's hosted MCP server does on a failed upstream fetch and with the note
//     store's absolute paths, each carrying `LEAK` (for the sanitize cases);
//   - `/parity/rebinding`: a stateless transport with the SDK's DNS-rebinding protection
//     on (`allowedOrigins: ['https://allowed.example']`), whose refusals the sidecar's
//     own `Origin` refusal is compared with. The gateway has no such route.
//
// No rate limit on /mcp (the gateway's is 60 per minute): the suite sends thousands of
// requests and each one must reach the SDK.
//
// What it records, for the driver:
//   - `counters.tool`: runs of a view tool's handler (`get_section_source`,
//     `get_note_outline`, `get_document_tree`: a gateway version could serve all three);
//   - `counters.rest`: runs of a view's REST route handler (section-source,
//     note-outline);
//   - `counters.resource`: reads of a view's resource template (section-source,
//     note-outline, document-tree), which a gateway version could offer beside the tool
//     (the sidecar hides them: §6 ACL);
//   - `opened`: transports created for a POST on no live session of its caller;
//   - `requests`: one entry per HTTP request reaching the gateway app: method, target,
//     headers, the body bytes as received (body-parser's `verify` hook, which sees them
//     after gzip/deflate inflation and before any charset decoding; bodies body-parser
//     does not read are drained here), whether the /mcp router handled it, and
//     `dispatched`: every JSON-RPC message the SDK handed to its protocol layer, with the
//     method it read and, for `tools/call`, the tool name the SDK looked up in its tool
//     table (after its own zod parsing); and `client`: the client as Express reads it
//     (`req.ip`, `req.protocol`, `req.hostname`) and, where a rate limit ran, the key
//     and count of its bucket (`req.rateLimit`).

import http from 'node:http';
import { randomUUID } from 'node:crypto';
import express from 'express';
import jwt from 'jsonwebtoken';
import { z } from 'zod';
import { McpServer, ResourceTemplate } from '@modelcontextprotocol/sdk/server/mcp.js';
import { mcpAuthRouter } from '@modelcontextprotocol/sdk/server/auth/router.js';
import { StreamableHTTPServerTransport } from '@modelcontextprotocol/sdk/server/streamableHttp.js';
import {
  isJSONRPCRequest,
  isJSONRPCNotification,
  isJSONRPCResultResponse,
  isJSONRPCErrorResponse,
  McpError,
  ErrorCode,
} from '@modelcontextprotocol/sdk/types.js';

const NETLIFY_PREFIX = '/.netlify/functions/gateway';
const MAX_SESSIONS_PER_USER = 8;

export const CANARY = 'CANARY';

// What the gateway's hosted MCP server lets out on a failed upstream fetch and in its note
// tools (`hub/gateway/mcp-hosted-server.mjs`), for the sanitize cases: `LEAK` stands for
// a canister error page and the note store's own directory.
export const LEAK = 'LEAK-sanitize-5e2b';
const LEAK_BODY = `<html>${LEAK} TypeError at /srv/canister/app.js:42</html>`;
/** The gateway's `Upstream <status>: <first 200 characters of the body>`. */
const upstreamText = (status) => `Upstream ${status}: ${LEAK_BODY.slice(0, 200)}`;
/** The gateway's `jsonError(message, code)` tool result. */
const jsonError = (message, code) => ({ content: [{ type: 'text', text: JSON.stringify({ error: message, code }) }], isError: true });
const jsonText = (value) => ({ content: [{ type: 'text', text: JSON.stringify(value) }] });
const storePath = (p) => `/Users/${LEAK}/vault/${p}`;

function listen(server, host) {
  return new Promise((resolve, reject) => {
    server.once('error', reject);
    server.listen(0, host, () => {
      server.off('error', reject);
      resolve(`http://${host}:${server.address().port}`);
    });
  });
}

function readAll(stream) {
  return new Promise((resolve) => {
    const chunks = [];
    stream.on('data', (c) => chunks.push(c));
    stream.on('end', () => resolve(Buffer.concat(chunks)));
    stream.on('error', () => resolve(Buffer.concat(chunks)));
  });
}

function sendJson(res, status, value) {
  const body = Buffer.from(JSON.stringify(value));
  res.writeHead(status, { 'Content-Type': 'application/json; charset=utf-8', 'Content-Length': body.length });
  res.end(body);
}

/**
 * An event store for the SDK's transport: the SDK's example store (`InMemoryEventStore`)
 * orders a stream's events by ids made of the time and a random part, so two events of
 * one millisecond may replay out of order; here ids carry a sequence number instead.
 * Bounded: the oldest events go past `max`.
 */
export class EventStore {
  constructor(max = 10_000) {
    this.max = max;
    this.seq = 0;
    this.events = new Map(); // id -> { streamId, message }
  }

  async storeEvent(streamId, message) {
    this.seq += 1;
    const id = `${streamId}_${String(this.seq).padStart(10, '0')}`;
    this.events.set(id, { streamId, message });
    if (this.events.size > this.max) this.events.delete(this.events.keys().next().value);
    return id;
  }

  async replayEventsAfter(lastEventId, { send }) {
    const last = this.events.get(lastEventId);
    if (!last) return '';
    let after = false;
    for (const [id, { streamId, message }] of this.events) {
      if (id === lastEventId) {
        after = true;
        continue;
      }
      // The priming event is stored as `{}`: nothing to replay for it.
      if (after && streamId === last.streamId && message && Object.keys(message).length) await send(id, message);
    }
    return last.streamId;
  }
}

/**
 * Starts the gateway stand-in, its bridge and its canister on `host`, ephemeral ports.
 * @param {{ secret: string, host?: string, eventStoreUsers?: string[] }} options
 */
export async function startStandin({ secret, host = '127.0.0.1', eventStoreUsers = [] }) {
  const state = {
    counters: { tool: 0, rest: 0, resource: 0 },
    opened: 0,
    requests: [],
    bridgeHits: 0,
    canisterHits: 0,
    inFlight: 0,
    current: null,
  };

  // ---- bridge: GET /api/v1/hosted-context --------------------------------------------
  const bridge = http.createServer(async (req, res) => {
    await readAll(req);
    state.bridgeHits += 1;
    const sub = subOf(req.headers.authorization);
    if (req.method !== 'GET' || !req.url.startsWith('/api/v1/hosted-context') || sub == null) {
      return sendJson(res, sub == null ? 401 : 404, { error: 'Not found' });
    }
    sendJson(res, 200, {
      effective_canister_user_id: String(sub),
      allowed_vault_ids: ['default'],
      scope: null,
      role: 'editor',
    });
  });

  // ---- canister: GET /api/v1/notes/:path ---------------------------------------------
  const canister = http.createServer(async (req, res) => {
    await readAll(req);
    state.canisterHits += 1;
    const prefix = '/api/v1/notes/';
    if (req.method !== 'GET' || !req.url.startsWith(prefix)) {
      return sendJson(res, 404, { error: 'Not found' });
    }
    let notePath;
    try {
      notePath = decodeURIComponent(req.url.slice(prefix.length).split('?')[0]);
    } catch {
      return sendJson(res, 400, { error: 'Bad path' });
    }
    sendJson(res, 200, { path: notePath, frontmatter: '{}', body: `# Title\n\nbody ${CANARY}\n` });
  });

  // ---- identity: the gateway's reading of the bearer token ---------------------------
  function subOf(authorization) {
    const token = authorization && authorization.startsWith('Bearer ') ? authorization.slice(7) : null;
    if (!token) return null;
    try {
      const payload = jwt.verify(token, secret);
      return payload.sub ?? null;
    } catch {
      return null;
    }
  }

  const bridgeUrl = await listen(bridge, host);
  const canisterUrl = await listen(canister, host);

  async function hostedContext(req) {
    try {
      const r = await fetch(`${bridgeUrl}/api/v1/hosted-context`, {
        headers: {
          Authorization: req.headers.authorization,
          Accept: 'application/json',
          'X-Vault-Id': String(req.headers['x-vault-id'] || 'default').trim(),
        },
        signal: AbortSignal.timeout(3000),
      });
      if (!r.ok) return null;
      return await r.json();
    } catch {
      return null;
    }
  }

  // ---- the MCP server of one session -------------------------------------------------
  function createMcpServer() {
    const server = new McpServer({ name: 'knowtation-hub-standin', version: '0.0.0' });
    server.registerTool(
      'search',
      { description: 'Search the vault (stub).', inputSchema: { query: z.string() } },
      async () => ({ content: [{ type: 'text', text: '{"results":[]}' }] }),
    );
    // `get_note` and `relate` answer as the gateway's do for the sanitize cases: a path
    // under `leak/` fails upstream, one under `abs/` comes back as the note store's
    // absolute path; any other is a stub.
    server.registerTool(
      'get_note',
      { description: 'One note (stub).', inputSchema: { path: z.string() } },
      async (args) => {
        if (args.path.startsWith('leak/')) return jsonError(upstreamText(500), 'UPSTREAM_ERROR');
        if (args.path.startsWith('abs/')) return jsonText({ path: storePath(args.path), frontmatter: {}, body: 'note body' });
        return { content: [{ type: 'text', text: '{"path":"a.md"}' }] };
      },
    );
    server.registerTool(
      'relate',
      { description: 'Related notes (stub).', inputSchema: { path: z.string() } },
      async (args) => {
        if (args.path.startsWith('leak/')) return jsonError(upstreamText(502), 'UPSTREAM_ERROR');
        return jsonText({ path: storePath(args.path), related: [{ path: storePath('b.md'), score: 1, title: 'B' }, { path: 'c.md', score: 0.5 }] });
      },
    );
    // A prompt that fails upstream, as the gateway's do: the error text in its message.
    server.registerPrompt(
      'daily-brief',
      { description: 'Daily brief (stub).' },
      async () => ({ description: 'Daily brief', messages: [{ role: 'user', content: { type: 'text', text: `Error loading notes: ${upstreamText(500)}` } }] }),
    );
    // The three body-free views, as a gateway version could serve them: the sidecar
    // answers each itself, so none of these handlers may ever run.
    for (const [name, description] of [
      ['get_section_source', 'Return body-free SectionSource v0 metadata for one hosted note.'],
      ['get_note_outline', 'Return the body-free NoteOutline v1 (headings only) for one hosted note.'],
      ['get_document_tree', 'Return the body-free DocumentTree v0 (headings nested by level) for one hosted note.'],
    ]) {
      server.registerTool(
        name,
        { description, inputSchema: { path: z.string().describe('Vault-relative note path') } },
        async (args) => {
          state.counters.tool += 1;
          return { content: [{ type: 'text', text: JSON.stringify({ reached: name, path: args.path, body: CANARY }) }] };
        },
      );
    }
    // Two resource templates, as the gateway registers its note reads: an ordinary one,
    // and one for section sources that the sidecar must keep out of reach.
    server.registerResource(
      'note',
      new ResourceTemplate('knowtation://hosted/vault/{+path}', { list: undefined }),
      { description: 'One note (stub).' },
      async (uri, { path }) => {
        // A failed read, as the gateway throws it.
        if (String(path).startsWith('leak/')) throw new McpError(ErrorCode.InternalError, upstreamText(404));
        return { contents: [{ uri: uri.href, text: 'note (stub)' }] };
      },
    );
    for (const view of ['section-source', 'note-outline', 'document-tree']) {
      server.registerResource(
        view,
        new ResourceTemplate(`knowtation://hosted/${view}/{+path}`, { list: undefined }),
        { description: `The ${view} view of one note (stub).` },
        async (uri) => {
          state.counters.resource += 1;
          return { contents: [{ uri: uri.href, text: JSON.stringify({ reached: `${view} resource`, body: CANARY }) }] };
        },
      );
    }
    return server;
  }

  // What the SDK dispatched. Every message the transport delivers to the protocol layer
  // passes through `transport.onmessage`; for `tools/call` the McpServer reads
  // `_registeredTools[request.params.name]` synchronously inside the handler registered
  // for that method, after the SDK's zod parsing, so a read trap on that table, armed
  // while that handler runs, sees exactly the name the SDK dispatched on.
  function instrument(mcpServer, transport) {
    const entries = new WeakMap();
    let sink = null;
    const tools = mcpServer._registeredTools;
    mcpServer._registeredTools = new Proxy(tools, {
      get(target, key, receiver) {
        if (sink && typeof key === 'string' && sink.lookups.length === 0) sink.lookups.push(key);
        return Reflect.get(target, key, receiver);
      },
    });
    const handlers = mcpServer.server._requestHandlers;
    const toolsCall = handlers.get('tools/call');
    handlers.set('tools/call', (request, extra) => {
      const entry = entries.get(request) ?? { orphan: true, lookups: [] };
      sink = entry;
      try {
        return toolsCall(request, extra);
      } finally {
        sink = null;
        entry.toolName = entry.lookups[0];
      }
    });
    const deliver = transport.onmessage;
    transport.onmessage = (message, extra) => {
      const kind = isJSONRPCRequest(message)
        ? 'request'
        : isJSONRPCNotification(message)
          ? 'notification'
          : isJSONRPCResultResponse(message) || isJSONRPCErrorResponse(message)
            ? 'response'
            : 'other';
      const entry = { kind, method: message?.method, id: message?.id, lookups: [], toolName: undefined };
      if (message && typeof message === 'object') entries.set(message, entry);
      const rec = state.current;
      if (rec) rec.dispatched.push(entry);
      else state.orphanDispatches = (state.orphanDispatches || 0) + 1;
      return deliver(message, extra);
    };
  }

  // ---- the /mcp router ---------------------------------------------------------------
  const sessions = new Map(); // id -> { transport, userId, lastActive }
  const userSessions = new Map(); // userId -> Set(id)

  function destroySession(id) {
    const s = sessions.get(id);
    if (!s) return;
    sessions.delete(id);
    const set = userSessions.get(s.userId);
    if (set) {
      set.delete(id);
      if (set.size === 0) userSessions.delete(s.userId);
    }
    try {
      s.transport.close?.();
    } catch {
      /* closing a dead transport */
    }
  }

  // Activity times come from a clock finer than the gateway's `Date.now()`, so that two
  // requests in the same millisecond keep their order and the eviction below is the
  // one the order of requests implies.
  const clock = () => performance.now();

  // The least recently active session of a user who holds the cap goes; one at most.
  function evictOldest(uid) {
    const ids = userSessions.get(uid);
    if (!ids || ids.size < MAX_SESSIONS_PER_USER) return;
    let victim = null;
    for (const id of ids) {
      const s = sessions.get(id);
      if (s && (victim === null || s.lastActive < sessions.get(victim).lastActive)) victim = id;
    }
    if (victim !== null) destroySession(victim);
  }

  const sessionNotFound = { jsonrpc: '2.0', error: { code: -32600, message: 'Session not found' } };

  const router = express.Router();
  router.use((req, res, next) => {
    if (req.parityRecord) req.parityRecord.mcpRoute = true;
    // A POST to the router's root is a POST to the MCP endpoint, whatever happens next.
    if (req.parityRecord && req.method === 'POST' && req.path === '/') req.parityRecord.mcp = true;
    const uid = subOf(req.headers.authorization);
    if (!uid) return res.status(401).json({ jsonrpc: '2.0', error: { code: -32600, message: 'Unauthorized' } });
    req.mcpUserId = uid;
    next();
  });

  function ownSession(req) {
    const sid = req.headers['mcp-session-id'];
    if (!sid) return null;
    const s = sessions.get(String(sid));
    return s && s.userId === req.mcpUserId ? s : null;
  }

  router.post('/', async (req, res) => {
    if (req.parityRecord) req.parityRecord.mcp = true;
    try {
      const own = ownSession(req);
      if (own) {
        own.lastActive = clock();
        await own.transport.handleRequest(req, res, req.body);
        return;
      }
      // Whatever the message: no live session of this caller means a new one, which the
      // SDK refuses as not initialized unless the message initializes it.
      const uid = req.mcpUserId;
      evictOldest(uid);
      state.opened += 1;
      if (req.parityRecord) req.parityRecord.opened = true;
      const ctx = await hostedContext(req);
      if (!ctx) return res.status(403).json({ jsonrpc: '2.0', error: { code: -32600, message: 'No hosted access' } });
      const resumable = eventStoreUsers.includes(uid) ? { eventStore: new EventStore(), retryInterval: 1000 } : {};
      const transport = new StreamableHTTPServerTransport({
        ...resumable,
        sessionIdGenerator: () => randomUUID(),
        onsessioninitialized: (id) => {
          sessions.set(id, { transport, userId: uid, lastActive: clock() });
          const set = userSessions.get(uid) || new Set();
          set.add(id);
          userSessions.set(uid, set);
        },
      });
      const mcpServer = createMcpServer();
      await mcpServer.connect(transport);
      instrument(mcpServer, transport);
      await transport.handleRequest(req, res, req.body);
    } catch (e) {
      if (!res.headersSent) {
        res.status(500).json({ jsonrpc: '2.0', error: { code: -32603, message: e?.message || 'Internal error' } });
      }
    }
  });

  router.get('/', async (req, res) => {
    const own = ownSession(req);
    if (!own) return res.status(404).json(sessionNotFound);
    own.lastActive = clock();
    await own.transport.handleRequest(req, res, req.body);
  });

  router.delete('/', (req, res) => {
    const sid = req.headers['mcp-session-id'];
    if (sid && ownSession(req)) destroySession(String(sid));
    res.status(200).json({ ok: true });
  });

  // ---- the gateway app ---------------------------------------------------------------
  const app = express();
  app.set('trust proxy', 1);
  app.set('etag', false);

  // Recording (the stand-in's own; runs before anything else sees the request).
  app.use((req, res, next) => {
    const rec = {
      method: req.method,
      target: req.url,
      rawHeaders: req.rawHeaders.slice(),
      headers: { ...req.headers },
      body: null,
      mcp: false,
      mcpRoute: false,
      dispatched: [],
      status: null,
      overlap: state.inFlight > 0,
      // Express's reading of the client, as its one trusted hop (`trust proxy` = 1) told it.
      client: { ip: req.ip, protocol: req.protocol, hostname: req.hostname, rateLimit: null },
    };
    state.inFlight += 1;
    state.requests.push(rec);
    state.current = rec;
    req.parityRecord = rec;
    res.on('close', () => {
      state.inFlight -= 1;
      if (req.rateLimit) rec.client.rateLimit = { key: req.rateLimit.key, used: req.rateLimit.used };
      rec.status = res.statusCode;
    });
    next();
  });

  // The Netlify function prefix, stripped once from the path (query kept).
  app.use((req, _res, next) => {
    const raw = req.url || '/';
    const q = raw.indexOf('?');
    const pathPart = q >= 0 ? raw.slice(0, q) : raw;
    const query = q >= 0 ? raw.slice(q) : '';
    if (pathPart === NETLIFY_PREFIX || pathPart.startsWith(`${NETLIFY_PREFIX}/`)) {
      const rest = pathPart.slice(NETLIFY_PREFIX.length) || '/';
      req.url = rest + query;
      req.originalUrl = rest + query;
      delete req._parsedUrl;
      delete req._parsedOriginalUrl;
    }
    next();
  });

  app.use(
    express.json({
      limit: '10mb',
      verify: (req, _res, buf) => {
        if (req.parityRecord) req.parityRecord.body = Buffer.from(buf);
      },
    }),
  );

  // Bodies express.json did not read (another media type): drained for the record only.
  app.use(async (req, _res, next) => {
    if (!req._body && req.parityRecord && !req.readableEnded) {
      req.parityRecord.body = await readAll(req);
    }
    next();
  });

  // The OAuth routes, as the gateway mounts them (`mcpAuthRouter` with
  // `rateLimit: { validate: false }` on each), over a provider that registers any client
  // and keeps none.
  const rateLimit = { rateLimit: { validate: false } };
  const refuse = async () => {
    throw new Error('not part of the stand-in');
  };
  app.use(
    mcpAuthRouter({
      provider: {
        clientsStore: { getClient: async () => undefined, registerClient: async (client) => client },
        authorize: async (_client, _params, res) => res.status(400).json({ error: 'not part of the stand-in' }),
        challengeForAuthorizationCode: refuse,
        exchangeAuthorizationCode: refuse,
        exchangeRefreshToken: refuse,
        verifyAccessToken: refuse,
      },
      issuerUrl: new URL('https://hub.example'),
      scopesSupported: ['vault:read', 'vault:write', 'vault:admin'],
      authorizationOptions: rateLimit,
      tokenOptions: rateLimit,
      clientRegistrationOptions: rateLimit,
      revocationOptions: rateLimit,
    }),
  );

  for (const route of ['section-source', 'note-outline']) {
    app.get(`/api/v1/${route}`, (req, res) => {
      state.counters.rest += 1;
      res.status(200).json({ reached: route, body: CANARY });
    });
  }

  app.use('/mcp', router);

  // The SDK's DNS-rebinding protection, on a route of its own (stateless: a transport per
  // request), for comparing answers.
  app.all('/parity/rebinding', async (req, res) => {
    const transport = new StreamableHTTPServerTransport({
      sessionIdGenerator: undefined,
      enableDnsRebindingProtection: true,
      allowedOrigins: ['https://allowed.example'],
    });
    await transport.handleRequest(req, res, req.body);
  });

  app.use((req, res) => {
    res.status(404).json({ error: 'Not found', code: 'NOT_FOUND', standin: 'catch-all' });
  });

  // eslint-disable-next-line no-unused-vars
  app.use((err, req, res, next) => {
    if (req.parityRecord) req.parityRecord.error = err?.message || String(err);
    const status =
      typeof err.status === 'number' && err.status >= 400 && err.status < 600
        ? err.status
        : typeof err.statusCode === 'number' && err.statusCode >= 400 && err.statusCode < 600
          ? err.statusCode
          : 500;
    res.status(status).json({ error: err.message || 'Internal error', code: err.code || 'INTERNAL_ERROR' });
  });

  const gateway = http.createServer(app);
  gateway.keepAliveTimeout = 30_000;
  const gatewayUrl = await listen(gateway, host);

  return {
    gatewayUrl,
    bridgeUrl,
    canisterUrl,
    state,
    /** The owner of a live session, or undefined. */
    sessionOwner(id) {
      return sessions.get(id)?.userId;
    },
    /** The live session ids of `uid`. */
    sessionsOf(uid) {
      return [...(userSessions.get(uid) || [])];
    },
    /** Forgets every session and its transport, as a gateway restart does. */
    restart() {
      for (const id of [...sessions.keys()]) destroySession(id);
    },
    /** Forgets the per-request records (counters are kept). */
    takeRequests() {
      const out = state.requests;
      state.requests = [];
      state.current = null;
      return out;
    },
    async close() {
      for (const id of [...sessions.keys()]) destroySession(id);
      for (const s of [gateway, bridge, canister]) {
        s.closeAllConnections?.();
        await new Promise((r) => s.close(() => r()));
      }
    },
  };
}
