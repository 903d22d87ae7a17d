#!/usr/bin/env bash
# Checks that every tracked C++ file is formatted as .clang-format says
# (clang-format --dry-run --Werror). Lists the files that differ and exits 1
# if there are any; `clang-format -i <file>` fixes one.
set -euo pipefail
cd "$(dirname "$0")/.."

mapfile -t files < <(git ls-files '*.h' '*.cc' '*.cpp')
differ=()
for f in "${files[@]}"; do
  clang-format --dry-run --Werror "$f" >/dev/null 2>&1 || differ+=("$f")
done

if ((${#differ[@]})); then
  echo "format check: ${#differ[@]} of ${#files[@]} C++ files differ from .clang-format:"
  printf '  %s\n' "${differ[@]}"
  echo "fix with: clang-format -i <file>"
  exit 1
fi
echo "format check: ${#files[@]} C++ files formatted"
