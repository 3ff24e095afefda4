#!/usr/bin/env bash
# The whole test suite: Release and ASan+UBSan builds with every unit, model and CLI test,
# the CUDA kernels' registers and spills (ptxas, from the Release build: a decode kernel that
# spills fails), a bounded libFuzzer run over the GGUF reader, and the layer-order check of
# DESIGN.md.
# Usage: tools/test.sh [--quick]   (--quick: Release tests only)
set -euo pipefail
cd "$(dirname "$0")/.."
fixtures=../shared/fixtures
if [[ ! -d $fixtures ]]; then
  echo "error: $fixtures not found; the tests need the shared fixtures beside the repository" >&2
  exit 1
fi

passed=0
failed=0
run_ctest() {  # preset
  local log
  log=$(mktemp)
  if ctest --preset "$1" -j2 2>&1 | tee "$log"; then :; fi
  local total fails
  total=$(sed -n 's/.*tests passed, \([0-9]*\) tests failed out of \([0-9]*\).*/\2/p' "$log" | tail -1)
  fails=$(sed -n 's/.*tests passed, \([0-9]*\) tests failed out of \([0-9]*\).*/\1/p' "$log" | tail -1)
  if [[ -z $total ]]; then failed=$((failed + 1)); return; fi
  passed=$((passed + total - fails))
  failed=$((failed + fails))
  rm -f "$log"
}

echo "== Release build"
# CUDA code for one architecture (sm_90) only: it is compiled and linked here, never run (no
# test runs CUDA without a GPU), and one architecture keeps CI fast. TANDEM_CUDA_ARCHITECTURES
# picks others; tools/gpu-check.sh runs the CUDA tests on a GPU machine.
cmake --preset release -DCMAKE_CUDA_ARCHITECTURES="${TANDEM_CUDA_ARCHITECTURES:-90}" \
  -DTANDEM_PTXAS_VERBOSE=ON >/dev/null
# The build's output goes to a log (ptxas prints a few lines for each of ~350 kernels).
build_log=build/release/build.log
if ! cmake --build --preset release >"$build_log" 2>&1; then
  grep -v "^ptxas info\|bytes stack frame" "$build_log" | tail -60
  exit 1
fi
grep -v "^ptxas info\|bytes stack frame" "$build_log" | tail -3
run_ctest release

if find build/release -name '*.cu.o' | grep -q .; then  # the CUDA backend is built
  echo "== CUDA kernels: registers and spills (ptxas)"
  if python3 tools/ptxas-report.py --build build/release "$build_log"; then
    passed=$((passed + 1))
  else
    failed=$((failed + 1))
  fi
fi

if [[ ${1:-} != --quick ]]; then
  echo "== ASan + UBSan build"
  cmake --preset asan >/dev/null
  cmake --build --preset asan
  run_ctest asan

  echo "== GGUF reader fuzzing"
  if bash tools/fuzz-gguf.sh "${TANDEM_FUZZ_SECONDS:-60}"; then passed=$((passed + 1)); else failed=$((failed + 1)); fi

  echo "== Layer order (DESIGN.md)"
  if ../shared/tools/check-layers .; then passed=$((passed + 1)); else failed=$((failed + 1)); fi
fi

echo "$passed passed, $failed failed"
((failed == 0))
