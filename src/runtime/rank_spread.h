#pragma once
// How a run over several ranks divides a model between them (DESIGN.md "Several machines"), as
// `--spread` chooses: whole layers per rank (a pipeline), each MoE layer's routed experts over
// every rank, or both; within a rank, its own devices hold its parts as its one-machine plan puts
// them. Or (Plan) where a plan over N machines puts each part (device_setup.h rank_plan_for).
#include <cstdint>
#include <string_view>
#include <vector>

#include "model/device_plan.h"
#include "model/model.h"

namespace tandem {

enum class Spread {
  Pipeline,  // consecutive layers per rank; one activation crosses each cut per step
  Experts,   // every layer on rank 0, each MoE layer's routed experts spread over all ranks
  Mixed,     // layers as the pipeline, experts as Experts
  Plan,      // where a plan over N machines like this rank's puts each part (device_setup.h)
};

// "pipeline", "experts", "mixed" or "plan"; throws tandem::Error naming the accepted names.
Spread parse_spread(std::string_view name);
std::string_view spread_name(Spread spread);

// Which rank runs each part of a model of `info` over `n_ranks` ranks (transport not set), for
// every spread but Plan.
// Pipeline stages take consecutive layers in equal shares (the first stage the embeddings, the
// last the output head); routed experts go in consecutive equal shares. Throws tandem::Error
// when there are fewer layers (pipeline) or experts (experts) than ranks.
RankPlan spread_over_ranks(Spread spread, const ModelInfo& info, int32_t n_ranks);

// The ranks of `n_ranks` that `ranks` gives no part of the model, in order.
std::vector<int32_t> ranks_without_parts(const RankPlan& ranks, int32_t n_ranks);

// How many steps of different sequences can run over `ranks` at once, each on another rank: the
// ranks a step's residual stream passes through, when rank 0's share of the step comes first and
// is its own (the embeddings and a first run of layers, all their experts on rank 0) and it takes
// no part after (none of the later layers, their experts or the head); 1 otherwise, as rank 0
// would wait for another rank to finish the earlier step before it could finish its own.
//
// That rule is also what makes the overlap safe over MPI's matching: every message rank 0
// receives from a later rank during a step (the logits; with sim devices also the stand-in
// channel's answers to its sends) then comes after that rank has finished
// everything of the earlier steps, in the order rank 0 posted its receives.
int32_t overlapping_stages(const RankPlan& ranks);

// Restricts `plan` (this rank's devices for the whole model) to the parts `ranks` gives `rank`:
// the others become null. Split heads and copies of experts are dropped: they spread one layer
// over the devices of one machine, which a run over ranks does not do yet.
void keep_parts_of_rank(DevicePlan& plan, const RankPlan& ranks, int32_t rank);

}  // namespace tandem
