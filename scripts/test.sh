#!/usr/bin/env bash
# Sets up and runs every test: the format check, clang's thread-safety
# analysis, the whole suite in a release build, then the concurrency tests
# under ThreadSanitizer and the rest under AddressSanitizer with UBSan.
# Exits non-zero on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh

export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
export TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1

echo "== format: every tracked C++ file as .clang-format says"
bash scripts/check_format.sh

echo "== thread-safety analysis: the libraries that lock and _stoker, built by clang with -Werror=thread-safety"
cmake --preset tsa >/dev/null
cmake --build --preset tsa --target stoker_engine stoker_tune _stoker

echo "== release build: all tests"
bash scripts/build.sh release
ctest --preset release -j2

echo "== release build: Python and command-line tests"
/usr/bin/python3 -m pytest -q -p no:cacheprovider python/tests tests/test_cli.py

echo "== ThreadSanitizer: concurrency tests"
cmake --preset tsan >/dev/null
cmake --build --preset tsan --target engine_test loader_property_test tuner_test process_workers_test
ctest --preset tsan -L concurrency -j2

echo "== AddressSanitizer + UBSan: the rest"
bash scripts/build.sh asan
ctest --preset asan -LE concurrency -j2

echo "== libFuzzer smoke: ${STOKER_FUZZ_SECONDS:=20} s per target"
cmake --preset fuzz >/dev/null
cmake --build --preset fuzz --target fuzzers
for target in build/fuzz/fuzz/*_fuzzer; do
  name=$(basename "$target")
  work=$(mktemp -d)
  seeds=()
  [[ -d fuzz/corpus/$name ]] && seeds=("fuzz/corpus/$name")
  "$target" -max_total_time="$STOKER_FUZZ_SECONDS" -print_final_stats=0 "$work" "${seeds[@]}" \
    >"$work.log" 2>&1 || { tail -40 "$work.log"; echo "fuzz target $name failed"; exit 1; }
  echo "$name: $(grep -c '^#' "$work.log") status lines, no crash"
  rm -rf "$work" "$work.log"
done

echo "all test stages passed"
