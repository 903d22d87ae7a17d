#!/usr/bin/env bash
# Sets up and runs every test: the whole suite in a release build, then the
# concurrency tests under ThreadSanitizer and the rest under AddressSanitizer
# with UBSan. Exits non-zero on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh

export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
export TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1

echo "== release build: all tests"
bash scripts/build.sh release
ctest --preset release -j2

echo "== ThreadSanitizer: concurrency tests"
bash scripts/build.sh tsan
ctest --preset tsan -L concurrency -j2

echo "== AddressSanitizer + UBSan: the rest"
bash scripts/build.sh asan
ctest --preset asan -LE concurrency -j2

echo "all test stages passed"
