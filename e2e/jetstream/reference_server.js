// The reference Jetstream server (npm `jetstream` 0.13.4, Uber's lib/) with the demo's
// models, for side-by-side tests and benchmarks: every fetched scope name gets its own
// in-memory scope with a List root (the reference keeps models in memory only).
// Usage: NODE_PATH=<repo>/.tools/jetstream/node_modules node reference_server.js PORT
'use strict';

const jetstream = require('jetstream');

// Quiet unless JETSTREAM_LOG is set: the bundled winston logs everything at 'silent'
// (its level order is inverted), and debug lines of whole ScopeStates would slow the
// server down in benchmarks. Warnings and errors still go to stderr.
if (!process.env.JETSTREAM_LOG) {
  const noop = function () {};
  const toStderr = function () { console.error.apply(console, arguments); };
  jetstream.logger.replaceLogger({
    debug: noop, trace: noop, info: noop, warn: toStderr, error: toStderr, log: noop,
  });
}

const Item = jetstream.model('Item', function () {
  this.has('text', String);
  this.has('done', Boolean);
  this.has('created', Date);
});
const List = jetstream.model('List', function () {
  this.has('title', String);
  this.has('items', [Item]);
});

const port = parseInt(process.argv[2], 10);
const scopes = new Map();

function scopeFor(name, callback) {
  if (scopes.has(name)) {
    return callback(null, scopes.get(name));
  }
  const scope = jetstream.scope({ name: name });
  const root = new List();
  // Benchmarks: "preload-<N>-..." starts with N items, built in memory. The reference
  // overflows its stack (RangeError) when a client sync sets a collection of thousands.
  const preload = /^preload-(\d+)-/.exec(name);
  if (preload) {
    for (let i = 0; i < parseInt(preload[1], 10); i++) {
      const item = new Item();
      item.text = 'item ' + item.uuid.slice(0, 8);
      item.done = false;
      root.items.push(item);
    }
  }
  scope.setRoot(root, function (err) {
    if (err) {
      return callback(err);
    }
    scopes.set(name, scope);
    callback(null, scope);
  });
}

const transport = jetstream.transport.WebsocketTransport.configure({ port: port });
const server = jetstream({ transports: [transport] });
server.on('session', function (session, connection, params, callback) {
  callback();
  session.on('fetch', function (name, fetchParams, fetchCallback) {
    scopeFor(name, fetchCallback);
  });
});
// The listener binds synchronously inside start(); give it a tick before announcing.
setTimeout(function () { process.stdout.write('ready ' + port + '\n'); }, 200);
