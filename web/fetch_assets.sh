#!/usr/bin/env bash
# Fetches the browser libraries the pages use, at pinned versions from npm, into OUT_DIR:
# uplot.js and uplot.css (uPlot, the dashboard's charts), swagger-ui-bundle.js and swagger-ui.css
# (Swagger UI, the /docs API reference). Where npm cannot install them (no registry), it writes
# stubs instead and says so: the dashboard then shows its numbers as tables and /docs links the
# document. Usage: fetch_assets.sh OUT_DIR
set -euo pipefail
out=$1
mkdir -p "$out"
npm_dir="$out/npm"
uplot=uplot@1.6.32
swagger=swagger-ui-dist@5.35.0
if command -v npm >/dev/null 2>&1 &&
  npm install --silent --no-audit --no-fund --prefer-offline --prefix "$npm_dir" "$uplot" "$swagger" >&2; then
  cp "$npm_dir/node_modules/uplot/dist/uPlot.iife.min.js" "$out/uplot.js"
  cp "$npm_dir/node_modules/uplot/dist/uPlot.min.css" "$out/uplot.css"
  # Without their source-map comments: the maps are not served.
  sed '/^\/\/# sourceMappingURL=/d' "$npm_dir/node_modules/swagger-ui-dist/swagger-ui-bundle.js" \
    >"$out/swagger-ui-bundle.js"
  sed 's|/\*# sourceMappingURL=[^*]*\*/||' "$npm_dir/node_modules/swagger-ui-dist/swagger-ui.css" \
    >"$out/swagger-ui.css"
else
  echo "fetch_assets: npm could not install $uplot and $swagger; the dashboard's charts and /docs are stubs in this build" >&2
  echo "// uPlot is not bundled in this build (npm was not reachable at build time)." >"$out/uplot.js"
  echo "/* uPlot is not bundled in this build. */" >"$out/uplot.css"
  echo "// Swagger UI is not bundled in this build (npm was not reachable at build time)." >"$out/swagger-ui-bundle.js"
  echo "/* Swagger UI is not bundled in this build. */" >"$out/swagger-ui.css"
fi
