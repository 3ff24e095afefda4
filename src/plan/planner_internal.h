#pragma once
// The planner's working state, shared by planner.cpp (budgets, pins, the choice among
// candidates, the explanation) and candidates.cpp (how each candidate lays out the hot path and
// the routed experts). Not part of the plan module's interface: planner.h is.
#include <cstdint>
#include <string>
#include <vector>

#include "plan/cost_model.h"
#include "plan/planner.h"

namespace tandem::plan::detail {

constexpr int32_t kUnplaced = -2;

// One placement the planner builds and the cost model weighs.
struct CandidateSpec {
  enum class Kind {
    LayerSplit,      // today's plan: layers in ranges over the fewest of `gpus` that hold the
                     // model (or all of them), each layer's experts beside its attention
    ExpertParallel,  // the hot path in ranges over `gpus`, every MoE layer's experts spread over
                     // all of them
    Hybrid,          // GPUs too small for every expert: `whole_layers` MoE layers keep all their
                     // experts on GPUs, the other layers share what VRAM is left, the same
                     // fraction each; on the GPU that owns the layer or spread over all GPUs
  };
  Kind kind = Kind::LayerSplit;
  std::vector<int32_t> gpus;  // device indices it uses, in index order
  // ExpertParallel over machines: the hot path on these alone (the first machine's GPUs), the
  // experts over `gpus`; empty: the hot path over `gpus` too.
  std::vector<int32_t> hot_gpus;
  int32_t whole_layers = 0;   // Hybrid: quarters (0-4) of the most whole layers that fit
  bool spread = false;
  // LayerSplit over machines without GPUs: the layers in ranges over the machines' hosts.
  bool over_hosts = false;
  bool split_heads = false;  // ExpertParallel: each layer's attention heads over `gpus` too
  bool copy_experts = false;  // ExpertParallel: the hottest experts copied where VRAM is left
  // LayerSplit over machines, serving several sequences: every GPU of `gpus` takes layers in
  // proportion to its room, rather than the fewest that hold the model, so that like machines
  // hold equal shares of a step and their overlapped steps take equal time (cost_model.h).
  bool balanced = false;
  std::string name;  // Hybrid: filled in when built
};

class Planner {
 public:
  Planner(const ModelInventory& inv, const Hardware& hw, const Workload& wl,
          const RoutingProfile* profile, const CostParams& cost);
  Placement run(const Rules& rules, bool suggest_alternatives);

 private:
  // ---- accounting (planner.cpp) ----
  uint64_t used(int32_t d) const { return p_.devices[size_t(d)].used_bytes(); }
  uint64_t cap(int32_t d) const { return p_.devices[size_t(d)].spec.memory_bytes; }
  uint64_t room(int32_t d) const { return cap(d) > used(d) ? cap(d) - used(d) : 0; }
  int32_t n_devices() const { return int32_t(p_.devices.size()); }
  bool is_host(int32_t d) const { return p_.devices[size_t(d)].spec.kind == DeviceKind::Cpu; }
  // A machine's host the plan may put parts on: the first's always, another's where its RAM holds
  // the work buffers (reserve_buffers).
  bool usable_host(int32_t h) const { return h == 0 || p_.devices[size_t(h)].buffer_bytes > 0; }
  std::vector<int32_t> usable_hosts() const;
  const std::string& name(int32_t d) const { return p_.devices[size_t(d)].spec.name; }
  // How many machines (DeviceSpec::node) the devices `ds` are on.
  int32_t machines_of(const std::vector<int32_t>& ds) const;
  double bandwidth(int32_t d) const;
  uint64_t bytes(size_t g) const { return inv_.groups[g].bytes; }
  // Whether device d's backend can multiply group g's formats (CUDA: cuda_reads).
  bool can_hold(size_t g, int32_t d) const;
  bool put(size_t g, int32_t d);
  uint64_t unplaced_hot_bytes(uint32_t l) const;
  uint64_t unplaced_expert_bytes(uint32_t l) const;
  bool put_layer(uint32_t l, int32_t d);
  // The RAM for group g: its layer's machine's host when it has room, else for routed experts,
  // the embeddings and the head another machine's (the first's first), else kOnDisk.
  int32_t host_for(size_t g) const;
  void put_on_host(size_t g);
  void put_layer_on_host_anyway(uint32_t l);
  int64_t top_group(WeightGroup kind) const;
  double choice(size_t g) const;
  bool have_profile() const;
  std::vector<int32_t> gpus_by_speed() const;

  void reserve_buffers();
  int32_t device_index(const std::string& device, size_t rule) const;
  void apply_pins(const Rules& rules);

  // ---- candidates (candidates.cpp) ----
  std::vector<CandidateSpec> candidate_specs() const;
  void build(CandidateSpec& spec);
  // The layer split, as the planner made it before it weighed candidates, on gpus_; `balanced`
  // as CandidateSpec says.
  void place_hot_path(bool balanced = false);
  void split_layers(const std::vector<uint32_t>& layers, const std::vector<int32_t>& gpus,
                    const std::vector<double>& weight, bool all_fit);
  void place_output_and_embeddings();
  void place_experts_on_gpus();
  // Expert-parallel and hybrid candidates.
  void place_hot_path_over(const std::vector<int32_t>& gpus, bool spread);
  void place_experts_spread(CandidateSpec& spec);
  void split_heads(const std::vector<int32_t>& gpus);
  void copy_hot_experts(const std::vector<int32_t>& gpus);
  void place_rest_on_host();
  // Machines without GPUs: the layers in ranges over their hosts, in proportion to their RAM.
  void place_layers_on_hosts();
  std::vector<uint32_t> free_layers();

  // ---- after a candidate is built (planner.cpp) ----
  void settle();  // fix-ups and the budget check; the prediction follows for a new placement
  void finish(bool suggest_alternatives, const Rules& rules);
  void explain();
  std::string holds(int32_t d) const;
  void suggest(const Rules& rules);

  const ModelInventory& inv_;
  const Hardware& hw_;
  const Workload& wl_;
  const RoutingProfile* profile_;
  const CostParams& cost_;
  Placement p_;
  std::vector<std::vector<size_t>> layer_hot_, layer_experts_;  // group indices per layer
  std::vector<size_t> top_;                                     // groups outside the blocks
  std::vector<std::vector<double>> choice_;                     // P(token chooses expert)
  std::vector<int32_t> gpus_;                                   // usable GPU device indices
  std::vector<int32_t> hosts_;  // each machine's host (device index), the first's (0) first
  std::vector<uint32_t> overflow_;
  std::vector<uint64_t> kv_per_layer_;  // [layer] KV cache bytes for the workload
  uint64_t buffer_ = 0;
  size_t disk_experts_ = 0;
  uint64_t disk_expert_bytes_ = 0;
  // The candidates weighed, with their placements, and the one chosen.
  std::vector<Placement> built_;
  std::vector<CandidateSpec> specs_;
  size_t chosen_ = 0;
};

}  // namespace tandem::plan::detail
