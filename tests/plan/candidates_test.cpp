// The planner's candidates (issue 17): it weighs the layer split against expert-parallel and
// hybrid placements and keeps the one the cost model predicts fastest, within every budget.
// Values are predictions; these tests pin their direction and the acceptance figures.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "plan/hardware.h"
#include "plan/planner.h"
#include "plan_test_support.h"

namespace tandem::plan {
namespace {

using test::expect_valid;
using test::kGiB;
using test::machine;
using test::with_reserve;

Placement plan(const ModelInventory& inv, const Hardware& hw, const Rules& rules = {},
               const Workload& wl = {}) {
  return plan_placement(inv, hw, wl, rules, nullptr);
}

// Eight A100 80GB (the datasheet's 2039 GB/s) and a host with `ram_gib` of RAM.
Hardware a100s(size_t n, LinkKind link, double ram_gib = 1024) {
  Hardware hw = machine({}, ram_gib);
  for (size_t i = 0; i < n; ++i) hw.gpus.push_back(parse_gpu("a100-80g", int32_t(i)));
  return with_reserve(hw, link);
}

const Candidate& layer_split(const Placement& p) {
  EXPECT_FALSE(p.candidates.empty());
  EXPECT_EQ(p.candidates.front().name, "layer split");
  return p.candidates.front();
}

const Candidate& chosen(const Placement& p) {
  const auto it = std::find_if(p.candidates.begin(), p.candidates.end(),
                               [](const Candidate& c) { return c.chosen; });
  EXPECT_NE(it, p.candidates.end());
  return *it;
}

// Which GPUs hold routed experts of every MoE layer.
std::vector<int32_t> gpus_in_every_moe_layer(const Placement& p, const ModelInventory& inv) {
  std::vector<int32_t> every;
  for (int32_t d = 1; d < int32_t(p.devices.size()); ++d) {
    bool all = true;
    for (uint32_t l = 0; l < inv.n_layers && all; ++l) {
      if (!inv.info.is_moe_layer(l)) continue;
      bool here = false;
      for (size_t i = 0; i < inv.groups.size() && !here; ++i)
        here = inv.groups[i].kind == WeightGroup::RoutedExperts &&
               inv.groups[i].layer == int32_t(l) && p.group_device[i] == d;
      all = here;
    }
    if (all) every.push_back(d);
  }
  return every;
}

std::string joined(const std::vector<std::string>& lines) {
  std::string all;
  for (const std::string& s : lines) all += s + "\n";
  return all;
}

// Issue 17's first acceptance item. Assumed: Q4_K_M DeepSeek-V3, 8 x A100 80GB SXM at their
// datasheet bandwidth, NVLink 3 between them (230 GB/s and 2.5 us a copy, CostParams::nvlink),
// context 4096 x 1 stream, the cost model's CUDA op overheads (8 us a coarse op, 3 us a small
// one, 5 us a graph launch). The layer split predicts 50.7 tokens/s, as before the candidates;
// expert parallel over all 8 ~70 (+38%); with each layer's heads split over the same GPUs too
// ~88 (+73%); ~91 (+79%) with copies of 2/3 of the experts on a second GPU in the VRAM left
// (the busiest GPU of a MoE layer gets ~2.1 experts a step instead of ~2.8, for one more small
// op a GPU). Not the issue's 2x (>= 101): 61 layers x 10 coarse ops at 8 us are 4.9 ms of the
// ~11 ms step whatever the split, two of them (norm, routing) before any other GPU can start a
// MoE layer's experts. Gathers cost one latency and one add whatever the number of peers (the
// peers send at once, add_parts adds), so every GPU more reads fewer bytes for almost nothing
// and the plan uses all eight.
TEST(Candidates, v3_on_eight_a100s_with_nvlink_spreads_the_experts_and_beats_the_layer_split) {
  const ModelInventory inv = inventory_from_preset("deepseek-v3", "Q4_K_M");
  const Placement p = plan(inv, a100s(8, LinkKind::Nvlink));
  expect_valid(p, inv);
  EXPECT_TRUE(p.fits);
  EXPECT_NEAR(layer_split(p).predicted.decode_tokens_per_s, 50.7, 0.3);
  EXPECT_EQ(layer_split(p).idle_gpus.size(), 3u);  // layers 0-60 on cuda:0-4
  EXPECT_EQ(chosen(p).name, "expert parallel + heads split + hot experts copied over 8 GPUs");
  EXPECT_GE(p.predicted.decode_tokens_per_s, 1.75 * layer_split(p).predicted.decode_tokens_per_s);
  // The copies: most of the experts have one, the plan says so, and the same plan without them
  // predicts less.
  size_t copied = 0;
  for (const std::vector<int32_t>& copies : p.group_copies) copied += copies.size();
  EXPECT_GT(copied, 9000u);
  const auto no_copies =
      std::find_if(p.candidates.begin(), p.candidates.end(), [](const Candidate& c) {
        return c.name == "expert parallel + heads split over 8 GPUs";
      });
  ASSERT_NE(no_copies, p.candidates.end());
  EXPECT_LT(no_copies->predicted.decode_tokens_per_s, p.predicted.decode_tokens_per_s);
  EXPECT_NE(joined(p.reasons).find("have a copy on a second GPU"), std::string::npos);
  // Every layer's heads are split over the GPUs that hold experts, in whole blocks of
  // attn_output's columns (256 values), with the layer's device first.
  ASSERT_EQ(p.layer_heads.size(), inv.n_layers);
  for (uint32_t l = 0; l < inv.n_layers; ++l) {
    ASSERT_EQ(p.layer_heads[l].size(), 8u) << l;
    for (const HeadShare& share : p.layer_heads[l])
      EXPECT_EQ(share.n_heads * int64_t(inv.info.head_split.v_head_dim) % 256, 0) << l;
  }
  // The same split of experts without the heads split predicts less.
  const std::string split_name = "expert parallel + heads split";
  const std::string without = "expert parallel" + chosen(p).name.substr(split_name.size());
  const auto plain = std::find_if(p.candidates.begin(), p.candidates.end(),
                                  [&](const Candidate& c) { return c.name == without; });
  ASSERT_NE(plain, p.candidates.end()) << without;
  EXPECT_LT(plain->predicted.decode_tokens_per_s, p.predicted.decode_tokens_per_s);
  // All eight GPUs hold a share of every MoE layer.
  const std::vector<int32_t> spread = gpus_in_every_moe_layer(p, inv);
  EXPECT_EQ(spread.size(), 8u);
  for (int32_t d = 1; d <= 8; ++d) {
    const bool holds = p.devices[size_t(d)].weight_bytes > 0;
    EXPECT_EQ(holds, std::find(spread.begin(), spread.end(), d) != spread.end()) << d;
  }
  // The candidate over all eight was weighed too: experts of every MoE layer on all 8 GPUs,
  // predicted well above the layer split.
  const auto all8 = std::find_if(p.candidates.begin(), p.candidates.end(), [](const Candidate& c) {
    return c.name == "expert parallel over 8 GPUs";
  });
  ASSERT_NE(all8, p.candidates.end());
  EXPECT_TRUE(all8->idle_gpus.empty());
  EXPECT_GE(all8->predicted.decode_tokens_per_s,
            1.2 * layer_split(p).predicted.decode_tokens_per_s);
  // The idle GPUs are explained with the candidate that would use them.
  const std::string why = joined(p.explanation);
  for (int32_t d = 1; d <= 8; ++d)
    if (p.devices[size_t(d)].used_bytes() == 0) {
      EXPECT_NE(why.find(p.devices[size_t(d)].spec.name + " stays idle"), std::string::npos) << why;
    }
}

// The copies' effect in the cost model: the same placement without them predicts a slower
// decode (the busiest GPU of each MoE layer gets fewer experts) and the same prompt speed (a
// prompt chunk chooses nearly every expert and reads each at home, as the executor does); the
// sampled routings make the same prediction every time.
TEST(Candidates, copies_of_experts_shorten_decode_and_leave_prompts_alone) {
  const ModelInventory inv = inventory_from_preset("deepseek-v3", "Q4_K_M");
  const Hardware hw = a100s(8, LinkKind::Nvlink);
  const Placement with = plan(inv, hw);
  ASSERT_FALSE(with.group_copies.empty());
  Placement without = with;
  without.group_copies.clear();
  const Prediction a = predict_speed(inv, hw, Workload{}, with, nullptr);
  const Prediction b = predict_speed(inv, hw, Workload{}, without, nullptr);
  EXPECT_GT(a.decode_tokens_per_s, 1.02 * b.decode_tokens_per_s);
  EXPECT_EQ(a.prefill_tokens_per_s, b.prefill_tokens_per_s);
  EXPECT_EQ(predict_speed(inv, hw, Workload{}, with, nullptr).decode_tokens_per_s,
            a.decode_tokens_per_s);
  // Sixteen streams choose ~100 of a layer's 256 experts a step: the copies still spread them.
  const Workload many{.n_parallel = 16};
  EXPECT_GT(predict_speed(inv, hw, many, with, nullptr).decode_tokens_per_s,
            predict_speed(inv, hw, many, without, nullptr).decode_tokens_per_s);
}

// Issue 16's planner item: the 1.58-bit-class V3 file fits one 24 GiB GPU and 192 GiB of RAM
// (with the RAM reserve kept free) and the plan says what it predicts. The GPU reads its IQ1_S
// and IQ2_XXS experts (quant/block_decode.h), so it holds some beside the hot path.
TEST(Candidates, v3_in_the_ud_iq1_s_mix_fits_one_24_gib_gpu_and_192_gib_of_ram) {
  const ModelInventory inv = inventory_from_preset("deepseek-v3", "UD-IQ1_S");
  const Placement p = plan(inv, with_reserve(machine({24}, 192), LinkKind::Pcie4));
  expect_valid(p, inv);
  EXPECT_TRUE(p.fits) << joined(p.problems);
  EXPECT_GT(p.predicted.decode_tokens_per_s, 0);
  size_t experts_on_gpu = 0;
  for (size_t g = 0; g < inv.groups.size(); ++g) {
    EXPECT_FALSE(inv.groups[g].not_on_cuda.has_value()) << inv.groups[g].label();
    experts_on_gpu += inv.groups[g].kind == WeightGroup::RoutedExperts && p.group_device[g] == 1;
  }
  EXPECT_GT(experts_on_gpu, 0u);
}

// Every format tandem reads has GPU kernels today; a group in one without them (as when a new
// format's CPU kernels land first) stays in RAM, and the plan says why; simulated GPUs run the
// CPU's kernels and take it.
TEST(Candidates, weights_the_gpu_cannot_multiply_stay_in_ram_and_the_plan_says_why) {
  ModelInventory inv = inventory_from_preset("deepseek-v2-lite", "Q4_K_M");
  for (InventoryGroup& g : inv.groups) {
    EXPECT_FALSE(g.not_on_cuda.has_value()) << g.label();
    if (g.kind == WeightGroup::RoutedExperts && g.layer % 2 == 1) g.not_on_cuda = DType::TQ1_0;
  }
  const Hardware hw = with_reserve(machine({24}, 64), LinkKind::Pcie4);
  const Placement p = plan(inv, hw);
  expect_valid(p, inv);
  EXPECT_TRUE(p.fits) << joined(p.problems);
  for (size_t g = 0; g < inv.groups.size(); ++g) {
    if (inv.groups[g].not_on_cuda) {
      EXPECT_EQ(p.group_device[g], 0) << inv.groups[g].label();
    } else if (inv.groups[g].kind == WeightGroup::RoutedExperts) {
      EXPECT_EQ(p.group_device[g], 1) << inv.groups[g].label();  // the rest fits the GPU
    }
  }
  EXPECT_NE(joined(p.reasons).find("TQ1_0 weights, which the CUDA backend does not multiply yet"),
            std::string::npos)
      << joined(p.reasons);
  Hardware sim = hw;
  sim.gpus[0].kind = DeviceKind::Sim;
  EXPECT_GT(plan(inv, sim).devices[1].weight_bytes, p.devices[1].weight_bytes);
}

TEST(Candidates, over_pcie_the_same_machine_predicts_less_and_says_why) {
  const ModelInventory inv = inventory_from_preset("deepseek-v3", "Q4_K_M");
  const Placement nvlink = plan(inv, a100s(8, LinkKind::Nvlink));
  for (LinkKind link : {LinkKind::Pcie4, LinkKind::Pcie5}) {
    const Placement pcie = plan(inv, a100s(8, link));
    expect_valid(pcie, inv);
    EXPECT_LT(pcie.predicted.decode_tokens_per_s, nvlink.predicted.decode_tokens_per_s);
    EXPECT_GE(pcie.predicted.decode_tokens_per_s, layer_split(pcie).predicted.decode_tokens_per_s);
    // Each candidate that spreads experts predicts less over PCIe than over NVLink.
    for (const Candidate& c : pcie.candidates)
      for (const Candidate& n : nvlink.candidates)
        if (c.name == n.name && c.name != "layer split") {
          EXPECT_LT(c.predicted.decode_tokens_per_s, n.predicted.decode_tokens_per_s) << c.name;
        }
    const std::string why = joined(pcie.explanation);
    EXPECT_NE(why.find(std::string("over ") + link_name(link)), std::string::npos) << why;
    EXPECT_NE(why.find("over NVLink, which would predict"), std::string::npos) << why;
  }
  // PCIe 5 is between the two.
  EXPECT_GE(plan(inv, a100s(8, LinkKind::Pcie5)).predicted.decode_tokens_per_s,
            plan(inv, a100s(8, LinkKind::Pcie4)).predicted.decode_tokens_per_s);
}

// The seed machines of the bar-style checks: the chosen plan is never predicted slower than the
// layer split, fits every budget, and keeps the RAM reserve free.
TEST(Candidates, seed_machines_never_predict_slower_than_the_layer_split_and_keep_the_reserve) {
  struct Seed {
    const char* model;
    std::vector<double> gpu_gib;
    double ram_gib;
    std::vector<double> bandwidth;
    bool fits;
  };
  const std::vector<Seed> seeds = {
      {"deepseek-coder-v2", {48, 48}, 192, {}, true},
      {"deepseek-coder-v2", {24, 24}, 64, {}, false},
      {"deepseek-v3", {24}, 512, {}, true},
      {"deepseek-v3", {48, 48, 48, 48}, 512, {}, true},
      {"deepseek-v3", std::vector<double>(8, 80), 512, {}, true},
      {"deepseek-coder-v2", {24, 48}, 256, {1008e9, 768e9}, true},
  };
  for (const Seed& seed : seeds) {
    const ModelInventory inv = inventory_from_preset(seed.model, "Q4_K_M");
    for (LinkKind link : {LinkKind::Pcie4, LinkKind::Nvlink}) {
      const Hardware hw = with_reserve(machine(seed.gpu_gib, seed.ram_gib, seed.bandwidth), link);
      const Placement p = plan(inv, hw);
      const std::string what =
          fmt::format("{} on {} GPUs, {} GiB RAM, {}: chose {}", seed.model, seed.gpu_gib.size(),
                      seed.ram_gib, link_name(link), chosen(p).name);
      expect_valid(p, inv);
      EXPECT_EQ(p.fits, seed.fits) << what;
      EXPECT_GE(p.predicted.decode_tokens_per_s, layer_split(p).predicted.decode_tokens_per_s)
          << what;
      for (const Candidate& c : p.candidates)  // the chosen one is the fastest weighed
        if (c.fits || !seed.fits) {
          EXPECT_LE(c.predicted.decode_tokens_per_s, p.predicted.decode_tokens_per_s * (1 + 1e-9))
              << what << " / " << c.name;
        }
      // RAM: what the plan uses leaves the reserve free.
      EXPECT_GT(hw.ram_reserve_bytes, 0u);
      EXPECT_LE(p.devices[0].used_bytes() + hw.ram_reserve_bytes, hw.ram_bytes) << what;
      EXPECT_NE(joined(p.reasons).find("kept free for the system"), std::string::npos);
      std::printf("%s: decode %.2f tokens/s (layer split %.2f), prefill %.1f (%.1f)\n",
                  what.c_str(), p.predicted.decode_tokens_per_s,
                  layer_split(p).predicted.decode_tokens_per_s, p.predicted.prefill_tokens_per_s,
                  layer_split(p).predicted.prefill_tokens_per_s);
    }
  }
}

// Issue 17's figure: a 64 GiB machine planned 63.99 GiB of RAM; now 10% stays free.
TEST(Candidates, a_64_gib_machine_keeps_6_gib_of_ram_free) {
  const ModelInventory inv = inventory_from_preset("deepseek-coder-v2", "Q4_K_M");
  const Hardware hw = with_reserve(machine({24, 24}, 64));
  const Placement p = plan(inv, hw);
  EXPECT_EQ(hw.host.memory_bytes, 64 * kGiB - 64 * kGiB / 10);
  EXPECT_LE(p.devices[0].used_bytes(), hw.host.memory_bytes);
  EXPECT_GE(test::used_fraction(p, 0), 0.90);  // what is left is still used before the disk
}

TEST(Candidates, adding_a_gpu_never_predicts_slower) {
  for (const char* model : {"deepseek-coder-v2", "deepseek-v3"}) {
    const ModelInventory inv = inventory_from_preset(model, "Q4_K_M");
    for (double gib : {24.0, 48.0, 80.0})
      for (LinkKind link : {LinkKind::Pcie4, LinkKind::Nvlink}) {
        double last = 0;
        for (size_t n = 0; n <= 8; ++n) {
          const Placement p =
              plan(inv, with_reserve(machine(std::vector<double>(n, gib), 512), link));
          expect_valid(p, inv);
          EXPECT_GE(p.predicted.decode_tokens_per_s, last * (1 - 1e-9))
              << model << ", " << n << " x " << gib << " GiB, " << link_name(link);
          last = p.predicted.decode_tokens_per_s;
        }
      }
  }
}

TEST(Candidates, adding_ram_never_predicts_slower) {
  const ModelInventory inv = inventory_from_preset("deepseek-coder-v2", "Q4_K_M");
  for (const std::vector<double>& gpus : {std::vector<double>{24, 24}, std::vector<double>{48}}) {
    double last = 0;
    for (double ram = 32; ram <= 512; ram *= 1.25) {
      const Placement p = plan(inv, with_reserve(machine(gpus, ram)));
      expect_valid(p, inv);
      EXPECT_GE(p.predicted.decode_tokens_per_s, last * (1 - 1e-9)) << ram << " GiB";
      last = p.predicted.decode_tokens_per_s;
    }
  }
}

TEST(Candidates, the_same_inputs_give_the_same_placement) {
  const ModelInventory inv = inventory_from_preset("deepseek-v3", "Q4_K_M");
  for (const Hardware& hw : {a100s(8, LinkKind::Nvlink), with_reserve(machine({48, 48, 48}, 256)),
                             with_reserve(machine({24, 48}, 512, {1008e9, 768e9}))}) {
    const Placement a = plan(inv, hw), b = plan(inv, hw);
    EXPECT_EQ(a.group_device, b.group_device);
    EXPECT_EQ(a.layer_device, b.layer_device);
    EXPECT_EQ(a.predicted.decode_tokens_per_s, b.predicted.decode_tokens_per_s);
    ASSERT_EQ(a.candidates.size(), b.candidates.size());
    for (size_t i = 0; i < a.candidates.size(); ++i) {
      EXPECT_EQ(a.candidates[i].name, b.candidates[i].name);
      EXPECT_EQ(a.candidates[i].chosen, b.candidates[i].chosen);
    }
  }
}

// Pins hold in every candidate: the experts and attention a rule puts somewhere stay there, and
// the rest is built around them.
TEST(Candidates, pins_are_honoured_by_every_candidate) {
  const ModelInventory inv = inventory_from_preset("deepseek-v3", "Q4_K_M");
  Rules rules;
  rules.pins.push_back({.pattern = R"(blk\.\d+\.expert\.\d+)",
                        .layers = std::pair{10, 20},
                        .experts = std::pair{0, 63},
                        .device = "cuda:7"});
  rules.pins.push_back({.pattern = R"(blk\.30\.attention)", .device = "cuda:2"});
  rules.pins.push_back({.pattern = R"(blk\.40\.expert\.\d+)", .device = "cpu"});
  for (LinkKind link : {LinkKind::Nvlink, LinkKind::Pcie4}) {
    const Placement p = plan(inv, a100s(8, link), rules);
    expect_valid(p, inv);
    for (size_t i = 0; i < inv.groups.size(); ++i) {
      const InventoryGroup& g = inv.groups[i];
      const bool expert = g.kind == WeightGroup::RoutedExperts;
      if (expert && g.layer >= 10 && g.layer <= 20 && g.expert < 64) {
        EXPECT_EQ(p.group_device[i], 8) << g.label();
      }
      if (expert && g.layer == 40) {
        EXPECT_EQ(p.group_device[i], 0) << g.label();
      }
      if (g.label() == "blk.30.attention") {
        EXPECT_EQ(p.group_device[i], 3);
      }
    }
    EXPECT_EQ(p.layer_device[30], 3);
    EXPECT_GE(p.predicted.decode_tokens_per_s, layer_split(p).predicted.decode_tokens_per_s);
  }
}

// Many streams: the planner keeps the plan with the most tokens/s over all of them.
TEST(Candidates, many_streams_choose_by_aggregate_throughput) {
  const ModelInventory inv = inventory_from_preset("deepseek-v3", "Q4_K_M");
  const Placement p =
      plan(inv, a100s(8, LinkKind::Nvlink), {}, Workload{.n_ctx = 4096, .n_parallel = 16});
  expect_valid(p, inv);
  for (const Candidate& c : p.candidates)
    EXPECT_LE(c.predicted.decode_tokens_per_s, p.predicted.decode_tokens_per_s * (1 + 1e-9));
  EXPECT_NE(joined(p.explanation).find("16 streams"), std::string::npos);
}

// Hybrid machines weigh how many whole expert layers stay on the GPUs; each candidate fills the
// GPUs and keeps the rest in RAM.
TEST(Candidates, hybrid_candidates_fill_the_gpus_and_differ_in_whole_layers) {
  const ModelInventory inv = inventory_from_preset("deepseek-v3", "Q4_K_M");
  const Placement p = plan(inv, with_reserve(machine({48, 48, 48, 48}, 512)));
  expect_valid(p, inv);
  size_t hybrids = 0;
  for (const Candidate& c : p.candidates) {
    hybrids += c.name.starts_with("hybrid");
    EXPECT_TRUE(c.fits) << c.name;
    EXPECT_TRUE(c.idle_gpus.empty()) << c.name;
  }
  EXPECT_GE(hybrids, 4u);
  for (size_t d = 1; d < p.devices.size(); ++d) EXPECT_GE(test::used_fraction(p, d), 0.90);
}

}  // namespace
}  // namespace tandem::plan
