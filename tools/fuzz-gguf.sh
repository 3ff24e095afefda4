#!/usr/bin/env bash
# Builds the GGUF fuzz target (clang, libFuzzer, ASan+UBSan) and runs it for SECONDS
# (default 60) on a seed corpus of small written files plus the head of every fixture GGUF.
# Exits non-zero on any crash, sanitizer report or reader/writer disagreement; the crashing
# input is left in build/fuzz/ as crash-*.
#
#   tools/fuzz-gguf.sh [SECONDS]
set -euo pipefail

seconds="${1:-60}"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

cmake --preset fuzz >/dev/null
cmake --build --preset fuzz --target gguf_fuzz gguf_fuzz_seeds

build="$root/build/fuzz"
corpus="$build/corpus"
seeds="$build/seeds"
mkdir -p "$corpus" "$seeds"
"$build/fuzz/gguf_fuzz_seeds" "$seeds"
fixtures="$root/../shared/fixtures"
for f in "$fixtures"/*.gguf; do
  [ -e "$f" ] || continue
  # The first 64 KiB hold the header, metadata and tensor index of the small fixtures.
  head -c 65536 "$f" > "$seeds/fixture-$(basename "$f")"
done

# The corpus folder keeps what earlier runs found; seeds are read but never written.
cd "$build"
ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1}" \
UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}" \
  "$build/fuzz/gguf_fuzz" -max_total_time="$seconds" -max_len=65536 -rss_limit_mb=2048 \
  -print_final_stats=1 "$corpus" "$seeds"
