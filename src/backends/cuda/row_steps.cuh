#pragma once
// Steps on one row shared by the CUDA kernels that run them alone (rms_norm_kernel, rope_kernel)
// and the fused kernels that run them inside a longer launch (latent_store_kernel, the MLA
// kernels' query loads), so that a fused op gives the bits of the sequence it replaces. Device
// code: included by .cu files only.
#include <cstdint>

#include "backends/rope_angles.h"
#include "core/backend.h"

namespace tandem::cuda {

constexpr int kNormThreads = 256;

// 1 / sqrt(mean(x[0, dim)^2) + eps) for a block of kNormThreads threads, every thread getting it.
// The sum of squares in double, as the CPU: each thread's share in order, a shuffle tree in each
// warp, then the warps' sums in order (one barrier; the H200 profile had the eight-barrier tree
// at 6 us a launch for a 2048-wide row). A block that calls it twice puts a barrier between:
// the second call writes the shared sums the first one's threads may still be reading.
__device__ inline float block_rms_scale(const float* x, int64_t dim, float eps) {
  constexpr int kWarps = kNormThreads / 32;
  __shared__ double warp_sums[kWarps];
  double sum = 0;
  for (int64_t i = threadIdx.x; i < dim; i += kNormThreads) sum += double(x[i]) * double(x[i]);
  for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = sum;
  __syncthreads();
  double total = 0;
  for (int w = 0; w < kWarps; ++w) total += warp_sums[w];
  return float(1.0 / sqrt(total / double(dim) + double(eps)));
}

// rms_norm_kernel's row: y = x * block_rms_scale(x) * w with two roundings, in place when y is x
// (each thread writes only what it read, after the scale's barrier).
__device__ inline void block_rms_norm(const float* x, float* y, const float* w, int64_t dim,
                                      float eps) {
  const float scale = block_rms_scale(x, dim, eps);
  for (int64_t i = threadIdx.x; i < dim; i += kNormThreads)
    y[i] = __fmul_rn(__fmul_rn(x[i], scale), w[i]);
}

// Where pair i of a head's rotated dims lies: dims (2i, 2i + 1), or (i, i + half) in the NeoX
// layout.
__device__ inline int64_t rope_first(const RopeParams& p, int64_t i) {
  return p.neox ? i : 2 * i;
}
__device__ inline int64_t rope_second(const RopeParams& p, int64_t i) {
  return p.neox ? i + p.rope_dims / 2 : 2 * i + 1;
}

// Pair i (x0, x1) rotated at `position` into (*y0, *y1); low and high from yarn_ramp(p).
__device__ inline void rope_rotate(const RopeParams& p, float low, float high, float position,
                                   int64_t i, float x0, float x1, float* y0, float* y1) {
  float c, s;
  rope_cos_sin(p, low, high, position, i, &c, &s);
  *y0 = __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s));
  *y1 = __fadd_rn(__fmul_rn(x0, s), __fmul_rn(x1, c));
}

// Rotates pair i of a head's rotated dims (`x` their first) in place.
__device__ inline void rope_pair(const RopeParams& p, float low, float high, float position,
                                 int64_t i, float* x) {
  const int64_t first = rope_first(p, i), second = rope_second(p, i);
  rope_rotate(p, low, high, position, i, x[first], x[second], &x[first], &x[second]);
}

}  // namespace tandem::cuda
