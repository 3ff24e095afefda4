#pragma once
// How fast this machine's decode kernel streams weights: a one-token Q4_K matmul over
// expert-sized matrices that come from DRAM, in weight bytes per second. Decode reads every
// weight once per token with one token's activations, and on a few cores it is our kernel, not
// the memory bus, that sets the pace (a STREAM triad on 2 cores reads ~2x faster than the kernel
// can consume), so the cost model predicts CPU decode from this rate rather than from the triad.
#include <cstdint>

namespace tandem::plan {

// About a second: matrices of 1408 x 2048 (a DeepSeek-V2-Lite expert's gate) cycled through
// 256 MiB, or a quarter of the free RAM where that is less; the best of several passes.
// `interleaved`: the same matrices as Q4_K_R16 (`tandem repack`), whose kernels are faster.
double measure_decode_kernel_bytes_per_s(int32_t threads, uint64_t available_ram_bytes,
                                         bool interleaved = false);

}  // namespace tandem::plan
