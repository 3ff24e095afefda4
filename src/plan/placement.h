#pragma once
// The planner's answer: where every weight group and every layer's KV cache lives, what each
// device holds, the predicted speed, and why. A pure function of (inventory, hardware,
// workload, rules, routing profile) computes it (planner.h); the runtime executes it.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "plan/hardware.h"
#include "plan/inventory.h"

namespace tandem::plan {

struct Workload {
  int64_t n_ctx = 4096;     // context per sequence
  int64_t n_parallel = 1;   // sequences served at once
  int64_t prefill_batch = 512;  // tokens per prefill step
  DType cache_type = DType::F32;  // the KV cache's values (--cache-type-k/v): F32 or BF16
};

// How often each routed expert was chosen: counts[layer][expert] (layers that are not MoE have
// empty rows). Written by `tandem profile`, read by `plan` and `run`.
struct RoutingProfile {
  std::string model;
  std::vector<std::vector<uint64_t>> counts;
};

// A pin from a rule file: weight groups matching `pattern` (a label regex, see
// InventoryGroup::label), optionally limited to layers and experts, go to `device`.
struct Pin {
  std::string pattern;
  std::optional<std::pair<int32_t, int32_t>> layers;   // inclusive range
  std::optional<std::pair<int32_t, int32_t>> experts;  // inclusive range
  std::string device;                                  // "cpu", "cuda:1", "sim:0", "disk"
};

struct Rules {
  std::vector<Pin> pins;
};

// Where a group lives: an index into Placement::devices (0 is the host), or kOnDisk when it is
// streamed from the file at every use.
constexpr int32_t kOnDisk = -1;

// Some of one layer's attention heads on one device (head-split attention: that device computes
// their queries, attention and share of the output projection from a copy of the layer's latent
// KV cache; the layer's device adds the partial outputs in the order of the shares).
struct HeadShare {
  int32_t device = 0;  // index into Placement::devices
  int32_t first_head = 0;
  int32_t n_heads = 0;
};

struct DeviceUsage {
  DeviceSpec spec;
  uint64_t weight_bytes = 0;
  uint64_t kv_bytes = 0;
  uint64_t buffer_bytes = 0;
  uint64_t used_bytes() const { return weight_bytes + kv_bytes + buffer_bytes; }
  std::string holds;  // "layers 0-29: attention, shared experts, KV; experts of 12 layers"
};

struct Prediction {
  double prefill_tokens_per_s = 0;
  double decode_tokens_per_s = 0;
  // Decode time per token by where it goes (seconds), for the explanation.
  double decode_seconds_gpu = 0, decode_seconds_cpu = 0, decode_seconds_transfer = 0,
         decode_seconds_disk = 0;
  // Decode steps in flight at once: a pipeline over machines serving several sequences overlaps
  // a step per machine (its decode_tokens_per_s counts that; the times above are one step of all
  // the sequences); 1 otherwise.
  int32_t overlapping_steps = 1;
  // Prompt chunks of at least this many tokens stream the routed experts held in RAM to their
  // layer's GPU (DevicePlan::stream_experts_min_tokens); 0: never (no such experts, or the
  // host's cores are faster at every chunk size). Set for the chosen placement only
  // (stream_experts_min_tokens in cost_model.h). When prefill_tokens_per_s counts on streaming,
  // what the host computing them would give.
  bool experts_streamable = false;  // some layer's experts in RAM sit beside its GPU
  int64_t stream_experts_min_tokens = 0;
  double prefill_tokens_per_s_host_experts = 0;
};

// One placement the planner built and weighed (planner.h), with what the cost model predicts for
// it; the chosen one is the Placement itself.
struct Candidate {
  std::string name;    // "layer split", "expert parallel over 8 GPUs", ...
  std::string layout;  // what goes where, in one line
  Prediction predicted;
  bool fits = false;  // no weight streamed from disk
  bool chosen = false;
  std::vector<std::string> idle_gpus;  // GPUs it leaves without work
};

struct Placement {
  std::vector<DeviceUsage>
      devices;  // [0] = host ("cpu"), then the GPUs in order, then the
                // hosts of the machines after the first (Hardware::other_hosts)
  std::vector<int32_t> group_device;  // per inventory group
  // Per inventory group, the other devices that hold a copy of it: routed experts copied to a
  // second GPU where VRAM is left, so that a step gives each chosen expert to the less busy of
  // its holders (core/replica_choice.h). Empty when no group has copies.
  std::vector<std::vector<int32_t>> group_copies;
  std::vector<int32_t> layer_device;  // per layer: attention, norms, router, KV cache
  // Per layer: empty when all heads run on layer_device, else the shares in head order, the
  // first on layer_device (which also computes q_a, kv_a and the router, and keeps the KV cache).
  std::vector<std::vector<HeadShare>> layer_heads;
  Prediction predicted;               // from the cost model
  std::vector<std::string> reasons;   // one line per choice
  std::vector<std::string> problems;  // empty when it fits
  bool fits = false;
  std::vector<Candidate> candidates;     // every placement weighed, in the order built
  std::vector<std::string> explanation;  // why this one, why an idle GPU stays idle (--explain)
};

}  // namespace tandem::plan
