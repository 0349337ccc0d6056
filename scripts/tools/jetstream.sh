#!/usr/bin/env bash
# Installs the Jetstream reference (npm `jetstream` 0.13.4: Uber's server in lib/, the
# jetstream-js client in client/) with what the tests need around it: `ws` (a WebSocket
# global for the client under Node; the reference server uses its own copy), esbuild
# (bundles the client for the demo page: the client's gulp 3 build no longer runs on
# current Node), the browser shims the client needs (assert, events, util), keymirror (a
# client dependency the npm package does not install) and playwright-core (drives
# Debian's chromium; it downloads no browser).
#
# Result: <repo>/.tools/jetstream/node_modules and the bundle
# <repo>/.tools/jetstream/jetstream-client.js. Versions are pinned in
# scripts/tools/jetstream/package.json; a run with the same inputs does nothing.
# Usage: scripts/tools/jetstream.sh
set -euo pipefail

root="$(cd "$(dirname "$0")/../.." && pwd)"
src="$root/scripts/tools/jetstream"
dest="$root/.tools/jetstream"
stamp="$dest/.installed"
want="$(cat "$src/package.json" "$src/bundle-entry.js" | sha256sum | cut -d' ' -f1)"

if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -s "$dest/jetstream-client.js" ]; then
    echo "jetstream: already installed ($dest)" >&2
    exit 0
fi
command -v npm >/dev/null || { echo "jetstream: npm is required (apt-get install nodejs npm)" >&2; exit 1; }

mkdir -p "$dest"
cp "$src/package.json" "$src/bundle-entry.js" "$dest/"
echo "jetstream: npm install into $dest" >&2
(cd "$dest" && npm install --no-audit --no-fund --no-package-lock --loglevel=error >/dev/null)

echo "jetstream: bundling the reference client with esbuild" >&2
# Through esbuild's JS API: its bin/ entry is a native binary or a JS shim depending on
# whether npm ran install scripts.
(cd "$dest" && node -e "
require('esbuild').buildSync({
  entryPoints: ['bundle-entry.js'], bundle: true, format: 'iife', platform: 'browser',
  target: 'es2017', outfile: 'jetstream-client.js.tmp', logLevel: 'warning',
  define: {'process.env.NODE_DEBUG': 'false', global: 'window'},
});")
mv -f "$dest/jetstream-client.js.tmp" "$dest/jetstream-client.js"
echo "$want" > "$stamp"
echo "jetstream: installed ($(node -e "console.log(require('$dest/node_modules/jetstream/package.json').version)"))" >&2
