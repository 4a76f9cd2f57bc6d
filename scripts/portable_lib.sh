# shellcheck shell=bash
# Sourced (not run) by scripts that run on a machine without this project's packages (a GPU
# machine): portable_unpack PACK DIR unpacks scripts/pack_portable.sh's file into DIR and wraps
# its programs, so that `headroom`, Postgres and Redis run from it (services.sh finds them through
# PG_BIN and PATH); it sets $portable_headroom. The pack's libraries are for its programs only:
# each runs through a wrapper that puts them on its library path, so that this machine's own
# programs (runuser, useradd, python3) keep theirs.
portable_unpack() {
  local pack=$1 dir=$2 wrap
  mkdir -p "$dir/pack"
  if command -v xz >/dev/null; then
    tar -C "$dir/pack" -xJf "$pack"
  else
    # (Python unpacks it where there is no xz; trusted: the pack's own links, some absolute, are
    # kept as they are)
    python3 -c 'import sys, tarfile
kw = {"filter": "fully_trusted"} if hasattr(tarfile, "fully_trusted_filter") else {}
tarfile.open(sys.argv[1]).extractall(sys.argv[2], **kw)' "$pack" "$dir/pack"
  fi
  # Unpacked where the Postgres user can reach it.
  chmod 755 "$dir"
  chmod -R a+rX "$dir/pack"
  wrap=$dir/bin
  mkdir -p "$wrap"
  chmod 755 "$wrap"
  for prog in "$dir"/pack/usr/lib/postgresql/15/bin/* "$dir"/pack/usr/bin/* "$dir"/pack/bin/*; do
    [ -f "$prog" ] || continue
    printf '#!/bin/sh\nexport LD_LIBRARY_PATH=%s${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}\nexec %s "$@"\n' \
      "$dir/pack/lib" "$prog" >"$wrap/${prog##*/}"
    chmod 755 "$wrap/${prog##*/}"
  done
  portable_headroom=$wrap/headroom
  export PG_BIN=$wrap
  export PATH=$wrap:$PATH
  export TZ=GMT
}
