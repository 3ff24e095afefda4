#include "runtime/rank_agreement.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

#include "core/error.h"
#include "core/fnv_hash.h"
#include "plan/cluster.h"
#include "runtime/transport.h"

namespace tandem {
namespace {

// The rates of a device the plan reads (DeviceSpec), in a fixed order.
constexpr size_t kRates = 7;
void rates_of(const plan::DeviceSpec& d, double* out) {
  out[0] = d.bandwidth_bytes_per_s, out[1] = d.flops_per_s, out[2] = d.int8_ops_per_s;
  out[3] = d.decode_kernel_bytes_per_s, out[4] = d.interleaved_kernel_bytes_per_s;
  out[5] = d.host_link_bytes_per_s, out[6] = d.host_handoff_s;
}
void set_rates(plan::DeviceSpec& d, const double* in) {
  d.bandwidth_bytes_per_s = in[0], d.flops_per_s = in[1], d.int8_ops_per_s = in[2];
  d.decode_kernel_bytes_per_s = in[3], d.interleaved_kernel_bytes_per_s = in[4];
  d.host_link_bytes_per_s = in[5], d.host_handoff_s = in[6];
}

}  // namespace

Spread default_spread(Transport& transport, bool cpu_only) {
  const std::vector<int32_t> all = gather_from_every_rank<int32_t>(
      transport, cpu_only ? 1 : 0, "whether every rank has devices");
  return std::ranges::any_of(all, [](int32_t c) { return c != 0; }) ? Spread::Pipeline
                                                                    : Spread::Plan;
}

void agree_on_hardware(Transport& transport, plan::Hardware& hw) {
  check_same_on_every_rank(transport, hw.gpus.size(), "the number of devices to plan for",
                           "give every rank the same --devices (like machines), or --spread "
                           "pipeline, experts or mixed");
  for (plan::DeviceSpec& gpu : hw.gpus) {
    const std::vector<uint64_t> memory =
        gather_from_every_rank(transport, gpu.memory_bytes, "each device's free memory");
    gpu.memory_bytes = *std::ranges::min_element(memory);
  }
  // The hosts (a cluster file's machines after the first start from this machine's rates) and
  // the devices, as rank 0 has them.
  std::vector<plan::DeviceSpec*> specs = {&hw.host};
  for (plan::DeviceSpec& host : hw.other_hosts) specs.push_back(&host);
  for (plan::DeviceSpec& gpu : hw.gpus) specs.push_back(&gpu);
  std::vector<double> rates(specs.size() * kRates);
  for (size_t i = 0; i < specs.size(); ++i) rates_of(*specs[i], rates.data() + i * kRates);
  transport.broadcast(0, std::as_writable_bytes(std::span(rates)), "rank 0's device rates");
  for (size_t i = 0; i < specs.size(); ++i) set_rates(*specs[i], rates.data() + i * kRates);
  int32_t link = int32_t(hw.gpu_link);
  transport.broadcast(0, std::as_writable_bytes(std::span(&link, 1)), "rank 0's GPU links");
  if (link != int32_t(hw.gpu_link)) {
    hw.gpu_link = plan::LinkKind(link);
    hw.link_source = "rank 0's, so that every rank plans alike";
  }
}

plan::Hardware cluster_of_ranks(Transport& transport, const std::string& path, int32_t threads) {
  plan::Hardware cluster = plan::load_cluster(path, threads);
  Fnv1a fingerprint;  // over what the plan reads of the machines
  fingerprint.mix(uint64_t(cluster.n_nodes));
  fingerprint.mix(uint64_t(cluster.node_link_bytes_per_s));
  fingerprint.mix(uint64_t(cluster.node_link_latency_s * 1e9));
  fingerprint.mix(uint64_t(cluster.gpu_link));
  if (cluster.host.memory_given) fingerprint.mix(cluster.host.memory_bytes);
  for (const plan::DeviceSpec& host : cluster.other_hosts) {
    if (host.memory_given) fingerprint.mix(host.memory_bytes);
    if (host.bandwidth_source == "given") fingerprint.mix(uint64_t(host.bandwidth_bytes_per_s));
  }
  for (const plan::DeviceSpec& gpu : cluster.gpus) {
    fingerprint.mix(uint64_t(gpu.node));
    fingerprint.mix(gpu.memory_bytes);
    fingerprint.mix(uint64_t(gpu.bandwidth_bytes_per_s));
  }
  check_same_on_every_rank(transport, fingerprint.value(),
                           fmt::format("the machines the cluster file {} lists", path),
                           "give every rank the same cluster file");
  if (cluster.n_nodes != transport.n_ranks())
    fail(
        "{} lists {} machine{} and this run has {} ranks: start one rank per machine (mpirun -np "
        "{})",
        path, cluster.n_nodes, cluster.n_nodes == 1 ? "" : "s", transport.n_ranks(),
        cluster.n_nodes);
  return cluster;
}

}  // namespace tandem
