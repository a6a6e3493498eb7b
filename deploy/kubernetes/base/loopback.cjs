// Preloaded into the gateway (NODE_OPTIONS=--require=.../loopback.cjs): the gateway
// listens on GATEWAY_PORT on every interface and has no host setting, so this makes
// every TCP listen() in the process bind 127.0.0.1, where only the sidecar in the same
// pod reaches it. Unix sockets, inherited handles and file descriptors are left alone.
'use strict';

const net = require('net');

const HOST = '127.0.0.1';
const listen = net.Server.prototype.listen;

function isPort(value) {
  return typeof value === 'number' || (typeof value === 'string' && /^[0-9]+$/.test(value));
}

net.Server.prototype.listen = function loopbackListen(...args) {
  const first = args[0];
  if (first !== null && typeof first === 'object') {
    // listen(options[, cb]); a handle or an fd carries its own address.
    const isHandle = first._handle !== undefined || typeof first.fd === 'number' ||
      first.handle !== undefined || first.path !== undefined;
    if (!isHandle) {
      args[0] = { ...first, host: HOST };
      delete args[0].ipv6Only;
    }
  } else if (isPort(first) || first === undefined || typeof first === 'function') {
    // listen([port[, host[, backlog]]][, cb]) and listen(cb): an absent or undefined
    // port is 0 (any free port), as in net.Server itself.
    const port = isPort(first) ? first : 0;
    const rest = typeof first === 'function' ? args : args.slice(1);
    if (typeof rest[0] === 'string' || rest[0] === null || (rest[0] === undefined && rest.length > 1)) {
      rest.shift();
    }
    args = [port, HOST, ...rest];
  }
  // A string that is not a port number is a Unix socket path: unchanged.
  return listen.apply(this, args);
};
