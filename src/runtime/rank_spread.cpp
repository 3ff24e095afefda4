#include "runtime/rank_spread.h"

#include <algorithm>

#include "core/error.h"

namespace tandem {

Spread parse_spread(std::string_view name) {
  if (name == "pipeline") return Spread::Pipeline;
  if (name == "experts") return Spread::Experts;
  if (name == "mixed") return Spread::Mixed;
  if (name == "plan") return Spread::Plan;
  fail("--spread {}: not a way to spread a model over ranks; use plan, pipeline, experts or mixed",
       name);
}

std::string_view spread_name(Spread spread) {
  switch (spread) {
    case Spread::Pipeline:
      return "pipeline";
    case Spread::Experts:
      return "experts";
    case Spread::Mixed:
      return "mixed";
    case Spread::Plan:
      return "plan";
  }
  return "?";
}

RankPlan spread_over_ranks(Spread spread, const ModelInfo& info, int32_t n_ranks) {
  TANDEM_CHECK(n_ranks >= 1 && spread != Spread::Plan);
  const int64_t n_layers = info.n_layer, n_expert = info.n_expert;
  const bool stages = spread != Spread::Experts, spread_experts = spread != Spread::Pipeline;
  if (stages && n_layers < n_ranks)
    fail(
        "a pipeline over {} ranks needs as many layers; the model has {}: use fewer ranks or "
        "--spread experts",
        n_ranks, n_layers);
  if (spread_experts && n_expert < n_ranks)
    fail(
        "spreading experts over {} ranks needs as many per layer; the model has {}: use fewer "
        "ranks or --spread pipeline",
        n_ranks, n_expert);
  RankPlan ranks;
  ranks.embeddings = 0;
  ranks.output = stages ? n_ranks - 1 : 0;
  for (int64_t il = 0; il < n_layers; ++il) {
    const int32_t layer_rank = stages ? int32_t(il * n_ranks / n_layers) : 0;
    ranks.layers.push_back(layer_rank);
    std::vector<int32_t>& experts = ranks.experts.emplace_back(size_t(n_expert), layer_rank);
    if (spread_experts && info.is_moe_layer(uint32_t(il)))
      for (int64_t e = 0; e < n_expert; ++e) experts[size_t(e)] = int32_t(e * n_ranks / n_expert);
  }
  return ranks;
}

std::vector<int32_t> ranks_without_parts(const RankPlan& ranks, int32_t n_ranks) {
  std::vector<bool> has(size_t(n_ranks), false);
  auto mark = [&](int32_t r) {
    if (r >= 0 && r < n_ranks) has[size_t(r)] = true;
  };
  mark(ranks.embeddings);
  mark(ranks.output);
  for (size_t il = 0; il < ranks.layers.size(); ++il) {
    mark(ranks.layers[il]);
    for (int32_t r : ranks.experts[il]) mark(r);
  }
  std::vector<int32_t> idle;
  for (int32_t r = 0; r < n_ranks; ++r)
    if (!has[size_t(r)]) idle.push_back(r);
  return idle;
}

int32_t overlapping_stages(const RankPlan& ranks) {
  if (ranks.embeddings != 0) return 1;
  std::vector<int32_t> seen = {0};  // the ranks the residual stream has passed through
  int32_t holder = 0;
  for (size_t il = 0; il < ranks.layers.size(); ++il) {
    const std::vector<int32_t>& experts = ranks.experts[il];
    if (ranks.layers[il] == 0) {
      // In rank 0's share every expert is rank 0's too: another rank's would make rank 0 wait
      // for that rank to finish the earlier step before it could finish its own.
      if (holder != 0 || std::ranges::any_of(experts, [](int32_t r) { return r != 0; })) return 1;
      continue;
    }
    if (std::ranges::find(experts, 0) != experts.end()) return 1;  // rank 0 again later
    holder = ranks.layers[il];
    if (std::ranges::find(seen, holder) == seen.end()) seen.push_back(holder);
  }
  if (ranks.output == 0) return 1;
  if (std::ranges::find(seen, ranks.output) == seen.end()) seen.push_back(ranks.output);
  return int32_t(seen.size());
}

void keep_parts_of_rank(DevicePlan& plan, const RankPlan& ranks, int32_t rank) {
  TANDEM_CHECK(ranks.layers.size() == plan.layers.size() &&
               ranks.experts.size() == plan.experts.size());
  if (ranks.embeddings != rank) plan.embeddings = nullptr;
  if (ranks.output != rank) plan.output = nullptr;
  for (size_t il = 0; il < plan.layers.size(); ++il) {
    if (ranks.layers[il] != rank) plan.layers[il] = nullptr;
    for (size_t e = 0; e < plan.experts[il].size(); ++e)
      if (ranks.experts[il][e] != rank) plan.experts[il][e] = nullptr;
  }
  plan.expert_copies.clear();
  for (std::vector<AttentionShare>& shares : plan.heads) shares.clear();
  plan.ranks = ranks;
}

}  // namespace tandem
