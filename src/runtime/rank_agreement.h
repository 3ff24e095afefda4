#pragma once
// What the ranks of one run over MPI must agree on before each plans its part alone: whether to
// divide the model by a plan at all (every rank has devices to plan for), and the machine that
// plan is for. Each rank measures its own devices (free memory, rates), and machines alike differ
// by a few MiB or percent: planned from their own numbers, two ranks could choose different
// candidates. So every rank plans from the same numbers: the least free memory of each device
// over the ranks, and rank 0's rates and links.
#include <cstdint>
#include <string>

#include "core/transport.h"
#include "plan/hardware.h"
#include "runtime/rank_spread.h"

namespace tandem {

// The default --spread: Plan when every rank has devices to plan for (`cpu_only` false on each),
// Pipeline otherwise (the planner plans the RAM of the first machine only). A collective.
Spread default_spread(Transport& transport, bool cpu_only);

// Makes `hw` (this rank's machine) the same on every rank: the same number of devices (else
// throws naming the ranks that differ), each device's memory the least any rank has, the hosts'
// (every machine's) and each device's rates and the GPUs' links rank 0's. A collective.
void agree_on_hardware(Transport& transport, plan::Hardware& hw);

// The machines of the cluster file at `path` (plan/cluster.h), read by every rank from its own
// copy: throws unless every rank read the same machines (their GPUs and memory, the RAM it gives,
// the links) and there are as many as ranks, naming the fix. The hosts' rates (measured where the
// file gives none) are still each rank's own: agree_on_hardware makes them rank 0's. `threads`
// measure them. A collective.
plan::Hardware cluster_of_ranks(Transport& transport, const std::string& path, int32_t threads);

}  // namespace tandem
