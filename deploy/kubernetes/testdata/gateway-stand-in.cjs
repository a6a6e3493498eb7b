// A stand-in for the Knowtation hub gateway in deploy/kubernetes/check: it listens on
// GATEWAY_PORT as the gateway does (every interface, no host setting), answers every
// request with a small JSON document naming itself, and exits 0 on SIGTERM.
'use strict';

const http = require('http');

const server = http.createServer((req, res) => {
  res.setHeader('content-type', 'application/json');
  res.end(JSON.stringify({
    standIn: 'knowtation-gateway',
    method: req.method,
    url: req.url,
    forwardedProto: req.headers['x-forwarded-proto'] || null,
  }));
});
server.listen(process.env.GATEWAY_PORT || 3340);
process.on('SIGTERM', () => {
  server.close(() => process.exit(0));
  setTimeout(() => process.exit(0), 5000).unref();
});
