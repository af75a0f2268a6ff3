#!/usr/bin/env bash
# scripts/ui-xterm.sh: build the dashboard's browser terminal files from
# Debian's xterm.js 3.8 packages into pkg/orchestrator/ui/xterm/ (gitignored),
# where the Go build embeds them. Without them the dashboard has no terminal
# and everything else works (see docs/dashboard.md).
#
#   scripts/ui-xterm.sh [OUTDIR]
#
# node-xterm ships xterm.js as CommonJS modules (/usr/share/nodejs/xterm/lib)
# and libjs-xterm the fit addon; libjs-xterm's own xterm.js is a stub that
# needs those modules. Browsers cannot load CommonJS, so this script wraps
# every module in a function and adds a 20-line require(): a bundle, with no
# Node toolchain. It exits 0 without doing anything when the packages are
# missing (run scripts/deps.sh, or apt-get install node-xterm libjs-xterm).
set -euo pipefail

out=${1:-$(dirname "$0")/../pkg/orchestrator/ui/xterm}
lib=/usr/share/nodejs/xterm/lib
fit=/usr/share/javascript/xterm/addons/fit/fit.js
if [[ ! -f $lib/public/Terminal.js || ! -f $fit || ! -f $lib/xterm.css ]]; then
	echo "ui-xterm: node-xterm or libjs-xterm not installed: the dashboard is built without its terminal" >&2
	exit 0
fi
tmp=$(mktemp "$out/.bundle.XXXXXX")
trap 'rm -f "$tmp"' EXIT
{
	echo "/* xterm.js $(sed -n 's/.*"version": "\(.*\)".*/\1/p' "$lib/../package.json") (MIT, Debian node-xterm and libjs-xterm), bundled by scripts/ui-xterm.sh */"
	cat <<'JS'
(function () {
  'use strict';
  var defs = {}, cache = {};
  function norm(parts) {
    var o = [];
    parts.forEach(function (p) { if (p === '..') o.pop(); else if (p && p !== '.') o.push(p); });
    return o.join('/');
  }
  function load(from, p) {
    var base = from.split('/').slice(0, -1);
    var id = norm((p.charAt(0) === '.' ? base.concat(p.split('/')) : p.split('/'))).replace(/\.js$/, '');
    if (!defs[id] && defs[id + '/index']) id = id + '/index';
    if (cache[id]) return cache[id].exports;
    if (!defs[id]) throw new Error('xterm bundle: no module ' + id + ' (required by ' + from + ')');
    var module = { exports: {} };
    cache[id] = module;
    defs[id].call(module.exports, module, module.exports, function (q) { return load(id, q); });
    return module.exports;
  }
JS
	(cd "$lib" && find . -name '*.js' ! -name '*.test.js' | LC_ALL=C sort) | while read -r f; do
		id=${f#./}
		id=${id%.js}
		printf 'defs["%s"] = function (module, exports, require) {\n' "$id"
		grep -v '^//# sourceMappingURL=' "$lib/$f"
		printf '\n};\n'
	done
	printf 'defs["addons/fit/fit"] = function (module, exports, require) {\n'
	grep -v '^//# sourceMappingURL=' "$fit"
	printf '\n};\n'
	cat <<'JS'
  var Terminal = load('', 'public/Terminal').Terminal;
  Terminal.applyAddon(load('', 'addons/fit/fit'));
  window.BerthXterm = Terminal;
})();
JS
} >"$tmp"
chmod 0644 "$tmp"
mv "$tmp" "$out/xterm.bundle.js"
trap - EXIT
cp "$lib/xterm.css" "$out/xterm.css"
echo "ui-xterm: $out/xterm.bundle.js ($(wc -c <"$out/xterm.bundle.js") bytes), xterm.css" >&2
