#!/usr/bin/env bash
# Installs npm packages into a scratch prefix once: npm_prefix.sh DIR PACKAGE...
# Tests that check against official JavaScript libraries run node with DIR/node_modules.
set -euo pipefail
dir=$1
shift
mkdir -p "$dir"
missing=()
for pkg in "$@"; do
  [ -d "$dir/node_modules/$pkg" ] || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
  # Several tests may ask at once: one installs, the others wait for it.
  exec 9>"$dir/.lock"
  flock 9
  npm install --silent --no-audit --no-fund --prefix "$dir" "${missing[@]}" >&2
fi
