// The reference server of the conformance run: an MCP server on the MCP SDK 1.27.1 (the
// gateway's version) that implements what the conformance suite's server scenarios call,
// written for this suite. It serves streamable HTTP at `/mcp` on the SDK's own Express app
// (`createMcpExpressApp`, which refuses a non-localhost `Host` with 403, the SDK's
// DNS-rebinding protection), one `StreamableHTTPServerTransport` + low-level `Server` per
// session, with an event store, so that streams of protocol 2025-11-25 start with a
// priming event (`id`, `retry`, empty `data`) and can be resumed with `Last-Event-ID`.
//
// Server-to-client requests of the scenarios' tools (sampling, elicitation) and their
// notifications (logging, progress) go on the stream of the request that caused them, as
// the specification recommends: nothing in a scenario then depends on the standalone
// `GET /mcp` stream being open. The tools `standalone_sampling` and
// `standalone_elicitation`, which no scenario calls, send theirs on the standalone stream
// instead, for `race.mjs`.

import { randomUUID } from 'node:crypto';
import { Server } from '@modelcontextprotocol/sdk/server/index.js';
import { StreamableHTTPServerTransport } from '@modelcontextprotocol/sdk/server/streamableHttp.js';
import { createMcpExpressApp } from '@modelcontextprotocol/sdk/server/express.js';
import {
  CallToolRequestSchema,
  CompleteRequestSchema,
  CreateMessageResultSchema,
  ElicitResultSchema,
  GetPromptRequestSchema,
  isInitializeRequest,
  ListPromptsRequestSchema,
  ListResourcesRequestSchema,
  ListResourceTemplatesRequestSchema,
  ListToolsRequestSchema,
  McpError,
  ErrorCode,
  ReadResourceRequestSchema,
  SetLevelRequestSchema,
  SubscribeRequestSchema,
  UnsubscribeRequestSchema,
} from '@modelcontextprotocol/sdk/types.js';

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// ---- fixed content -------------------------------------------------------------------------

// A 1×1 PNG (one red pixel).
const PNG_1X1 =
  'iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg==';

/** A valid WAV file: 8 kHz, 8-bit mono, `samples` samples of silence. */
function wav(samples = 80) {
  const b = Buffer.alloc(44 + samples, 0x80);
  b.write('RIFF', 0, 'ascii');
  b.writeUInt32LE(36 + samples, 4);
  b.write('WAVE', 8, 'ascii');
  b.write('fmt ', 12, 'ascii');
  b.writeUInt32LE(16, 16); // fmt chunk size
  b.writeUInt16LE(1, 20); // PCM
  b.writeUInt16LE(1, 22); // mono
  b.writeUInt32LE(8000, 24); // sample rate
  b.writeUInt32LE(8000, 28); // byte rate
  b.writeUInt16LE(1, 32); // block align
  b.writeUInt16LE(8, 34); // bits per sample
  b.write('data', 36, 'ascii');
  b.writeUInt32LE(samples, 40);
  return b.toString('base64');
}
const WAV_SILENCE = wav();

const LEVELS = ['debug', 'info', 'notice', 'warning', 'error', 'critical', 'alert', 'emergency'];

const EMPTY_OBJECT_SCHEMA = { type: 'object', properties: {} };

const TOOLS = [
  { name: 'test_simple_text', description: 'Returns one text block.', inputSchema: EMPTY_OBJECT_SCHEMA },
  { name: 'test_image_content', description: 'Returns one PNG image block.', inputSchema: EMPTY_OBJECT_SCHEMA },
  { name: 'test_audio_content', description: 'Returns one WAV audio block.', inputSchema: EMPTY_OBJECT_SCHEMA },
  { name: 'test_embedded_resource', description: 'Returns one embedded text resource.', inputSchema: EMPTY_OBJECT_SCHEMA },
  {
    name: 'test_multiple_content_types',
    description: 'Returns a text, an image and an embedded resource block.',
    inputSchema: EMPTY_OBJECT_SCHEMA,
  },
  {
    name: 'test_tool_with_logging',
    description: 'Sends three log messages at level info while it runs.',
    inputSchema: EMPTY_OBJECT_SCHEMA,
  },
  { name: 'test_error_handling', description: 'Always fails with a tool error.', inputSchema: EMPTY_OBJECT_SCHEMA },
  {
    name: 'test_tool_with_progress',
    description: 'Reports progress 0, 50 and 100 of 100 when given a progress token.',
    inputSchema: EMPTY_OBJECT_SCHEMA,
  },
  {
    name: 'test_sampling',
    description: 'Asks the client for a completion of the prompt (sampling/createMessage).',
    inputSchema: {
      type: 'object',
      properties: { prompt: { type: 'string', description: 'The prompt to send' } },
      required: ['prompt'],
    },
  },
  {
    name: 'test_elicitation',
    description: 'Asks the user for a username and an email address (elicitation/create).',
    inputSchema: {
      type: 'object',
      properties: { message: { type: 'string', description: 'The message to show the user' } },
      required: ['message'],
    },
  },
  {
    name: 'test_elicitation_sep1034_defaults',
    description: 'Elicits one field of each primitive type, each with a default.',
    inputSchema: EMPTY_OBJECT_SCHEMA,
  },
  {
    name: 'test_elicitation_sep1330_enums',
    description: 'Elicits the five kinds of enum field.',
    inputSchema: EMPTY_OBJECT_SCHEMA,
  },
  {
    name: 'test_reconnection',
    description: 'Closes its own event stream before it answers, so that the client resumes it with Last-Event-ID.',
    inputSchema: EMPTY_OBJECT_SCHEMA,
  },
  {
    name: 'json_schema_2020_12_tool',
    description: 'Tool with JSON Schema 2020-12 features',
    inputSchema: {
      $schema: 'https://json-schema.org/draft/2020-12/schema',
      type: 'object',
      $defs: {
        address: {
          type: 'object',
          properties: { street: { type: 'string' }, city: { type: 'string' } },
        },
      },
      properties: { name: { type: 'string' }, address: { $ref: '#/$defs/address' } },
      additionalProperties: false,
    },
  },
  {
    name: 'standalone_sampling',
    description: 'Asks the client for a completion on the standalone GET stream (race measurement).',
    inputSchema: EMPTY_OBJECT_SCHEMA,
  },
  {
    name: 'standalone_elicitation',
    description: 'Asks the user for input on the standalone GET stream (race measurement).',
    inputSchema: EMPTY_OBJECT_SCHEMA,
  },
];

const RESOURCES = [
  { uri: 'test://static-text', name: 'static-text', description: 'A fixed text.', mimeType: 'text/plain' },
  { uri: 'test://static-binary', name: 'static-binary', description: 'A fixed PNG image.', mimeType: 'image/png' },
  { uri: 'test://watched-resource', name: 'watched-resource', description: 'A text one may subscribe to.', mimeType: 'text/plain' },
];

const TEMPLATE = /^test:\/\/template\/([^/]+)\/data$/;

const PROMPTS = [
  { name: 'test_simple_prompt', description: 'A prompt without arguments.' },
  {
    name: 'test_prompt_with_arguments',
    description: 'A prompt that quotes its two arguments.',
    arguments: [
      { name: 'arg1', description: 'First argument', required: true },
      { name: 'arg2', description: 'Second argument', required: true },
    ],
  },
  {
    name: 'test_prompt_with_embedded_resource',
    description: 'A prompt that embeds the resource it is given.',
    arguments: [{ name: 'resourceUri', description: 'URI of the resource to embed', required: true }],
  },
  { name: 'test_prompt_with_image', description: 'A prompt with an image.' },
];

const COMPLETIONS = ['paris', 'park', 'party', 'test', 'testing', 'tested'];

/** The elicitation of `test_elicitation`. */
function contactRequest(message) {
  return {
    method: 'elicitation/create',
    params: {
      message,
      requestedSchema: {
        type: 'object',
        properties: {
          username: { type: 'string', description: "User's response" },
          email: { type: 'string', description: "User's email address" },
        },
        required: ['username', 'email'],
      },
    },
  };
}

function samplingRequest(prompt) {
  return {
    method: 'sampling/createMessage',
    params: { messages: [{ role: 'user', content: { type: 'text', text: prompt } }], maxTokens: 100 },
  };
}

const text = (t) => ({ content: [{ type: 'text', text: t }] });
const toolError = (t) => ({ content: [{ type: 'text', text: t }], isError: true });

// ---- the event store -------------------------------------------------------------------------

/**
 * Events of every stream of one session, in memory, at most `limit` of them (the oldest go
 * first). Ids are `<stream>.<sequence>`; a replay sends the later JSON-RPC messages of the
 * same stream, never the priming events (they carry no message).
 */
class EventStore {
  constructor(limit = 1000) {
    this.limit = limit;
    this.seq = 0;
    this.events = new Map(); // id -> { stream, message }
  }

  async storeEvent(stream, message) {
    this.seq += 1;
    const id = `${stream}.${this.seq}`;
    this.events.set(id, { stream, message });
    if (this.events.size > this.limit) this.events.delete(this.events.keys().next().value);
    return id;
  }

  async getStreamIdForEventId(id) {
    return this.events.get(id)?.stream;
  }

  async replayEventsAfter(lastId, { send }) {
    const last = this.events.get(lastId);
    if (!last) return '';
    let after = false;
    for (const [id, e] of this.events) {
      if (id === lastId) {
        after = true;
      } else if (after && e.stream === last.stream && e.message && e.message.jsonrpc) {
        await send(id, e.message);
      }
    }
    return last.stream;
  }
}

// ---- one session's MCP server -------------------------------------------------------------

function mcpServer() {
  const server = new Server(
    { name: 'knowtation-sidecar-conformance-reference', version: '1.0.0' },
    {
      capabilities: {
        tools: {},
        resources: { subscribe: true },
        prompts: {},
        logging: {},
        completions: {},
      },
    },
  );
  let level = 'info';
  const subscriptions = new Set();
  const logs = (l) => LEVELS.indexOf(l) >= LEVELS.indexOf(level);

  server.setRequestHandler(SetLevelRequestSchema, async (req) => {
    level = req.params.level;
    return {};
  });

  server.setRequestHandler(ListToolsRequestSchema, async () => ({ tools: TOOLS }));

  server.setRequestHandler(CallToolRequestSchema, async (req, extra) => {
    const args = req.params.arguments ?? {};
    const caps = server.getClientCapabilities() ?? {};
    switch (req.params.name) {
      case 'test_simple_text':
        return text('This is a simple text response for testing.');
      case 'test_image_content':
        return { content: [{ type: 'image', data: PNG_1X1, mimeType: 'image/png' }] };
      case 'test_audio_content':
        return { content: [{ type: 'audio', data: WAV_SILENCE, mimeType: 'audio/wav' }] };
      case 'test_embedded_resource':
        return {
          content: [
            {
              type: 'resource',
              resource: { uri: 'test://embedded-resource', mimeType: 'text/plain', text: 'This is an embedded resource content.' },
            },
          ],
        };
      case 'test_multiple_content_types':
        return {
          content: [
            { type: 'text', text: 'Multiple content types test:' },
            { type: 'image', data: PNG_1X1, mimeType: 'image/png' },
            {
              type: 'resource',
              resource: {
                uri: 'test://mixed-content-resource',
                mimeType: 'application/json',
                text: JSON.stringify({ test: 'data', value: 123 }),
              },
            },
          ],
        };
      case 'test_tool_with_logging': {
        const steps = ['Tool execution started', 'Tool processing data', 'Tool execution completed'];
        for (let i = 0; i < steps.length; i += 1) {
          if (i > 0) await sleep(50);
          if (logs('info')) {
            await extra.sendNotification({
              method: 'notifications/message',
              params: { level: 'info', logger: 'reference', data: steps[i] },
            });
          }
        }
        return text('Logged three messages.');
      }
      case 'test_error_handling':
        return toolError('This tool intentionally returns an error for testing');
      case 'test_tool_with_progress': {
        const token = req.params._meta?.progressToken;
        for (const [i, progress] of [0, 50, 100].entries()) {
          if (i > 0) await sleep(50);
          if (token !== undefined) {
            await extra.sendNotification({
              method: 'notifications/progress',
              params: { progressToken: token, progress, total: 100 },
            });
          }
        }
        return text('Progress reported.');
      }
      case 'test_sampling': {
        if (!caps.sampling) return toolError('The client does not support sampling.');
        const r = await extra.sendRequest(samplingRequest(String(args.prompt ?? '')), CreateMessageResultSchema);
        const reply = r.content?.type === 'text' ? r.content.text : JSON.stringify(r.content);
        return text(`LLM response: ${reply}`);
      }
      case 'test_elicitation': {
        if (!caps.elicitation) return toolError('The client does not support elicitation.');
        const r = await extra.sendRequest(contactRequest(String(args.message ?? '')), ElicitResultSchema);
        return text(`User response: action=${r.action}, content=${JSON.stringify(r.content ?? {})}`);
      }
      case 'test_elicitation_sep1034_defaults': {
        if (!caps.elicitation) return toolError('The client does not support elicitation.');
        const r = await extra.sendRequest(
          {
            method: 'elicitation/create',
            params: {
              message: 'Please review the defaults.',
              requestedSchema: {
                type: 'object',
                properties: {
                  name: { type: 'string', description: 'Name', default: 'John Doe' },
                  age: { type: 'integer', description: 'Age', default: 30 },
                  score: { type: 'number', description: 'Score', default: 95.5 },
                  status: { type: 'string', description: 'Status', enum: ['active', 'inactive', 'pending'], default: 'active' },
                  verified: { type: 'boolean', description: 'Verified', default: true },
                },
              },
            },
          },
          ElicitResultSchema,
        );
        return text(`Elicitation completed: action=${r.action}, content=${JSON.stringify(r.content ?? {})}`);
      }
      case 'test_elicitation_sep1330_enums': {
        if (!caps.elicitation) return toolError('The client does not support elicitation.');
        const r = await extra.sendRequest(
          {
            method: 'elicitation/create',
            params: {
              message: 'Please choose.',
              requestedSchema: {
                type: 'object',
                properties: {
                  untitledSingle: { type: 'string', enum: ['option1', 'option2', 'option3'] },
                  titledSingle: {
                    type: 'string',
                    oneOf: [
                      { const: 'value1', title: 'First Option' },
                      { const: 'value2', title: 'Second Option' },
                      { const: 'value3', title: 'Third Option' },
                    ],
                  },
                  legacyEnum: {
                    type: 'string',
                    enum: ['opt1', 'opt2', 'opt3'],
                    enumNames: ['Option One', 'Option Two', 'Option Three'],
                  },
                  untitledMulti: { type: 'array', items: { type: 'string', enum: ['option1', 'option2', 'option3'] } },
                  titledMulti: {
                    type: 'array',
                    items: {
                      anyOf: [
                        { const: 'value1', title: 'First Choice' },
                        { const: 'value2', title: 'Second Choice' },
                        { const: 'value3', title: 'Third Choice' },
                      ],
                    },
                  },
                },
              },
            },
          },
          ElicitResultSchema,
        );
        return text(`Elicitation completed: action=${r.action}, content=${JSON.stringify(r.content ?? {})}`);
      }
      case 'test_reconnection':
        // Only a stream that began with a priming event can be resumed (protocol
        // 2025-11-25 and an event store): the SDK offers to close only such a stream.
        if (extra.closeSSEStream) {
          extra.closeSSEStream();
          await sleep(100);
        }
        return text('Answered after the stream was closed.');
      case 'standalone_sampling':
      case 'standalone_elicitation': {
        // Not related to the call: the SDK sends it on the standalone GET stream, and drops
        // it there when no such stream is open yet.
        const timeout = Number(args.timeoutMs) > 0 ? Number(args.timeoutMs) : 2000;
        const sampling = req.params.name === 'standalone_sampling';
        try {
          if (sampling) await server.request(samplingRequest('race'), CreateMessageResultSchema, { timeout });
          else await server.request(contactRequest('race'), ElicitResultSchema, { timeout });
          return text('answered');
        } catch (e) {
          return toolError(e instanceof McpError && e.code === ErrorCode.RequestTimeout ? 'lost' : `failed: ${e.message}`);
        }
      }
      default:
        throw new McpError(ErrorCode.InvalidParams, `Tool ${req.params.name} not found`);
    }
  });

  server.setRequestHandler(ListResourcesRequestSchema, async () => ({ resources: RESOURCES }));
  server.setRequestHandler(ListResourceTemplatesRequestSchema, async () => ({
    resourceTemplates: [
      { uriTemplate: 'test://template/{id}/data', name: 'template-data', description: 'Data for one id.', mimeType: 'application/json' },
    ],
  }));
  server.setRequestHandler(ReadResourceRequestSchema, async (req) => {
    const { uri } = req.params;
    if (uri === 'test://static-text') {
      return { contents: [{ uri, mimeType: 'text/plain', text: 'This is the content of the static text resource.' }] };
    }
    if (uri === 'test://static-binary') return { contents: [{ uri, mimeType: 'image/png', blob: PNG_1X1 }] };
    if (uri === 'test://watched-resource') return { contents: [{ uri, mimeType: 'text/plain', text: 'Watched.' }] };
    const m = TEMPLATE.exec(uri);
    if (m) {
      const id = decodeURIComponent(m[1]);
      return {
        contents: [{ uri, mimeType: 'application/json', text: JSON.stringify({ id, templateTest: true, data: `Data for ID: ${id}` }) }],
      };
    }
    throw new McpError(ErrorCode.InvalidParams, `Resource ${uri} not found`);
  });
  server.setRequestHandler(SubscribeRequestSchema, async (req) => {
    subscriptions.add(req.params.uri);
    return {};
  });
  server.setRequestHandler(UnsubscribeRequestSchema, async (req) => {
    subscriptions.delete(req.params.uri);
    return {};
  });

  server.setRequestHandler(ListPromptsRequestSchema, async () => ({ prompts: PROMPTS }));
  server.setRequestHandler(GetPromptRequestSchema, async (req) => {
    const args = req.params.arguments ?? {};
    switch (req.params.name) {
      case 'test_simple_prompt':
        return { messages: [{ role: 'user', content: { type: 'text', text: 'This is a simple prompt for testing.' } }] };
      case 'test_prompt_with_arguments':
        return {
          messages: [
            { role: 'user', content: { type: 'text', text: `Prompt with arguments: arg1='${args.arg1}', arg2='${args.arg2}'` } },
          ],
        };
      case 'test_prompt_with_embedded_resource':
        return {
          messages: [
            {
              role: 'user',
              content: {
                type: 'resource',
                resource: { uri: String(args.resourceUri ?? ''), mimeType: 'text/plain', text: 'Embedded resource content for testing.' },
              },
            },
            { role: 'user', content: { type: 'text', text: 'Please process the embedded resource above.' } },
          ],
        };
      case 'test_prompt_with_image':
        return {
          messages: [
            { role: 'user', content: { type: 'image', data: PNG_1X1, mimeType: 'image/png' } },
            { role: 'user', content: { type: 'text', text: 'Please analyze the image above.' } },
          ],
        };
      default:
        throw new McpError(ErrorCode.InvalidParams, `Prompt ${req.params.name} not found`);
    }
  });

  server.setRequestHandler(CompleteRequestSchema, async (req) => {
    const prefix = String(req.params.argument?.value ?? '');
    const values = COMPLETIONS.filter((v) => v.startsWith(prefix));
    return { completion: { values, total: values.length, hasMore: false } };
  });

  return server;
}

// ---- HTTP ------------------------------------------------------------------------------------

const sessionNotFound = (res) =>
  res.status(404).json({ jsonrpc: '2.0', error: { code: -32600, message: 'Session not found' }, id: null });

/**
 * Starts the reference server on `host` (loopback), port `port` (0: any free one).
 * `record(event)`, when given, is told of every request to `/mcp` as it arrives
 * (`{kind: 'http', method, rpc, tool, session, socket, nth, at}`: `nth` is 1 on a new
 * connection).
 */
export async function startReferenceServer({ host = '127.0.0.1', port = 0, record } = {}) {
  const app = createMcpExpressApp({ host });
  const sessions = new Map(); // id -> transport
  let sockets = 0;
  const socketIds = new WeakMap(); // socket -> { id, requests }

  app.all('/mcp', async (req, res) => {
    if (!socketIds.has(req.socket)) socketIds.set(req.socket, { id: (sockets += 1), requests: 0 });
    const sock = socketIds.get(req.socket);
    sock.requests += 1;
    const id = req.headers['mcp-session-id'];
    const body = req.body;
    record?.({
      kind: 'http',
      method: req.method,
      rpc: Array.isArray(body) ? body.map((m) => m?.method ?? 'response') : body?.method ?? (req.method === 'POST' ? 'response' : undefined),
      tool: body?.params?.name,
      session: id,
      socket: sock.id,
      // 1 on a new connection.
      nth: sock.requests,
      at: performance.timeOrigin + performance.now(),
    });
    try {
      if (typeof id === 'string' && id !== '') {
        const transport = sessions.get(id);
        if (!transport) return sessionNotFound(res);
        return await transport.handleRequest(req, res, body);
      }
      if (req.method !== 'POST' || !isInitializeRequest(body)) return sessionNotFound(res);
      const transport = new StreamableHTTPServerTransport({
        sessionIdGenerator: () => randomUUID(),
        eventStore: new EventStore(),
        retryInterval: 200,
        onsessioninitialized: (sid) => sessions.set(sid, transport),
      });
      transport.onclose = () => {
        if (transport.sessionId) sessions.delete(transport.sessionId);
      };
      await mcpServer().connect(transport);
      return await transport.handleRequest(req, res, body);
    } catch (e) {
      if (!res.headersSent) {
        res.status(500).json({ jsonrpc: '2.0', error: { code: -32603, message: `Internal error: ${e.message}` }, id: null });
      }
    }
  });

  const http = await new Promise((resolve, reject) => {
    const s = app.listen(port, host, () => resolve(s));
    s.once('error', reject);
  });
  const { port: bound } = http.address();
  return {
    url: `http://${host}:${bound}/mcp`,
    port: bound,
    sessions: () => sessions.size,
    async close() {
      for (const t of sessions.values()) await t.close().catch(() => {});
      http.closeAllConnections?.();
      await new Promise((r) => http.close(() => r()));
    },
  };
}

// `node server.mjs [port]`: the reference server alone, for a run by hand. Forked with an
// IPC channel (race.mjs), it sends its URL and then every record to its parent.
if (import.meta.url === `file://${process.argv[1]}`) {
  const ipc = typeof process.send === 'function';
  const s = await startReferenceServer({ port: Number(process.argv[2] ?? 0), record: ipc ? (e) => process.send(e) : undefined });
  if (ipc) {
    process.send({ kind: 'listening', url: s.url });
    process.on('disconnect', () => process.exit(0));
  } else {
    console.log(`reference MCP server at ${s.url}`);
  }
}
