"""The demo page: a shared list on the reference client (jetstream-js), served by the replica.

Open ``http://<replica>:<http port><path>/demo`` in two browsers (on the same or on
different replicas): items added, ticked or removed in one appear in the other. Query
parameters: ``scope`` (default ``demo``) and ``token`` (the fleet's client token, when one
is configured). The page works only with the default classes (List/Item).
"""

from __future__ import annotations

import html
import json

from eventfleet_server.jetstream.config import JetstreamConfig

_PAGE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>eventfleet · Jetstream shared list</title>
<style>
 body { font: 15px/1.4 system-ui, sans-serif; max-width: 40em; margin: 2em auto; color: #222; }
 h1 { font-size: 1.3em; } #status { color: #666; font-size: .9em; }
 ul { list-style: none; padding: 0; }
 li { display: flex; gap: .5em; align-items: center; padding: .3em 0;
      border-bottom: 1px solid #eee; }
 li.done .text { text-decoration: line-through; color: #888; }
 .text { flex: 1; } form { display: flex; gap: .5em; } input[type=text] { flex: 1; padding: .3em; }
</style>
</head>
<body>
<h1>Shared list <code id="scope-name"></code></h1>
<p id="status">loading the reference client…</p>
<form id="add-form"><input id="new-text" type="text" placeholder="New item" autocomplete="off">
<button id="add" type="submit">Add</button></form>
<ul id="items"></ul>
<p id="replica" style="color:#999;font-size:.8em"></p>
<script src="__PATH__/client.js"></script>
<script>
(function () {
  'use strict';
  var PATH = __PATH_JSON__;
  var status = document.getElementById('status');
  if (!window.Jetstream) {
    status.textContent = 'client bundle missing (run scripts/tools/jetstream.sh)';
    return;
  }
  var J = window.Jetstream;
  var Item = J.model('Item', function () {
    this.has('text', String); this.has('done', Boolean); this.has('created', Date);
  });
  var List = J.model('List', function () { this.has('title', String); this.has('items', [Item]); });
  var query = new URLSearchParams(location.search);
  var scopeName = query.get('scope') || 'demo';
  var token = query.get('token');
  document.getElementById('scope-name').textContent = scopeName;
  document.getElementById('replica').textContent = 'replica ' + location.host;
  var base = (location.protocol === 'https:' ? 'wss://' : 'ws://') + location.host + PATH;
  var url = base + (token ? '?x-jetstream-token=' + encodeURIComponent(token) : '');
  var adapter = J.transport.WebSocket({ url: url });
  var client = J({ transport: adapter });
  var list = new List();
  var state = { synced: false, list: list, client: client, adapter: adapter, session: null };
  window.demo = state;

  function render() {
    var ul = document.getElementById('items');
    ul.textContent = '';
    list.get('items').forEach(function (item, i) {
      if (!item) { return; }
      var li = document.createElement('li');
      li.dataset.uuid = item.uuid;
      if (item.get('done')) { li.className = 'done'; }
      var box = document.createElement('input');
      box.type = 'checkbox'; box.checked = !!item.get('done'); box.className = 'toggle';
      box.onchange = function () { item.set('done', box.checked); };
      var text = document.createElement('span');
      text.className = 'text'; text.textContent = item.get('text') || '';
      var del = document.createElement('button');
      del.className = 'remove'; del.textContent = 'Remove';
      del.onclick = function () {
        var at = list.get('items').indexOf(item);
        if (at >= 0) { list.get('items').splice(at, 1); }
      };
      li.appendChild(box); li.appendChild(text); li.appendChild(del);
      ul.appendChild(li);
    });
  }
  list.on('treeChanged', render);

  document.getElementById('add-form').onsubmit = function (e) {
    e.preventDefault();
    var input = document.getElementById('new-text');
    if (!input.value || !state.synced) { return; }
    var item = new Item();
    item.set('text', input.value); item.set('done', false); item.set('created', new Date());
    list.get('items').push(item);
    input.value = '';
    render();
  };

  client.on('statusChanged', function (s) {
    status.textContent = (s === 'ONLINE' ? 'connected' : 'offline, reconnecting…') +
      (state.synced ? ' · synced' : '');
  });
  client.on('sessionDenied', function () {
    status.textContent = 'session denied (wrong or missing ?token=)';
  });
  client.on('session', function (session) {
    state.session = session;
    // The reference client reconnects to the same URL: name the session in it so that a
    // dropped connection resumes the session (and its resendMissing) instead of being refused.
    adapter.url = base + '?x-jetstream-sessiontoken=' + encodeURIComponent(session._token);
    var scope = J.scope({ name: scopeName });
    list.setScopeAndMakeRootModel(scope);
    session.fetch(scope, function (err) {
      if (err) { status.textContent = 'fetch failed: ' + JSON.stringify(err); return; }
      state.synced = true;
      status.textContent = 'connected · synced';
      setTimeout(render, 50);
    });
  });
  client.connect();
})();
</script>
</body>
</html>
"""


def page(config: JetstreamConfig) -> str:
    return _PAGE.replace("__PATH_JSON__", json.dumps(config.path)).replace(
        "__PATH__", html.escape(config.path, quote=True)
    )
