#pragma once
// Which device computes each chosen expert of a step when some experts have copies on several
// devices (the planner copies hot experts where VRAM is left: plan/candidates.cpp). Every device
// of the layer runs this same function on the same routing and so agrees, without talking, on
// one holder per expert; the backends call it inside their `pick_replicas` op (a CUDA kernel on a
// GPU), and the cost model runs it on sampled routings to predict what the copies buy.
//
// The rule, greedy and deterministic: experts with one holder go there first (they have no
// choice), then each copied expert, in slot order, to its least loaded holder (the first listed
// on ties, its home). Load counts distinct experts (a step reads each chosen expert's weights
// once, whatever its tokens); `busy_shard` starts at `busy_load` (the layer's device also runs
// the shared experts). Near the best assignment: for DeepSeek-V3 on 8 GPUs with 65% of the
// experts copied (and no busy start), the busiest GPU gets 2.01 experts a decode step on average
// where the best assignment (searched exhaustively) gets 1.94 and no copies 2.56.
//
// Which device computes a slot never changes its bits: copies are placed only on devices of one
// kind, which run the same kernels, and the layer's device sums the slots in routing order.
#include <cstdint>

#include "core/host_device.h"

namespace tandem {

// Holders per expert and devices per layer the rule handles (a layer's devices are few GPUs).
inline constexpr int32_t kMaxReplicaShards = 16;

// holders: [n_expert][max_holders] shard numbers (0..n_shards-1), the home first, -1 padding.
// chosen: [n_expert], -1 everywhere on entry; on return the shard that computes each chosen
// expert this step (-1 for the others). load (out): [kMaxReplicaShards] distinct experts each
// shard computes, busy_load included.
TANDEM_HD void choose_replicas(const int32_t* expert_ids, int64_t n_slots, const int32_t* holders,
                               int32_t max_holders, int64_t n_expert, int32_t busy_shard,
                               int32_t busy_load, int32_t* chosen, int32_t* load) {
  for (int32_t i = 0; i < kMaxReplicaShards; ++i) load[i] = 0;
  if (busy_shard >= 0 && busy_shard < kMaxReplicaShards) load[busy_shard] = busy_load;
  for (int pass = 0; pass < 2; ++pass) {  // 0: experts with one holder; 1: the copied ones
    for (int64_t s = 0; s < n_slots; ++s) {
      const int32_t e = expert_ids[s];
      if (e < 0 || e >= n_expert || chosen[e] >= 0) continue;
      const int32_t* h = holders + int64_t(e) * max_holders;
      const bool copied = max_holders > 1 && h[1] >= 0;
      if (copied != (pass == 1)) continue;
      int32_t best = h[0];
      for (int32_t i = 1; i < max_holders && h[i] >= 0; ++i)
        if (load[h[i]] < load[best]) best = h[i];
      chosen[e] = best;
      ++load[best];
    }
  }
}

}  // namespace tandem
