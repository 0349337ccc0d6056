// The reference Jetstream server (npm `jetstream` 0.13.4, Uber's lib/) with the demo's
// models, for side-by-side tests and benchmarks: every fetched scope name gets its own
// in-memory scope with a List root (the reference keeps models in memory only).
// Usage: NODE_PATH=<repo>/.tools/jetstream/node_modules node reference_server.js PORT
'use strict';

const jetstream = require('jetstream');

jetstream.logger.setLevel(process.env.JETSTREAM_LOG || 'silent');

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
