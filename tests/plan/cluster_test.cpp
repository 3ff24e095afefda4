// Cluster files (plan --cluster): machines alike or unlike become one Hardware whose GPUs are
// named by machine, with the network between them and one kind of GPU link (the slowest); fields
// the planner would not use are refused, not ignored.
#include <gtest/gtest.h>

#include <string>

#include "core/error.h"
#include "plan/cluster.h"

namespace tandem::plan {
namespace {

// The first machine's bandwidth is given, so nothing is measured.
Hardware cluster(const std::string& yaml) {
  return parse_cluster(yaml, "test.yaml", 1);
}

std::string error_of(const std::string& yaml) {
  try {
    cluster(yaml);
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(Cluster, TwoLikeMachinesAreWhatRepeatNodesGives) {
  const Hardware hw = cluster(R"(
machines:
  - gpus: [8x a100-80g]
    link: nvlink
    ram: 1TiB
    cpu_cores: 64
    host_bandwidth: 200
  - gpus: [8x a100-80g]
    link: nvlink
)");
  EXPECT_EQ(hw.n_nodes, 2);
  ASSERT_EQ(hw.gpus.size(), 16u);
  EXPECT_EQ(hw.gpus[7].name, "cuda:7");
  EXPECT_EQ(hw.gpus[7].node, 0);
  EXPECT_EQ(hw.gpus[15].name, "node1:cuda:7");
  EXPECT_EQ(hw.gpus[15].node, 1);
  EXPECT_EQ(hw.gpus[15].memory_bytes, hw.gpus[0].memory_bytes);
  EXPECT_EQ(hw.gpu_link, LinkKind::Nvlink);
  EXPECT_EQ(hw.cpu_cores, 64);
  EXPECT_DOUBLE_EQ(hw.host.bandwidth_bytes_per_s, 200e9);
  EXPECT_EQ(hw.ram_bytes, uint64_t(1) << 40);
  // No network given: InfiniBand HDR, said to be assumed.
  EXPECT_DOUBLE_EQ(hw.node_link_bytes_per_s, 22.5e9);
  EXPECT_NE(hw.node_link_source.find("assumed"), std::string::npos) << hw.node_link_source;
}

TEST(Cluster, UnlikeMachinesKeepTheirOwnCardsAndTheSlowestLink) {
  const Hardware hw = cluster(R"(
machines:
  - gpus: [4090, 4090]
    link: pcie4
    ram: 256GiB
    host_bandwidth: 80
  - gpus: 3x 48GiB
    link: pcie5
  - gpus: [h100]
    link: nvlink
network: eth100
)");
  EXPECT_EQ(hw.n_nodes, 3);
  ASSERT_EQ(hw.gpus.size(), 6u);
  EXPECT_EQ(hw.gpus[1].node, 0);
  EXPECT_EQ(hw.gpus[2].name, "node1:cuda:0");
  EXPECT_EQ(hw.gpus[4].name, "node1:cuda:2");
  EXPECT_EQ(hw.gpus[5].name, "node2:cuda:0");
  EXPECT_EQ(hw.gpus[5].node, 2);
  EXPECT_GT(hw.gpus[5].memory_bytes, hw.gpus[0].memory_bytes);  // an H100 beside a 4090
  EXPECT_EQ(hw.gpu_link, LinkKind::Pcie4);
  EXPECT_NE(hw.link_source.find("slowest"), std::string::npos) << hw.link_source;
  EXPECT_DOUBLE_EQ(hw.node_link_bytes_per_s, 11e9);
  EXPECT_DOUBLE_EQ(hw.node_link_latency_s, 25e-6);
}

// Every machine's host joins the plan: its own RAM (less the default reserve), cores and memory
// bandwidth where the file gives them, the first machine's where it does not; a machine may have
// no GPUs at all (its RAM and CPU still hold parts).
TEST(Cluster, EveryMachinesRamAndCpuAreItsOwnOrTheFirsts) {
  const Hardware hw = cluster(R"(
machines:
  - gpus: [4090]
    ram: 256GiB
    cpu_cores: 32
    host_bandwidth: 80
  - gpus: [4090]
    ram: 1TiB
    cpu_cores: 64
    host_bandwidth: 200
  - cpu_cores: 16
)");
  EXPECT_EQ(hw.n_nodes, 3);
  ASSERT_EQ(hw.other_hosts.size(), 2u);
  const DeviceSpec& second = hw.other_hosts[0];
  const DeviceSpec& third = hw.other_hosts[1];
  EXPECT_EQ(second.name, "node1:cpu");
  EXPECT_EQ(second.node, 1);
  EXPECT_EQ(second.kind, DeviceKind::Cpu);
  EXPECT_EQ(second.memory_bytes, (uint64_t(1) << 40) - default_ram_reserve(uint64_t(1) << 40));
  EXPECT_DOUBLE_EQ(second.bandwidth_bytes_per_s, 200e9);
  EXPECT_DOUBLE_EQ(second.flops_per_s, 2 * hw.host.flops_per_s);
  EXPECT_EQ(third.name, "node2:cpu");
  EXPECT_EQ(third.memory_bytes, hw.host.memory_bytes);
  EXPECT_DOUBLE_EQ(third.bandwidth_bytes_per_s, 80e9);
  EXPECT_DOUBLE_EQ(third.flops_per_s, hw.host.flops_per_s / 2);
  EXPECT_EQ(hw.gpus.size(), 2u);
}

TEST(Cluster, FieldsThePlannerWouldNotUseAreRefusedByName) {
  EXPECT_NE(error_of("machines:\n  - gpus: [4090]\n    host_bandwidth: 80\n    nics: 2\n")
                .find("machine 1, nics: unknown field"),
            std::string::npos);
  EXPECT_NE(error_of("nodes: 2\n").find("give a list `machines:`"), std::string::npos);
  EXPECT_NE(error_of("machines:\n  - gpus: [4090]\n    host_bandwidth: 80\nswitch: x\n")
                .find("unknown field 'switch'"),
            std::string::npos);
  EXPECT_NE(error_of("machines: [\n").find("test.yaml:"), std::string::npos);
  EXPECT_NE(error_of("machines:\n  - gpus: [4090]\n    host_bandwidth: 80\n    cpu_cores: many\n")
                .find("is not a number"),
            std::string::npos);
  // Cards, links and networks are checked as --gpu, --link and --node-link check them, and the
  // error says where in the file.
  EXPECT_NE(error_of("machines:\n  - gpus: [a-potato]\n    host_bandwidth: 80\n")
                .find("test.yaml: machine 1: "),
            std::string::npos);
  EXPECT_NE(error_of("machines:\n  - gpus: [4090]\n    host_bandwidth: 80\n  - gpus: [4090]\n"
                     "    link: usb\n")
                .find("test.yaml: machine 2: "),
            std::string::npos);
  EXPECT_NE(
      error_of("machines:\n  - gpus: [4090]\n    host_bandwidth: 80\nnetwork: carrier-pigeon\n")
          .find("test.yaml: network: "),
      std::string::npos);
}

}  // namespace
}  // namespace tandem::plan
