#!/usr/bin/env bash
# Every C++ and CUDA source of the project is formatted as the repo's .clang-format says
# (clang-format --dry-run -Werror); the generated Unicode tables excepted. Lists the files that
# are not, with the command that formats them.
# Usage: format_check.sh SOURCE_DIR
set -euo pipefail
root=${1:-.}
cd "$root"
if ! command -v clang-format >/dev/null 2>&1; then
  echo "format_check: clang-format is not installed (scripts/setup.sh installs it)" >&2
  exit 1
fi
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  mapfile -t files < <(git ls-files --cached --others --exclude-standard \
    '*.h' '*.cc' '*.cu' '*.cuh' | grep -v '^engine/unicode_tables\.cc$' | while read -r f; do
      [ -f "$f" ] && echo "$f"; done)
else
  mapfile -t files < <(find . -path ./build -prune -o -path './build-*' -prune -o -path ./.git -prune \
    -o \( -name '*.h' -o -name '*.cc' -o -name '*.cu' -o -name '*.cuh' \) -print |
    sed 's|^\./||' | grep -v '^engine/unicode_tables\.cc$' | grep -v '^\.headroom/')
fi
bad=()
for f in "${files[@]}"; do
  clang-format --dry-run -Werror "$f" >/dev/null 2>&1 || bad+=("$f")
done
if [ ${#bad[@]} -gt 0 ]; then
  printf 'format_check: not formatted: %s\n' "${bad[@]}"
  echo "format_check: run: clang-format -i ${bad[*]}"
  exit 1
fi
echo "format_check: ok (${#files[@]} files, $(clang-format --version | head -1))"
