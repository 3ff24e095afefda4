// --devices texts: what each form asks for, in order, and the errors a person can act on.
#include "runtime/device_setup.h"

#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "backends/sim/sim_backend.h"
#include "core/error.h"
#include "gguf/gguf_file.h"
#include "plan/cluster.h"
#include "plan/inventory.h"
#include "test_support.h"

namespace tandem {
namespace {

std::string error_of(std::string_view spec, int gpus_found) {
  try {
    parse_devices(spec, gpus_found);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(DeviceSetup, CpuAndAutoWithoutGpusAskForNothingBesidesTheHost) {
  EXPECT_TRUE(parse_devices("cpu", 0).empty());
  EXPECT_TRUE(parse_devices("", 3).empty());
  EXPECT_TRUE(parse_devices("auto", 0).empty());
}

TEST(DeviceSetup, AutoAndCudaTakeEveryGpuInOrder) {
  for (const char* spec : {"auto", "cuda", "cpu,cuda"}) {
    const std::vector<DeviceRequest> r = parse_devices(spec, 2);
    ASSERT_EQ(r.size(), 2u) << spec;
    EXPECT_TRUE(r[0].cuda && r[1].cuda);
    EXPECT_EQ(r[0].cuda_index, 0);
    EXPECT_EQ(r[1].cuda_index, 1);
  }
}

TEST(DeviceSetup, NamedGpusAndSimulatedDevicesKeepTheirOrder) {
  const std::vector<DeviceRequest> r = parse_devices("cuda:1,sim:2x1MiB,cuda:0", 2);
  ASSERT_EQ(r.size(), 4u);
  EXPECT_TRUE(r[0].cuda);
  EXPECT_EQ(r[0].cuda_index, 1);
  EXPECT_FALSE(r[1].cuda);
  EXPECT_EQ(r[1].sim_bytes, uint64_t(1) << 20);
  EXPECT_FALSE(r[2].cuda);
  EXPECT_TRUE(r[3].cuda);
  EXPECT_EQ(r[3].cuda_index, 0);
  EXPECT_EQ(parse_sim_devices("cuda:0,sim:1GiB,sim:2x1MiB"),
            (std::vector<uint64_t>{uint64_t(1) << 30, uint64_t(1) << 20, uint64_t(1) << 20}));
}

TEST(DeviceSetup, MistakesAreNamedWithTheFix) {
  EXPECT_NE(error_of("cuda", 0).find("no CUDA GPU found"), std::string::npos)
      << error_of("cuda", 0);
  EXPECT_NE(error_of("cuda", 0).find("--devices cpu"), std::string::npos);
  EXPECT_NE(error_of("cuda:1", 1).find("there is no cuda:1: 1 GPU found"), std::string::npos)
      << error_of("cuda:1", 1);
  EXPECT_NE(error_of("cuda:0,cuda:0", 1).find("cuda:0 is named twice"), std::string::npos);
  EXPECT_NE(error_of("cuda:x", 1).find("bad GPU index in 'cuda:x'"), std::string::npos);
  EXPECT_NE(error_of("gpu:0", 1).find("unknown device 'gpu:0'"), std::string::npos);
  EXPECT_NE(error_of("sim:0x1GiB", 0).find("bad device count"), std::string::npos);
}

// A placement becomes the executor's plan: each group on its device, copies of experts beside
// their homes, what is streamed from disk computed by the host.
TEST(DeviceSetup, APlacementsDevicesHomesAndCopiesReachTheExecutor) {
  const gguf::GgufFile file = gguf::GgufFile::open(test::fixture("micro-v3-F32.gguf").string());
  const plan::ModelInventory inv = plan::inventory_from_file(file);
  std::vector<std::unique_ptr<Backend>> backends;
  backends.push_back(std::make_unique<cpu::CpuBackend>(1));
  backends.push_back(std::make_unique<sim::SimBackend>(0, size_t(1) << 30));
  backends.push_back(std::make_unique<sim::SimBackend>(1, size_t(1) << 30));
  plan::Placement p;
  p.devices.resize(3);
  p.layer_device.assign(inv.n_layers, 1);
  p.group_copies.resize(inv.groups.size());
  for (size_t g = 0; g < inv.groups.size(); ++g) {
    const plan::InventoryGroup& group = inv.groups[g];
    if (group.kind == WeightGroup::RoutedExperts) {
      p.group_device.push_back(group.expert % 2 ? 2 : 1);
      if (group.expert % 3 == 0) p.group_copies[g] = {group.expert % 2 ? 1 : 2};
    } else {
      p.group_device.push_back(group.kind == WeightGroup::Embedding ? plan::kOnDisk : 1);
    }
  }
  const DevicePlan dp = device_plan_for(p, inv, backends);
  EXPECT_EQ(dp.embeddings, backends[0].get());  // from disk: the host
  EXPECT_EQ(dp.output, backends[1].get());
  ASSERT_EQ(dp.expert_copies.size(), inv.n_layers);
  size_t copies = 0;
  for (const plan::InventoryGroup& group : inv.groups) {
    if (group.kind != WeightGroup::RoutedExperts) continue;
    const size_t l = size_t(group.layer), e = size_t(group.expert);
    EXPECT_EQ(dp.experts[l][e], backends[e % 2 ? 2 : 1].get()) << group.label();
    ASSERT_EQ(dp.expert_copies[l].size(), dp.experts[l].size());
    if (e % 3 == 0) {
      ASSERT_EQ(dp.expert_copies[l][e].size(), 1u) << group.label();
      EXPECT_EQ(dp.expert_copies[l][e][0], backends[e % 2 ? 1 : 2].get()) << group.label();
      ++copies;
    } else {
      EXPECT_TRUE(dp.expert_copies[l][e].empty()) << group.label();
    }
  }
  EXPECT_GT(copies, 0u);
}

// A plan over two machines by hand: host and cuda:0 on the first, node1:cuda:0, node1:cuda:1 and
// node1:cpu on the second. Two layers of two experts; layer 0 on cuda:0, layer 1 on node1:cuda:1,
// one expert in the second machine's RAM, one streamed from disk, the head on node1:cuda:0.
plan::Placement two_machine_plan() {
  plan::Placement p;
  auto device = [](std::string name, int32_t node, plan::DeviceKind kind) {
    plan::DeviceUsage u;
    u.spec.name = std::move(name);
    u.spec.node = node;
    u.spec.kind = kind;
    return u;
  };
  using plan::DeviceKind;
  p.devices = {device("cpu", 0, DeviceKind::Cpu), device("cuda:0", 0, DeviceKind::Cuda),
               device("node1:cuda:0", 1, DeviceKind::Cuda),
               device("node1:cuda:1", 1, DeviceKind::Cuda),
               device("node1:cpu", 1, DeviceKind::Cpu)};
  p.layer_device = {1, 3};
  // Groups: embeddings, output, layer 0's experts 0-1, layer 1's experts 0-1.
  p.group_device = {0, 2, 1, 4, plan::kOnDisk, 3};
  p.group_copies = {{}, {}, {}, {}, {}, {2}};
  p.layer_heads = {{}, {{.device = 3, .first_head = 0, .n_heads = 1}}};
  return p;
}

plan::ModelInventory two_layer_inventory() {
  plan::ModelInventory inv;
  inv.n_layers = 2;
  inv.info.n_expert = 2;
  inv.groups = {{.kind = WeightGroup::Embedding},
                {.kind = WeightGroup::OutputHead},
                {.kind = WeightGroup::RoutedExperts, .layer = 0, .expert = 0},
                {.kind = WeightGroup::RoutedExperts, .layer = 0, .expert = 1},
                {.kind = WeightGroup::RoutedExperts, .layer = 1, .expert = 0},
                {.kind = WeightGroup::RoutedExperts, .layer = 1, .expert = 1}};
  return inv;
}

TEST(DeviceSetup, APlanOverMachinesGivesEachRankItsMachinesPartsOnItsOwnDevices) {
  const plan::Placement p = two_machine_plan();
  const RankPlan ranks = rank_plan_for(p, two_layer_inventory());
  EXPECT_EQ(ranks.embeddings, 0);
  EXPECT_EQ(ranks.output, 1);
  EXPECT_EQ(ranks.layers, (std::vector<int32_t>{0, 1}));
  // An expert in the second machine's RAM is its, under a layer of the first; the disk's experts
  // are the first machine's, under a layer of the second.
  EXPECT_EQ(ranks.experts[0], (std::vector<int32_t>{0, 1}));
  EXPECT_EQ(ranks.experts[1], (std::vector<int32_t>{0, 1}));

  // Machine 1 runs its parts on its own devices, in order: node1:cpu is its host (0),
  // node1:cuda:0 its 1, node1:cuda:1 its 2; what the other machine runs goes to the host, to be
  // dropped.
  const plan::Placement second = placement_on_machine(p, 1);
  ASSERT_EQ(second.devices.size(), 3u);
  EXPECT_EQ(second.devices[0].spec.name, "node1:cpu");
  EXPECT_EQ(second.devices[2].spec.name, "node1:cuda:1");
  EXPECT_EQ(second.layer_device, (std::vector<int32_t>{0, 2}));
  EXPECT_EQ(second.group_device, (std::vector<int32_t>{0, 1, 0, 0, plan::kOnDisk, 2}));
  EXPECT_TRUE(second.group_copies.empty());
  EXPECT_TRUE(second.layer_heads[1].empty());
  const plan::Placement first = placement_on_machine(p, 0);
  ASSERT_EQ(first.devices.size(), 2u);
  EXPECT_EQ(first.layer_device, (std::vector<int32_t>{1, 0}));
  EXPECT_EQ(first.group_device, (std::vector<int32_t>{0, 0, 1, 0, plan::kOnDisk, 0}));
}

// A run that follows a cluster file: this rank's devices stand for its machine's GPUs in order,
// planned with no more memory than they have; the other machines keep the file's numbers.
TEST(DeviceSetup, AClusterFilesMachineIsPlannedWithTheMemoryOfTheDevicesStandingForIt) {
  const gguf::GgufFile file = gguf::GgufFile::open(test::fixture("micro-v3-F32.gguf").string());
  const plan::Hardware cluster =
      plan::parse_cluster("machines:\n  - gpus: [1GiB]\n  - gpus: [2x 1GiB]\n", "cluster.yaml", 1);
  const DeviceSetup setup = setup_devices(
      file, "sim:2x64MiB", "", "", 1, {.n_ctx = 256, .n_parallel = 1}, false, 2, 1, {}, &cluster);
  std::vector<std::pair<std::string, uint64_t>> gpus;
  for (const plan::DeviceUsage& usage : setup.placement.devices)
    if (usage.spec.kind != plan::DeviceKind::Cpu)
      gpus.emplace_back(usage.spec.name, usage.spec.memory_bytes);
  const uint64_t listed = cluster.gpus[0].memory_bytes;  // 1 GiB less the CUDA runtime's share
  EXPECT_LT(listed, uint64_t(1) << 30);
  EXPECT_GT(listed, uint64_t(64) << 20);
  EXPECT_EQ(gpus,
            (std::vector<std::pair<std::string, uint64_t>>{
                {"cuda:0", listed}, {"node1:cuda:0", 64u << 20}, {"node1:cuda:1", 64u << 20}}));
  EXPECT_EQ(setup.backends.size(), 3u);  // the host and this rank's two sim devices

  try {
    setup_devices(file, "sim:64MiB", "", "", 1, {.n_ctx = 256, .n_parallel = 1}, false, 2, 1, {},
                  &cluster);
    FAIL() << "a rank with one device ran machine 1's two GPUs";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("gives machine 1 (rank 1) 2 GPUs, and this rank has 1 "
                                         "device (--devices sim:64MiB)"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace tandem
