// Which rank runs each part of a model (runtime/rank_spread.h).
#include "runtime/rank_spread.h"

#include <gtest/gtest.h>

#include "core/error.h"

namespace tandem {
namespace {

ModelInfo moe_model(uint32_t n_layers, uint32_t n_expert, uint32_t n_dense) {
  ModelInfo info;
  info.n_layer = n_layers;
  info.n_expert = n_expert;
  info.n_leading_dense = n_dense;
  return info;
}

TEST(RankSpread, APipelineGivesEachRankConsecutiveLayersAndItsExperts) {
  const RankPlan ranks = spread_over_ranks(Spread::Pipeline, moe_model(5, 4, 1), 2);
  EXPECT_EQ(ranks.layers, (std::vector<int32_t>{0, 0, 0, 1, 1}));
  EXPECT_EQ(ranks.embeddings, 0);
  EXPECT_EQ(ranks.output, 1);
  for (size_t il = 0; il < 5; ++il)
    EXPECT_EQ(ranks.experts[il], std::vector<int32_t>(4, ranks.layers[il])) << "layer " << il;
}

TEST(RankSpread, SpreadExpertsGoInEqualSharesAndDenseLayersStayWhole) {
  const RankPlan ranks = spread_over_ranks(Spread::Experts, moe_model(3, 6, 1), 3);
  EXPECT_EQ(ranks.layers, (std::vector<int32_t>{0, 0, 0}));
  EXPECT_EQ(ranks.output, 0);
  EXPECT_EQ(ranks.experts[0], std::vector<int32_t>(6, 0));  // dense: nothing to spread
  EXPECT_EQ(ranks.experts[1], (std::vector<int32_t>{0, 0, 1, 1, 2, 2}));
  const RankPlan mixed = spread_over_ranks(Spread::Mixed, moe_model(3, 6, 0), 3);
  EXPECT_EQ(mixed.layers, (std::vector<int32_t>{0, 1, 2}));
  EXPECT_EQ(mixed.experts[2], (std::vector<int32_t>{0, 0, 1, 1, 2, 2}));
}

TEST(RankSpread, TooManyRanksForTheModelIsRefusedWithTheFix) {
  EXPECT_THROW(spread_over_ranks(Spread::Pipeline, moe_model(2, 8, 0), 3), Error);
  EXPECT_THROW(spread_over_ranks(Spread::Experts, moe_model(8, 2, 0), 3), Error);
  EXPECT_THROW(parse_spread("tensor"), Error);
  EXPECT_EQ(parse_spread("mixed"), Spread::Mixed);
  EXPECT_EQ(parse_spread("plan"), Spread::Plan);
}

TEST(RankSpread, RanksWithoutPartsAreNamed) {
  RankPlan ranks = spread_over_ranks(Spread::Experts, moe_model(2, 4, 0), 2);
  EXPECT_TRUE(ranks_without_parts(ranks, 2).empty());
  EXPECT_EQ(ranks_without_parts(ranks, 4), (std::vector<int32_t>{2, 3}));
  ranks.experts[1].assign(4, 0);
  ranks.experts[0].assign(4, 0);
  EXPECT_EQ(ranks_without_parts(ranks, 2), (std::vector<int32_t>{1}));
  ranks.output = 1;  // the head alone is a part
  EXPECT_TRUE(ranks_without_parts(ranks, 2).empty());
}

TEST(RankSpread, StepsOverlapOnlyWhereRankZerosShareComesFirstAndEndsBeforeTheRest) {
  EXPECT_EQ(overlapping_stages(spread_over_ranks(Spread::Pipeline, moe_model(6, 4, 1), 2)), 2);
  EXPECT_EQ(overlapping_stages(spread_over_ranks(Spread::Pipeline, moe_model(6, 4, 1), 3)), 3);
  // Rank 0 computes experts of every layer, or runs every layer: it would wait for the rest.
  EXPECT_EQ(overlapping_stages(spread_over_ranks(Spread::Experts, moe_model(6, 4, 1), 2)), 1);
  EXPECT_EQ(overlapping_stages(spread_over_ranks(Spread::Mixed, moe_model(6, 4, 1), 2)), 1);
  RankPlan ranks = spread_over_ranks(Spread::Pipeline, moe_model(4, 4, 0), 2);  // 0 0 1 1
  EXPECT_EQ(overlapping_stages(ranks), 2);
  ranks.experts[0] = {0, 1, 0, 1};  // rank 1's experts in rank 0's share
  EXPECT_EQ(overlapping_stages(ranks), 1);
  ranks.experts[0] = {0, 0, 0, 0};
  ranks.experts[3] = {0, 1, 1, 1};  // rank 0 again after rank 1
  EXPECT_EQ(overlapping_stages(ranks), 1);
  ranks.experts[3] = {1, 1, 1, 1};
  ranks.layers = {0, 1, 0, 1};  // the residual goes 0 -> 1 -> 0 -> 1
  EXPECT_EQ(overlapping_stages(ranks), 1);
  // A later rank twice in a step (0 -> 1 -> 2 -> 1) is one stage: 3 ranks, 3 steps in flight.
  RankPlan three = spread_over_ranks(Spread::Pipeline, moe_model(4, 4, 0), 2);
  three.layers = {0, 1, 2, 1};
  for (size_t il = 0; il < 4; ++il) three.experts[il].assign(4, three.layers[il]);
  EXPECT_EQ(overlapping_stages(three), 3);
  ranks.layers = {0, 0, 0, 0};  // every layer on rank 0, the head on rank 1
  ranks.experts.assign(4, std::vector<int32_t>(4, 0));
  EXPECT_EQ(overlapping_stages(ranks), 2);
  ranks.output = 0;  // nothing leaves rank 0
  EXPECT_EQ(overlapping_stages(ranks), 1);
  ranks.output = 1;
  ranks.embeddings = 1;  // the step starts elsewhere
  EXPECT_EQ(overlapping_stages(ranks), 1);
}

TEST(RankSpread, ARankKeepsOnlyItsPartsAndDropsOneMachineSplits) {
  Backend* here = reinterpret_cast<Backend*>(uintptr_t(64));  // never dereferenced
  DevicePlan plan = DevicePlan::single(*here, 2, 4);
  plan.heads[0].push_back({.device = here, .first_head = 0, .n_heads = 1});
  const RankPlan ranks = spread_over_ranks(Spread::Mixed, moe_model(2, 4, 0), 2);
  keep_parts_of_rank(plan, ranks, 1);
  EXPECT_EQ(plan.embeddings, nullptr);
  EXPECT_EQ(plan.output, here);
  EXPECT_EQ(plan.layers, (std::vector<Backend*>{nullptr, here}));
  EXPECT_EQ(plan.experts[0], (std::vector<Backend*>{nullptr, nullptr, here, here}));
  EXPECT_TRUE(plan.heads[0].empty());
  EXPECT_EQ(plan.ranks.layers, ranks.layers);
}

}  // namespace
}  // namespace tandem
