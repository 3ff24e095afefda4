// activations.h: the portable kernel and the split over the pool.
#include "backends/cpu/activations.h"

#include <algorithm>
#include <cmath>

#include "backends/cpu/kernels.h"
#include "backends/ffn_activation.h"

namespace tandem::cpu {
namespace {

// Elements per task: enough to pay for a task, few enough that a decode step's dozen thousand
// elements still stay on the calling thread.
constexpr int64_t kElementsPerTask = 16384;

void run_silu_mul(const KernelTable& table, float* gate, const float* up, int64_t n,
                  ThreadPool& pool) {
  // One task (a decode step's few thousand elements) runs on the calling thread: the pool does
  // that itself.
  const int64_t tasks = (n + kElementsPerTask - 1) / kElementsPerTask;
  pool.parallel_for(tasks, [&](int64_t task, int) {
    const int64_t first = task * kElementsPerTask, count = std::min(kElementsPerTask, n - first);
    table.silu_mul(gate + first, up + first, count);
  });
}

}  // namespace

void silu_mul_portable(float* gate, const float* up, int64_t n) {
  for (int64_t i = 0; i < n; ++i) gate[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
}

void swiglu_clamped(float* gate, const float* up, int64_t n, ThreadPool& pool) {
  const int64_t tasks = (n + kElementsPerTask - 1) / kElementsPerTask;
  pool.parallel_for(tasks, [&](int64_t task, int) {
    const int64_t first = task * kElementsPerTask, last = std::min(n, first + kElementsPerTask);
    for (int64_t i = first; i < last; ++i)
      gate[i] = ffn_activation(FfnActivation::SwiGluClamped, gate[i], up[i]);
  });
}

void silu_mul(float* gate, const float* up, int64_t n, ThreadPool& pool) {
  run_silu_mul(best_kernel_table(), gate, up, n, pool);
}

void silu_mul_with_isa(CpuIsa isa, float* gate, const float* up, int64_t n, ThreadPool& pool) {
  run_silu_mul(kernel_table(isa), gate, up, n, pool);
}

}  // namespace tandem::cpu
