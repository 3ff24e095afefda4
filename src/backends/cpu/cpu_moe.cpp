// Expert routing and the mixture-of-experts FFN on the CPU.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/matmul.h"
#include "core/error.h"

namespace tandem::cpu {
namespace {

// Indices of the k largest values, largest first; ties go to the lower index.
void top_k_indices(const float* values, int64_t n, int64_t k, int32_t* out, int32_t* order) {
  std::iota(order, order + n, 0);
  std::partial_sort(order, order + k, order + n, [&](int32_t a, int32_t b) {
    return values[a] > values[b] || (values[a] == values[b] && a < b);
  });
  std::copy(order, order + k, out);
}

float silu(float x) {
  return x / (1.0f + std::exp(-x));
}

}  // namespace

void CpuBackend::moe_route(const MoeRouteOp& op) {
  const int64_t E = op.n_expert, K = op.top_k;
  TANDEM_CHECK(K >= 1 && K <= E && op.n_groups >= 1 && E % op.n_groups == 0);
  float* probs = grow(scratch_a_, size_t(E));
  float* selection = grow(scratch_b_, size_t(E));
  float* group_scores = grow(scratch_c_, size_t(op.n_groups));
  if (index_scratch_.size() < size_t(E + op.n_groups))
    index_scratch_.resize(size_t(E + op.n_groups));
  int32_t* order = index_scratch_.data();
  int32_t* kept_groups = order + E;
  const int64_t per_group = E / op.n_groups;

  for (int64_t t = 0; t < op.n_tokens; ++t) {
    const float* logits = op.logits + t * E;
    if (op.gating == MoeGating::Softmax) {
      const float max_logit = *std::max_element(logits, logits + E);
      float sum = 0;
      for (int64_t e = 0; e < E; ++e) sum += probs[e] = std::exp(logits[e] - max_logit);
      for (int64_t e = 0; e < E; ++e) probs[e] /= sum;
    } else {
      for (int64_t e = 0; e < E; ++e) probs[e] = 1.0f / (1.0f + std::exp(-logits[e]));
    }
    // The bias steers which experts are chosen, never how much they weigh (DeepSeek-V3).
    for (int64_t e = 0; e < E; ++e) selection[e] = probs[e] + (op.bias ? op.bias[e] : 0.0f);

    if (op.n_groups > 1 && op.n_groups_used < op.n_groups) {
      // Group score: V3 (sigmoid) sums each group's two best experts; V2 (softmax) takes the
      // best one, as each model was trained.
      for (int64_t g = 0; g < op.n_groups; ++g) {
        const float* s = selection + g * per_group;
        float best = -INFINITY, second = -INFINITY;
        for (int64_t i = 0; i < per_group; ++i) {
          if (s[i] > best)
            second = best, best = s[i];
          else if (s[i] > second)
            second = s[i];
        }
        group_scores[g] = op.gating == MoeGating::Sigmoid && per_group > 1 ? best + second : best;
      }
      top_k_indices(group_scores, op.n_groups, op.n_groups_used, kept_groups, order);
      std::sort(kept_groups, kept_groups + op.n_groups_used);
      for (int64_t g = 0, next_kept = 0; g < op.n_groups; ++g) {
        if (next_kept < op.n_groups_used && kept_groups[next_kept] == g) {
          ++next_kept;
          continue;
        }
        std::fill(selection + g * per_group, selection + (g + 1) * per_group, -INFINITY);
      }
    }

    int32_t* ids = op.expert_ids + t * K;
    float* weights = op.expert_weights + t * K;
    top_k_indices(selection, E, K, ids, order);
    float sum = 0;
    for (int64_t k = 0; k < K; ++k) sum += weights[k] = probs[ids[k]];
    for (int64_t k = 0; k < K; ++k)
      weights[k] = (op.normalize ? weights[k] / sum : weights[k]) * op.scale;
  }
  if (op.counts)
    for (int64_t i = 0; i < op.n_tokens * K; ++i) ++op.counts[op.expert_ids[i]];
}

void CpuBackend::moe(const MoeOp& op) {
  const int64_t T = op.n_tokens, K = op.top_k, D = op.dim, F = op.ffn_dims;
  const int64_t held = op.gate.n_mats;
  // Slots grouped by the expert's local matrix, so each held expert's weights are read once.
  if (index_scratch_.size() < size_t(held + 1 + T * K)) index_scratch_.resize(size_t(held + 1 + T * K));
  int32_t* offsets = index_scratch_.data();  // [held + 1]
  int32_t* order = offsets + held + 1;       // [<= T * K] slot indices, by local expert
  std::fill(offsets, offsets + held + 1, 0);
  auto local = [&](int64_t slot) -> int32_t {
    const int32_t e = op.expert_ids[slot];
    TANDEM_CHECK(e >= 0 && e < op.n_expert);
    return op.local_index ? op.local_index[e] : e;
  };
  for (int64_t s = 0; s < T * K; ++s)
    if (const int32_t m = local(s); m >= 0) ++offsets[m + 1];
  for (int64_t m = 0; m < held; ++m) offsets[m + 1] += offsets[m];
  expert_fill_.assign(offsets, offsets + held);
  for (int64_t s = 0; s < T * K; ++s)
    if (const int32_t m = local(s); m >= 0) order[expert_fill_[size_t(m)]++] = int32_t(s);

  float* x = grow(scratch_a_, size_t(T * K * D));
  float* gate = grow(scratch_b_, size_t(T * K * F));
  float* up = grow(scratch_c_, size_t(T * K * F));
  float* down = grow(scratch_d_, size_t(T * K * D));
  // Expert m's n tokens occupy rows [first, first + n) of x, gate, up and down. All experts'
  // gate and up projections run as one parallel job, then all the down projections: at decode
  // the threads share out a dozen small matrices instead of meeting after each one.
  auto for_each_used_expert = [&](auto&& fn) {
    for (int64_t m = 0; m < held; ++m)
      if (const int64_t n = offsets[m + 1] - offsets[m]; n > 0) fn(m, int64_t(offsets[m]), n);
  };
  auto args_of = [&](const WeightView& w, const float* input, int64_t n, float* output) {
    return cpu::MatmulArgs{.weight_type = w.type, .weights = w.data, .rows = w.rows,
                           .cols = w.cols, .input = input, .n_tokens = n, .output = output,
                           .kernels = op.kernels};
  };
  matmul_args_.clear();
  for_each_used_expert([&](int64_t m, int64_t first, int64_t n) {
    for (int64_t i = 0; i < n; ++i)
      std::copy_n(op.input + (order[first + i] / K) * D, D, x + (first + i) * D);
    matmul_args_.push_back(args_of(op.gate.matrix(m), x + first * D, n, gate + first * F));
    matmul_args_.push_back(args_of(op.up.matrix(m), x + first * D, n, up + first * F));
  });
  cpu::matmul_many(matmul_args_, pool_);
  const int64_t n_slots = offsets[held];
  for (int64_t i = 0; i < n_slots * F; ++i) gate[i] = silu(gate[i]) * up[i];
  matmul_args_.clear();
  for_each_used_expert([&](int64_t m, int64_t first, int64_t n) {
    matmul_args_.push_back(args_of(op.down.matrix(m), gate + first * F, n, down + first * D));
  });
  cpu::matmul_many(matmul_args_, pool_);
  for (int64_t i = 0; i < n_slots; ++i)
    std::copy_n(down + i * D, D, op.slots + int64_t(order[i]) * D);
}

void CpuBackend::moe_reduce(const MoeReduceOp& op) {
  const int64_t K = op.top_k, D = op.dim;
  for (int64_t t = 0; t < op.n_tokens; ++t) {
    float* out = op.output + t * D;
    std::fill(out, out + D, 0.0f);
    for (int64_t k = 0; k < K; ++k) {
      const float w = op.weights[t * K + k];
      const float* slot = op.slots + (t * K + k) * D;
      for (int64_t d = 0; d < D; ++d) out[d] += w * slot[d];
    }
  }
}

void CpuBackend::matmul_rows(const WeightView& w, const float* input, int64_t n_tokens,
                             float* output, KernelChoice kernels) {
  cpu::matmul({.weight_type = w.type,
               .weights = w.data,
               .rows = w.rows,
               .cols = w.cols,
               .input = input,
               .n_tokens = n_tokens,
               .output = output,
               .kernels = kernels},
              pool_);
}

}  // namespace tandem::cpu
