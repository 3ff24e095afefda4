#pragma once
// Predicts prefill and decode tokens/s of a Placement without running it: bytes each step reads
// over each device's bandwidth, FLOPs over its throughput, activations copied at every device
// cut, and CPU/GPU overlap (a MoE layer's parts on different devices run at the same time, so
// the layer costs the slowest part plus a sync, not the sum). Every number it gives is a
// prediction and is printed as one. All tuning values live in CostParams, each with its reason.
#include <cstdint>
#include <vector>

#include "plan/placement.h"

namespace tandem::plan {

// How close one kind of device gets to its DeviceSpec, and what a step costs besides bytes.
struct DeviceKindCost {
  double bandwidth_efficiency = 1;  // fraction of DeviceSpec::bandwidth_bytes_per_s reached
  double flops_efficiency = 1;      // fraction of DeviceSpec::flops_per_s reached by matmuls
  double op_overhead_s = 0;         // fixed cost of one coarse op (launch, fork/join)
  double kernel_efficiency = 1;     // fraction of DeviceSpec::decode_kernel_bytes_per_s reached
                                    // inside a whole decode step (where that rate is measured)
  double fallback_bandwidth_bytes_per_s = 0;  // used when a spec leaves bandwidth at 0
  double fallback_flops_per_s = 0;            // used when a spec leaves flops at 0
};

struct CostParams {
  // CPU: bandwidth is measured with a STREAM triad, which quantized matmuls that dequantize on
  // the fly do not reach: llama.cpp-style kernels read weights at 60-80% of it on decode.
  // Quantized dot kernels reach about half of nominal FMA peak at prefill batch sizes. One
  // coarse op forks and joins the thread pool once: 5-20 us on a many-core host.
  // With our decode kernel's rate measured on the host (kernel_rate.h), a decode step reads its
  // weights at that rate; the fork/joins of its ~320 ops come on top (measured on the lite
  // model, 2 threads, weights on huge pages: 17.9 tokens/s = 28.8 GB/s of weights against a
  // 28.3 GB/s kernel rate. With 4 KiB pages it was 75%, the rest page-table work).
  DeviceKindCost cpu = {.bandwidth_efficiency = 0.7,
                        .flops_efficiency = 0.5,
                        .op_overhead_s = 15e-6,
                        .kernel_efficiency = 1.0,
                        .fallback_bandwidth_bytes_per_s = 50e9,  // dual-channel DDR5 desktop
                        .fallback_flops_per_s = 0.5e12};         // 8 AVX2 cores at ~3 GHz
  // CUDA: bandwidth is the spec-sheet peak; quantized GEMV kernels reach 70-80% of it.
  // Quantized GEMM with dequantization reaches 30-50% of tensor-core peak at batch 512.
  // A coarse op is a few kernels; with decode captured as a CUDA graph each costs ~2-3 us.
  DeviceKindCost cuda = {.bandwidth_efficiency = 0.75,
                         .flops_efficiency = 0.4,
                         .op_overhead_s = 8e-6,
                         .fallback_bandwidth_bytes_per_s = 700e9,  // mid-range data-centre card
                         .fallback_flops_per_s = 100e12};
  // sim:N runs the CPU kernels on its own worker thread: CPU efficiencies of its spec, plus per
  // op the wake-up of that thread and its wait for a core the pool's threads also want: 150 us
  // (measured on the lite model, 2 cores: decode lost ~0.5 ms per device per layer beyond the
  // bytes, alike with sim:2x2GiB and sim:3x1GiB; a part is 4 ops).
  DeviceKindCost sim = {.bandwidth_efficiency = 0.7,
                        .flops_efficiency = 0.5,
                        .op_overhead_s = 150e-6,
                        .kernel_efficiency = 0.75,
                        .fallback_bandwidth_bytes_per_s = 20e9,
                        .fallback_flops_per_s = 0.1e12};

  // Copies between host and device: pinned-memory copies reach ~80% of the PCIe rate, and each
  // copy plus its event costs ~10 us however small (decode copies are a few KiB).
  double transfer_efficiency = 0.8;
  double transfer_latency_s = 10e-6;
  // When a MoE layer's experts span devices, the owner waits on the others' events and adds
  // their partial sums: one event wait and one small add.
  double sync_s = 20e-6;
  // Experts streamed from the file are read whole (tens of MB each), close to sequential NVMe
  // speed, less page-cache overhead.
  double disk_efficiency = 0.7;
  // Predictions are for a context this full: the average over a conversation that fills it.
  double context_fill = 0.5;
  // Coarse ops per attention block (norm, q, kv_a, attention, output, add) and per FFN block
  // (norm, router, experts, add): each pays op_overhead_s once.
  int attention_ops = 6;
  int ffn_ops = 4;

  const DeviceKindCost& of(DeviceKind kind) const;
};

// Expected number of distinct experts a step of `batch` tokens reads, when each token chooses
// `n_used` of `n_expert` uniformly: E * (1 - (1 - k/E)^B).
double expected_distinct_experts(uint32_t n_expert, uint32_t n_used, int64_t batch);
// The same from per-expert choice probabilities p_e (summing to k): sum_e 1 - (1 - p_e)^B.
double expected_distinct_experts(const std::vector<double>& choice_probability, int64_t batch);

// Probability that one token chooses each expert of `layer`: from the profile's counts
// (normalized to sum to n_expert_used) when it has that layer, else uniform k/E.
std::vector<double> expert_choice_probabilities(const ModelInventory& inventory,
                                                const RoutingProfile* profile, uint32_t layer);

// FLOPs one token spends in a weight group's matmuls (2 per weight; embeddings are a row copy).
double group_flops_per_token(const Deepseek2Hparams& hp, const InventoryGroup& group);

// Prefill tokens/s (one sequence, Workload::prefill_batch tokens per step) and decode tokens/s
// (Workload::n_parallel sequences, one token each per step; the total over sequences).
Prediction predict_speed(const ModelInventory& inventory, const Hardware& hardware,
                         const Workload& workload, const Placement& placement,
                         const RoutingProfile* profile, const CostParams& params = CostParams{});

}  // namespace tandem::plan
