// core/replica_choice.h gives each chosen expert of a step to one of its holders; every device of
// the layer runs it and must agree, each expert computed exactly once. The rule: experts with one
// holder first, then each copied expert in slot order to its least loaded holder, the home on
// ties; load counts distinct experts, the layer's device starting at its shared experts.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "core/replica_choice.h"

namespace tandem {
namespace {

// Holders table from lists (home first), padded to the longest.
struct Table {
  std::vector<int32_t> holders;
  int32_t max_holders = 1;
  explicit Table(const std::vector<std::vector<int32_t>>& of) {
    for (const auto& h : of) max_holders = std::max(max_holders, int32_t(h.size()));
    holders.assign(of.size() * size_t(max_holders), -1);
    for (size_t e = 0; e < of.size(); ++e)
      std::copy(of[e].begin(), of[e].end(), holders.begin() + ptrdiff_t(e * size_t(max_holders)));
  }
  int64_t n_expert() const { return int64_t(holders.size()) / max_holders; }
};

struct Choice {
  std::vector<int32_t> chosen;
  std::vector<int32_t> load;
};

Choice choose(const Table& t, const std::vector<int32_t>& ids, int32_t busy_shard = -1,
              int32_t busy_load = 0) {
  Choice c{std::vector<int32_t>(size_t(t.n_expert()), -1), std::vector<int32_t>(kMaxReplicaShards)};
  choose_replicas(ids.data(), int64_t(ids.size()), t.holders.data(), t.max_holders, t.n_expert(),
                  busy_shard, busy_load, c.chosen.data(), c.load.data());
  return c;
}

TEST(ReplicaChoice, ExpertsWithoutCopiesGoHomeFirstThenCopiesFillTheLeastLoaded) {
  // Experts 0-3 homed on shard 0, 4-7 on shard 1; 2 and 3 have copies on shard 1.
  const Table t({{0}, {0}, {0, 1}, {0, 1}, {1}, {1}, {1}, {1}});
  // Slot order puts the copied experts first: they still wait for the forced ones (0 and 1 go
  // to shard 0, 4 to shard 1), then 2 goes to shard 1 (its load 1 < 2), and 3 finds both at 2:
  // the tie goes to its home, shard 0.
  const Choice c = choose(t, {2, 3, 0, 1, 4});
  EXPECT_EQ(c.chosen, (std::vector<int32_t>{0, 0, 1, 0, 1, -1, -1, -1}));
  EXPECT_EQ(c.load[0], 3);
  EXPECT_EQ(c.load[1], 2);
}

TEST(ReplicaChoice, AnExpertChosenByManyTokensIsReadOnceAndCountedOnce) {
  const Table t({{0, 1}, {0, 1}, {1}});
  const Choice c = choose(t, {0, 2, 0, 2, 0, 1});  // three tokens, two slots each
  // Forced: 2 on shard 1. Then 0 to shard 0 (0 < 1), 1 to shard 0 (tie 1 = 1: home).
  EXPECT_EQ(c.chosen, (std::vector<int32_t>{0, 0, 1}));
  EXPECT_EQ(c.load[0], 2);
  EXPECT_EQ(c.load[1], 1);
}

TEST(ReplicaChoice, TheLayersDeviceStartsBusyWithItsSharedExperts) {
  const Table t({{0, 1}, {1, 0}});
  EXPECT_EQ(choose(t, {0, 1}).chosen, (std::vector<int32_t>{0, 1}));  // each at home
  // Shard 0 runs the shared experts (one): expert 0 moves to shard 1, expert 1 stays there.
  const Choice busy = choose(t, {0, 1}, /*busy_shard=*/0, /*busy_load=*/1);
  EXPECT_EQ(busy.chosen, (std::vector<int32_t>{1, 1}));
  EXPECT_EQ(busy.load[0], 1);
  EXPECT_EQ(busy.load[1], 2);
}

// On random routings: each chosen expert goes to one of its holders, the others stay -1, the
// loads add up, and the busiest shard has fewer experts on average than without the copies (a
// greedy rule: one routing may come out worse, the average must not).
TEST(ReplicaChoice, RandomRoutingsAreCoveredOnceAndTheBusiestShardWaitsLess) {
  std::mt19937 rng(7);
  const int32_t n_expert = 64, n_shards = 4, k = 6;
  std::vector<std::vector<int32_t>> with, without;
  for (int32_t e = 0; e < n_expert; ++e) {
    const int32_t home = e * n_shards / n_expert;
    without.push_back({home});
    with.push_back(e % 3 ? std::vector<int32_t>{home, (home + 1 + e % 2) % n_shards}
                         : std::vector<int32_t>{home});
  }
  const Table copies(with), homes(without);
  double busiest_with = 0, busiest_without = 0;
  for (int trial = 0; trial < 2000; ++trial) {
    const int tokens = 1 + trial % 3;
    std::vector<int32_t> ids;
    for (int t = 0; t < tokens; ++t) {
      std::vector<int32_t> all(size_t(n_expert), 0);
      for (int32_t e = 0; e < n_expert; ++e) all[size_t(e)] = e;
      std::shuffle(all.begin(), all.end(), rng);
      ids.insert(ids.end(), all.begin(), all.begin() + k);
    }
    const Choice c = choose(copies, ids, 0, 1), h = choose(homes, ids, 0, 1);
    int32_t total = 0;
    for (int32_t e = 0; e < n_expert; ++e) {
      const bool picked = std::find(ids.begin(), ids.end(), e) != ids.end();
      if (!picked) {
        EXPECT_EQ(c.chosen[size_t(e)], -1);
        continue;
      }
      const auto& of = with[size_t(e)];
      EXPECT_NE(std::find(of.begin(), of.end(), c.chosen[size_t(e)]), of.end()) << e;
      ++total;
    }
    int32_t sum = 0;
    for (int32_t s = 0; s < n_shards; ++s) sum += c.load[size_t(s)];
    EXPECT_EQ(sum, total + 1);  // + the busy shard's start
    busiest_with += *std::max_element(c.load.begin(), c.load.end());
    busiest_without += *std::max_element(h.load.begin(), h.load.end());
  }
  EXPECT_LT(busiest_with, 0.9 * busiest_without);
}

// The backend op: this device's step index is its local index for the experts given to it.
TEST(ReplicaChoice, TheCpuOpKeepsTheLocalIndexOfItsOwnChoicesOnly) {
  cpu::CpuBackend cpu(1);
  const Table t({{0}, {0, 1}, {1, 0}, {1}});
  const std::vector<int32_t> ids = {0, 1, 2, 3};
  const std::vector<int32_t> local = {0, 1, 2, -1};  // shard 0 holds experts 0, 1, 2
  std::vector<int32_t> step(4, 99);
  cpu.pick_replicas({.expert_ids = ids.data(), .n_slots = 4, .holders = t.holders.data(),
                     .max_holders = t.max_holders, .n_expert = 4, .shard = 0, .busy_shard = -1,
                     .busy_load = 0, .local_index = local.data(), .step_local_index = step.data()});
  const Choice c = choose(t, ids);
  for (int32_t e = 0; e < 4; ++e)
    EXPECT_EQ(step[size_t(e)], c.chosen[size_t(e)] == 0 ? local[size_t(e)] : -1) << e;
  EXPECT_EQ(step[0], 0);   // forced home
  EXPECT_EQ(step[3], -1);  // another shard's
}

}  // namespace
}  // namespace tandem
