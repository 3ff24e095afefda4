#pragma once
// Elementwise activations of the CPU backend's FFNs, spread over the pool. Each element's result
// depends on that element alone, so it is the same whatever the batch and the split.
#include <cstdint>

#include "backends/cpu/cpu_features.h"
#include "core/thread_pool.h"

namespace tandem::cpu {

// gate[i] = silu(gate[i]) * up[i] = gate[i] / (1 + e^-gate[i]) * up[i], for i < n; with the
// kernels of best_cpu_isa().
void silu_mul(float* gate, const float* up, int64_t n, ThreadPool& pool);
// The same with a chosen instruction set (tests); throws tandem::Error when the CPU lacks it.
void silu_mul_with_isa(CpuIsa isa, float* gate, const float* up, int64_t n, ThreadPool& pool);

// gate[i] = ffn_activation(SwiGluClamped, gate[i], up[i]) (backends/ffn_activation.h: gpt-oss's
// clamped SwiGLU) for i < n, over the pool. Portable code: the experts' products cost a hundred
// times more.
void swiglu_clamped(float* gate, const float* up, int64_t n, ThreadPool& pool);

}  // namespace tandem::cpu
