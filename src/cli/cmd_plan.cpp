// `tandem plan MODEL|--preset NAME`: where every part of the model would live on this machine (or
// on one described with --gpu/--ram), how fast the cost model predicts it to run, and why.
// Nothing is loaded: a GGUF file's headers are enough, and presets need no file at all.
// Exit status: 0 when the plan fits in memory, 3 when it does not (the plan and its problems are
// still printed), 1 for errors (bad flags, impossible rules).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/options.h"
#include "core/error.h"
#include "core/progress.h"
#include "gguf/gguf_file.h"
#include "plan/cluster.h"
#include "plan/hardware.h"
#include "plan/inventory.h"
#include "plan/planner.h"
#include "plan/routing_profile.h"
#include "plan/rules.h"

namespace tandem::cli {
namespace {

using nlohmann::ordered_json;
using namespace tandem::plan;

constexpr int kExitDoesNotFit = 3;
// A plan that does not fit is re-planned on up to this many machines to say how many would do.
constexpr int32_t kMostNodesTried = 16;

struct PlanOptions {
  std::string model, preset, quant = "Q4_K_M";
  std::vector<std::string> gpus;
  std::string ram;
  double host_bandwidth_gb_per_s = 0;
  int32_t cpu_cores = 0;
  int32_t threads = 0;
  int64_t n_ctx = 4096, n_parallel = 1, prefill_batch = 512;
  DType cache_type_k = DType::F32, cache_type_v = DType::F32;
  std::string rules_path, profile_path, rules_out;
  std::string link, ram_reserve;
  int32_t nodes = 1;
  std::string node_link, cluster_path;
  bool json = false, explain = false;
};

std::string kind_name(DeviceKind kind) {
  switch (kind) {
    case DeviceKind::Cpu:
      return "cpu";
    case DeviceKind::Cuda:
      return "cuda";
    case DeviceKind::Sim:
      return "sim";
  }
  return "cpu";
}

std::vector<int32_t> layers_on(const Placement& p, int32_t d) {
  std::vector<int32_t> layers;
  for (size_t l = 0; l < p.layer_device.size(); ++l)
    if (p.layer_device[l] == d) layers.push_back(int32_t(l));
  return layers;
}

struct Counts {
  uint64_t groups = 0, experts = 0, bytes = 0;
  uint64_t expert_copies = 0;  // copies of experts homed elsewhere (not in groups or bytes)
};
Counts counts_on(const Placement& p, const ModelInventory& inv, int32_t d) {
  Counts c;
  for (size_t i = 0; i < inv.groups.size(); ++i) {
    if (i < p.group_copies.size()) c.expert_copies += uint64_t(std::ranges::count(p.group_copies[i], d));
    if (p.group_device[i] != d) continue;
    ++c.groups, c.bytes += inv.groups[i].bytes;
    c.experts += inv.groups[i].kind == WeightGroup::RoutedExperts;
  }
  return c;
}

void print_text(const Placement& p, const ModelInventory& inv, const Workload& wl,
                const Hardware& hw, bool explain, bool cluster, int32_t machines_needed) {
  fmt::print(
      "plan for {} {}: {} of weights in {} groups; context {} x {} sequence{} ({} KV cache), "
      "prefill batch {}\n",
      inv.name, inv.quant_mix, format_bytes(inv.total_weight_bytes()), inv.groups.size(), wl.n_ctx,
      wl.n_parallel, wl.n_parallel == 1 ? "" : "s", dtype_name(wl.cache_type), wl.prefill_batch);
  if (hw.n_nodes > 1)
    fmt::print(
        "{} machines, their GPUs and hosts named nodeN:cuda:M and nodeN:cpu beyond the first's "
        "(rank 0's); between machines {:.1f} GB/s, {:.0f} us ({})\n",
        hw.n_nodes, hw.node_link_bytes_per_s / 1e9, hw.node_link_latency_s * 1e6,
        hw.node_link_source);
  fmt::print("\n");
  size_t name_width = 8;  // "node1:cuda:0" on plans over machines
  for (const DeviceUsage& u : p.devices) name_width = std::max(name_width, u.spec.name.size());
  fmt::print("{:<{}} {:<36} {:>10} {:>10} {:>10} {:>10} {:>10} {:>6}\n", "device", name_width,
             "model", "memory", "weights", "KV cache", "buffers", "used", "use");
  for (const DeviceUsage& u : p.devices) {
    const std::string model =
        fmt::format("{} ({:.0f} GB/s{})", u.spec.model, u.spec.bandwidth_bytes_per_s / 1e9,
                    u.spec.bandwidth_source.rfind("measured", 0) == 0 ? " measured" : "");
    fmt::print("{:<{}} {:<36} {:>10} {:>10} {:>10} {:>10} {:>10} {:>5.1f}%\n", u.spec.name,
               name_width, model, format_bytes(u.spec.memory_bytes), format_bytes(u.weight_bytes),
               format_bytes(u.kv_bytes), format_bytes(u.buffer_bytes), format_bytes(u.used_bytes()),
               100.0 * double(u.used_bytes()) / double(std::max<uint64_t>(u.spec.memory_bytes, 1)));
    fmt::print("{:<{}} holds {}\n", "", name_width, u.holds);
    if (u.spec.host_link_bytes_per_s > 0 || u.spec.host_handoff_s > 0)
      fmt::print(
          "{:<{}} from the host: {:.1f} GB/s page-locked, a MoE layer's hand-off {:.0f} us "
          "(measured)\n",
          "", name_width, u.spec.host_link_bytes_per_s / 1e9, u.spec.host_handoff_s * 1e6);
  }
  const Counts disk = counts_on(p, inv, kOnDisk);
  if (disk.groups)
    fmt::print("{:<{}} {} streamed from the file at every use: {} groups ({} experts)\n", "disk",
               name_width, format_bytes(disk.bytes), disk.groups, disk.experts);

  const Prediction& s = p.predicted;
  fmt::print(
      "\npredicted by the cost model (not measured): decode {:.2f} tokens/s{}, prefill {:.1f} "
      "tokens/s\n",
      s.decode_tokens_per_s,
      wl.n_parallel > 1 ? fmt::format(" (all {} sequences)", wl.n_parallel) : "",
      s.prefill_tokens_per_s);
  fmt::print(
      "  one decode step on its critical path: GPU {:.1f} ms, CPU {:.1f} ms, transfers {:.1f} ms, "
      "disk {:.1f} ms\n",
      s.decode_seconds_gpu * 1e3, s.decode_seconds_cpu * 1e3, s.decode_seconds_transfer * 1e3,
      s.decode_seconds_disk * 1e3);
  if (s.overlapping_steps > 1)
    fmt::print(
        "  steps overlap over the machines' pipeline: the sequences go in {} groups, each with a "
        "step in flight on another machine (the decode figure counts it; the step above is all "
        "of them at once)\n",
        s.overlapping_steps);
  if (const std::string streaming = expert_streaming_summary(s, s.stream_experts_min_tokens,
                                                             /*asked=*/false, wl.prefill_batch);
      !streaming.empty())
    fmt::print("  {}\n", streaming);
  fmt::print("\nwhy:\n");
  for (const std::string& r : p.reasons) fmt::print("  - {}\n", r);
  if (explain) {
    fmt::print("\ncandidates weighed (cost model, not measured):\n");
    fmt::print("  {:<62} {:>14} {:>15}  {}\n", "", "decode tok/s", "prefill tok/s", "memory used");
    for (const Candidate& c : p.candidates)
      fmt::print("{} {:<62} {:>14.2f} {:>15.1f}  {}{}{}\n", c.chosen ? "  *" : "   ", c.name,
                 c.predicted.decode_tokens_per_s, c.predicted.prefill_tokens_per_s, c.layout,
                 c.idle_gpus.empty() ? "" : fmt::format("; idle: {}", fmt::join(c.idle_gpus, ", ")),
                 c.fits ? "" : "; streams experts from disk");
    fmt::print("\nexplanation:\n");
    for (const std::string& r : p.explanation) fmt::print("  - {}\n", r);
  }
  if (!p.problems.empty()) {
    fmt::print("\nPROBLEMS:\n");
    for (const std::string& r : p.problems) fmt::print("  ! {}\n", r);
  }
  if (!p.fits)
    fmt::print(
        "\n{}\n",
        cluster ? std::string("add machines to the cluster file, or take a smaller quant")
        : machines_needed > 0
            ? fmt::format("it would fit on {} machines like this one (plan --nodes {})",
                          machines_needed, machines_needed)
            : fmt::format("it would not fit on {} machines like this one either", kMostNodesTried));
}

void print_json(const Placement& p, const ModelInventory& inv, const Workload& wl,
                const Hardware& hw, int32_t machines_needed) {
  ordered_json out;
  out["model"] = {{"name", inv.name},
                  {"quant_mix", inv.quant_mix},
                  {"weight_bytes", inv.total_weight_bytes()},
                  {"groups", inv.groups.size()},
                  {"layers", inv.n_layers}};
  out["workload"] = {{"n_ctx", wl.n_ctx},
                     {"n_parallel", wl.n_parallel},
                     {"prefill_batch", wl.prefill_batch},
                     {"cache_type", std::string(dtype_name(wl.cache_type))}};
  out["machine"] = {{"gpu_link", link_name(hw.gpu_link)},
                    {"link_source", hw.link_source},
                    {"ram_bytes", hw.ram_bytes},
                    {"ram_reserve_bytes", hw.ram_reserve_bytes},
                    {"ram_reserve_source", hw.ram_reserve_source},
                    {"nodes", hw.n_nodes},
                    {"node_link_bytes_per_s", hw.node_link_bytes_per_s},
                    {"node_link_latency_s", hw.node_link_latency_s},
                    {"node_link_source", hw.node_link_source}};
  out["fits"] = p.fits;
  // When it does not fit: how many machines like this one would hold it (0: not even 16).
  if (!p.fits) out["machines_needed"] = machines_needed;
  ordered_json devices = ordered_json::array();
  for (size_t d = 0; d < p.devices.size(); ++d) {
    const DeviceUsage& u = p.devices[d];
    const Counts c = counts_on(p, inv, int32_t(d));
    devices.push_back({{"name", u.spec.name},
                       {"kind", kind_name(u.spec.kind)},
                       {"model", u.spec.model},
                       {"capacity_bytes", u.spec.memory_bytes},
                       {"used_bytes", u.used_bytes()},
                       {"weight_bytes", u.weight_bytes},
                       {"kv_bytes", u.kv_bytes},
                       {"buffer_bytes", u.buffer_bytes},
                       {"used_fraction", double(u.used_bytes()) /
                                             double(std::max<uint64_t>(u.spec.memory_bytes, 1))},
                       {"bandwidth_bytes_per_s", u.spec.bandwidth_bytes_per_s},
                       {"bandwidth_source", u.spec.bandwidth_source},
                       {"host_link_bytes_per_s", u.spec.host_link_bytes_per_s},
                       {"host_handoff_s", u.spec.host_handoff_s},
                       {"layers", layers_on(p, int32_t(d))},
                       {"groups", c.groups},
                       {"experts", c.experts},
                       {"expert_copies", c.expert_copies},
                       {"holds", u.holds}});
  }
  out["devices"] = devices;
  ordered_json heads = ordered_json::array();  // head-split layers only
  for (size_t l = 0; l < p.layer_heads.size(); ++l) {
    if (p.layer_heads[l].size() < 2) continue;
    ordered_json shares = ordered_json::array();
    for (const HeadShare& share : p.layer_heads[l])
      shares.push_back({{"device", p.devices[size_t(share.device)].spec.name},
                        {"first_head", share.first_head},
                        {"n_heads", share.n_heads}});
    heads.push_back({{"layer", l}, {"shares", shares}});
  }
  out["split_heads"] = heads;
  const Counts disk = counts_on(p, inv, kOnDisk);
  out["disk"] = {{"weight_bytes", disk.bytes}, {"groups", disk.groups}, {"experts", disk.experts}};
  const Prediction& s = p.predicted;
  out["predicted"] = {{"source", "cost model"},
                      {"prefill_tokens_per_s", s.prefill_tokens_per_s},
                      {"stream_experts_min_tokens", s.stream_experts_min_tokens},
                      {"prefill_tokens_per_s_host_experts", s.prefill_tokens_per_s_host_experts},
                      {"decode_tokens_per_s", s.decode_tokens_per_s},
                      {"overlapping_steps", s.overlapping_steps},
                      {"decode_step_seconds",
                       {{"gpu", s.decode_seconds_gpu},
                        {"cpu", s.decode_seconds_cpu},
                        {"transfer", s.decode_seconds_transfer},
                        {"disk", s.decode_seconds_disk}}}};
  out["reasons"] = p.reasons;
  out["problems"] = p.problems;
  ordered_json candidates = ordered_json::array();
  for (const Candidate& c : p.candidates)
    candidates.push_back({{"name", c.name},
                          {"chosen", c.chosen},
                          {"fits", c.fits},
                          {"decode_tokens_per_s", c.predicted.decode_tokens_per_s},
                          {"overlapping_steps", c.predicted.overlapping_steps},
                          {"prefill_tokens_per_s", c.predicted.prefill_tokens_per_s},
                          {"decode_step_seconds",
                           {{"gpu", c.predicted.decode_seconds_gpu},
                            {"cpu", c.predicted.decode_seconds_cpu},
                            {"transfer", c.predicted.decode_seconds_transfer},
                            {"disk", c.predicted.decode_seconds_disk}}},
                          {"layout", c.layout},
                          {"idle_gpus", c.idle_gpus}});
  out["candidates"] = candidates;
  out["explanation"] = p.explanation;
  fmt::print("{}\n", out.dump(2));
}

void run_plan(const PlanOptions& o) {
  if (o.model.empty() == o.preset.empty())
    fail("give either a GGUF file or --preset NAME (presets: {})",
         fmt::join(inventory_preset_names(), ", "));
  if (o.n_ctx <= 0 || o.n_parallel <= 0 || o.prefill_batch <= 0)
    fail("--ctx, --parallel and --batch must be positive");
  if (o.cache_type_k != o.cache_type_v)
    fail(
        "--cache-type-k {} and --cache-type-v {}: tandem keeps keys and values in one type; give "
        "both the same",
        dtype_name(o.cache_type_k), dtype_name(o.cache_type_v));
  const ModelInventory inv = o.preset.empty() ? inventory_from_file(gguf::GgufFile::open(o.model))
                                              : inventory_from_preset(o.preset, o.quant);
  const bool cluster = !o.cluster_path.empty();
  Hardware hw = cluster ? load_cluster(o.cluster_path, o.threads)
                : o.gpus.empty() && o.ram.empty()
                    ? detect_hardware(o.threads)
                    : describe_hardware(o.gpus, o.ram, o.host_bandwidth_gb_per_s * 1e9, o.threads);
  if (o.host_bandwidth_gb_per_s > 0) {
    hw.host.bandwidth_bytes_per_s = o.host_bandwidth_gb_per_s * 1e9;
    hw.host.bandwidth_source = "given";
  }
  if (o.cpu_cores > 0) set_cpu_cores(hw, o.cpu_cores);
  // A host described by its bandwidth or its cores is not predicted from this machine's measured
  // decode kernel rate (its own memory and thread count), which the cost model prefers to the
  // bandwidth: from the given bandwidth, or with --cpu-cores alone from this machine's STREAM
  // bandwidth and the given cores.
  if (o.host_bandwidth_gb_per_s > 0 || o.cpu_cores > 0)
    hw.host.decode_kernel_bytes_per_s = hw.host.interleaved_kernel_bytes_per_s = 0;
  // As `run` refuses it (engine.cpp): a plan it would not run is no answer.
  if (o.cache_type_k != DType::F32 && !hw.gpus.empty())
    fail(
        "--cache-type-k/v {}: the CUDA backend keeps its KV cache in F32, and a plan with GPUs "
        "puts attention on them; plan with f32, or without --gpu (a BF16 cache is CPU-only)",
        dtype_name(o.cache_type_k));
  if (!o.link.empty()) {
    hw.gpu_link = parse_link(o.link);
    hw.link_source = "given";
  }
  if (!o.ram_reserve.empty())
    set_ram_reserve(hw, parse_ram_reserve(o.ram_reserve, hw.ram_bytes),
                    fmt::format("--ram-reserve {}", o.ram_reserve));
  const Rules rules = o.rules_path.empty() ? Rules{} : load_rules(o.rules_path);
  std::optional<RoutingProfile> profile;
  if (!o.profile_path.empty()) profile = load_routing_profile(o.profile_path);
  const Workload wl{.n_ctx = o.n_ctx,
                    .n_parallel = o.n_parallel,
                    .prefill_batch = o.prefill_batch,
                    .cache_type = o.cache_type_k};
  if (!o.node_link.empty()) set_node_link(hw, o.node_link);
  const Hardware one_machine = hw;
  if (o.nodes > 1) repeat_nodes(hw, o.nodes);
  const Placement p = plan_placement(inv, hw, wl, rules, profile ? &*profile : nullptr);
  // A plan that does not fit: how many such machines would hold it all in memory.
  int32_t machines_needed = 0;
  for (int32_t n = o.nodes + 1; !p.fits && !cluster && n <= kMostNodesTried && machines_needed == 0;
       ++n) {
    Hardware more = one_machine;
    repeat_nodes(more, n);
    if (plan_placement(inv, more, wl, rules, profile ? &*profile : nullptr).fits)
      machines_needed = n;
  }

  if (o.json)
    print_json(p, inv, wl, hw, machines_needed);
  else
    print_text(p, inv, wl, hw, o.explain || hw.n_nodes > 1, cluster, machines_needed);
  if (!o.rules_out.empty()) {
    std::ofstream out(o.rules_out, std::ios::binary | std::ios::trunc);
    const std::string yaml = rules_to_yaml(p, inv);
    if (!out || !(out << yaml) || !out.flush())
      fail("--rules-out {}: cannot write the file", o.rules_out);
    std::fflush(stdout);  // the plan before the note, where both go to one pipe
    fmt::print(stderr, "wrote the plan as a rule file to {}\n", o.rules_out);
  }
  std::fflush(stdout);
  if (!p.fits) throw CLI::RuntimeError(kExitDoesNotFit);
}

}  // namespace

void register_plan(CLI::App& app) {
  auto o = std::make_shared<PlanOptions>();
  CLI::App* cmd = app.add_subcommand(
      "plan",
      "Plan where every part of a model goes (GPUs, RAM, disk) and predict its speed, for this "
      "machine or one described with --gpu/--ram. Nothing is loaded. Exit status 0 when the plan "
      "fits in memory, 3 when it does not (the plan and its problems are still printed).");
  cmd->add_option("model", o->model, "GGUF file (first part of a split model); or use --preset");
  cmd->add_option("--preset", o->preset, "plan a built-in model shape instead of a file")
      ->check(CLI::IsMember(inventory_preset_names()));
  cmd->add_option("--quant", o->quant,
                  "quant mix of the preset; UD-IQ1_S and UD-IQ2_XXS are the dynamic low-bit mixes "
                  "(routed experts IQ1_S/IQ2_XXS/IQ3_XXS, the rest Q4_K/Q6_K)")
      ->capture_default_str()
      ->check(CLI::IsMember(inventory_quant_mixes()));
  cmd->add_option("--gpu", o->gpus,
                  "a GPU: 48GiB, 24GiB:1000GBps, or a card (4090, 3090, a6000, a100, a100-80g, "
                  "h100, h200, l40s, 5090); repeat for several. Without --gpu/--ram: this machine");
  cmd->add_option("--ram", o->ram, "RAM tandem may use, e.g. 192GiB (default: available RAM)");
  cmd->add_option("--host-bandwidth", o->host_bandwidth_gb_per_s,
                  "host memory bandwidth in GB/s (default: measured on this machine, with the rate "
                  "our decode kernel reaches there; given, the host is predicted from it alone)");
  cmd->add_option("--cpu-cores", o->cpu_cores,
                  "plan for a host with this many cores (default: this one; given, the host's "
                  "memory reads come from its bandwidth, not this machine's measured decode "
                  "kernel rate)");
  cmd->add_option("-t,--threads", o->threads,
                  "threads for measuring bandwidth (default: all cores)");
  cmd->add_option("-c,--ctx", o->n_ctx, "context per sequence")->capture_default_str();
  cmd->add_option("--parallel", o->n_parallel, "sequences served at once")->capture_default_str();
  cmd->add_option("-b,--batch", o->prefill_batch, "tokens per prefill step")->capture_default_str();
  add_cache_type_options(cmd, o->cache_type_k, o->cache_type_v);
  cmd->add_option("--rules", o->rules_path, "YAML rule file pinning weight groups to devices");
  cmd->add_option("--profile", o->profile_path, "routing profile (from `tandem profile`)");
  cmd->add_option("--rules-out", o->rules_out, "write the plan as a rule file");
  cmd->add_option("--link", o->link,
                  "how the GPUs reach each other: nvlink, pcie4 or pcie5 (default: this machine's, "
                  "read from the driver (NVML) when tandem is built with CUDA; for --gpu or "
                  "without an answer pcie4, said to be assumed); host to GPU is PCIe 5 with "
                  "pcie5, PCIe 4 otherwise")
      ->check(CLI::IsMember({"nvlink", "pcie4", "pcie5"}));
  cmd->add_option("--ram-reserve", o->ram_reserve,
                  "RAM kept free for the system and the page cache: 8GiB or 10% (default: 10% of "
                  "RAM, at least 4 GiB, at most half)");
  cmd->add_option("--nodes", o->nodes,
                  "plan for this many identical machines (each with the --gpu cards, --ram and "
                  "--cpu-cores; rank 0 runs on the first): pipeline stages and experts spread "
                  "over their GPUs, experts no GPU holds in the RAM of their layer's machine, "
                  "with the network's cost between them")
      ->capture_default_str();
  cmd->add_option("--node-link", o->node_link,
                  "the network between machines: ib-ndr, ib-hdr (default, assumed), eth100, "
                  "eth25, eth10, or BANDWIDTH:LATENCY such as 50GBps:3us");
  CLI::Option* cluster = cmd->add_option(
      "--cluster", o->cluster_path,
      "plan for the machines a YAML file describes, alike or not (instead of --gpu, --ram, "
      "--nodes ...): `machines:` a list, rank 0's first, each with `gpus: [a100-80g, 8x 48GiB]` "
      "and `link: nvlink`, `ram`, `cpu_cores`, `host_bandwidth` (GB/s; a machine after the "
      "first without them has the first's); and `network: ib-ndr` between them (as "
      "--node-link)");
  for (const char* other : {"--gpu", "--ram", "--host-bandwidth", "--cpu-cores", "--link",
                            "--nodes", "--node-link", "--ram-reserve"})
    cluster->excludes(cmd->get_option(other));
  cmd->add_flag("--explain", o->explain,
                "also print the candidate placements weighed, with their predicted speeds, and "
                "why an idle GPU stays idle");
  cmd->add_flag("--json", o->json, "print one JSON object instead of tables (with candidates)");
  cmd->callback([o] { run_plan(*o); });
}

}  // namespace tandem::cli
