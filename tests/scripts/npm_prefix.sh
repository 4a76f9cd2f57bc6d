#!/usr/bin/env bash
# Installs npm packages into a scratch prefix once: npm_prefix.sh DIR PACKAGE... (a PACKAGE may
# pin a version: name@1.2.3, @scope/name@1.2.3).
# Tests that check against official JavaScript libraries run node with DIR/node_modules.
set -euo pipefail
dir=$1
shift
mkdir -p "$dir"
missing=()
for pkg in "$@"; do
  name=${pkg%@*}  # without a pinned version
  [ -n "$name" ] || name=$pkg
  [ -d "$dir/node_modules/$name" ] || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
  # Several tests may ask at once: one installs, the others wait for it.
  exec 9>"$dir/.lock"
  flock 9
  npm install --silent --no-audit --no-fund --prefix "$dir" "${missing[@]}" >&2
fi
