// route_token (backends/moe_routing.h), the routing shared by the CPU backend and the CUDA
// kernels, against the sort-based algorithm CpuBackend::moe_route used before it: the same ids
// and bit-identical weights on logits full of ties (equal logits, equal group scores), for both
// gatings, with and without bias and group limits, every top_k from 1 to 8.
#include "backends/moe_routing.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backends/cpu/cpu_backend.h"

namespace tandem {
namespace {

// Indices of the k largest values, largest first; ties go to the lower index.
void top_k_indices(const float* values, int64_t n, int64_t k, int32_t* out) {
  std::vector<int32_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int32_t a, int32_t b) {
    return values[a] > values[b] || (values[a] == values[b] && a < b);
  });
  std::copy(order.begin(), order.begin() + k, out);
}

// One token's routing as CpuBackend::moe_route computed it before route_token existed.
void reference_route(const RouteParams& p, const float* logits, const float* bias, int32_t* ids,
                     float* weights) {
  const int64_t E = p.n_expert, K = p.top_k;
  std::vector<float> probs(static_cast<size_t>(E)), selection(static_cast<size_t>(E)),
      group_scores(size_t(p.n_groups));
  if (p.gating == MoeGating::Softmax) {
    const float max_logit = *std::max_element(logits, logits + E);
    float sum = 0;
    for (int64_t e = 0; e < E; ++e) sum += probs[e] = std::exp(logits[e] - max_logit);
    for (int64_t e = 0; e < E; ++e) probs[e] /= sum;
  } else {
    for (int64_t e = 0; e < E; ++e) probs[e] = 1.0f / (1.0f + std::exp(-logits[e]));
  }
  for (int64_t e = 0; e < E; ++e) selection[e] = probs[e] + (bias ? bias[e] : 0.0f);
  if (p.n_groups > 1 && p.n_groups_used < p.n_groups) {
    const int64_t per_group = E / p.n_groups;
    for (int64_t g = 0; g < p.n_groups; ++g) {
      const float* s = selection.data() + g * per_group;
      float best = -INFINITY, second = -INFINITY;
      for (int64_t i = 0; i < per_group; ++i) {
        if (s[i] > best)
          second = best, best = s[i];
        else if (s[i] > second)
          second = s[i];
      }
      group_scores[g] = p.gating == MoeGating::Sigmoid && per_group > 1 ? best + second : best;
    }
    std::vector<int32_t> kept(size_t(p.n_groups_used));
    top_k_indices(group_scores.data(), p.n_groups, p.n_groups_used, kept.data());
    for (int64_t g = 0; g < p.n_groups; ++g)
      if (std::find(kept.begin(), kept.end(), g) == kept.end())
        std::fill(selection.begin() + g * per_group, selection.begin() + (g + 1) * per_group,
                  -INFINITY);
  }
  top_k_indices(selection.data(), E, K, ids);
  float sum = 0;
  for (int64_t k = 0; k < K; ++k) sum += weights[k] = probs[ids[k]];
  for (int64_t k = 0; k < K; ++k)
    weights[k] = (p.normalize ? weights[k] / sum : weights[k]) * p.scale;
}

struct Routed {
  std::vector<int32_t> ids;
  std::vector<float> weights;
};

Routed route_one(const RouteParams& p, const float* logits, const float* bias) {
  Routed r{std::vector<int32_t>(size_t(p.top_k)), std::vector<float>(size_t(p.top_k))};
  std::vector<float> probs(size_t(p.n_expert)), selection(size_t(p.n_expert));
  std::vector<float> group_scores(size_t(p.n_groups));
  route_token(p, logits, bias, probs.data(), selection.data(), group_scores.data(), r.ids.data(),
              r.weights.data());
  return r;
}

Routed reference_one(const RouteParams& p, const float* logits, const float* bias) {
  Routed r{std::vector<int32_t>(size_t(p.top_k)), std::vector<float>(size_t(p.top_k))};
  reference_route(p, logits, bias, r.ids.data(), r.weights.data());
  return r;
}

void expect_same_bits(const Routed& got, const Routed& want, const std::string& where) {
  ASSERT_EQ(got.ids, want.ids) << where;
  for (size_t k = 0; k < want.weights.size(); ++k)
    EXPECT_EQ(std::bit_cast<uint32_t>(got.weights[k]), std::bit_cast<uint32_t>(want.weights[k]))
        << where << " k " << k << ": " << got.weights[k] << " vs " << want.weights[k];
}

// Logits with many exact ties: a quarter are small multiples of 1/2, a quarter one shared value.
float tie_prone(std::mt19937& rng) {
  switch (rng() % 4) {
    case 0:
      return float(int(rng() % 5) - 2) * 0.5f;
    case 1:
      return 0.25f;
    default:
      return std::normal_distribution<float>(0.0f, 2.0f)(rng);
  }
}

// The tokens each parameter set is routed on, [n_tokens, n_expert]: random with ties; all equal;
// every group the same values in the same order; every group the same values shuffled (so with
// no bias or a periodic one, all group scores tie).
std::vector<float> test_tokens(int64_t n_expert, int64_t per_group, std::mt19937& rng) {
  std::vector<float> tokens;
  for (int64_t e = 0; e < n_expert; ++e) tokens.push_back(tie_prone(rng));
  for (int64_t e = 0; e < n_expert; ++e) tokens.push_back(-1.5f);
  std::vector<float> group(static_cast<size_t>(per_group));
  for (float& x : group) x = tie_prone(rng);
  for (int64_t e = 0; e < n_expert; ++e) tokens.push_back(group[size_t(e % per_group)]);
  for (int64_t g = 0; g < n_expert / per_group; ++g) {
    std::shuffle(group.begin(), group.end(), rng);
    tokens.insert(tokens.end(), group.begin(), group.end());
  }
  return tokens;
}

TEST(MoeRouting, RouteTokenMatchesSortReferenceBitwise) {
  std::mt19937 rng(11);
  int64_t cases = 0;
  for (int64_t n_expert : {8, 16, 24, 64, 160, 256}) {
    for (auto [n_groups, n_groups_used] : {std::pair<int64_t, int64_t>{1, 1}, {4, 2}, {8, 3}}) {
      if (n_expert % n_groups) continue;
      const int64_t per_group = n_expert / n_groups;
      for (int bias_kind = 0; bias_kind < 3; ++bias_kind) {  // none, random, periodic by group
        std::vector<float> bias(static_cast<size_t>(n_expert));
        for (int64_t e = 0; e < n_expert; ++e)
          bias[e] = bias_kind == 2 ? float(e % per_group % 3) * 0.125f : tie_prone(rng) * 0.1f;
        for (MoeGating gating : {MoeGating::Softmax, MoeGating::Sigmoid}) {
          for (bool normalize : {false, true}) {
            for (float scale : {1.0f, 2.5f}) {
              for (int64_t top_k = 1; top_k <= 8; ++top_k) {
                const RouteParams p{.n_expert = n_expert,
                                    .top_k = top_k,
                                    .gating = gating,
                                    .n_groups = n_groups,
                                    .n_groups_used = n_groups_used,
                                    .normalize = normalize,
                                    .scale = scale};
                const std::vector<float> tokens = test_tokens(n_expert, per_group, rng);
                for (size_t t = 0; t * n_expert < tokens.size(); ++t) {
                  const float* logits = tokens.data() + t * n_expert;
                  const float* b = bias_kind ? bias.data() : nullptr;
                  expect_same_bits(
                      route_one(p, logits, b), reference_one(p, logits, b),
                      "experts " + std::to_string(n_expert) + " groups " +
                          std::to_string(n_groups) + "/" + std::to_string(n_groups_used) +
                          " bias " + std::to_string(bias_kind) + " sigmoid " +
                          std::to_string(gating == MoeGating::Sigmoid) + " normalize " +
                          std::to_string(normalize) + " scale " + std::to_string(scale) +
                          " top_k " + std::to_string(top_k) + " token " + std::to_string(t));
                  ++cases;
                }
              }
            }
          }
        }
      }
    }
  }
  EXPECT_GT(cases, 5000);
}

// The tie rule by hand: equal scores go to the lower expert, equal groups to the lower group.
TEST(MoeRouting, TiesGoToTheLowerIndex) {
  const std::vector<float> equal(16, 0.5f);
  RouteParams p{.n_expert = 16, .top_k = 4, .gating = MoeGating::Sigmoid};
  EXPECT_EQ(route_one(p, equal.data(), nullptr).ids, (std::vector<int32_t>{0, 1, 2, 3}));

  // Four groups of four with the same values; groups 0 and 1 are kept, so the ties among their
  // best experts (3 and 7, then 2 and 6) go to group 0 first.
  const std::vector<float> periodic = {0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3};
  p = {.n_expert = 16, .top_k = 6, .gating = MoeGating::Sigmoid, .n_groups = 4, .n_groups_used = 2};
  EXPECT_EQ(route_one(p, periodic.data(), nullptr).ids, (std::vector<int32_t>{3, 7, 2, 6, 1, 5}));
  // Asking for more experts than the kept groups hold fills up with the lowest masked ones.
  p.top_k = 10;
  EXPECT_EQ(route_one(p, periodic.data(), nullptr).ids,
            (std::vector<int32_t>{3, 7, 2, 6, 1, 5, 0, 4, 8, 9}));
}

// A NaN logit (sigmoid gating keeps it to its own expert) ranks after every number: the ids stay
// valid and distinct.
TEST(MoeRouting, NanLogitStillGivesDistinctValidIds) {
  std::vector<float> logits = {0.1f, NAN, 2.0f, -1.0f, NAN, 0.3f, 0.2f, 1.0f};
  const RouteParams p{.n_expert = 8, .top_k = 8, .gating = MoeGating::Sigmoid};
  EXPECT_EQ(route_one(p, logits.data(), nullptr).ids,
            (std::vector<int32_t>{2, 7, 5, 6, 0, 3, 1, 4}));
}

TEST(MoeRouting, CpuMoeRouteIsRouteTokenPerToken) {
  std::mt19937 rng(5);
  cpu::CpuBackend cpu(1);
  const int64_t n_tokens = 9;
  for (const RouteParams& p :
       {RouteParams{.n_expert = 64,
       .top_k = 6,
       .gating = MoeGating::Softmax,
       .n_groups = 8,
       .n_groups_used = 3,
       .normalize = false,
       .scale = 16.0f},
        RouteParams{.n_expert = 256,
        .top_k = 8,
        .gating = MoeGating::Sigmoid,
        .n_groups = 8,
        .n_groups_used = 4,
        .normalize = true,
        .scale = 2.5f},
        RouteParams{.n_expert = 8, .top_k = 2, .gating = MoeGating::Softmax}}) {
    std::vector<float> logits(size_t(n_tokens * p.n_expert)), bias(size_t(p.n_expert));
    for (float& x : logits) x = tie_prone(rng);
    for (float& x : bias) x = tie_prone(rng) * 0.1f;
    std::vector<int32_t> ids(size_t(n_tokens * p.top_k));
    std::vector<float> weights(size_t(n_tokens * p.top_k));
    cpu.moe_route({.logits = logits.data(),
                   .bias = bias.data(),
                   .n_tokens = n_tokens,
                   .n_expert = p.n_expert,
                   .top_k = p.top_k,
                   .gating = p.gating,
                   .n_groups = p.n_groups,
                   .n_groups_used = p.n_groups_used,
                   .normalize = p.normalize,
                   .scale = p.scale,
                   .expert_ids = ids.data(),
                   .expert_weights = weights.data()});
    for (int64_t t = 0; t < n_tokens; ++t) {
      const Routed want = route_one(p, logits.data() + t * p.n_expert, bias.data());
      const Routed got{{ids.begin() + t * p.top_k, ids.begin() + (t + 1) * p.top_k},
                       {weights.begin() + t * p.top_k, weights.begin() + (t + 1) * p.top_k}};
      expect_same_bits(got, want,
                       "experts " + std::to_string(p.n_expert) + " token " + std::to_string(t));
    }
  }
}

// The GPU's routing kernel (backends/cuda/cuda_moe.cu) picks each expert with a warp: lane l
// keeps the best candidate among experts l, l + 32, ..., then a shuffle tree folds lane l with
// lane l ^ 16, l ^ 8, ... 1. Emulated here on tie-prone and NaN scores: every lane must end with
// route_token's pick, because keep_better folds under a total order.
TEST(MoeRouting, WarpFoldOfLaneBestsPicksRouteTokensExperts) {
  std::mt19937 rng(23);
  constexpr int kLanes = 32;
  int64_t picks = 0;
  for (int64_t n_expert : {8, 64, 160, 256}) {
    for (int trial = 0; trial < 40; ++trial) {
      std::vector<float> logits(static_cast<size_t>(n_expert));
      for (float& x : logits) x = tie_prone(rng);
      if (trial % 4 == 1) logits[size_t(trial) % logits.size()] = NAN;
      if (trial % 4 == 2) logits[size_t(3 * trial) % logits.size()] = -INFINITY;
      const int64_t top_k = std::min<int64_t>(8, n_expert);
      const RouteParams p{.n_expert = n_expert, .top_k = top_k, .gating = MoeGating::Sigmoid};
      const std::vector<int32_t> expected = route_one(p, logits.data(), nullptr).ids;
      std::vector<float> selection(logits.size());
      for (size_t e = 0; e < logits.size(); ++e)
        selection[e] = gate_probability(MoeGating::Sigmoid, logits[e], 0.0f);
      std::vector<int32_t> picked(static_cast<size_t>(top_k), -1);
      for (int64_t k = 0; k < top_k; ++k) {
        float score[kLanes];
        int32_t index[kLanes];
        for (int lane = 0; lane < kLanes; ++lane) {
          score[lane] = 0.0f, index[lane] = -1;
          for (int64_t e = lane; e < n_expert; e += kLanes)
            if (may_pick(selection.data(), picked.data(), k, e))
              keep_better(score[lane], index[lane], selection[size_t(e)], int32_t(e));
        }
        for (int offset = kLanes / 2; offset > 0; offset /= 2) {
          float next_score[kLanes];
          int32_t next_index[kLanes];
          for (int lane = 0; lane < kLanes; ++lane) {
            next_score[lane] = score[lane], next_index[lane] = index[lane];
            keep_better(next_score[lane], next_index[lane], score[lane ^ offset], index[lane ^ offset]);
          }
          std::copy(next_score, next_score + kLanes, score);
          std::copy(next_index, next_index + kLanes, index);
        }
        for (int lane = 0; lane < kLanes; ++lane)
          ASSERT_EQ(index[lane], expected[size_t(k)])
              << "experts " << n_expert << " trial " << trial << " pick " << k << " lane " << lane;
        picked[size_t(k)] = index[0];
        ++picks;
      }
    }
  }
  EXPECT_GT(picks, 1000);
}

}  // namespace
}  // namespace tandem
