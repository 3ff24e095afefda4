#include "plan/cluster.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <charconv>
#include <fstream>
#include <sstream>
#include <vector>

#include "core/error.h"

namespace tandem::plan {
namespace {

struct Machine {
  std::vector<std::string> gpus;
  std::string link, ram;
  int32_t cpu_cores = 0;
  double host_bandwidth_gb_per_s = 0;
};

// "8x a100-80g" is eight of the card; anything else is one.
void add_gpus(const std::string& item, std::vector<std::string>& gpus) {
  const size_t x = item.find("x ");
  int count = 0;
  if (x != std::string::npos && x > 0) {
    const auto [end, error] = std::from_chars(item.data(), item.data() + x, count);
    if (error == std::errc() && end == item.data() + x && count > 0) {
      gpus.insert(gpus.end(), size_t(count), item.substr(x + 2));
      return;
    }
  }
  gpus.push_back(item);
}

std::string scalar(const YAML::Node& value, const std::string& where) {
  if (!value.IsScalar()) fail("{}: give one value", where);
  return value.as<std::string>();
}

template <typename T>
T number(const YAML::Node& value, const std::string& where) {
  try {
    return value.as<T>();
  } catch (const YAML::Exception&) {
    fail("{}: '{}' is not a number", where, YAML::Dump(value));
  }
}

Machine parse_machine(const YAML::Node& node, const std::string& where) {
  if (!node.IsMap()) fail("{}: give the machine as fields (gpus, link, ...)", where);
  Machine m;
  for (const auto& kv : node) {
    const std::string key = kv.first.as<std::string>();
    const std::string at = fmt::format("{}, {}", where, key);
    if (key == "gpus") {
      if (kv.second.IsScalar()) {
        add_gpus(kv.second.as<std::string>(), m.gpus);
      } else if (kv.second.IsSequence()) {
        for (const YAML::Node& item : kv.second) add_gpus(scalar(item, at), m.gpus);
      } else {
        fail("{}: give a list of cards ([a100-80g, a100-80g] or [8x a100-80g])", at);
      }
    } else if (key == "link") {
      m.link = scalar(kv.second, at);
    } else if (key == "ram") {
      m.ram = scalar(kv.second, at);
    } else if (key == "cpu_cores") {
      m.cpu_cores = number<int32_t>(kv.second, at);
      if (m.cpu_cores < 1) fail("{}: give 1 or more cores", at);
    } else if (key == "host_bandwidth") {
      m.host_bandwidth_gb_per_s = number<double>(kv.second, at);
      if (!(m.host_bandwidth_gb_per_s > 0)) fail("{}: give the bandwidth in GB/s", at);
    } else {
      fail("{}: unknown field (a machine has gpus, link, ram, cpu_cores, host_bandwidth)", at);
    }
  }
  return m;
}

// `parse()`'s result, its error prefixed with where in the file the text came from (the
// parsers it calls name the command-line flags that take the same text).
template <typename Parse>
auto where_in(const std::string& where, Parse parse) {
  try {
    return parse();
  } catch (const Error& e) {
    fail("{}: {}", where, e.what());
  }
}

// The cost model takes one kind of link between the GPUs of a machine: the slowest of theirs.
int link_speed_order(LinkKind kind) {
  switch (kind) {
    case LinkKind::Pcie4:
      return 0;
    case LinkKind::Pcie5:
      return 1;
    case LinkKind::Nvlink:
      return 2;
  }
  return 0;
}

// The host of machine `node` after the first: the first machine's (`hw.host`, its rates), with
// what the file gives this one instead: its RAM (less the default reserve, as the first's),
// cores (compute scaled from the first's per core) and memory bandwidth (the kernel rates
// measured on the first machine no longer apply).
DeviceSpec host_of(const Machine& m, const Hardware& hw, int32_t node) {
  DeviceSpec host = host_on_node(hw.host, node);
  if (!m.ram.empty()) {
    const uint64_t ram = parse_bytes(m.ram);
    host.memory_bytes = ram - default_ram_reserve(ram);
    host.memory_given = true;
  }
  if (m.cpu_cores > 0) {
    host.flops_per_s *= double(m.cpu_cores) / double(std::max(hw.cpu_cores, 1));
    host.model = fmt::format("CPU ({} cores, given)", m.cpu_cores);
  }
  if (m.host_bandwidth_gb_per_s > 0) {
    host.bandwidth_bytes_per_s = m.host_bandwidth_gb_per_s * 1e9;
    host.decode_kernel_bytes_per_s = host.interleaved_kernel_bytes_per_s = 0;
    host.bandwidth_source = "given";
  }
  return host;
}

}  // namespace

Hardware parse_cluster(std::string_view yaml_text, std::string_view source, int32_t threads) {
  YAML::Node doc;
  try {
    doc = YAML::Load(std::string(yaml_text));
  } catch (const YAML::Exception& e) {
    fail("{}:{}: not valid YAML: {}", source, e.mark.line + 1, e.msg);
  }
  if (!doc.IsMap() || !doc["machines"] || !doc["machines"].IsSequence() ||
      doc["machines"].size() == 0)
    fail(
        "{}: give a list `machines:` with one entry per machine, rank 0's first (see `tandem "
        "plan --help`)",
        source);
  for (const auto& kv : doc) {
    const std::string key = kv.first.as<std::string>();
    if (key != "machines" && key != "network")
      fail("{}: unknown field '{}' (a cluster file has machines and network)", source, key);
  }
  std::vector<Machine> machines;
  for (size_t i = 0; i < doc["machines"].size(); ++i)
    machines.push_back(
        parse_machine(doc["machines"][i], fmt::format("{}: machine {}", source, i + 1)));
  if (machines.size() > 64) fail("{}: {} machines; plans go up to 64", source, machines.size());

  const Machine& first = machines[0];
  Hardware hw = where_in(fmt::format("{}: machine 1", source), [&] {
    return describe_hardware(first.gpus, first.ram, first.host_bandwidth_gb_per_s * 1e9, threads);
  });
  if (first.cpu_cores > 0) set_cpu_cores(hw, first.cpu_cores);
  if (doc["network"]) {
    const std::string where = fmt::format("{}: network", source);
    where_in(where, [&] { set_node_link(hw, scalar(doc["network"], where)); });
  }
  if (hw.node_link_bytes_per_s <= 0 && machines.size() > 1) {
    set_node_link(hw, "ib-hdr");
    hw.node_link_source = "assumed InfiniBand HDR (200 Gb/s): give `network:`";
  }
  // The cost model takes one kind of link between the GPUs of a machine: the slowest of the
  // machines' (one that gives none is taken as PCIe 4, the slowest kind).
  std::vector<std::string> links;
  for (size_t i = 0; i < machines.size(); ++i) {
    const Machine& m = machines[i];
    const std::string where = fmt::format("{}: machine {}", source, i + 1);
    const LinkKind kind =
        m.link.empty() ? LinkKind::Pcie4 : where_in(where, [&] { return parse_link(m.link); });
    if (i == 0 || link_speed_order(kind) < link_speed_order(hw.gpu_link)) hw.gpu_link = kind;
    links.push_back(m.link.empty() ? "pcie4 assumed" : m.link);
    if (i == 0) continue;
    hw.other_hosts.push_back(where_in(where, [&] { return host_of(m, hw, int32_t(i)); }));
    for (size_t g = 0; g < m.gpus.size(); ++g) {
      DeviceSpec gpu =
          where_in(where, [&] { return parse_gpu(m.gpus[g], int32_t(g), DeviceKind::Cuda); });
      gpu.name = fmt::format("node{}:{}", i, gpu.name);
      gpu.node = int32_t(i);
      hw.gpus.push_back(std::move(gpu));
    }
  }
  if (machines.size() > 1)
    hw.link_source = fmt::format("the slowest of the machines' ({}): the cost model takes one kind",
                                 fmt::join(links, ", "));
  else
    hw.link_source = first.link.empty() ? "assumed PCIe 4: give `link:`" : "given";
  hw.n_nodes = int32_t(machines.size());
  return hw;
}

Hardware load_cluster(const std::string& path, int32_t threads) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("cannot read the cluster file {}", path);
  std::stringstream text;
  text << in.rdbuf();
  return parse_cluster(text.str(), path, threads);
}

}  // namespace tandem::plan
