// Plans over several identical machines (plan --nodes): the GPUs of each join the plan, copies
// between machines cost the network, and candidates that share one layer's work inside a machine
// (split heads, copies of experts) stay within one.
#include <gtest/gtest.h>

#include "core/error.h"
#include "plan/hardware.h"
#include "plan/planner.h"
#include "plan_test_support.h"

namespace tandem::plan {
namespace {

using test::machine;
using test::with_reserve;

Hardware eight_a100s() {
  return with_reserve(machine(std::vector<double>(8, 80), 1024, std::vector<double>(8, 2039e9)),
                      LinkKind::Nvlink);
}

TEST(Nodes, RepeatedMachinesNameTheirGpusByMachine) {
  Hardware hw = machine({24, 24}, 64);
  repeat_nodes(hw, 3);
  ASSERT_EQ(hw.gpus.size(), 6u);
  EXPECT_EQ(hw.n_nodes, 3);
  EXPECT_EQ(hw.gpus[1].name, "cuda:1");
  EXPECT_EQ(hw.gpus[1].node, 0);
  EXPECT_EQ(hw.gpus[4].name, "node2:cuda:0");
  EXPECT_EQ(hw.gpus[4].node, 2);
  EXPECT_NE(hw.node_link_source.find("assumed"), std::string::npos);
  EXPECT_THROW(repeat_nodes(hw, 0), Error);
}

TEST(Nodes, NetworkNamesAndNumbersAreReadAndNonsenseIsRefused) {
  Hardware hw;
  set_node_link(hw, "ib-ndr");
  EXPECT_DOUBLE_EQ(hw.node_link_bytes_per_s, 45e9);
  set_node_link(hw, "12.5GBps:30us");
  EXPECT_DOUBLE_EQ(hw.node_link_bytes_per_s, 12.5e9);
  EXPECT_DOUBLE_EQ(hw.node_link_latency_s, 30e-6);
  EXPECT_THROW(set_node_link(hw, "carrier-pigeon"), Error);
  EXPECT_THROW(set_node_link(hw, "-5GBps:3us"), Error);
}

// Issue 32's machine: DeepSeek-V3 at 8 bits does not fit one 8xA100-80G box (the experts left
// in RAM set the pace); two fit it in VRAM and predict faster, each candidate with a speed.
TEST(Nodes, V3AtEightBitsOnTwoEightGpuMachinesFitsAndBeatsOne) {
  const ModelInventory inv = inventory_from_preset("deepseek-v3", "Q8_0");
  const Hardware one = eight_a100s();
  Hardware two = one;
  repeat_nodes(two, 2);
  const Placement p1 = plan_placement(inv, one, {}, {}, nullptr);
  const Placement p2 = plan_placement(inv, two, {}, {}, nullptr);
  ASSERT_TRUE(p2.fits);
  EXPECT_GT(p2.predicted.decode_tokens_per_s, p1.predicted.decode_tokens_per_s);
  // The three ways over machines of the issue: pipeline stages, every layer on the first machine
  // with its experts over all of them, and both.
  bool pipeline = false, mixed = false, experts = false;
  for (const Candidate& c : p2.candidates) {
    EXPECT_GT(c.predicted.decode_tokens_per_s, 0) << c.name;
    pipeline |= c.name.starts_with("pipeline");
    mixed |= c.name.starts_with("mixed");
    experts |= c.name.starts_with("experts: layers on 1 machine, experts over 16 GPUs");
    EXPECT_EQ(c.name.find("heads split"), std::string::npos) << c.name;  // not over machines
  }
  EXPECT_TRUE(pipeline && mixed && experts);
  // The second machine's GPUs hold some of it.
  bool second_used = false;
  for (int32_t d : p2.group_device) second_used |= d >= 9;
  EXPECT_TRUE(second_used);
}

// Serving many sequences, a pipeline over the machines overlaps their steps (a group per
// machine): a layer split in equal shares keeps both machines busy and wins; one sequence at a
// time gets no such candidate (its plan is the same as before).
TEST(Nodes, ServingManySequencesPrefersAPipelineInEqualSharesWhoseStepsOverlap) {
  const ModelInventory inv = inventory_from_preset("deepseek-v3", "Q8_0");
  Hardware two = eight_a100s();
  repeat_nodes(two, 2);
  const Placement many = plan_placement(inv, two, {.n_parallel = 64}, {}, nullptr);
  const Candidate* chosen = nullptr;
  for (const Candidate& c : many.candidates)
    if (c.chosen) chosen = &c;
  ASSERT_NE(chosen, nullptr);
  EXPECT_EQ(chosen->name, "pipeline: layer split in equal shares on 2 machines");
  EXPECT_EQ(chosen->predicted.overlapping_steps, 2);
  for (const Candidate& c : many.candidates)
    EXPECT_TRUE(c.chosen || c.predicted.decode_tokens_per_s < chosen->predicted.decode_tokens_per_s)
        << c.name;
  const Placement one = plan_placement(inv, two, {}, {}, nullptr);
  for (const Candidate& c : one.candidates) {
    EXPECT_EQ(c.name.find("equal shares"), std::string::npos) << c.name;
    EXPECT_EQ(c.predicted.overlapping_steps, 1) << c.name;
  }
}

// The same two machines over a slow network predict slower than over a fast one (copies between
// machines pay it), and there the planner picks the pipeline: one activation crosses per step,
// not every MoE layer's tokens.
TEST(Nodes, ASlowerNetworkPredictsASlowerPlan) {
  const ModelInventory inv = inventory_from_preset("deepseek-v3", "Q8_0");
  Hardware fast = eight_a100s(), slow = eight_a100s();
  set_node_link(fast, "ib-ndr");
  set_node_link(slow, "eth10");
  repeat_nodes(fast, 2);
  repeat_nodes(slow, 2);
  const Placement pf = plan_placement(inv, fast, {}, {}, nullptr);
  const Placement ps = plan_placement(inv, slow, {}, {}, nullptr);
  EXPECT_GT(pf.predicted.decode_tokens_per_s, ps.predicted.decode_tokens_per_s);
  auto chosen = [](const Placement& p) {
    for (const Candidate& c : p.candidates)
      if (c.chosen) return c.name;
    return std::string();
  };
  EXPECT_TRUE(chosen(pf).starts_with("mixed")) << chosen(pf);
  EXPECT_TRUE(chosen(ps).starts_with("pipeline")) << chosen(ps);
}

// Every group a plan keeps in RAM sits on the host of its layer's machine unless that host has no
// room left for it (host_for) and it is a routed expert (a layer's other groups run on its
// machine), and the budgets hold.
void expect_ram_groups_on_their_layers_machine(const ModelInventory& inv, const Placement& p) {
  std::vector<int32_t> host_of(size_t(p.devices.size()), -1);  // node -> device index
  for (size_t d = 0; d < p.devices.size(); ++d)
    if (p.devices[d].spec.kind == DeviceKind::Cpu)
      host_of[size_t(p.devices[d].spec.node)] = int32_t(d);
  for (const DeviceUsage& u : p.devices)
    EXPECT_LE(u.used_bytes(), u.spec.memory_bytes) << u.spec.name;
  for (size_t g = 0; g < inv.groups.size(); ++g) {
    const int32_t d = p.group_device[g];
    const int32_t layer = inv.groups[g].layer;
    if (d < 0 || p.devices[size_t(d)].spec.kind != DeviceKind::Cpu || layer < 0) continue;
    const int32_t node = p.devices[size_t(p.layer_device[size_t(layer)])].spec.node;
    const DeviceUsage& home = p.devices[size_t(host_of[size_t(node)])];
    if (p.devices[size_t(d)].spec.node != node) {
      EXPECT_EQ(inv.groups[g].kind, WeightGroup::RoutedExperts) << inv.groups[g].label();
      EXPECT_LT(home.spec.memory_bytes - home.used_bytes(), inv.groups[g].bytes)
          << inv.groups[g].label() << " left its layer's machine with room there";
    }
  }
}

// Kimi-K2 at 8 bits on 8x 48 GiB machines with 256 GiB of RAM: one machine would stream experts
// from disk; two hold it, the experts no GPU holds in both machines' RAM (each beside its layer
// where it has room), every machine's host named and budgeted.
TEST(Nodes, EveryMachinesRamHoldsTheExpertsOfItsOwnLayers) {
  const ModelInventory inv = inventory_from_preset("kimi-k2", "Q8_0");
  Hardware one = with_reserve(machine(std::vector<double>(8, 48), 256));
  const Placement p1 = plan_placement(inv, one, {}, {}, nullptr);
  EXPECT_FALSE(p1.fits);
  Hardware two = one;
  repeat_nodes(two, 2);
  ASSERT_EQ(two.other_hosts.size(), 1u);
  EXPECT_EQ(two.other_hosts[0].name, "node1:cpu");
  EXPECT_EQ(two.other_hosts[0].node, 1);
  EXPECT_EQ(two.other_hosts[0].memory_bytes, one.host.memory_bytes);
  const Placement p2 = plan_placement(inv, two, {}, {}, nullptr);
  ASSERT_TRUE(p2.fits);
  ASSERT_EQ(p2.devices.size(), 18u);  // cpu, 16 GPUs, then node1:cpu
  EXPECT_EQ(p2.devices.back().spec.name, "node1:cpu");
  EXPECT_GT(p2.devices[0].weight_bytes, 0u);
  EXPECT_GT(p2.devices.back().weight_bytes, 0u);
  expect_ram_groups_on_their_layers_machine(inv, p2);
}

// Machines without GPUs: a model larger than one machine's RAM fits on two, each RAM-held group
// beside its layer where there is room. One sequence at a time, the layers stay on the first
// machine (its experts overflowing to the second's RAM, computed at the same time); serving
// several, a pipeline over their CPUs overlaps the steps and wins, each layer's experts in its
// own machine's RAM.
TEST(Nodes, MachinesWithoutGpusHoldAModelTooBigForOne) {
  const ModelInventory inv = inventory_from_preset("deepseek-v2-lite", "Q8_0");
  const Hardware one = with_reserve(machine({}, 16));
  EXPECT_FALSE(plan_placement(inv, one, {}, {}, nullptr).fits);
  Hardware two = one;
  repeat_nodes(two, 2);
  auto chosen = [](const Placement& p) {
    for (const Candidate& c : p.candidates)
      if (c.chosen) return c;
    return Candidate{};
  };
  const Placement single = plan_placement(inv, two, {}, {}, nullptr);
  ASSERT_TRUE(single.fits) << (single.problems.empty() ? "" : single.problems[0]);
  EXPECT_EQ(chosen(single).name, "layers on the first machine, experts in every machine's RAM");
  expect_ram_groups_on_their_layers_machine(inv, single);
  EXPECT_GT(single.devices[1].weight_bytes, 0u);  // node1:cpu holds the experts that overflow

  const Placement many = plan_placement(inv, two, {.n_parallel = 8}, {}, nullptr);
  ASSERT_TRUE(many.fits);
  EXPECT_EQ(chosen(many).name, "pipeline: layer split over the CPUs of 2 machines");
  EXPECT_EQ(many.predicted.overlapping_steps, 2);
  ASSERT_EQ(many.devices.size(), 2u);
  EXPECT_EQ(many.layer_device.front(), 0);
  EXPECT_EQ(many.layer_device.back(), 1);
  expect_ram_groups_on_their_layers_machine(inv, many);
  for (size_t g = 0; g < inv.groups.size(); ++g) {  // nothing had to leave its layer's machine
    if (inv.groups[g].layer < 0) continue;
    EXPECT_EQ(many.group_device[g], many.layer_device[size_t(inv.groups[g].layer)])
        << inv.groups[g].label();
  }
}

}  // namespace
}  // namespace tandem::plan
