// The cost model: distinct experts per batch, overlap of CPU and GPU parts, transfers at cuts,
// disk streaming. Values are predictions; the tests pin their arithmetic and their direction.
#include "plan/cost_model.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>

#include "plan/inventory.h"
#include "plan/planner.h"
#include "plan_test_support.h"

namespace tandem::plan {
namespace {

using test::kGiB;
using test::machine;
using test::tiny_inventory;

// A placement built by hand: everything on `device` except what `where` says.
Placement manual(const ModelInventory& inv, const Hardware& hw, int32_t device,
                 const std::function<int32_t(const InventoryGroup&)>& where = nullptr) {
  Placement p;
  p.devices.push_back({.spec = hw.host});
  for (const DeviceSpec& g : hw.gpus) p.devices.push_back({.spec = g});
  for (const DeviceSpec& h : hw.other_hosts) p.devices.push_back({.spec = h});
  for (const InventoryGroup& g : inv.groups) {
    const int32_t d = where ? where(g) : device;
    p.group_device.push_back(d);
    if (g.kind == WeightGroup::Attention) p.layer_device.push_back(d < 0 ? 0 : d);
  }
  return p;
}

double step_seconds(const Prediction& p) {
  return p.decode_seconds_gpu + p.decode_seconds_cpu + p.decode_seconds_transfer +
         p.decode_seconds_disk;
}

TEST(CostModel, distinct_experts_follow_the_uniform_formula) {
  EXPECT_DOUBLE_EQ(expected_distinct_experts(256, 8, 0), 0.0);
  EXPECT_NEAR(expected_distinct_experts(256, 8, 1), 8.0, 1e-9);
  EXPECT_NEAR(expected_distinct_experts(256, 8, 4), 256.0 * (1 - std::pow(1 - 8.0 / 256, 4)), 1e-9);
  // A prefill batch of 512 touches practically every expert.
  EXPECT_GT(expected_distinct_experts(256, 8, 512), 255.9);
  EXPECT_LE(expected_distinct_experts(256, 8, 512), 256.0);
  // Two tokens share experts: fewer than 2k distinct.
  EXPECT_LT(expected_distinct_experts(64, 6, 2), 12.0);
}

TEST(CostModel, distinct_experts_from_frequencies) {
  std::vector<double> uniform(256, 8.0 / 256);
  EXPECT_NEAR(expected_distinct_experts(uniform, 7), expected_distinct_experts(256, 8, 7), 1e-9);
  // Skewed routing: 4 experts always chosen, 4 more spread over the other 252.
  std::vector<double> skewed(256, 4.0 / 252);
  for (int e = 0; e < 4; ++e) skewed[size_t(e)] = 1.0;
  EXPECT_NEAR(expected_distinct_experts(skewed, 1), 8.0, 1e-9);
  EXPECT_LT(expected_distinct_experts(skewed, 16), expected_distinct_experts(uniform, 16));
}

TEST(CostModel, profile_probabilities_sum_to_experts_used) {
  const ModelInventory inv = tiny_inventory();
  RoutingProfile profile;
  profile.counts.resize(8);
  profile.counts[3] = std::vector<uint64_t>(16, 1);
  profile.counts[3][0] = 3;  // 3 of 18 choices: a token picks it with probability 4 * 3 / 18
  const std::vector<double> p = expert_choice_probabilities(inv, &profile, 3);
  double sum = 0;
  for (double x : p) sum += x;
  EXPECT_NEAR(sum, 4.0, 1e-9);
  EXPECT_NEAR(p[0], 4.0 * 3 / 18, 1e-9);
  // A layer the profile lacks is uniform.
  EXPECT_NEAR(expert_choice_probabilities(inv, &profile, 2)[5], 4.0 / 16, 1e-12);
}

TEST(CostModel, expert_flops_count_three_matrices) {
  const ModelInventory inv = tiny_inventory();
  InventoryGroup expert{.kind = WeightGroup::RoutedExperts, .layer = 1, .expert = 0};
  EXPECT_DOUBLE_EQ(group_flops_per_token(inv.info, expert), 2.0 * 3 * 1024 * 512);
  EXPECT_DOUBLE_EQ(group_flops_per_token(inv.info, {.kind = WeightGroup::Embedding}), 0.0);
}

TEST(CostModel, gpu_is_faster_than_cpu_and_split_experts_overlap) {
  const ModelInventory inv = tiny_inventory();
  const Hardware hw = machine({24}, 64);
  const Workload wl;
  const Prediction cpu = predict_speed(inv, hw, wl, manual(inv, hw, 0), nullptr);
  const Prediction gpu = predict_speed(inv, hw, wl, manual(inv, hw, 1), nullptr);
  // A model this small is bound by per-op overheads at decode, by FLOPs at prefill.
  EXPECT_GT(gpu.decode_tokens_per_s, 3 * cpu.decode_tokens_per_s);
  EXPECT_GT(gpu.prefill_tokens_per_s, 10 * cpu.prefill_tokens_per_s);
  EXPECT_EQ(cpu.decode_seconds_gpu, 0);
  EXPECT_EQ(gpu.decode_seconds_cpu, 0);

  // Attention on the GPU; experts 0-7 of each layer on the GPU and 8-15 on the CPU. The layer
  // costs the slower (CPU) half plus a round trip, not the sum of both halves.
  const auto half = [](const InventoryGroup& g) {
    return g.kind == WeightGroup::RoutedExperts && g.expert >= 8 ? 0 : 1;
  };
  const auto all_experts_cpu = [](const InventoryGroup& g) {
    return g.kind == WeightGroup::RoutedExperts ? 0 : 1;
  };
  const Prediction split = predict_speed(inv, hw, wl, manual(inv, hw, 1, half), nullptr);
  const Prediction experts_cpu =
      predict_speed(inv, hw, wl, manual(inv, hw, 1, all_experts_cpu), nullptr);
  EXPECT_GT(split.decode_tokens_per_s, experts_cpu.decode_tokens_per_s);
  EXPECT_LT(split.decode_tokens_per_s, gpu.decode_tokens_per_s);
  EXPECT_GT(split.decode_seconds_transfer, 0);
  // Overlap: the split step is shorter than GPU-only plus the CPU half run in sequence.
  const double cpu_half_s = step_seconds(experts_cpu) - step_seconds(gpu);
  EXPECT_LT(step_seconds(split), step_seconds(gpu) + cpu_half_s);
}

// Routed experts in RAM beside a GPU: a prompt chunk streams them all over PCIe (whatever the
// routing) and the GPU computes them, or the host's cores compute the ones chosen. The host's
// time grows with the chunk, the link's does not: streaming wins from some chunk size on, sooner
// over a faster link, never where there is no GPU or the host's layout is its own.
TEST(CostModel, prompts_stream_the_hosts_experts_to_the_gpu_from_the_chunk_where_that_is_faster) {
  const ModelInventory inv = tiny_inventory();
  Hardware hw = machine({24}, 64);
  const auto experts_on_host = [](const InventoryGroup& g) {
    return g.kind == WeightGroup::RoutedExperts ? 0 : 1;
  };
  const Placement hybrid = manual(inv, hw, 1, experts_on_host);
  // This host (200 GB/s, 2 TFLOPS) keeps up with PCIe 4 up to chunks of a few thousand tokens.
  const Workload chunks_of_4096{.prefill_batch = 4096};
  Workload wl = chunks_of_4096;
  const int64_t from = stream_experts_min_tokens(inv, hw, wl, hybrid, nullptr);
  ASSERT_GT(from, 1) << "one token's four experts per layer cost less than the whole layer's copy";
  ASSERT_LE(from, wl.prefill_batch);
  // At that chunk the prediction streams, and says what the host alone would give; at half of
  // it the host computes them.
  wl.prefill_batch = from;
  const Prediction at = predict_speed(inv, hw, wl, hybrid, nullptr);
  EXPECT_TRUE(at.experts_streamable);
  EXPECT_GT(at.prefill_tokens_per_s_host_experts, 0);
  EXPECT_GT(at.prefill_tokens_per_s, at.prefill_tokens_per_s_host_experts);
  wl.prefill_batch = from / 2;
  const Prediction below = predict_speed(inv, hw, wl, hybrid, nullptr);
  EXPECT_TRUE(below.experts_streamable);
  EXPECT_EQ(below.prefill_tokens_per_s_host_experts, 0);
  // A link twice as fast: from a smaller chunk.
  wl = chunks_of_4096;
  Hardware pcie5 = hw;
  pcie5.gpu_link = LinkKind::Pcie5;
  EXPECT_LT(stream_experts_min_tokens(inv, pcie5, wl, hybrid, nullptr), from);
  // Nothing to stream: everything on the CPU, or the experts in tandem's interleaved layout
  // (a GPU does not read it).
  const Placement cpu = manual(inv, hw, 0);
  EXPECT_FALSE(predict_speed(inv, hw, wl, cpu, nullptr).experts_streamable);
  EXPECT_EQ(stream_experts_min_tokens(inv, hw, wl, cpu, nullptr), 0);
  ModelInventory repacked = inv;
  for (InventoryGroup& g : repacked.groups)
    if (g.kind == WeightGroup::RoutedExperts) g.interleaved_bytes = g.bytes;
  EXPECT_FALSE(predict_speed(repacked, hw, wl, hybrid, nullptr).experts_streamable);
  EXPECT_EQ(stream_experts_min_tokens(repacked, hw, wl, hybrid, nullptr), 0);
  // Nor where some experts are read from disk (the host's share maps them: every chunk would
  // read them from the file again).
  const Placement some_on_disk = manual(inv, hw, 1, [](const InventoryGroup& g) {
    return g.kind != WeightGroup::RoutedExperts ? 1 : g.expert == 0 ? kOnDisk : 0;
  });
  EXPECT_EQ(stream_experts_min_tokens(inv, hw, wl, some_on_disk, nullptr), 0);
  // The summary `plan` and `bench` print says which way prompts go.
  EXPECT_NE(expert_streaming_summary(at, from, false, from).find("cost model's choice"),
            std::string::npos);
  EXPECT_NE(expert_streaming_summary(at, 0, true, from).find("the CPU computes"),
            std::string::npos);
  EXPECT_EQ(expert_streaming_summary(predict_speed(inv, hw, wl, cpu, nullptr), 0, false, 512), "");
  // What a run with streaming forced on or off predicts.
  wl.prefill_batch = from;
  EXPECT_DOUBLE_EQ(predict_prefill_tokens_per_s(inv, hw, wl, hybrid, nullptr, true),
                   at.prefill_tokens_per_s);
  EXPECT_DOUBLE_EQ(predict_prefill_tokens_per_s(inv, hw, wl, hybrid, nullptr, false),
                   at.prefill_tokens_per_s_host_experts);
}

// A GPU's hybrid costs measured on the machine (cuda::GpuRates, cached with its other rates)
// replace the defaults: the hand-off of a MoE layer's share to the host and back sets the hybrid
// decode step, the page-locked copy rate the link that streamed experts take.
TEST(CostModel, measured_hand_off_and_host_link_replace_the_defaults) {
  const ModelInventory inv = tiny_inventory();
  const auto experts_on_host = [](const InventoryGroup& g) {
    return g.kind == WeightGroup::RoutedExperts ? 0 : 1;
  };
  const Workload wl{.prefill_batch = 4096};
  auto predict = [&](double handoff_s, double link_bytes_per_s) {
    Hardware hw = machine({24}, 64);
    hw.gpus[0].host_handoff_s = handoff_s;
    hw.gpus[0].host_link_bytes_per_s = link_bytes_per_s;
    const Placement hybrid = manual(inv, hw, 1, experts_on_host);
    Prediction p = predict_speed(inv, hw, wl, hybrid, nullptr);
    p.stream_experts_min_tokens = stream_experts_min_tokens(inv, hw, wl, hybrid, nullptr);
    return p;
  };
  const Prediction defaults = predict(0, 0), quick = predict(5e-6, 0), slow = predict(2e-3, 0);
  // Seven MoE layers: 2 ms a hand-off is ~14 ms a step more than 5 us.
  EXPECT_GT(step_seconds(slow) - step_seconds(quick), 7 * 1.9e-3);
  EXPECT_LT(step_seconds(quick), step_seconds(defaults));  // the defaults: ~40 us a layer
  EXPECT_GT(slow.decode_seconds_transfer, quick.decode_seconds_transfer);
  // A link measured at 4x PCIe 4's default rate streams from smaller chunks; one at a quarter,
  // from larger ones (or never).
  const Prediction fast_link = predict(0, 100e9), slow_link = predict(0, 6e9);
  ASSERT_GT(defaults.stream_experts_min_tokens, 0);
  EXPECT_LT(fast_link.stream_experts_min_tokens, defaults.stream_experts_min_tokens);
  EXPECT_TRUE(slow_link.stream_experts_min_tokens == 0 ||
              slow_link.stream_experts_min_tokens > defaults.stream_experts_min_tokens);
}

TEST(CostModel, each_cut_between_devices_costs_a_transfer) {
  const ModelInventory inv = tiny_inventory();
  const Hardware hw = machine({24, 24}, 64);
  const Workload wl;
  // Layers 0-3 on cuda:0, 4-7 on cuda:1 (one cut) against alternating layers (seven cuts).
  const auto one_cut = [](const InventoryGroup& g) { return g.layer < 4 ? 1 : 2; };
  const auto alternating = [](const InventoryGroup& g) {
    return g.layer < 0 ? 1 : 1 + g.layer % 2;
  };
  const Prediction a = predict_speed(inv, hw, wl, manual(inv, hw, 1, one_cut), nullptr);
  const Prediction b = predict_speed(inv, hw, wl, manual(inv, hw, 1, alternating), nullptr);
  EXPECT_GT(a.decode_tokens_per_s, b.decode_tokens_per_s);
  // Two copies of the hidden state (the cut, and back to cuda:0 for the output head) against
  // eight; both read the logits back to the host. Each copy between GPUs goes over the machine's
  // link (PCIe 4 unless said otherwise): its latency plus 4 KiB at its rate.
  const CostParams params;
  const double copy_s = params.pcie4.latency_s + 1024 * 4 / params.pcie4.bandwidth_bytes_per_s;
  EXPECT_NEAR(b.decode_seconds_transfer - a.decode_seconds_transfer, 6 * copy_s, 1e-12);
  // Over NVLink the same cuts cost less.
  Hardware nvlink = hw;
  nvlink.gpu_link = LinkKind::Nvlink;
  const Prediction c = predict_speed(inv, nvlink, wl, manual(inv, hw, 1, alternating), nullptr);
  EXPECT_LT(c.decode_seconds_transfer, b.decode_seconds_transfer);
  EXPECT_GT(c.decode_tokens_per_s, b.decode_tokens_per_s);
}

// Two machines in a pipeline (layers 0-3 on the first's GPU, 4-7 and the head on the second's):
// serving several sequences, each machine computes another group's step, as the runtime overlaps
// them (rank_spread.h overlapping_stages). A cycle is a group's step through both machines or the
// busier machine's share of both groups' steps, whichever is longer. One sequence, or a plan that
// comes back to the first machine, runs one step at a time.
TEST(CostModel, a_pipeline_over_machines_overlaps_the_steps_of_sequence_groups) {
  const ModelInventory inv = tiny_inventory();
  Hardware hw = machine({24}, 64);
  repeat_nodes(hw, 2);  // cpu (node 0), cuda:0 (node 0), node1:cuda:0 (node 1)
  const auto pipeline = [](const InventoryGroup& g) {
    if (g.kind == WeightGroup::Embedding) return 0;
    if (g.kind == WeightGroup::OutputHead) return 2;
    return g.layer < 4 ? 1 : 2;
  };
  const Placement p = manual(inv, hw, 1, pipeline);
  const Prediction one = predict_speed(inv, hw, {.n_parallel = 1}, p, nullptr);
  EXPECT_EQ(one.overlapping_steps, 1);
  Workload eight{.n_parallel = 8};
  const Prediction overlapped = predict_speed(inv, hw, eight, p, nullptr);
  EXPECT_EQ(overlapped.overlapping_steps, 2);
  // The step of all eight at once, as the times say, is slower than the cycle counted.
  EXPECT_GT(overlapped.decode_tokens_per_s, 8 / step_seconds(overlapped) * 1.05);
  // A residual that comes back to the first machine (layer 7 there) runs one step at a time.
  const auto back = [&](const InventoryGroup& g) { return g.layer == 7 ? 1 : pipeline(g); };
  const Prediction returning = predict_speed(inv, hw, eight, manual(inv, hw, 1, back), nullptr);
  EXPECT_EQ(returning.overlapping_steps, 1);
  EXPECT_NEAR(returning.decode_tokens_per_s, 8 / step_seconds(returning), 1e-9);
}

// Two machines without GPUs: half of every layer's experts in the second machine's RAM are
// computed by its CPU while the first computes the other half (each machine's host is its own
// branch of the layer), so over a fast network the step is shorter than with every expert on the
// first machine, and it pays the network for the experts' inputs and outputs.
TEST(CostModel, the_hosts_of_two_machines_compute_their_experts_at_once) {
  const ModelInventory inv = tiny_inventory();
  Hardware hw = machine({}, 64);
  set_node_link(hw, "ib-ndr");
  repeat_nodes(hw, 2);  // cpu (node 0), node1:cpu (node 1)
  const Workload wl;
  const Prediction first = predict_speed(inv, hw, wl, manual(inv, hw, 0), nullptr);
  const auto half_on_second = [](const InventoryGroup& g) {
    return g.kind == WeightGroup::RoutedExperts && g.expert >= 8 ? 1 : 0;
  };
  const Prediction both = predict_speed(inv, hw, wl, manual(inv, hw, 0, half_on_second), nullptr);
  EXPECT_EQ(first.decode_seconds_transfer, 0);
  EXPECT_GT(both.decode_seconds_transfer, 0);
  EXPECT_LT(step_seconds(both), step_seconds(first));
  EXPECT_GT(both.decode_tokens_per_s, first.decode_tokens_per_s);
}

TEST(CostModel, head_split_divides_the_head_projections_by_weights) {
  // DeepSeek-V3: q_b 1536 x 128 x 192, kv_b 512 x 128 x (128 + 128), output 128 x 128 x 7168
  // divide by head; q_a 7168 x 1536 and kv_a 7168 x (512 + 64) stay whole.
  const ModelInfo hp = inventory_from_preset("deepseek-v3", "Q4_K_M").info;
  const double by_head = 1536.0 * 128 * 192 + 512.0 * 128 * 256 + 128.0 * 128 * 7168;
  const double whole = 7168.0 * 1536 + 7168.0 * 576;
  EXPECT_NEAR(hp.head_split.head_fraction, by_head / (by_head + whole), 1e-12);
  EXPECT_EQ(head_share_bytes(hp, 1000000, int32_t(hp.n_head)),
            uint64_t(hp.head_split.head_fraction * 1000000));
  EXPECT_EQ(head_share_bytes(hp, 1000000, 0), 0u);
}

// The same two-GPU placement with every layer's heads split half and half: each GPU reads half
// of the divided attention weights and the whole latent cache; the owner adds one partial more.
TEST(CostModel, heads_split_over_two_gpus_read_half_the_attention_each) {
  const ModelInventory inv = inventory_from_preset("deepseek-v3", "Q4_K_M");
  Hardware hw = machine({80, 80}, 1024);
  hw.gpu_link = LinkKind::Nvlink;
  const Workload wl;
  Placement whole = manual(inv, hw, 1, [](const InventoryGroup& g) {
    return g.kind == WeightGroup::RoutedExperts ? 1 + g.expert % 2 : 1;
  });
  Placement split = whole;
  split.layer_heads.assign(inv.n_layers, {{.device = 1, .first_head = 0, .n_heads = 64},
                                          {.device = 2, .first_head = 64, .n_heads = 64}});
  const Prediction a = predict_speed(inv, hw, wl, whole, nullptr);
  const Prediction b = predict_speed(inv, hw, wl, split, nullptr);
  EXPECT_GT(b.decode_tokens_per_s, a.decode_tokens_per_s);
  EXPECT_GT(b.decode_seconds_transfer, a.decode_seconds_transfer);  // the partials come back
  // Over PCIe the copies cost more and the split gains less.
  Hardware pcie = hw;
  pcie.gpu_link = LinkKind::Pcie4;
  const double gain_nvlink = b.decode_tokens_per_s / a.decode_tokens_per_s;
  const double gain_pcie = predict_speed(inv, pcie, wl, split, nullptr).decode_tokens_per_s /
                           predict_speed(inv, pcie, wl, whole, nullptr).decode_tokens_per_s;
  EXPECT_LT(gain_pcie, gain_nvlink);
}

TEST(CostModel, disk_streamed_experts_cost_their_bytes_over_disk_bandwidth) {
  const ModelInventory inv = tiny_inventory();
  Hardware hw = machine({}, 64);
  hw.disk_bytes_per_s = 1e9;
  const Workload wl{.n_ctx = 1024, .n_parallel = 1};
  const CostParams params;
  const auto experts_on_disk = [](const InventoryGroup& g) {
    return g.kind == WeightGroup::RoutedExperts ? kOnDisk : 0;
  };
  const Prediction disk =
      predict_speed(inv, hw, wl, manual(inv, hw, 0, experts_on_disk), nullptr, params);
  // Decode of one token reads k = 4 of 16 experts of 8 MiB in each of the 7 MoE layers.
  const double bytes = 7 * 4 * 8.0 * 1024 * 1024;
  EXPECT_NEAR(disk.decode_seconds_disk, bytes / (1e9 * params.disk_efficiency), 1e-9);
  const Prediction ram = predict_speed(inv, hw, wl, manual(inv, hw, 0), nullptr, params);
  EXPECT_LT(disk.decode_tokens_per_s, ram.decode_tokens_per_s);
}

TEST(CostModel, more_bandwidth_never_predicts_slower) {
  const ModelInventory inv = tiny_inventory();
  double last = 0;
  for (double bw : {100e9, 300e9, 1000e9, 3000e9}) {
    const Hardware hw = machine({24}, 64, {bw});
    const double tps =
        predict_speed(inv, hw, Workload{}, manual(inv, hw, 1), nullptr).decode_tokens_per_s;
    EXPECT_GT(tps, last);
    last = tps;
  }
}

TEST(CostModel, a_profile_that_matches_the_gpu_experts_predicts_faster) {
  const ModelInventory inv = tiny_inventory();
  const Hardware hw = machine({24}, 64);
  // Experts 0-3 on the GPU, the rest on the CPU; the profile says 0-3 take 90% of choices.
  const auto where = [](const InventoryGroup& g) {
    return g.kind == WeightGroup::RoutedExperts && g.expert >= 4 ? 0 : 1;
  };
  RoutingProfile profile;
  profile.counts.resize(8);
  for (uint32_t l = 1; l < 8; ++l) {
    profile.counts[l] = std::vector<uint64_t>(16, 1);
    for (int e = 0; e < 4; ++e) profile.counts[l][size_t(e)] = 27;
  }
  const Placement p = manual(inv, hw, 1, where);
  const Workload wl{.n_parallel = 4};
  EXPECT_GT(predict_speed(inv, hw, wl, p, &profile).decode_tokens_per_s,
            predict_speed(inv, hw, wl, p, nullptr).decode_tokens_per_s);
}

}  // namespace
}  // namespace tandem::plan
