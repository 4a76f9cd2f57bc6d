#!/usr/bin/env bash
# Packs what `scripts/serve_check.sh` needs on a machine without this project's packages (a GPU
# machine with CUDA but no Postgres, Redis, libpqxx or hiredis) into one file:
#   scripts/pack_portable.sh OUT.tar.xz
# It holds `headroom` (Release, built with CUDA when nvcc is here; stripped), PostgreSQL 15's
# server programs, modules and share files, redis-server and redis-cli, and every shared library
# they load except the C library's own, libstdc++/libgcc and CUDA's. serve_check.sh unpacks it
# when HEADROOM_PORTABLE names it. Postgres finds its share files relative to its programs.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
out=${1:?usage: scripts/pack_portable.sh OUT.tar.xz}
case $out in /*) ;; *) out=$PWD/$out ;; esac

scripts/setup.sh >/dev/null
cmake -S . -B build-release -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build-release -j "${HEADROOM_JOBS:-2}" --target headroom

stage=$(mktemp -d /tmp/headroom-pack.XXXXXX)
trap 'rm -rf "$stage"' EXIT
pg=/usr/lib/postgresql/15
mkdir -p "$stage/bin" "$stage/lib" "$stage$pg/bin" "$stage$pg/lib" "$stage/usr/share/postgresql" "$stage/usr/bin"
strip -o "$stage/bin/headroom" build-release/headroom
cp -a "$pg/bin/postgres" "$pg/bin/initdb" "$pg/bin/pg_ctl" "$pg/bin/psql" "$stage$pg/bin/"
for module in "$pg"/lib/*.so; do
  case $module in *llvmjit*) ;; *) cp -a "$module" "$stage$pg/lib/" ;; esac
done
cp -a /usr/share/postgresql/15 "$stage/usr/share/postgresql/"
cp -L /usr/bin/redis-server /usr/bin/redis-cli "$stage/usr/bin/"
# The libraries all of them load, but for the C library's, the C++ runtime and CUDA's (the target
# machine has its own, and mixing those breaks programs).
for program in "$stage/bin/headroom" "$stage$pg"/bin/* "$stage$pg"/lib/*.so "$stage"/usr/bin/*; do
  ldd "$program" | awk '$3 ~ /^\// {print $3}'
done | sort -u |
  grep -Ev '/(libc|libm|libdl|libpthread|librt|libresolv|libutil|libstdc\+\+|libgcc_s)\.so|ld-linux|/cuda|libcudart|libcublas|libnccl' |
  while read -r lib; do cp -L "$lib" "$stage/lib/"; done
tar -C "$stage" -cJf "$out" .
echo "pack_portable: $(du -h "$out" | cut -f1) in $out"
