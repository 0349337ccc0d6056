// Entry of the browser bundle of the reference client (jetstream-js, from the npm
// package `jetstream` 0.13.4, folder client/). esbuild turns it into one IIFE that sets
// `window.Jetstream`; the replica serves it at /jetstream/client.js for the demo page.
// The client logs only when window.DEBUG is set.
window.Jetstream = require('jetstream/client');
window.Jetstream.messages = {
  ScopeSync: require('jetstream/client/lib/message/scope-sync-message'),
  SyncFragment: require('jetstream/client/lib/sync-fragment'),
};
