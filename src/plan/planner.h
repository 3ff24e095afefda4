#pragma once
// The placement planner (DESIGN.md "Placement"): a pure function from the model's inventory,
// the machine, the workload, the user's rules and an optional routing profile to a Placement.
// No device and no file is touched, so every decision is unit-tested.
#include "plan/cost_model.h"
#include "plan/placement.h"

namespace tandem::plan {

// 1. reserves each layer's KV cache (on the device of its attention) and work buffers;
// 2. applies the rules' pins, rejecting a pin to an unknown device or one that overfills a
//    device (the message names the shortfall in GiB);
// 3. puts what every token reads (attention, router, shared experts, dense FFN, KV, output
//    head) on GPUs, layers split into contiguous ranges in proportion to free memory x
//    bandwidth; embeddings stay in RAM (a step reads one row per token);
// 4. fills the GPUs' remaining memory with routed experts: the most used first when a profile
//    is given, else whole layers on the GPU that owns the layer;
// 5. leaves the rest in RAM, streamed from disk (kOnDisk) when RAM is short; `problems` then
//    says what does not fit, by how much, and what would (another quant mix, more RAM);
// 6. predicts prefill and decode tokens/s with the cost model.
// Never exceeds any device's memory_bytes. Throws tandem::Error for impossible rules.
Placement plan_placement(const ModelInventory& inventory, const Hardware& hardware,
                         const Workload& workload, const Rules& rules,
                         const RoutingProfile* profile, const CostParams& cost = CostParams{});

// "0-29, 31, 40-60" from a sorted list.
std::string format_ranges(const std::vector<int32_t>& sorted_values);

}  // namespace tandem::plan
