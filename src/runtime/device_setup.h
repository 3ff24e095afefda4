#pragma once
// From a `--devices` description to running backends and a DevicePlan: the CPU is always
// there (it holds what the plan leaves on the host), then GPUs (`cuda:N`) and simulated devices
// that stand in for GPUs (`sim:N`). The planner decides what goes where, within each device's
// budget and any rule-file pins.
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/backend.h"
#include "model/device_plan.h"
#include "plan/placement.h"

namespace tandem {
namespace gguf {
class GgufFile;
}

// One device besides the CPU, in the order given.
struct DeviceRequest {
  bool cuda = false;
  int cuda_index = 0;       // cuda: the GPU's index
  uint64_t sim_bytes = 0;   // sim: its memory budget
};

// A comma-separated list: "cpu" (the host only; it is always there), "auto" (every GPU found,
// none on a machine without), "cuda" (every GPU, at least one), "cuda:1" (that GPU),
// "sim:2x200MiB" (two simulated devices of 200 MiB), "sim:1GiB". `gpus_found`: how many GPUs the
// driver shows. Throws tandem::Error naming the text and the accepted forms.
std::vector<DeviceRequest> parse_devices(std::string_view spec, int gpus_found);
// The simulated devices' budgets of a --devices text (its other entries ignored).
std::vector<uint64_t> parse_sim_devices(std::string_view spec);

struct DeviceSetup {
  std::vector<std::unique_ptr<Backend>> backends;  // [0] = cpu, then the requests in order
  plan::Placement placement;                       // over every machine when planned for several
  DevicePlan plan;      // this machine's devices (parts of other machines on the host)
  RankPlan ranks;       // planned for several machines: the machine of every part
  std::string summary;  // a few lines: where everything went
};

// Plans `file` onto the CPU plus the requested devices and creates the backends.
// `rules_path` and `profile_path` may be empty. Throws when the plan does not fit, with the
// planner's problems. With `n_machines` > 1 (a run over MPI ranks, --spread plan) the plan is for
// that many machines like this one (plan::repeat_nodes: their GPUs join, RAM and CPU are the
// first's), and this is machine `machine`: `ranks` says where each part runs, and `plan` maps
// this machine's parts to its backends (keep_parts_of_rank then drops the others'). `agree`, when
// given, makes this machine's description the same as every other rank's before planning
// (rank_agreement.h), so that all of them plan alike. `cluster` (a cluster file's machines, as
// many as `n_machines`) replaces the machines like this one: the requested devices stand for
// machine `machine`'s GPUs in it, in order, and must be as many; each GPU is planned with no more
// memory than its device has.
DeviceSetup setup_devices(const gguf::GgufFile& file, std::string_view devices,
                          const std::string& rules_path, const std::string& profile_path,
                          int n_threads, const plan::Workload& workload, bool pin_threads = false,
                          int32_t n_machines = 1, int32_t machine = 0,
                          const std::function<void(plan::Hardware&)>& agree = {},
                          const plan::Hardware* cluster = nullptr);

// `placement` (a plan over several machines) as machine `machine` runs it: the host, then that
// machine's GPUs in order; parts on other machines go to the host here, to be dropped by
// keep_parts_of_rank (they run on their own machine's rank). Copies and split heads are dropped.
plan::Placement placement_on_machine(const plan::Placement& placement, int32_t machine);

// The machine of every part of `placement` (a plan over several, DeviceSpec::node): what runs
// on which rank.
RankPlan rank_plan_for(const plan::Placement& placement, const plan::ModelInventory& inventory);

// Where a placement's parts run: `backends` in the placement's device order ([0] the host, which
// also computes what is streamed from disk).
DevicePlan device_plan_for(const plan::Placement& placement, const plan::ModelInventory& inventory,
                           const std::vector<std::unique_ptr<Backend>>& backends);

}  // namespace tandem
