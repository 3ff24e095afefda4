#pragma once
// The placement planner (DESIGN.md "Placement"): a pure function from the model's inventory,
// the machine, the workload, the user's rules and an optional routing profile to a Placement.
// No device and no file is touched, so every decision is unit-tested.
#include "plan/cost_model.h"
#include "plan/placement.h"

namespace tandem::plan {

// 1. reserves each layer's KV cache (on the device of its attention) and work buffers, and keeps
//    the RAM reserve free (Hardware::ram_reserve_bytes is already out of host.memory_bytes);
// 2. applies the rules' pins, rejecting a pin to an unknown device or one that overfills a
//    device (the message names the shortfall in GiB);
// 3. builds candidate placements around the same budgets and pins (candidates.cpp):
//    - the layer split: what every token reads (attention, router, shared experts, dense FFN,
//      KV, output head) on GPUs in contiguous layer ranges in proportion to free memory x
//      bandwidth, embeddings in RAM, the GPUs' remaining memory filled with routed experts (the
//      most used first with a profile, else whole layers on the GPU that owns the layer); also
//      on fewer GPUs when the model fits in VRAM;
//    - when the model fits in VRAM: expert parallel over the 2..all fastest GPUs, every MoE
//      layer's experts spread over them in the same contiguous ranges;
//      and the same with each layer's attention heads split over those GPUs (head-split MLA);
//    - when it does not: hybrids that keep 4/4..0/4 of the most whole expert layers that fit on
//      the GPUs and the same share of every other layer, spread over the GPUs or on the layer's;
//    and the rest of each in RAM, streamed from disk (kOnDisk) when RAM is short;
// 4. keeps the one the cost model predicts fastest (decode tokens/s of all Workload::n_parallel
//    streams; then prefill; a plan in memory beats one that streams from disk; ties keep the
//    earlier, so the layer split stays unless something beats it); `candidates` lists them all and
//    `explanation` says why, and why an idle GPU stays idle;
// 5. when experts stream from disk, `problems` says what does not fit, by how much, and what
//    would (another quant mix, more RAM).
// Deterministic; never exceeds any device's memory_bytes. Throws tandem::Error for impossible
// rules. Replicated hot experts are not planned: the executor does not run them yet.
Placement plan_placement(const ModelInventory& inventory, const Hardware& hardware,
                         const Workload& workload, const Rules& rules,
                         const RoutingProfile* profile, const CostParams& cost = CostParams{});

// "0-29, 31, 40-60" from a sorted list.
std::string format_ranges(const std::vector<int32_t>& sorted_values);

}  // namespace tandem::plan
