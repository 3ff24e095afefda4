#pragma once
// From a `--devices` description to running backends and a DevicePlan: the CPU is always
// there (it holds what the plan leaves on the host); `sim:N` devices stand in for GPUs. The
// planner decides what goes where, within each device's budget and any rule-file pins.
#include <cstdint>
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

// "cpu" (or empty): the host only. "sim:2x200MiB": two simulated devices of 200 MiB each.
// "sim:200MiB,sim:1GiB": one per entry. Throws tandem::Error naming the text and the forms.
std::vector<uint64_t> parse_sim_devices(std::string_view spec);

struct DeviceSetup {
  std::vector<std::unique_ptr<Backend>> backends;  // [0] = cpu, then sim:0, sim:1, ...
  plan::Placement placement;
  DevicePlan plan;
  std::string summary;  // a few lines: where everything went
};

// Plans `file` onto the CPU plus the described sim devices and creates the backends.
// `rules_path` and `profile_path` may be empty. Throws when the plan does not fit, with the
// planner's problems.
DeviceSetup setup_devices(const gguf::GgufFile& file, std::string_view devices,
                          const std::string& rules_path, const std::string& profile_path,
                          int n_threads, int64_t n_ctx, int64_t n_seq, bool pin_threads = false);

}  // namespace tandem
