#!/usr/bin/env bash
# Installs npm packages into a scratch prefix once: npm_prefix.sh DIR PACKAGE... (a PACKAGE may
# pin a version: name@1.2.3, @scope/name@1.2.3).
# Tests that check against official JavaScript libraries run node with DIR/node_modules.
set -euo pipefail
dir=$1
shift
mkdir -p "$dir"
# Several tests may ask at once: the check and the install both happen under one lock, so no
# test sees a package that another is still extracting.
exec 9>"$dir/.lock"
flock 9
missing=()
for pkg in "$@"; do
  name=${pkg%@*}  # without a pinned version
  [ -n "$name" ] || name=$pkg
  [ -f "$dir/node_modules/$name/package.json" ] || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
  npm install --silent --no-audit --no-fund --prefix "$dir" "${missing[@]}" >&2
fi
