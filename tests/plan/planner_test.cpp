// The planner on the machines of issue 5's acceptance list and on a hand-built model: budgets,
// GPU use, shares, monotone predictions, pins, routing profiles.
#include "plan/planner.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "core/error.h"
#include "plan/routing_profile.h"
#include "plan/rules.h"
#include "plan_test_support.h"

namespace tandem::plan {
namespace {

using test::expect_valid;
using test::kGiB;
using test::machine;
using test::tiny_inventory;
using test::used_fraction;

Placement plan(const ModelInventory& inv, const Hardware& hw, const Rules& rules = {},
               const RoutingProfile* profile = nullptr, const Workload& wl = {}) {
  return plan_placement(inv, hw, wl, rules, profile);
}

uint64_t gpu_capacity(const Hardware& hw) {
  uint64_t sum = 0;
  for (const DeviceSpec& g : hw.gpus) sum += g.memory_bytes;
  return sum;
}

// Whenever the model exceeds VRAM, every GPU is at least 90% used.
void expect_gpus_full(const Placement& p) {
  for (size_t d = 1; d < p.devices.size(); ++d)
    EXPECT_GE(test::used_fraction(p, d), 0.90)
        << p.devices[d].spec.name << ": " << p.devices[d].holds;
}

size_t count_on(const Placement& p, int32_t device) {
  return size_t(std::count(p.group_device.begin(), p.group_device.end(), device));
}

TEST(Planner, coder_v2_on_two_48g_gpus_and_192g_ram_fits_and_fills_the_gpus) {
  const ModelInventory inv = inventory_from_preset("deepseek-coder-v2", "Q4_K_M");
  const Hardware hw = machine({48, 48}, 192);
  ASSERT_GT(inv.total_weight_bytes(), gpu_capacity(hw));
  const Placement p = plan(inv, hw);
  expect_valid(p, inv);
  EXPECT_TRUE(p.fits) << (p.problems.empty() ? "" : p.problems[0]);
  expect_gpus_full(p);
  EXPECT_EQ(count_on(p, kOnDisk), 0u);
  // Equal GPUs own about equal numbers of layers (one cut).
  const auto on0 = std::count(p.layer_device.begin(), p.layer_device.end(), 1);
  const auto on1 = std::count(p.layer_device.begin(), p.layer_device.end(), 2);
  EXPECT_NEAR(double(on0), double(on1), 2.0);
  EXPECT_TRUE(std::is_sorted(p.layer_device.begin(), p.layer_device.end()));
}

TEST(Planner, coder_v2_on_two_24g_gpus_and_64g_ram_says_what_does_not_fit_and_what_would) {
  const ModelInventory inv = inventory_from_preset("deepseek-coder-v2", "Q4_K_M");
  const Hardware hw = machine({24, 24}, 64);
  const Placement p = plan(inv, hw);
  expect_valid(p, inv);
  EXPECT_FALSE(p.fits);
  expect_gpus_full(p);
  EXPECT_GT(count_on(p, kOnDisk), 0u);
  ASSERT_GE(p.problems.size(), 3u);
  std::string all;
  for (const std::string& s : p.problems) all += s + "\n";
  EXPECT_NE(all.find("DOES NOT FIT"), std::string::npos) << all;
  EXPECT_NE(all.find("GiB of routed experts"), std::string::npos) << all;
  EXPECT_NE(all.find("from disk"), std::string::npos) << all;
  EXPECT_NE(all.find("tokens/s"), std::string::npos) << all;
  EXPECT_NE(all.find("more RAM"), std::string::npos) << all;
  EXPECT_NE(all.find("Q2_K"), std::string::npos) << all;  // the smaller quant that fits
  // The RAM is used before anything streams from disk.
  EXPECT_GE(used_fraction(p, 0), 0.90);
}

TEST(Planner, v3_on_one_24g_gpu_and_512g_ram) {
  const ModelInventory inv = inventory_from_preset("deepseek-v3", "Q4_K_M");
  const Hardware hw = machine({24}, 512);
  const Placement p = plan(inv, hw);
  expect_valid(p, inv);
  EXPECT_TRUE(p.fits) << (p.problems.empty() ? "" : p.problems[0]);
  expect_gpus_full(p);
  // Every layer's attention side is on the GPU; the experts are mostly in RAM.
  for (int32_t d : p.layer_device) EXPECT_EQ(d, 1);
  EXPECT_GT(p.devices[0].weight_bytes, 10 * p.devices[1].weight_bytes);
}

TEST(Planner, v3_on_four_48g_gpus_and_512g_ram) {
  const ModelInventory inv = inventory_from_preset("deepseek-v3", "Q4_K_M");
  const Hardware hw = machine({48, 48, 48, 48}, 512);
  const Placement p = plan(inv, hw);
  expect_valid(p, inv);
  EXPECT_TRUE(p.fits);
  expect_gpus_full(p);
  EXPECT_TRUE(std::is_sorted(p.layer_device.begin(), p.layer_device.end()));  // 3 cuts
}

TEST(Planner, v3_on_eight_80g_gpus_is_all_on_gpus) {
  const ModelInventory inv = inventory_from_preset("deepseek-v3", "Q4_K_M");
  const Hardware hw = machine(std::vector<double>(8, 80), 512);
  const Placement p = plan(inv, hw);
  expect_valid(p, inv);
  EXPECT_TRUE(p.fits);
  // Everything a step computes is on a GPU; only the embedding table (one row read per token)
  // stays in RAM by design.
  for (size_t i = 0; i < inv.groups.size(); ++i)
    if (inv.groups[i].kind != WeightGroup::Embedding) {
      EXPECT_GE(p.group_device[i], 1) << inv.groups[i].label();
    }
  for (int32_t d : p.layer_device) EXPECT_GE(d, 1);
}

TEST(Planner, mixed_24g_and_48g_gpus_get_shares_in_proportion_to_capacity) {
  const ModelInventory inv = inventory_from_preset("deepseek-coder-v2", "Q4_K_M");
  const Hardware hw = machine({24, 48}, 256, {1008e9, 768e9});
  const Placement p = plan(inv, hw);
  expect_valid(p, inv);
  EXPECT_TRUE(p.fits);
  expect_gpus_full(p);
  // Tolerance: each GPU's share of the bytes on GPUs is within 3 points of its share of VRAM.
  const double used = double(p.devices[1].used_bytes() + p.devices[2].used_bytes());
  EXPECT_NEAR(double(p.devices[1].used_bytes()) / used, 24.0 / 72, 0.03);
  EXPECT_NEAR(double(p.devices[2].used_bytes()) / used, 48.0 / 72, 0.03);
  // The larger card owns more layers.
  EXPECT_GT(std::count(p.layer_device.begin(), p.layer_device.end(), 2),
            std::count(p.layer_device.begin(), p.layer_device.end(), 1));
}

TEST(Planner, more_vram_never_predicts_slower) {
  const ModelInventory inv = inventory_from_preset("deepseek-v3", "Q4_K_M");
  for (int n_gpus : {1, 2, 3}) {
    double last_decode = 0, last_prefill = 0;
    for (double gib = 8; gib <= 400; gib *= 1.15) {
      const Placement p = plan(inv, machine(std::vector<double>(size_t(n_gpus), gib), 512));
      expect_valid(p, inv);
      EXPECT_GE(p.predicted.decode_tokens_per_s, last_decode * (1 - 1e-9))
          << n_gpus << " x " << gib << " GiB";
      EXPECT_GE(p.predicted.prefill_tokens_per_s, last_prefill * (1 - 1e-9))
          << n_gpus << " x " << gib << " GiB";
      last_decode = p.predicted.decode_tokens_per_s;
      last_prefill = p.predicted.prefill_tokens_per_s;
    }
  }
}

TEST(Planner, more_vram_never_predicts_slower_on_the_tiny_model) {
  const ModelInventory inv = tiny_inventory();
  double last = 0;
  for (double gib = 0.2; gib < 3; gib += 0.05) {
    const Placement p = plan(inv, machine({gib}, 16));
    expect_valid(p, inv);
    EXPECT_GE(p.predicted.decode_tokens_per_s, last * (1 - 1e-9)) << gib << " GiB";
    last = p.predicted.decode_tokens_per_s;
  }
}

TEST(Planner, without_gpus_everything_is_in_ram) {
  const ModelInventory inv = tiny_inventory();
  const Placement p = plan(inv, machine({}, 16));
  expect_valid(p, inv);
  EXPECT_TRUE(p.fits);
  EXPECT_EQ(count_on(p, 0), inv.groups.size());
}

// A BF16 cache (--cache-type-k/v bf16) is planned at its own size: half the F32 cache's bytes,
// and decode predicted no slower (the cost model takes the larger of a part's reads and its
// arithmetic: on the CPU, attention this deep is predicted arithmetic-bound either way).
TEST(Planner, a_bf16_kv_cache_reserves_half_the_f32_bytes) {
  const ModelInventory inv = inventory_from_preset("deepseek-coder-v2-lite", "Q4_K_M");
  const Hardware hw = machine({}, 64);
  const Workload f32{.n_ctx = 32768}, bf16{.n_ctx = 32768, .cache_type = DType::BF16};
  const Placement a = plan(inv, hw, {}, nullptr, f32), b = plan(inv, hw, {}, nullptr, bf16);
  ASSERT_TRUE(a.fits && b.fits);
  EXPECT_EQ(inv.kv_layer_bytes(3, 100, DType::BF16) * 2, inv.kv_layer_bytes(3, 100, DType::F32));
  EXPECT_GT(a.devices[0].kv_bytes, 0u);
  EXPECT_EQ(b.devices[0].kv_bytes * 2, a.devices[0].kv_bytes);
  EXPECT_GE(b.predicted.decode_tokens_per_s, a.predicted.decode_tokens_per_s);
}

// The layer split puts a model that fits one GPU on that GPU alone; the planner uses the second
// only for a plan the cost model predicts faster (on the tiny model, expert parallel over both:
// its gather costs about what reading half the experts on each saves).
TEST(Planner, a_model_that_fits_one_gpu_uses_the_other_only_when_predicted_faster) {
  const ModelInventory inv = tiny_inventory();
  const Placement p = plan(inv, machine({24, 24}, 16));
  expect_valid(p, inv);
  ASSERT_GE(p.candidates.size(), 2u);
  EXPECT_EQ(p.candidates[0].name, "layer split");
  EXPECT_EQ(p.candidates[0].idle_gpus, std::vector<std::string>{"cuda:1"});
  if (p.devices[2].used_bytes() == 0) {
    EXPECT_EQ(count_on(p, 1), inv.groups.size() - 1);  // all but the embeddings
  } else {
    EXPECT_GT(p.predicted.decode_tokens_per_s, p.candidates[0].predicted.decode_tokens_per_s);
    EXPECT_EQ(count_on(p, 1) + count_on(p, 2), inv.groups.size() - 1);
  }
}

TEST(Planner, pins_are_honoured_and_the_rest_is_placed_around_them) {
  const ModelInventory inv = tiny_inventory();
  const Hardware hw = machine({1, 1}, 16);
  Rules rules;
  rules.pins.push_back({.pattern = R"(blk\.\d+\.expert\.\d+)",
                        .layers = std::pair{2, 4},
                        .experts = std::pair{0, 3},
                        .device = "cuda:1"});
  rules.pins.push_back({.pattern = "blk\\.7\\.attention", .device = "cpu"});
  rules.pins.push_back({.pattern = "output", .device = "cpu"});
  const Placement p = plan(inv, hw, rules);
  expect_valid(p, inv);
  for (size_t i = 0; i < inv.groups.size(); ++i) {
    const InventoryGroup& g = inv.groups[i];
    if (g.kind == WeightGroup::RoutedExperts && g.layer >= 2 && g.layer <= 4 && g.expert <= 3) {
      EXPECT_EQ(p.group_device[i], 2) << g.label();
    }
    if (g.label() == "blk.7.attention" || g.label() == "output") {
      EXPECT_EQ(p.group_device[i], 0) << g.label();
    }
  }
  EXPECT_EQ(p.layer_device[7], 0);  // the KV cache follows the pinned attention
  EXPECT_GT(p.devices[1].weight_bytes, 0u);
}

TEST(Planner, impossible_pins_are_rejected_naming_the_shortfall_in_gib) {
  const ModelInventory inv = inventory_from_preset("deepseek-v3", "Q4_K_M");
  const Hardware hw = machine({24}, 512);
  Rules rules;
  rules.pins.push_back({.pattern = ".*expert.*", .layers = std::pair{3, 10}, .device = "cuda:0"});
  try {
    plan(inv, hw, rules);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("cuda:0"), std::string::npos) << message;
    EXPECT_NE(message.find("GiB short"), std::string::npos) << message;
  }
  rules.pins = {{.pattern = "output", .device = "cuda:3"}};
  EXPECT_THROW(
      {
        try {
          plan(inv, hw, rules);
        } catch (const Error& e) {
          EXPECT_NE(std::string(e.what()).find("cuda:3, which this machine does not have"),
                    std::string::npos)
              << e.what();
          throw;
        }
      },
      Error);
  // A format the CUDA backend does not multiply cannot be pinned to a GPU.
  ModelInventory ternary = inventory_from_preset("deepseek-v3", "Q4_K_M");
  for (InventoryGroup& g : ternary.groups)
    if (g.kind == WeightGroup::RoutedExperts) g.not_on_cuda = DType::TQ1_0;
  rules.pins = {{.pattern = "blk\\.5\\.expert\\.7", .device = "cuda:0"}};
  try {
    plan(ternary, hw, rules);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cannot multiply TQ1_0 yet; pin it to cpu"), std::string::npos)
        << e.what();
  }
  rules.pins = {{.pattern = "blk\\.1\\.atention", .device = "cpu"}};
  EXPECT_THROW(plan(inv, hw, rules), Error);  // a typo matches nothing: said, not ignored
  rules.pins = {{.pattern = "blk\\.1\\.attention", .device = "disk"}};
  EXPECT_THROW(plan(inv, hw, rules), Error);  // only experts and embeddings stream from disk
}

TEST(Planner, rules_written_from_a_plan_load_back_to_the_same_plan) {
  const ModelInventory inv = inventory_from_preset("deepseek-coder-v2", "Q4_K_M");
  for (const Hardware& hw : {machine({48, 48}, 192), machine({24, 24}, 64), machine({24}, 256)}) {
    const Placement p = plan(inv, hw);
    const std::string yaml = rules_to_yaml(p, inv);
    const Rules rules = parse_rules(yaml, "<plan>");
    EXPECT_LT(rules.pins.size(), 40u) << yaml;  // compact: ranges merged
    const Placement q = plan(inv, hw, rules);
    expect_valid(q, inv);
    EXPECT_EQ(q.group_device, p.group_device) << yaml;
    EXPECT_EQ(q.layer_device, p.layer_device);
    EXPECT_EQ(q.fits, p.fits);
  }
}

RoutingProfile skewed_profile(const ModelInventory& inv, uint64_t seed) {
  RoutingProfile profile;
  profile.model = inv.name;
  profile.counts.resize(inv.n_layers);
  for (uint32_t l = 0; l < inv.n_layers; ++l) {
    if (!inv.info.is_moe_layer(l)) continue;
    for (uint32_t e = 0; e < inv.info.n_expert; ++e) {
      seed = seed * 6364136223846793005ull + 1442695040888963407ull;
      profile.counts[l].push_back((seed >> 33) % 1000 * ((seed >> 20) % 7 == 0 ? 50 : 1));
    }
  }
  return profile;
}

TEST(Planner, with_a_profile_the_most_used_experts_go_to_the_gpus) {
  const ModelInventory inv = inventory_from_preset("deepseek-v3", "Q4_K_M");
  const Hardware hw = machine({24}, 512);
  const RoutingProfile profile = skewed_profile(inv, 7);
  const Placement p = plan(inv, hw, {}, &profile);
  expect_valid(p, inv);
  expect_gpus_full(p);
  double least_on_gpu = 1e9, most_on_cpu = 0;
  for (size_t i = 0; i < inv.groups.size(); ++i) {
    const InventoryGroup& g = inv.groups[i];
    if (g.kind != WeightGroup::RoutedExperts) continue;
    const double p_e =
        expert_choice_probabilities(inv, &profile, uint32_t(g.layer))[size_t(g.expert)];
    if (p.group_device[i] == 1)
      least_on_gpu = std::min(least_on_gpu, p_e);
    else
      most_on_cpu = std::max(most_on_cpu, p_e);
  }
  EXPECT_GE(least_on_gpu, most_on_cpu);
  // Knowing the routing makes the same machine faster than the uniform assumption.
  const Placement uniform = plan(inv, hw);
  EXPECT_GT(p.predicted.decode_tokens_per_s,
            predict_speed(inv, hw, Workload{}, uniform, &profile).decode_tokens_per_s);
  // And the plan round-trips through a rule file even with scattered experts.
  const Placement q = plan(inv, hw, parse_rules(rules_to_yaml(p, inv), "<plan>"), &profile);
  EXPECT_EQ(q.group_device, p.group_device);
}

TEST(RoutingProfile, round_trips_through_json) {
  const ModelInventory inv = tiny_inventory();
  const RoutingProfile profile = skewed_profile(inv, 3);
  const RoutingProfile back = parse_routing_profile(routing_profile_to_json(profile), "<text>");
  EXPECT_EQ(back.model, profile.model);
  EXPECT_EQ(back.counts, profile.counts);
  check_routing_profile(back, inv);
}

TEST(RoutingProfile, errors_name_the_source_and_the_mismatch) {
  const ModelInventory inv = tiny_inventory();
  auto message = [](auto&& f) {
    try {
      f();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message([] { parse_routing_profile("{", "p.json"); }).find("p.json: not valid JSON"),
            std::string::npos);
  EXPECT_NE(message([] {
              parse_routing_profile(R"({"format":"x","layers":[]})", "p.json");
            }).find("tandem_routing_profile/1"),
            std::string::npos);
  EXPECT_NE(message([] {
              parse_routing_profile(
                  R"({"format":"tandem_routing_profile/1","layers":[{"layer":1,"counts":[1,-2]}]})",
                  "p.json");
            }).find("non-negative"),
            std::string::npos);
  RoutingProfile wrong;
  wrong.model = "other";
  wrong.counts.resize(2);
  wrong.counts[1] = std::vector<uint64_t>(64, 1);
  const std::string m = message([&] { check_routing_profile(wrong, inv); });
  EXPECT_NE(m.find("64 experts"), std::string::npos) << m;
  EXPECT_NE(m.find("16 routed experts"), std::string::npos) << m;
  EXPECT_THROW(plan(inv, machine({24}, 16), {}, &wrong), Error);
}

}  // namespace
}  // namespace tandem::plan
