#include "runtime/device_setup.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <optional>

#include "backends/cpu/cpu_backend.h"
#include "backends/cuda/cuda_devices.h"
#include "backends/sim/sim_backend.h"
#include "core/error.h"
#include "core/progress.h"
#include "plan/hardware.h"
#include "plan/inventory.h"
#include "plan/planner.h"
#include "plan/routing_profile.h"
#include "plan/rules.h"

namespace tandem {
namespace {

constexpr std::string_view kDeviceForms =
    "use cpu, auto, cuda, cuda:0,cuda:1, sim:2x200MiB or sim:200MiB,sim:1GiB (comma-separated)";

std::vector<std::string_view> split(std::string_view text, char sep) {
  std::vector<std::string_view> parts;
  for (size_t start = 0;;) {
    const size_t end = text.find(sep, start);
    parts.push_back(text.substr(start, end - start));
    if (end == std::string_view::npos) return parts;
    start = end + 1;
  }
}

}  // namespace

std::vector<DeviceRequest> parse_devices(std::string_view spec, int gpus_found) {
  std::vector<DeviceRequest> requests;
  if (spec.empty() || spec == "cpu") return requests;
  auto add_gpu = [&](int index) {
    for (const DeviceRequest& r : requests)
      if (r.cuda && r.cuda_index == index) fail("--devices '{}': cuda:{} is named twice", spec, index);
    requests.push_back({.cuda = true, .cuda_index = index});
  };
  for (std::string_view entry : split(spec, ',')) {
    if (entry == "cpu") continue;
    if (entry == "auto" || entry == "cuda") {
      if (entry == "cuda" && gpus_found == 0)
        fail("--devices '{}': no CUDA GPU found ({}); use --devices cpu", spec,
             cuda::built_with_cuda() ? "the driver shows none; check `nvidia-smi`"
                                     : "this tandem was built without CUDA");
      for (int i = 0; i < gpus_found; ++i) add_gpu(i);
      continue;
    }
    if (entry.substr(0, 5) == "cuda:") {
      int index = -1;
      const std::string_view digits = entry.substr(5);
      const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), index);
      if (ec != std::errc() || end != digits.data() + digits.size() || index < 0)
        fail("--devices '{}': bad GPU index in '{}'; {}", spec, entry, kDeviceForms);
      if (index >= gpus_found)
        fail("--devices '{}': there is no {}: {} found{}", spec, entry,
             gpus_found == 0 ? "no GPU" : fmt::format("{} GPU{}", gpus_found, gpus_found == 1 ? "" : "s"),
             cuda::built_with_cuda() ? "" : " (this tandem was built without CUDA)");
      add_gpu(index);
      continue;
    }
    if (entry.substr(0, 4) != "sim:") fail("--devices '{}': unknown device '{}'; {}", spec, entry, kDeviceForms);
    std::string_view size = entry.substr(4);
    uint32_t count = 1;
    if (const size_t x = size.find('x'); x != std::string_view::npos) {
      const auto [end, ec] = std::from_chars(size.data(), size.data() + x, count);
      if (ec != std::errc() || end != size.data() + x || count == 0 || count > 64)
        fail("--devices '{}': bad device count in '{}'; {}", spec, entry, kDeviceForms);
      size = size.substr(x + 1);
    }
    const uint64_t bytes = plan::parse_bytes(size);
    requests.insert(requests.end(), count, DeviceRequest{.sim_bytes = bytes});
  }
  return requests;
}

std::vector<uint64_t> parse_sim_devices(std::string_view spec) {
  std::vector<uint64_t> budgets;
  for (std::string_view entry : split(spec, ','))
    if (entry.substr(0, 4) == "sim:")
      for (const DeviceRequest& r : parse_devices(entry, 0)) budgets.push_back(r.sim_bytes);
  return budgets;
}

plan::Placement placement_on_machine(const plan::Placement& p, int32_t machine) {
  // This machine's host is its CPU backend (0); other machines' parts get no device here
  // (keep_parts_of_rank drops them), so where they map does not matter.
  std::vector<int32_t> local(p.devices.size(), 0);
  plan::Placement mine = p;
  mine.devices.assign(1, p.devices[0]);
  for (size_t d = 1; d < p.devices.size(); ++d) {
    if (p.devices[d].spec.node != machine) continue;
    if (p.devices[d].spec.kind == plan::DeviceKind::Cpu) {
      mine.devices[0] = p.devices[d];
      continue;
    }
    local[d] = int32_t(mine.devices.size());
    mine.devices.push_back(p.devices[d]);
  }
  auto to_local = [&](int32_t d) { return d == plan::kOnDisk ? d : local[size_t(d)]; };
  for (int32_t& d : mine.group_device) d = to_local(d);
  for (int32_t& d : mine.layer_device) d = to_local(d);
  // Copies and split heads share a layer within one machine; a run over ranks drops them.
  mine.group_copies.clear();
  for (auto& shares : mine.layer_heads) shares.clear();
  return mine;
}

DeviceSetup setup_devices(const gguf::GgufFile& file, std::string_view devices,
                          const std::string& rules_path, const std::string& profile_path,
                          int n_threads, const plan::Workload& workload, bool pin_threads,
                          int32_t n_machines, int32_t machine,
                          const std::function<void(plan::Hardware&)>& agree,
                          const plan::Hardware* cluster) {
  // Only a text that names GPUs looks for them (a CUDA context per GPU is not free).
  const bool names_gpus = devices.find("cuda") != std::string_view::npos || devices.find("auto") != std::string_view::npos;
  const int gpus_found = names_gpus ? cuda::count_gpus() : 0;
  const std::vector<DeviceRequest> requests = parse_devices(devices, gpus_found);
  const bool any_gpu = std::any_of(requests.begin(), requests.end(), [](const DeviceRequest& r) { return r.cuda; });
  const std::vector<plan::DeviceSpec> gpus = any_gpu ? plan::detect_gpus(/*measure=*/true) : std::vector<plan::DeviceSpec>{};
  const plan::ModelInventory inventory = plan::inventory_from_file(file);

  // The host as the planner should see it: everything a CPU run can hold (the weights stay in
  // the page cache through the mmap). With GPUs its rates are measured (cached), since they
  // decide what the GPUs should hold; simulated runs assume fixed ones.
  plan::Hardware hardware;
  if (any_gpu) {
    hardware = plan::detect_hardware(n_threads, /*with_gpus=*/false);
  } else {
    hardware.host = {.name = "cpu", .kind = plan::DeviceKind::Cpu, .model = "host CPU",
                     .bandwidth_bytes_per_s = 20e9, .flops_per_s = 0.2e12,
                     .bandwidth_source = "assumed for simulated runs"};
  }
  // No RAM reserve here: RAM is not a budget the plan can overfill, since the weights it gives the
  // host are pages of the mapped file that the kernel may evict and read again.
  hardware.ram_bytes = hardware.host.memory_bytes = uint64_t(1) << 50;
  hardware.ram_reserve_bytes = 0;
  int n_sims = 0;
  for (const DeviceRequest& r : requests) {
    if (r.cuda) {
      const std::string name = fmt::format("cuda:{}", r.cuda_index);
      auto gpu = std::find_if(gpus.begin(), gpus.end(), [&](const plan::DeviceSpec& g) { return g.name == name; });
      if (gpu == gpus.end())
        fail("--devices {}: {} is there but cannot be used (held by another process in exclusive mode, or "
             "failing; see nvidia-smi)",
             devices, name);
      hardware.gpus.push_back(*gpu);
      continue;
    }
    hardware.gpus.push_back({.name = fmt::format("sim:{}", n_sims++), .kind = plan::DeviceKind::Sim,
                             .model = "simulated", .memory_bytes = r.sim_bytes,
                             .bandwidth_bytes_per_s = 20e9, .flops_per_s = 0.2e12,
                             .bandwidth_source = "assumed for simulated devices"});
  }
  if (std::ranges::any_of(requests, [](const DeviceRequest& r) { return r.cuda; })) {
    const cuda::GpuLinks links = cuda::detect_gpu_links();
    plan::apply_gpu_links(hardware, links.known, links.nvlink, links.pcie_generation, links.how);
  }
  if (cluster) {
    const auto listed = std::ranges::count_if(
        cluster->gpus, [&](const plan::DeviceSpec& gpu) { return gpu.node == machine; });
    if (size_t(listed) != requests.size())
      fail(
          "the cluster file gives machine {} (rank {}) {} GPU{}, and this rank has {} device{} "
          "(--devices {}): give it as many devices as its machine lists, in the same order",
          machine, machine, listed, listed == 1 ? "" : "s", requests.size(),
          requests.size() == 1 ? "" : "s", devices);
    // A listed GPU gets no more memory than the device standing for it has; agree (the least
    // over the ranks) then gives every rank the owners' numbers.
    const plan::Hardware here = std::move(hardware);
    // RAM the file gives is planned as `tandem plan --cluster` plans it (so the run follows that
    // plan, and a machine's RAM full sends experts to another's); other RAM as above.
    hardware = *cluster;
    if (!hardware.host.memory_given) {
      hardware.ram_bytes = hardware.host.memory_bytes = uint64_t(1) << 50;
      hardware.ram_reserve_bytes = 0;
    }
    for (plan::DeviceSpec& host : hardware.other_hosts)
      if (!host.memory_given) host.memory_bytes = uint64_t(1) << 50;
    size_t local = 0;
    for (plan::DeviceSpec& gpu : hardware.gpus)
      if (gpu.node == machine)
        gpu.memory_bytes = std::min(gpu.memory_bytes, here.gpus[local++].memory_bytes);
  }
  if (agree) agree(hardware);
  if (n_machines > 1 && !cluster) plan::repeat_nodes(hardware, n_machines);
  const plan::Rules rules = rules_path.empty() ? plan::Rules{} : plan::load_rules(rules_path);
  std::optional<plan::RoutingProfile> profile;
  if (!profile_path.empty()) {
    profile = plan::load_routing_profile(profile_path);
    plan::check_routing_profile(*profile, inventory);
  }
  DeviceSetup setup;
  setup.placement =
      plan::plan_placement(inventory, hardware, workload, rules, profile ? &*profile : nullptr);
  if (!setup.placement.fits) {
    std::string problems;
    for (const std::string& p : setup.placement.problems) problems += (problems.empty() ? "" : "; ") + p;
    fail("the model does not fit on --devices {}: {}", devices, problems);
  }

  setup.backends.push_back(std::make_unique<cpu::CpuBackend>(n_threads, "cpu", pin_threads));
  n_sims = 0;
  for (const DeviceRequest& r : requests) {
    if (r.cuda)
      setup.backends.push_back(cuda::make_cuda_backend(r.cuda_index));
    else
      setup.backends.push_back(std::make_unique<sim::SimBackend>(n_sims++, r.sim_bytes));
  }
  if (n_machines > 1) setup.ranks = rank_plan_for(setup.placement, inventory);
  setup.plan = device_plan_for(
      n_machines > 1 ? placement_on_machine(setup.placement, machine) : setup.placement, inventory,
      setup.backends);
  for (const plan::DeviceUsage& usage : setup.placement.devices)
    setup.summary += fmt::format("  {:<6} {:>10} of {:>10}: {}\n", usage.spec.name, format_bytes(usage.used_bytes()),
                                 usage.spec.memory_bytes >= (uint64_t(1) << 50) ? "host" : format_bytes(usage.spec.memory_bytes),
                                 usage.holds);
  return setup;
}

RankPlan rank_plan_for(const plan::Placement& p, const plan::ModelInventory& inventory) {
  auto machine_of = [&](int32_t device) {  // the disk is the first machine's
    return device == plan::kOnDisk ? 0 : p.devices[size_t(device)].spec.node;
  };
  RankPlan ranks;
  for (uint32_t il = 0; il < inventory.n_layers; ++il) {
    ranks.layers.push_back(machine_of(p.layer_device[il]));
    ranks.experts.emplace_back(size_t(inventory.info.n_expert), ranks.layers.back());
  }
  for (size_t g = 0; g < inventory.groups.size(); ++g) {
    const plan::InventoryGroup& group = inventory.groups[g];
    const int32_t machine = machine_of(p.group_device[g]);
    if (group.kind == WeightGroup::Embedding)
      ranks.embeddings = machine;
    else if (group.kind == WeightGroup::OutputHead)
      ranks.output = machine;
    else if (group.kind == WeightGroup::RoutedExperts)
      ranks.experts[size_t(group.layer)][size_t(group.expert)] = machine;
  }
  return ranks;
}

DevicePlan device_plan_for(const plan::Placement& p, const plan::ModelInventory& inventory,
                           const std::vector<std::unique_ptr<Backend>>& backends) {
  TANDEM_CHECK(backends.size() == p.devices.size());
  auto backend = [&](int32_t device) -> Backend* {
    return backends[device == plan::kOnDisk ? 0 : size_t(device)].get();  // disk = mmap on the host
  };
  const uint32_t n_layers = inventory.n_layers;
  DevicePlan dp = DevicePlan::single(*backends[0], n_layers, inventory.info.n_expert);
  dp.stream_experts_min_tokens = p.predicted.stream_experts_min_tokens;
  for (uint32_t il = 0; il < n_layers; ++il) {
    dp.layers[il] = backend(p.layer_device[il]);
    if (il < p.layer_heads.size())
      for (const plan::HeadShare& share : p.layer_heads[il])
        dp.heads[il].push_back({.device = backend(share.device), .first_head = share.first_head,
                                .n_heads = share.n_heads});
  }
  for (size_t g = 0; g < inventory.groups.size(); ++g) {
    const plan::InventoryGroup& group = inventory.groups[g];
    Backend* where = backend(p.group_device[g]);
    if (group.kind == WeightGroup::Embedding) dp.embeddings = where;
    else if (group.kind == WeightGroup::OutputHead) dp.output = where;
    else if (group.kind == WeightGroup::RoutedExperts) dp.experts[size_t(group.layer)][size_t(group.expert)] = where;
    if (g < p.group_copies.size() && !p.group_copies[g].empty()) {
      auto& copies = dp.expert_copies;
      if (copies.empty()) copies.assign(n_layers, {});
      auto& layer = copies[size_t(group.layer)];
      if (layer.empty()) layer.assign(inventory.info.n_expert, {});
      for (int32_t d : p.group_copies[g]) layer[size_t(group.expert)].push_back(backend(d));
    }
  }
  return dp;
}

}  // namespace tandem
