#pragma once
// What the ranks of one run over MPI must agree on before each plans its part alone: whether to
// divide the model by a plan at all (every rank has devices to plan for), and the machine that
// plan is for. Each rank measures its own devices (free memory, rates), and machines alike differ
// by a few MiB or percent: planned from their own numbers, two ranks could choose different
// candidates. So every rank plans from the same numbers: the least free memory of each device
// over the ranks, and rank 0's rates and links.
#include "core/transport.h"
#include "plan/hardware.h"
#include "runtime/rank_spread.h"

namespace tandem {

// The default --spread: Plan when every rank has devices to plan for (`cpu_only` false on each),
// Pipeline otherwise (the planner plans the RAM of the first machine only). A collective.
Spread default_spread(Transport& transport, bool cpu_only);

// Makes `hw` (this rank's machine) the same on every rank: the same number of devices (else
// throws naming the ranks that differ), each device's memory the least any rank has, the host's
// and each device's rates and the GPUs' links rank 0's. A collective.
void agree_on_hardware(Transport& transport, plan::Hardware& hw);

}  // namespace tandem
