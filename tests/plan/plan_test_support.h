#pragma once
// Machines and a small model built by hand, so that planner and cost-model tests depend on no
// preset, no file and no device.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "plan/cost_model.h"
#include "plan/hardware.h"
#include "plan/placement.h"

namespace tandem::plan::test {

inline constexpr uint64_t kMiB = 1024ull * 1024;
inline constexpr uint64_t kGiB = 1024ull * kMiB;

inline DeviceSpec gpu(int index, double gib, double bandwidth_bytes_per_s = 1000e9) {
  return {.name = "cuda:" + std::to_string(index),
          .kind = DeviceKind::Cuda,
          .model = "test GPU",
          .memory_bytes = uint64_t(gib * double(kGiB)),
          .bandwidth_bytes_per_s = bandwidth_bytes_per_s,
          .flops_per_s = 150e12,
          .bandwidth_source = "given"};
}

// A host with `ram_gib` of RAM, 200 GB/s and 2 TFLOPS (a two-socket server), and the GPUs.
inline Hardware machine(const std::vector<double>& gpu_gib, double ram_gib,
                        const std::vector<double>& gpu_bandwidth = {}) {
  Hardware hw;
  hw.host = {.name = "cpu",
             .kind = DeviceKind::Cpu,
             .model = "test CPU",
             .memory_bytes = uint64_t(ram_gib * double(kGiB)),
             .bandwidth_bytes_per_s = 200e9,
             .flops_per_s = 2e12,
             .bandwidth_source = "given"};
  hw.cpu_cores = 32;
  for (size_t i = 0; i < gpu_gib.size(); ++i)
    hw.gpus.push_back(
        gpu(int(i), gpu_gib[i], i < gpu_bandwidth.size() ? gpu_bandwidth[i] : 1000e9));
  return hw;
}

// The same machine with its RAM reserve as `tandem plan` keeps it (hardware.h), and a link.
inline Hardware with_reserve(Hardware hw, LinkKind link = LinkKind::Pcie4) {
  hw.ram_bytes = hw.host.memory_bytes;
  set_ram_reserve(hw, default_ram_reserve(hw.ram_bytes), "default");
  hw.gpu_link = link;
  hw.link_source = "given";
  return hw;
}

// 8 layers (1 dense, 7 MoE with 16 experts of 8 MiB, top-4): 32 MiB attention per layer,
// 64 MiB embeddings and output head. ~1.3 GiB in all.
inline ModelInventory tiny_inventory() {
  ModelInventory inv;
  inv.name = "tiny";
  inv.quant_mix = "Q4_K_M";
  Deepseek2Hparams hp;
  hp.n_layer = 8;
  hp.n_embd = 1024;
  hp.n_ff_dense = 2048;
  hp.n_head = 8;
  hp.n_vocab = 32000;
  hp.kv_lora_rank = 256;
  hp.qk_nope_dim = 64;
  hp.qk_rope_dim = 32;
  hp.v_head_dim = 64;
  hp.n_leading_dense = 1;
  hp.n_expert = 16;
  hp.n_expert_used = 4;
  hp.n_expert_shared = 1;
  hp.n_ff_expert = 512;
  inv.info = deepseek2_model_info(hp);
  inv.n_layers = 8;
  inv.groups.push_back({.kind = WeightGroup::Embedding, .bytes = 64 * kMiB});
  for (int32_t l = 0; l < 8; ++l) {
    inv.groups.push_back({.kind = WeightGroup::Attention, .layer = l, .bytes = 32 * kMiB});
    if (l == 0) {
      inv.groups.push_back({.kind = WeightGroup::DenseFfn, .layer = l, .bytes = 48 * kMiB});
      continue;
    }
    inv.groups.push_back({.kind = WeightGroup::Router, .layer = l, .bytes = 1 * kMiB});
    inv.groups.push_back({.kind = WeightGroup::SharedExperts, .layer = l, .bytes = 8 * kMiB});
    for (int32_t e = 0; e < 16; ++e)
      inv.groups.push_back(
          {.kind = WeightGroup::RoutedExperts, .layer = l, .expert = e, .bytes = 8 * kMiB});
  }
  inv.groups.push_back({.kind = WeightGroup::OutputHead, .bytes = 64 * kMiB});
  return inv;
}

// The invariants of every plan: each group placed somewhere valid, each device's accounting
// adds up, and no device holds more than its memory.
inline void expect_valid(const Placement& p, const ModelInventory& inv) {
  ASSERT_EQ(p.group_device.size(), inv.groups.size());
  ASSERT_EQ(p.layer_device.size(), inv.n_layers);
  std::vector<uint64_t> weights(p.devices.size(), 0);
  for (size_t i = 0; i < inv.groups.size(); ++i) {
    const int32_t d = p.group_device[i];
    ASSERT_TRUE(d == kOnDisk || (d >= 0 && size_t(d) < p.devices.size())) << inv.groups[i].label();
    if (d >= 0) weights[size_t(d)] += inv.groups[i].bytes;
    // A head-split layer's attention: each other share's part counts on its device.
    const InventoryGroup& g = inv.groups[i];
    if (g.kind == WeightGroup::Attention && g.layer >= 0 && size_t(g.layer) < p.layer_heads.size())
      for (size_t s = 1; s < p.layer_heads[size_t(g.layer)].size(); ++s) {
        const HeadShare& share = p.layer_heads[size_t(g.layer)][s];
        const uint64_t moved = head_share_bytes(inv.info, g.bytes, share.n_heads);
        weights[size_t(d)] -= moved;
        weights[size_t(share.device)] += moved;
      }
    // Copies: of routed experts held on a GPU, on other GPUs of its kind, each once; they count
    // there too.
    if (i < p.group_copies.size())
      for (size_t c = 0; c < p.group_copies[i].size(); ++c) {
        const int32_t at = p.group_copies[i][c];
        ASSERT_TRUE(at > 0 && size_t(at) < p.devices.size()) << g.label();
        EXPECT_EQ(g.kind, WeightGroup::RoutedExperts) << g.label();
        ASSERT_GT(d, 0) << g.label();  // GPUs (or simulated ones) of one kind: the same bits
        EXPECT_EQ(p.devices[size_t(at)].spec.kind, p.devices[size_t(d)].spec.kind) << g.label();
        EXPECT_NE(at, d) << g.label();
        for (size_t o = 0; o < c; ++o) EXPECT_NE(at, p.group_copies[i][o]) << g.label();
        weights[size_t(at)] += g.bytes;
      }
  }
  // Head shares cover every head in order, the first on the layer's device.
  for (size_t l = 0; l < p.layer_heads.size(); ++l) {
    int32_t next = 0;
    for (const HeadShare& share : p.layer_heads[l]) {
      EXPECT_EQ(share.first_head, next) << "layer " << l;
      EXPECT_GT(share.n_heads, 0) << "layer " << l;
      next += share.n_heads;
    }
    if (!p.layer_heads[l].empty()) {
      EXPECT_EQ(next, int32_t(inv.info.n_head)) << "layer " << l;
      EXPECT_EQ(p.layer_heads[l].front().device, p.layer_device[l]) << "layer " << l;
    }
  }
  for (size_t d = 0; d < p.devices.size(); ++d) {
    EXPECT_EQ(weights[d], p.devices[d].weight_bytes) << p.devices[d].spec.name;
    EXPECT_LE(p.devices[d].used_bytes(), p.devices[d].spec.memory_bytes) << p.devices[d].spec.name;
  }
  for (int32_t d : p.layer_device) EXPECT_TRUE(d >= 0 && size_t(d) < p.devices.size());
  EXPECT_GT(p.predicted.decode_tokens_per_s, 0);
  EXPECT_GT(p.predicted.prefill_tokens_per_s, 0);
  EXPECT_EQ(p.fits, p.problems.empty());
}

inline double used_fraction(const Placement& p, size_t device) {
  return double(p.devices[device].used_bytes()) / double(p.devices[device].spec.memory_bytes);
}

}  // namespace tandem::plan::test
