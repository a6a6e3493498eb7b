// deploy/kubernetes/check runs this with the gateway's NODE_OPTIONS (the loopback.cjs
// preload from the rendered ConfigMap): every way a Node program can ask for a TCP
// listener must end up on 127.0.0.1. Run without the preload, it must fail (exit 1).
'use strict';

const net = require('net');
const http = require('http');

const cases = [
  ['listen(port)', (s, cb) => { s.listen(0); s.once('listening', cb); }],
  ["listen('port') as from an environment variable", (s, cb) => s.listen('0', cb)],
  ["listen(port, '0.0.0.0', cb)", (s, cb) => s.listen(0, '0.0.0.0', cb)],
  ["listen(port, '::', backlog, cb)", (s, cb) => s.listen(0, '::', 511, cb)],
  ['listen(port, backlog, cb)', (s, cb) => s.listen(0, 511, cb)],
  ['listen(port, undefined, cb)', (s, cb) => s.listen(0, undefined, cb)],
  ['listen(cb)', (s, cb) => s.listen(cb)],
  ['listen()', (s, cb) => { s.listen(); s.once('listening', cb); }],
  ["listen({ port, host: '::', ipv6Only })", (s, cb) => s.listen({ port: 0, host: '::', ipv6Only: true }, cb)],
  ['listen({ port })', (s, cb) => s.listen({ port: 0 }, cb)],
  ['http.Server (as express app.listen)', (s, cb) => s.listen(0, cb), () => http.createServer()],
];

(async () => {
  let failed = 0;
  for (const [name, start, make] of cases) {
    const server = make ? make() : net.createServer();
    await new Promise((resolve) => start(server, resolve));
    const { address, port } = server.address();
    const ok = address === '127.0.0.1';
    if (!ok) failed += 1;
    process.stdout.write(`     ${ok ? 'ok ' : 'BAD'} ${name}: ${address} port ${port}\n`);
    await new Promise((resolve) => server.close(resolve));
  }
  process.exitCode = failed ? 1 : 0;
})();
