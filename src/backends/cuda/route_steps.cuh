#pragma once
// The routing of one token by one warp, shared by the routing kernel (cuda_moe.cu) and the router
// product that routes in its last block (matmul.cu). Device code: included by .cu files only.
#include <cstdint>

#include "backends/moe_routing.h"
#include "core/backend.h"

namespace tandem::cuda {

// Floats of shared memory route_token_warp takes for one token.
__host__ __device__ inline int64_t route_smem_floats(const RouteParams& p) {
  return 2 * p.n_expert + p.n_groups;
}

// One warp for token t: route_token's steps (backends/moe_routing.h) with the per-expert loops on
// 32 lanes and the scores in shared memory. A single thread per token, as the CPU runs it, took
// ~100 us a layer on an H200 (global-memory scratch, one expert at a time). The choices are the
// same: maxima and top-k picks under ranks_before (a total order) do not depend on the order of
// the comparisons; the softmax denominator is summed by a fixed tree (the CPU sums in expert
// order: the weights agree within rounding).
__device__ __forceinline__ void route_token_warp(const MoeRouteOp& op, const RouteParams& p,
                                                 int64_t t, float* smem) {
  constexpr int kWarp = 32;
  const int lane = threadIdx.x % kWarp;
  const int64_t E = p.n_expert;
  // A warp may route several tokens in turn on the same scratch: lane 0 finishes the last one's
  // weights (it alone reads probs at the end) before any lane writes this one's.
  __syncwarp();
  float* probs = smem;
  float* selection = probs + E;
  float* group_scores = selection + E;
  const float* logits = op.logits + t * E;
  float max_logit = logits[0];  // route_token's rule: NaN in front stays, later NaNs are skipped
  if (p.gating == MoeGating::Softmax && max_logit == max_logit) {
    float m = -INFINITY;
    for (int64_t e = lane; e < E; e += kWarp) m = fmaxf(m, logits[e]);
    for (int offset = kWarp / 2; offset > 0; offset /= 2)
      m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, offset));
    max_logit = fmaxf(max_logit, m);
  }
  float sum = 0.0f;
  for (int64_t e = lane; e < E; e += kWarp)
    sum += probs[e] = gate_probability(p.gating, logits[e], max_logit);
  for (int offset = kWarp / 2; offset > 0; offset /= 2)
    sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  for (int64_t e = lane; e < E; e += kWarp) {
    if (p.gating == MoeGating::Softmax) probs[e] /= sum;
    selection[e] = probs[e] + (op.bias ? op.bias[e] : 0.0f);
  }
  __syncwarp();
  if (p.n_groups > 1 && p.n_groups_used < p.n_groups) {
    const int64_t per_group = E / p.n_groups;
    for (int64_t g = lane; g < p.n_groups; g += kWarp)
      group_scores[g] = group_score(p.gating, selection + g * per_group, per_group);
    __syncwarp();
    bool kept[8];  // a lane's groups, decided before any selection score changes
    for (int64_t g = lane, i = 0; g < p.n_groups && i < 8; g += kWarp, ++i)
      kept[i] = group_kept(p, group_scores, g);
    __syncwarp();
    for (int64_t g = lane, i = 0; g < p.n_groups && i < 8; g += kWarp, ++i)
      if (!kept[i])
        for (int64_t j = 0; j < per_group; ++j) selection[g * per_group + j] = -INFINITY;
    __syncwarp();
  }
  int32_t* ids = op.expert_ids + t * p.top_k;
  int32_t picked[16];  // top_k <= 16: moe_route checks
  for (int64_t k = 0; k < p.top_k; ++k) {
    float best_score = 0.0f;
    int32_t best = -1;
    for (int64_t e = lane; e < E; e += kWarp)
      if (may_pick(selection, picked, k, e))
        keep_better(best_score, best, selection[e], int32_t(e));
    for (int offset = kWarp / 2; offset > 0; offset /= 2) {
      const float other_score = __shfl_xor_sync(0xffffffffu, best_score, offset);
      const int32_t other = __shfl_xor_sync(0xffffffffu, best, offset);
      keep_better(best_score, best, other_score, other);
    }
    picked[k] = best;
  }
  if (lane != 0) return;
  for (int64_t k = 0; k < p.top_k; ++k) ids[k] = picked[k];
  route_weights(p, probs, picked, op.expert_weights + t * p.top_k);
  if (op.counts)
    for (int64_t k = 0; k < p.top_k; ++k)
      atomicAdd(reinterpret_cast<unsigned long long*>(op.counts + picked[k]), 1ull);
}

}  // namespace tandem::cuda
