#pragma once
// Predicts prefill and decode tokens/s of a Placement without running it: bytes each step reads
// over each device's bandwidth, FLOPs over its throughput, activations copied at every device
// cut over the link between the two (NVLink or PCIe between GPUs, PCIe to the host), and the
// overlap of a MoE layer's parts on different devices: they run at the same time, so the layer
// costs the expected slowest part (which experts a step chooses is random, and with experts
// spread over many devices one of them usually gets more than its share), plus the broadcast of
// the input to them and the gather of their outputs, not the sum. Each GPU's graph launch and
// the logits' trip back to the host are paid once a step. Where experts have copies on a second
// GPU (Placement::group_copies), a decode step's slowest device is sampled: routings drawn from
// the choice probabilities, given to holders by the executor's own rule (core/replica_choice.h).
// Every number it gives is a prediction and is printed as one. All tuning values live in
// CostParams, each with its source.
#include <cstdint>
#include <string>
#include <vector>

#include "plan/placement.h"

namespace tandem::plan {

// One kind of link: the rate a copy reaches in one direction, and a small copy's time.
struct LinkCost {
  double bandwidth_bytes_per_s = 0;
  double latency_s = 0;
};

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
  // sim:N runs the CPU kernels on its own worker thread: CPU efficiencies of its spec, the
  // one-thread decode kernel rate (measured by bench) reached in full, plus per op the wake-up
  // of that thread and its wait for a core the pool's threads also want: 75 us (fitted on the
  // lite model, 2 cores, all on sim:12GiB; the same constants predict a layer split over
  // sim:2x6GiB at 0.91x and an expert split over it at 0.87x of measured).
  DeviceKindCost sim = {.bandwidth_efficiency = 0.7,
                        .flops_efficiency = 0.5,
                        .op_overhead_s = 75e-6,
                        .kernel_efficiency = 1.0,
                        .fallback_bandwidth_bytes_per_s = 20e9,
                        .fallback_flops_per_s = 0.1e12};

  // ---- links -----------------------------------------------------------------------------
  // What one copy over each kind of link costs: the rate copies reach in one direction and the
  // time of a small copy end to end (its latency: a captured copy node plus the event the next op
  // waits on). Decode copies are a few KiB to a few hundred KiB, so the latency dominates them.
  // GPU to GPU over NVLink 3 (A100 SXM): 12 links x 25 GB/s = 300 GB/s per direction (NVIDIA
  // A100 datasheet, "600 GB/s" counts both); copies reach ~230 GB/s (NCCL maintainer in
  // nccl-tests issue 149: 128-byte payloads give 20 of each link's 25 GB/s). Latency: 1.8-2.3 us
  // for a P2P write between NVLink-connected GPUs (cuda-samples p2pBandwidthLatencyTest, as
  // reported in cuda-samples issue 230). H100/H200 NVLink 4 is 1.5x this: the plan is
  // conservative for them.
  LinkCost nvlink = {.bandwidth_bytes_per_s = 230e9, .latency_s = 2.5e-6};
  // GPU to GPU over PCIe 4.0 x16: 31.5 GB/s per direction line rate (PCI-SIG); peer copies
  // measure 20-22 GB/s (p2pBandwidthLatencyTest on A100 PCIe in nccl issue 814). Latency:
  // 11-20 us where peer access is off and copies go through the host (cuda-samples issue 230);
  // consumer cards have no peer access.
  LinkCost pcie4 = {.bandwidth_bytes_per_s = 21e9, .latency_s = 12e-6};
  // PCIe 5.0 x16: 63 GB/s line rate (PCI-SIG), the same share of it as PCIe 4 reaches (one
  // H100 node measures 37 GB/s between GPUs through the host, nccl issue 1264); the latency is
  // the protocol's and the copy engines', unchanged by the generation.
  LinkCost pcie5 = {.bandwidth_bytes_per_s = 42e9, .latency_s = 12e-6};
  // Host to GPU over PCIe 4.0 / 5.0 x16 from pinned memory: ~80% of the line rate (CUDA's
  // bandwidthTest: 25-26 GB/s on PCIe 4, ~50 GB/s on PCIe 5), ~10 us for a small copy and its
  // event however small (measured on tandem's hybrid steps, a few KiB each).
  LinkCost host_pcie4 = {.bandwidth_bytes_per_s = 25e9, .latency_s = 10e-6};
  LinkCost host_pcie5 = {.bandwidth_bytes_per_s = 50e9, .latency_s = 10e-6};
  // Between host-memory devices (cpu, sim:N) a copy is a memcpy at the host's bandwidth; it
  // still costs a hand-over between threads (the sim calibration above includes it).
  double host_copy_latency_s = 10e-6;

  // ---- collectives of a parallel MoE layer ----------------------------------------------------
  // The executor (model/deepseek2.cpp routed_experts, split_attention) sends the layer's input and
  // routing to each device that holds some of its experts or heads (one copy each, on that
  // device's stream, all at once: a broadcast that shares the sender's link), and each of them
  // sends its outputs back on its own stream into a place of its own on the layer's device, all
  // at once (a gather that shares the receiver's link); the layer's device then adds them in a
  // fixed order with one op (add_parts). So a gather costs one copy's latency, the bytes of all
  // peers through one link, and one small kernel, whatever the number of peers. For scale: an
  // 8-byte NCCL all_reduce over NVLink 3 takes ~10 us (nccl-tests issue 331, A100); a gather
  // here is ~2.5 us + the bytes + an add. The broadcast waits for the layer's device to norm
  // and route the input (two coarse ops), so no other device starts before that.
  // One small kernel (an add, a zero) inside a captured CUDA graph: the ~2-3 us each kernel of a
  // coarse op costs (see cuda.op_overhead_s).
  double gpu_small_op_s = 3e-6;

  // ---- per step ----------------------------------------------------------------------------
  // Each GPU that runs a part of a step launches its captured graph once (cudaGraphLaunch:
  // ~2.5 us on the host for a straight-line graph, NVIDIA's "Constant Time Launch for
  // Straight-Line CUDA Graphs", plus its wait for the step's inputs); and the host waits for the
  // step's end and reads the logits back over PCIe (one small copy's latency plus their bytes).
  double gpu_step_launch_s = 5e-6;
  // When a MoE layer's experts span devices, the owner waits on the host's event and adds its
  // partial sums: one event wait and one small add (the host's share of a hybrid layer). Where
  // the GPU's hand-off was measured (DeviceSpec::host_handoff_s), that replaces this, the copies'
  // latencies and host_pcie's rate (by host_link_bytes_per_s).
  double sync_s = 20e-6;
  // A prompt chunk streams the host's experts to a GPU in groups of at most this many bytes
  // (DevicePlan::stream_group_bytes): each copy pays the link's latency once.
  double stream_group_bytes = 64.0 * 1024 * 1024;
  // Those copies come from the weights' pageable memory, which the driver stages through its own
  // page-locked buffers: about half the page-locked rate (NVIDIA's bandwidthTest, pageable
  // against pinned; not yet measured on tandem's copies).
  double pageable_copy_efficiency = 0.5;
  // Experts streamed from the file are read whole (tens of MB each), close to sequential NVMe
  // speed, less page-cache overhead.
  double disk_efficiency = 0.7;
  // Predictions are for a context this full: the average over a conversation that fills it.
  double context_fill = 0.5;
  // Coarse ops per attention block (norm, q, kv_a, attention, output, add) and per FFN block
  // (norm, router, experts, add): each pays op_overhead_s once.
  int attention_ops = 6;
  int ffn_ops = 4;
  // Of those, what each device of a head-split attention runs for its heads (q_b, attention with
  // its rope and KV store, output projection); the layer's device runs the rest.
  int head_ops = 3;

  const DeviceKindCost& of(DeviceKind kind) const;
  const LinkCost& gpu_link(LinkKind kind) const;   // GPU to GPU
  const LinkCost& host_link(LinkKind kind) const;  // host to GPU on a machine of that kind
};

// What `messages` copies of `bytes` in all cost over `link`: a latency each, the bytes at its rate
// (every transfer the model charges; bench compares it with a run over MPI ranks).
double link_seconds(const LinkCost& link, double messages, double bytes);

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
double group_flops_per_token(const ModelInfo& info, const InventoryGroup& group);

// The bytes of a layer's attention group (`attention_bytes`) that `n_heads` of its heads take to
// another device when it is split by heads (ModelInfo::head_split: q_b or q, k_b and v_b and the
// output projection go by head; q_a and kv_a stay whole on the layer's device): what the planner
// moves and its budgets count.
uint64_t head_share_bytes(const ModelInfo& info, uint64_t attention_bytes, int32_t n_heads);

// Prefill tokens/s (one sequence, Workload::prefill_batch tokens per step) and decode tokens/s
// (Workload::n_parallel sequences, one token each per step; the total over sequences).
Prediction predict_speed(const ModelInventory& inventory, const Hardware& hardware,
                         const Workload& workload, const Placement& placement,
                         const RoutingProfile* profile, const CostParams& params = CostParams{});

// The smallest prompt chunk (tokens) from which streaming the routed experts held in RAM to
// their layer's GPU is predicted faster than the host computing them; 0 when no chunk of up to
// workload.prefill_batch tokens is, or the placement has no such experts (or reads some from
// disk). A search over predict_speed's prompt step: the planner runs it for the placement it
// chose.
int64_t stream_experts_min_tokens(const ModelInventory& inventory, const Hardware& hardware,
                                  const Workload& workload, const Placement& placement,
                                  const RoutingProfile* profile,
                                  const CostParams& params = CostParams{});

// Prefill tokens/s of one chunk of workload.prefill_batch tokens with the host's experts streamed
// to their layer's GPU or computed by the host: what a run with --stream-experts does.
double predict_prefill_tokens_per_s(const ModelInventory& inventory, const Hardware& hardware,
                                    const Workload& workload, const Placement& placement,
                                    const RoutingProfile* profile, bool stream_host_experts,
                                    const CostParams& params = CostParams{});

// One line on how prompt chunks treat the routed experts kept in RAM beside a GPU (plan, bench):
// empty when the plan has none. `min_tokens`: what the run uses (the prediction's, or
// --stream-experts when `asked`); `prefill_batch`: the chunk the prediction is for.
std::string expert_streaming_summary(const Prediction& predicted, int64_t min_tokens, bool asked,
                                     int64_t prefill_batch);

}  // namespace tandem::plan
