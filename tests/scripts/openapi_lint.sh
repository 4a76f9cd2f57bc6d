#!/usr/bin/env bash
# Lints api/openapi.json with Redocly's CLI (npm @redocly/cli, installed into DIR on first use) and
# api/redocly.yaml: every recommended rule an error. Usage: openapi_lint.sh SOURCE_DIR DIR
set -euo pipefail
src=$1
dir=$2
mkdir -p "$dir"
if [ ! -x "$dir/node_modules/.bin/redocly" ]; then
  [ -f "$dir/package.json" ] || echo '{"private": true}' >"$dir/package.json"
  (cd "$dir" && npm install --no-audit --no-fund --loglevel=error @redocly/cli@2.77.0 >/dev/null)
fi
cd "$dir"
REDOCLY_TELEMETRY=off REDOCLY_SUPPRESS_UPDATE_NOTICE=true \
  node_modules/.bin/redocly lint --config "$src/api/redocly.yaml" "$src/api/openapi.json"
