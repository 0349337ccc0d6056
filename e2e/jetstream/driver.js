// One reference Jetstream client (jetstream-js from the npm package `jetstream` 0.13.4)
// driven by JSON commands, one per stdin line; one JSON answer per stdout line.
//
// Run with NODE_PATH=<repo>/.tools/jetstream/node_modules (scripts/tools/jetstream.sh).
// The client is written for browsers: it needs a WebSocket global (the `ws` package) and
// a `window` (its logger reads window.DEBUG). Models are the demo's shared list.
//
// Commands: {id, op, ...}
//   connect {url, scope, token?}  new session, fetch `scope`; answers with the state
//   state                         the list as the client sees it
//   add {text} | toggle {index} | remove {index} | title {text}
//                                 a local edit; answers when its ScopeSyncReply arrived
//   raw {message}                 send a ScopeSync built from JSON (e.g. atomic: true),
//                                 answers with the server's reply
//   offline {ms}                  drop the socket; reconnect (with the session token in
//                                 the URL, so the session resumes) only after `ms`
//   waitFor {count?, text?, items?, timeout}
//                                 until the list has `count` items, one with `text`,
//                                 or exactly `items` ([[text, done], ...])
//   stats | close
'use strict';

global.window = global.window || { DEBUG: !!process.env.JETSTREAM_DEBUG };
global.WebSocket = require('ws');

const readline = require('readline');
const J = require('jetstream/client');
const ScopeSyncMessage = require('jetstream/client/lib/message/scope-sync-message');
const SyncFragment = require('jetstream/client/lib/sync-fragment');

const Item = J.model('Item', function () {
  this.has('text', String);
  this.has('done', Boolean);
  this.has('created', Date);
});
const List = J.model('List', function () {
  this.has('title', String);
  this.has('items', [Item]);
});

let adapter = null;
let client = null;
let session = null;
let scope = null;
let list = null;
let base = null;
let closedCodes = [];
const pendingSets = [];

function out(obj) {
  process.stdout.write(JSON.stringify(obj) + '\n');
}

function snapshot() {
  if (!list) {
    return null;
  }
  return {
    rootUUID: list.uuid,
    title: list.get('title'),
    items: list.get('items').map(function (it) {
      return it ? { uuid: it.uuid, text: it.get('text'), done: it.get('done') } : null;
    }),
  };
}

function afterChanges(timeout) {
  // The scope batches local edits every 10 ms into a ChangeSet; wait for its outcome.
  return new Promise(function (resolve) {
    const timer = setTimeout(function () { resolve({ state: 'TIMEOUT' }); }, timeout || 10000);
    pendingSets.push(function (changeSet) {
      changeSet.once('changeSetComplete', function () {
        clearTimeout(timer);
        resolve({ state: 'COMPLETED' });
      });
      changeSet.once('changeSetError', function () {
        clearTimeout(timer);
        resolve({ state: changeSet._state });
      });
    });
  });
}

function connect(cmd) {
  return new Promise(function (resolve) {
    base = cmd.url;
    let url = base + (cmd.token ? '?x-jetstream-token=' + encodeURIComponent(cmd.token) : '');
    adapter = J.transport.WebSocket({ url: url });
    client = J({ transport: adapter });
    list = new List();
    const timer = setTimeout(function () { resolve({ ok: false, error: 'timeout' }); }, 15000);
    client.on('sessionDenied', function () {
      clearTimeout(timer);
      client.disconnect();
      resolve({ ok: false, error: 'sessionDenied' });
    });
    client.on('session', function (s) {
      session = s;
      // The reference client reconnects to the same URL: put the session token in it so
      // that a reconnect resumes the session (the reference server reads it there too).
      adapter.url = base + '?x-jetstream-sessiontoken=' + encodeURIComponent(s._token);
      scope = J.scope({ name: cmd.scope });
      scope.on('changes', function (sc, changeSet) {
        const waiter = pendingSets.shift();
        if (waiter) {
          waiter(changeSet);
        }
      });
      list.setScopeAndMakeRootModel(scope);
      s.fetch(scope, function (err) {
        setTimeout(function () {
          clearTimeout(timer);
          resolve(err ? { ok: false, error: err } : { ok: true, token: s._token, state: snapshot() });
        }, 100);
      });
    });
    client.connect();
  });
}

function raw(cmd) {
  return new Promise(function (resolve) {
    const m = cmd.message;
    const msg = new ScopeSyncMessage({
      index: session._getNextMessageIndex(),
      scopeIndex: m.scopeIndex === undefined ? 0 : m.scopeIndex,
      atomic: !!m.atomic,
      syncFragments: m.fragments.map(function (f) { return new SyncFragment(f); }),
    });
    const timer = setTimeout(function () { resolve({ ok: false, error: 'timeout' }); }, 10000);
    client.sendMessage(msg, function (reply) {
      clearTimeout(timer);
      resolve({ ok: true, type: reply.type, fragmentReplies: reply.fragmentReplies });
    });
  });
}

function waitFor(cmd) {
  return new Promise(function (resolve) {
    const deadline = Date.now() + (cmd.timeout || 10000);
    (function poll() {
      const s = snapshot();
      const n = s ? s.items.filter(Boolean).length : -1;
      const textOk = !cmd.text || (s && s.items.some(function (it) { return it && it.text === cmd.text; }));
      const itemsOk = !cmd.items || (s && JSON.stringify(s.items.filter(Boolean).map(function (it) {
        return [it.text, it.done];
      })) === JSON.stringify(cmd.items));
      if ((cmd.count === undefined || n === cmd.count) && textOk && itemsOk) {
        return resolve({ ok: true, state: s });
      }
      if (Date.now() > deadline) {
        return resolve({ ok: false, error: 'timeout', state: s });
      }
      setTimeout(poll, 20);
    })();
  });
}

async function run(cmd) {
  switch (cmd.op) {
    case 'connect':
      return connect(cmd);
    case 'state':
      return { ok: true, state: snapshot() };
    case 'add': {
      const done = afterChanges();
      const item = new Item();
      item.set('text', cmd.text);
      item.set('done', false);
      item.set('created', new Date(1700000000000));
      list.get('items').push(item);
      return Object.assign({ ok: true, uuid: item.uuid }, await done);
    }
    case 'toggle': {
      const done = afterChanges();
      const item = list.get('items').at(cmd.index);
      item.set('done', !item.get('done'));
      return Object.assign({ ok: true }, await done);
    }
    case 'remove': {
      const done = afterChanges();
      list.get('items').splice(cmd.index, 1);
      return Object.assign({ ok: true }, await done);
    }
    case 'title': {
      const done = afterChanges();
      list.set('title', cmd.text);
      return Object.assign({ ok: true }, await done);
    }
    case 'raw':
      return raw(cmd);
    case 'offline': {
      const reconnect = adapter.connect.bind(adapter);
      adapter.connect = function () {
        adapter.connect = reconnect;
        setTimeout(reconnect, cmd.ms);
      };
      adapter._socket.onclose = (function (orig) {
        return function (ev) {
          closedCodes.push(ev && ev.code);
          orig(ev);
        };
      })(adapter._socket.onclose);
      adapter._socket.close();
      return { ok: true };
    }
    case 'waitFor':
      return waitFor(cmd);
    case 'stats':
      return {
        ok: true,
        serverIndex: session ? session.serverIndex : null,
        nonAcked: adapter ? adapter._nonAckedMessages.length : null,
        status: adapter ? adapter._status : null,
        closedCodes: closedCodes,
      };
    case 'close':
      if (client) {
        client.disconnect();
      }
      setTimeout(function () { process.exit(0); }, 50);
      return { ok: true };
    default:
      return { ok: false, error: 'unknown op ' + cmd.op };
  }
}

const rl = readline.createInterface({ input: process.stdin });
let chain = Promise.resolve();
rl.on('line', function (line) {
  if (!line.trim()) {
    return;
  }
  const cmd = JSON.parse(line);
  chain = chain.then(function () {
    return run(cmd).then(function (res) {
      out(Object.assign({ id: cmd.id }, res));
    }, function (err) {
      out({ id: cmd.id, ok: false, error: String(err && err.stack || err) });
    });
  });
});
rl.on('close', function () {
  chain.then(function () { process.exit(0); });
});
