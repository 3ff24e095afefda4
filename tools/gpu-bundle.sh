#!/usr/bin/env bash
# Prepares what tools/gpu-check.sh runs on a GPU machine that has the NVIDIA driver and a CUDA
# toolkit but none of Debian's -dev libraries (the lent H200 machines): tandem and the CUDA tests
# built here for one GPU architecture, the shared libraries they need beyond the C library and
# the driver, and the fixtures the checks read (tools/gpu/fixtures.txt), in gpu-bundle/ (git-ignored). It must stay under
# the 64 MiB that travel with a device run; the size is printed.
#
# Usage: tools/gpu-bundle.sh [OUT_DIR]      (default gpu-bundle)
#        CUDA_ARCH=90 (default; 80 for A100, 89 for L40S/4090, 86 for 3090/A6000)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-gpu-bundle}
arch=${CUDA_ARCH:-90}
fixtures=../shared/fixtures
[[ -d $fixtures ]] || { echo "error: $fixtures not found" >&2; exit 1; }

# The release tree, for one architecture as tools/test.sh builds it.
cmake --preset release -DCMAKE_CUDA_ARCHITECTURES="$arch" >/dev/null
cmake --build --preset release --target tandem cuda_tests cuda_matmul_bench
[[ -f build/release/tests/cuda/cuda_tests ]] || { echo "error: no cuda_tests: was a CUDA toolkit found?" >&2; exit 1; }

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/bin" "$stage/lib"
for binary in build/release/bin/tandem build/release/tests/cuda/cuda_tests build/release/bench/cuda_matmul_bench; do
  strip -o "$stage/bin/$(basename "$binary")" "$binary"
  # Every shared library but the C library's own and the driver's: those come from the machine.
  ldd "$binary" | awk '/=> \// {print $3}' |
    grep -v -E '/(libc|libm|libdl|libpthread|librt|libcuda)\.so|/ld-linux' |
    while read -r lib; do cp -L -n "$lib" "$stage/lib/"; done
done
rm -rf "$out"
mkdir -p "$out"
tar -C "$stage" -cJf "$out/binaries.tar.xz" bin lib
# The fixtures compressed too (random F32 weights still shrink by a third): the list grew with the
# architectures past what fits the 64 MiB as plain files.
files=(check.py)
while read -r model; do
  [[ -z $model || $model == \#* ]] && continue
  refs=json
  [[ $model != *F32 ]] && refs=exact.json
  files+=("$model.gguf" "$model".{p1,p2,chat}."$refs")
done <tools/gpu/fixtures.txt
tar -C "$fixtures" -cf - "${files[@]}" | xz -T2 -6 >"$out/fixtures.tar.xz"
echo "$out: $(du -sh "$out" | cut -f1) (limit 64 MiB with the working tree); sm_$arch"
