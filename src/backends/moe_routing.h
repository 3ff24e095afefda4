#pragma once
// Expert routing of one token (MoeRouteOp, core/backend.h), written once for the CPU backend and
// the CUDA kernels: gate probabilities, the optional selection bias, group-limited selection, top-k
// and the weights. The CPU runs it per token; a kernel can run it per token in one thread.
//
// Ties are broken the same way everywhere: among equal scores the lower index wins, so the chosen
// experts never depend on the order in which a sort or a reduction happened to visit them. The
// selection loops cost O(n_expert * top_k) per token (top_k <= 8, n_expert <= 384 in the models we
// run) and need no container, so the device compiles them as they are.
#include <cmath>
#include <cstdint>

#include "core/backend.h"
#include "core/host_device.h"

namespace tandem {

// The routing of a MoE layer: MoeRouteOp without its arrays.
struct RouteParams {
  int64_t n_expert = 0;
  int64_t top_k = 0;  // experts per token, in [1, n_expert]
  MoeGating gating = MoeGating::Softmax;
  int64_t n_groups = 1;       // divides n_expert
  int64_t n_groups_used = 1;  // groups kept when n_groups > 1; 1/1 = no group limit
  bool normalize = false;     // divide the chosen weights by their sum
  float scale = 1.0f;         // then multiply by this
};

inline RouteParams route_params(const MoeRouteOp& op) {
  return {.n_expert = op.n_expert,
          .top_k = op.top_k,
          .gating = op.gating,
          .n_groups = op.n_groups,
          .n_groups_used = op.n_groups_used,
          .normalize = op.normalize,
          .scale = op.scale};
}

namespace routing_detail {

// Whether score a of index ia ranks before score b of index ib: the larger score first, the lower
// index on ties, NaN after every number (so a NaN logit still yields distinct, valid expert ids).
TANDEM_HD bool ranks_before(float a, int64_t ia, float b, int64_t ib) {
  if (a > b) return true;
  if (a < b) return false;
  const bool a_nan = a != a, b_nan = b != b;
  if (a_nan != b_nan) return b_nan;
  return ia < ib;
}

}  // namespace routing_detail

// The pieces of route_token below, shared with the GPU's warp-per-token kernel
// (backends/cuda/cuda_moe.cu), which runs the per-expert steps on 32 lanes.

// An expert's gate probability before softmax's division by the sum (sigmoid: final;
// SoftmaxOfTopK: the logit itself, which both selects and, through route_weights, weighs).
TANDEM_HD float gate_probability(MoeGating gating, float logit, float max_logit) {
  if (gating == MoeGating::SoftmaxOfTopK) return logit;
  return gating == MoeGating::Softmax ? hd::exp_f(logit - max_logit)
                                      : 1.0f / (1.0f + hd::exp_f(-logit));
}

// Group score: V3 (sigmoid) sums each group's two best experts; V2 (softmax) takes the best one,
// as each model was trained. `s` is the group's selection scores.
TANDEM_HD float group_score(MoeGating gating, const float* s, int64_t per_group) {
  float best = -INFINITY, second = -INFINITY;
  for (int64_t i = 0; i < per_group; ++i) {
    if (s[i] > best)
      second = best, best = s[i];
    else if (s[i] > second)
      second = s[i];
  }
  return gating == MoeGating::Sigmoid && per_group > 1 ? best + second : best;
}

// A group is kept when fewer than n_groups_used groups rank before it.
TANDEM_HD bool group_kept(const RouteParams& p, const float* group_scores, int64_t g) {
  int64_t rank = 0;
  for (int64_t h = 0; h < p.n_groups; ++h)
    if (routing_detail::ranks_before(group_scores[h], h, group_scores[g], g)) ++rank;
  return rank < p.n_groups_used;
}

// Whether expert e may be pick k: it ranks after pick k - 1 (every expert may be the first).
TANDEM_HD bool may_pick(const float* selection, const int32_t* ids, int64_t k, int64_t e) {
  return k == 0 || routing_detail::ranks_before(selection[ids[k - 1]], ids[k - 1], selection[e], e);
}

// The better of two candidates (score, index) by ranks_before; index -1 is no candidate. Folding
// candidates with it in any order and grouping finds the same pick as route_token's loop, since
// ranks_before is a total order on distinct indices: the GPU folds 32 lanes' bests by a shuffle
// tree (tested on the host against route_token).
TANDEM_HD void keep_better(float& score, int32_t& index, float other_score, int32_t other_index) {
  if (other_index < 0) return;
  if (index < 0 || routing_detail::ranks_before(other_score, other_index, score, index))
    score = other_score, index = other_index;
}

// The chosen weights from the unbiased probabilities, summed in k order, then normalized and
// scaled. SoftmaxOfTopK: `probs` holds the logits, and the weights are their softmax over the k
// chosen (the first pick has the largest logit).
TANDEM_HD void route_weights(const RouteParams& p, const float* probs, const int32_t* ids,
                             float* weights) {
  if (p.gating == MoeGating::SoftmaxOfTopK) {
    const float top = probs[ids[0]];
    float total = 0;
    for (int64_t k = 0; k < p.top_k; ++k) total += weights[k] = hd::exp_f(probs[ids[k]] - top);
    for (int64_t k = 0; k < p.top_k; ++k) weights[k] = weights[k] / total * p.scale;
    return;
  }
  float sum = 0;
  for (int64_t k = 0; k < p.top_k; ++k) sum += weights[k] = probs[ids[k]];
  for (int64_t k = 0; k < p.top_k; ++k)
    weights[k] = (p.normalize ? weights[k] / sum : weights[k]) * p.scale;
}

// Routes one token. The caller checks the parameters (RouteParams' comments). Scratch arrays are
// the caller's: probs and selection [n_expert], group_scores [n_groups].
TANDEM_HD void route_token(const RouteParams& p, const float* logits /*[n_expert]*/,
                           const float* bias /*[n_expert] or nullptr*/, float* probs,
                           float* selection, float* group_scores, int32_t* ids /*[top_k]*/,
                           float* weights /*[top_k]*/) {
  using routing_detail::ranks_before;
  const int64_t n_expert = p.n_expert;
  float max_logit = logits[0];  // std::max_element's rule: the first of equal maxima
  if (p.gating == MoeGating::Softmax)
    for (int64_t e = 1; e < n_expert; ++e)
      if (max_logit < logits[e]) max_logit = logits[e];
  float sum = 0;
  for (int64_t e = 0; e < n_expert; ++e) sum += probs[e] = gate_probability(p.gating, logits[e], max_logit);
  if (p.gating == MoeGating::Softmax)
    for (int64_t e = 0; e < n_expert; ++e) probs[e] /= sum;
  // The bias steers which experts are chosen, never how much they weigh (DeepSeek-V3).
  for (int64_t e = 0; e < n_expert; ++e) selection[e] = probs[e] + (bias ? bias[e] : 0.0f);

  if (p.n_groups > 1 && p.n_groups_used < p.n_groups) {
    const int64_t per_group = n_expert / p.n_groups;
    for (int64_t g = 0; g < p.n_groups; ++g)
      group_scores[g] = group_score(p.gating, selection + g * per_group, per_group);
    // The dropped groups' experts leave the selection.
    for (int64_t g = 0; g < p.n_groups; ++g)
      if (!group_kept(p, group_scores, g))
        for (int64_t i = 0; i < per_group; ++i) selection[g * per_group + i] = -INFINITY;
  }

  // Top-k, best first: pick k is the best expert that ranks after pick k - 1.
  for (int64_t k = 0; k < p.top_k; ++k) {
    int64_t best = -1;
    for (int64_t e = 0; e < n_expert; ++e) {
      if (!may_pick(selection, ids, k, e)) continue;
      if (best < 0 || ranks_before(selection[e], e, selection[best], best)) best = e;
    }
    ids[k] = int32_t(best);
  }
  route_weights(p, probs, ids, weights);
}

}  // namespace tandem
