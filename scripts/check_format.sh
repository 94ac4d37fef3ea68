#!/usr/bin/env bash
# Checks that every tracked C++/CUDA source is formatted as .clang-format says (clang-format's
# --dry-run --Werror): prints each file that is not, and exits 1 if any. `--fix` formats them
# in place instead. Formatting differs between clang-format releases, so the check runs only
# with the major version the tree was formatted with (Debian 12's clang-format 14) and prints
# SKIPPED with the reason otherwise.
set -euo pipefail
cd "$(dirname "$0")/.."
want=14
if ! command -v clang-format >/dev/null 2>&1; then
  echo "SKIPPED: format check: clang-format is not installed"; exit 0
fi
have=$(clang-format --version | sed -n 's/.*version \([0-9]*\).*/\1/p')
if [ "$have" != "$want" ]; then
  echo "SKIPPED: format check: clang-format $have here, the tree is formatted with $want"; exit 0
fi
mapfile -t files < <(git ls-files '*.cpp' '*.hpp' '*.h' '*.cu' '*.cuh')
if [ "${1:-}" = "--fix" ]; then
  clang-format -i "${files[@]}"
  exit 0
fi
bad=0
for f in "${files[@]}"; do
  clang-format --dry-run --Werror "$f" >/dev/null 2>&1 || { echo "not formatted: $f"; bad=1; }
done
[ $bad -eq 0 ] && echo "format check: ${#files[@]} files formatted as .clang-format says"
exit $bad
