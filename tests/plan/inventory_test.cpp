// Model inventories: weight groups from GGUF headers (fixtures, synthetic models, split files) and
// from the built-in presets, which go through the same tensor layout gen-model writes.
#include "plan/inventory.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <map>
#include <string>

#include "core/error.h"
#include "core/thread_pool.h"
#include "gguf/gguf_file.h"
#include "gguf/gguf_writer.h"
#include "model/model_shapes.h"
#include "model/synthetic_model.h"
#include "test_support.h"

namespace tandem::plan {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

uint64_t tensor_bytes(const gguf::GgufFile& file) {
  uint64_t total = 0;
  for (const gguf::TensorInfo& t : file.tensors()) total += t.n_bytes;
  return total;
}

const InventoryGroup* find_group(const ModelInventory& inv, const std::string& label) {
  for (const InventoryGroup& group : inv.groups)
    if (group.label() == label) return &group;
  return nullptr;
}

void expect_same_groups(const ModelInventory& a, const ModelInventory& b) {
  ASSERT_EQ(a.groups.size(), b.groups.size());
  for (size_t i = 0; i < a.groups.size(); ++i) {
    EXPECT_EQ(a.groups[i].label(), b.groups[i].label());
    EXPECT_EQ(a.groups[i].bytes, b.groups[i].bytes) << a.groups[i].label();
  }
  EXPECT_EQ(a.total_weight_bytes(), b.total_weight_bytes());
  EXPECT_EQ(a.kv_layer_bytes(0, 1000, DType::F32), b.kv_layer_bytes(0, 1000, DType::F32));
}

class TempDir {
 public:
  TempDir() { std::filesystem::create_directories(path_); }
  ~TempDir() { std::filesystem::remove_all(path_); }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_ =
      std::filesystem::temp_directory_path() / ("tandem-inventory-" + std::to_string(::getpid()));
};

TEST(InventoryFromFile, groups_of_every_fixture_hold_all_tensor_bytes) {
  for (const char* name : {"micro-v2-F32.gguf", "micro-v3-F32.gguf", "small-v2-Q4_K_M.gguf",
                           "small-v2-Q8_0.gguf", "small-v3-Q4_K_M.gguf", "small-v3-Q8_0.gguf"}) {
    const auto file = gguf::GgufFile::open(test::fixture(name).string());
    const ModelInventory inv = inventory_from_file(file);
    EXPECT_EQ(inv.total_weight_bytes(), tensor_bytes(file)) << name;
    EXPECT_EQ(inv.skipped_bytes, 0u) << name;
    EXPECT_EQ(inv.name, name);
  }
}

TEST(InventoryFromFile, small_v3_has_one_group_per_expert_and_labels_in_order) {
  const auto file = gguf::GgufFile::open(test::fixture("small-v3-Q4_K_M.gguf").string());
  const ModelInventory inv = inventory_from_file(file);
  EXPECT_EQ(inv.quant_mix, "Q4_K_M");
  EXPECT_EQ(inv.n_layers, 4u);
  EXPECT_EQ(inv.kv_layer_bytes(0, 1, DType::F32), (128u + 32u) * 4u);

  std::map<int32_t, int> experts_per_layer;
  for (const InventoryGroup& g : inv.groups)
    if (g.kind == WeightGroup::RoutedExperts) ++experts_per_layer[g.layer];
  EXPECT_EQ(experts_per_layer, (std::map<int32_t, int>{{1, 16}, {2, 16}, {3, 16}}));

  // token_embd, layer 0 (dense), layers 1-3 (attention, router, shared, 16 experts), output.
  ASSERT_EQ(inv.groups.size(), 1u + 2u + 3u * (3u + 16u) + 1u);
  EXPECT_EQ(inv.groups.front().label(), "token_embd");
  EXPECT_EQ(inv.groups[1].label(), "blk.0.attention");
  EXPECT_EQ(inv.groups[2].label(), "blk.0.dense_ffn");
  EXPECT_EQ(inv.groups[3].label(), "blk.1.attention");
  EXPECT_EQ(inv.groups[4].label(), "blk.1.router");
  EXPECT_EQ(inv.groups[5].label(), "blk.1.shared_experts");
  EXPECT_EQ(inv.groups[6].label(), "blk.1.expert.0");
  EXPECT_EQ(inv.groups[inv.groups.size() - 2].label(), "blk.3.expert.15");
  EXPECT_EQ(inv.groups.back().label(), "output");

  // Expert bytes: a sixteenth of gate + up + down. Layer 1: all Q4_K (144 bytes per 256 values);
  // layer 2 is a "more bits" layer: ffn_down_exps is Q6_K (210 bytes per 256).
  EXPECT_EQ(find_group(inv, "blk.1.expert.7")->bytes, 3u * 256u * 144u);
  EXPECT_EQ(find_group(inv, "blk.2.expert.7")->bytes, 2u * 256u * 144u + 256u * 210u);
  // The router holds ffn_gate_inp, exp_probs_b and the layer's ffn_norm (all F32).
  EXPECT_EQ(find_group(inv, "blk.1.router")->bytes, (256u * 16u + 16u + 256u) * 4u);
  // The dense layer's ffn_norm goes with its FFN; output_norm with the head (Q6_K, 4111 rows).
  EXPECT_EQ(find_group(inv, "blk.0.dense_ffn")->bytes, 3u * 768u * 256u / 256u * 144u + 256u * 4u);
  EXPECT_EQ(find_group(inv, "output")->bytes, 4111u * 210u + 256u * 4u);
}

// The layout rules reproduce llama.cpp's own Q4_K_M, Q8_0 and MXFP4_MOE files byte for byte, per
// group, for every architecture (the 8-expert rules for attn_k, attn_v and attn_output included).
TEST(InventoryFromFile, fixtures_match_their_layout_built_counterparts) {
  for (const char* name :
       {"micro-v2-F32.gguf", "micro-v3-F32.gguf", "small-v2-Q4_K_M.gguf", "small-v2-Q8_0.gguf",
        "small-v3-Q4_K_M.gguf", "small-v3-Q8_0.gguf", "qwen3moe-micro-F32.gguf",
        "qwen3moe-small-Q8_0.gguf", "qwen3moe-small-Q4_K_M.gguf", "gpt-oss-micro-F32.gguf",
        "gpt-oss-small-MXFP4.gguf", "glm4moe-micro-F32.gguf", "glm4moe-small-Q8_0.gguf",
        "glm4moe-small-Q4_K_M.gguf"}) {
    SCOPED_TRACE(name);
    const auto file = gguf::GgufFile::open(test::fixture(name).string());
    const ModelInventory from_file = inventory_from_file(file);
    const ModelInventory from_layout =
        inventory_from_shape(name, model_shape_of(file), from_file.quant_mix);
    expect_same_groups(from_file, from_layout);
    EXPECT_EQ(from_file.total_weight_bytes(), from_layout.total_weight_bytes());
  }
}

TEST(InventoryFromFile, synthetic_micro_model_equals_its_layout) {
  TempDir dir;
  ThreadPool pool(2);
  for (const char* format : {"Q4_K_M", "Q8_0", "BF16"}) {
    SCOPED_TRACE(format);
    const std::string path = dir.file(std::string("micro-") + format + ".gguf");
    write_synthetic_model(
        {.preset = "micro", .output_path = path, .format = format, .show_progress = false}, pool);
    const auto file = gguf::GgufFile::open(path);
    const ModelInventory from_file = inventory_from_file(file);
    EXPECT_EQ(from_file.quant_mix, format);
    EXPECT_EQ(from_file.total_weight_bytes(), tensor_bytes(file));
    expect_same_groups(from_file, inventory_from_shape("micro", model_shape_of(file), format));
  }
}

// Rewrites micro-v3 as two split parts (tensors divided between them) and checks the inventory
// of the split model is the inventory of the single file.
TEST(InventoryFromFile, split_model_counts_the_tensors_of_every_part) {
  TempDir dir;
  const auto single = gguf::GgufFile::open(test::fixture("micro-v3-F32.gguf").string());
  const std::string prefix = dir.file("micro-v3");
  const size_t n = single.tensors().size(), half = n / 2;
  for (uint16_t part = 0; part < 2; ++part) {
    gguf::GgufWriter writer(gguf::split_path(prefix, part + 1, 2));
    if (part == 0)
      for (const auto& [key, value] : single.metadata()) writer.add_metadata(key, value);
    writer.add_metadata("split.no", gguf::Value::u16(part));
    writer.add_metadata("split.count", gguf::Value::u16(2));
    writer.add_metadata("split.tensors.count", gguf::Value::i32(int32_t(n)));
    const size_t first = part == 0 ? 0 : half, last = part == 0 ? half : n;
    for (size_t i = first; i < last; ++i) {
      const gguf::TensorInfo& t = single.tensors()[i];
      writer.add_tensor(t.name, t.type, t.shape);
    }
    for (size_t i = first; i < last; ++i)
      writer.write_tensor_data(single.tensors()[i].name, single.tensors()[i].bytes());
    writer.finish();
  }
  const auto split = gguf::GgufFile::open(gguf::split_path(prefix, 1, 2));
  ASSERT_EQ(split.paths().size(), 2u);
  expect_same_groups(inventory_from_file(split), inventory_from_file(single));
}

// Published GGUF sizes (download pages of the common llama.cpp quantizations; GB = 1e9 bytes)
// against the preset totals this test prints (MTP layers are in neither):
//   preset             mix      published           preset
//   deepseek-v3 / r1   Q4_K_M   ~404 GB  (376 GiB)  404.5 GB (376.7 GiB)
//   deepseek-v3        Q8_0     ~713 GB  (664 GiB)  713.3 GB (664.3 GiB)
//   deepseek-v3        Q2_K     ~244 GB  (227 GiB)  247.0 GB (230.0 GiB)  attention kept at Q4_K
//   deepseek-coder-v2  Q4_K_M   ~142 GB  (132 GiB)  142.5 GB (132.7 GiB)
//   deepseek-v2-lite   Q4_K_M   ~10.4 GB (9.7 GiB)   10.4 GB (9.65 GiB)
//   kimi-k2            Q4_K_M   ~621 GB  (578 GiB)  620.6 GB (577.9 GiB)
// The ranges below are the published sizes ±5%.
TEST(InventoryFromPreset, totals_match_published_file_sizes) {
  struct Case {
    const char* preset;
    const char* mix;
    double min_gib, max_gib;
  };
  for (const Case& c :
       {Case{"deepseek-v3", "Q4_K_M", 357, 395}, Case{"deepseek-r1", "Q4_K_M", 357, 395},
        Case{"deepseek-v3", "Q2_K", 216, 239}, Case{"deepseek-v3", "Q8_0", 631, 697},
        Case{"deepseek-coder-v2", "Q4_K_M", 126, 139}, Case{"deepseek-v2", "Q4_K_M", 126, 139},
        Case{"deepseek-v2-lite", "Q4_K_M", 9.2, 10.2},
        Case{"deepseek-coder-v2-lite", "Q4_K_M", 9.2, 10.2}, Case{"kimi-k2", "Q4_K_M", 549, 607},
        // The dynamic low-bit mixes: published R1 files are 131 GB (UD-IQ1_S) and 183 GB
        // (UD-IQ2_XXS); these mixes keep every routed ffn_down one step up, ~15% more.
        Case{"deepseek-v3", "UD-IQ1_S", 135, 150}, Case{"deepseek-v3", "UD-IQ2_XXS", 180, 200}}) {
    const ModelInventory inv = inventory_from_preset(c.preset, c.mix);
    const double gib = double(inv.total_weight_bytes()) / kGiB;
    std::printf("%-24s %-7s %8.2f GiB (%7.1f GB), %5zu groups, %6.2f GB read per token\n", c.preset,
                c.mix, gib, double(inv.total_weight_bytes()) / 1e9, inv.groups.size(),
                double(inv.bytes_read_per_token()) / 1e9);
    EXPECT_GE(gib, c.min_gib) << c.preset << " " << c.mix;
    EXPECT_LE(gib, c.max_gib) << c.preset << " " << c.mix;
    EXPECT_EQ(inv.name, c.preset);
    EXPECT_EQ(inv.quant_mix, c.mix);
    EXPECT_EQ(inv.skipped_bytes, 0u);
  }
}

TEST(InventoryFromPreset, v3_has_the_published_shape) {
  const ModelInventory inv = inventory_from_preset("deepseek-v3", "Q4_K_M");
  EXPECT_EQ(inv.n_layers, 61u);
  EXPECT_EQ(inv.kv_layer_bytes(60, 10, DType::F32), (512u + 64u) * 4u * 10u);
  int experts = 0, dense = 0;
  for (const InventoryGroup& g : inv.groups) {
    experts += g.kind == WeightGroup::RoutedExperts;
    dense += g.kind == WeightGroup::DenseFfn;
  }
  EXPECT_EQ(experts, 58 * 256);
  EXPECT_EQ(dense, 3);
  // A Q4_K expert of V3: 3 matrices of 7168 x 2048 at 144 bytes per 256 values in layer 7 (the
  // first past the first eighth, not a "more bits" layer); layer 4 is one: its down is Q6_K.
  EXPECT_EQ(find_group(inv, "blk.7.expert.0")->bytes, 3u * 7168u * 2048u / 256u * 144u);
  EXPECT_EQ(find_group(inv, "blk.4.expert.0")->bytes, 7168u * 2048u / 256u * (2u * 144u + 210u));
  // 37B parameters are active per token; at ~4.5-6.5 bits that is 20-26 GB.
  EXPECT_GT(inv.bytes_read_per_token(), uint64_t(18e9));
  EXPECT_LT(inv.bytes_read_per_token(), uint64_t(28e9));
  const auto kimi = inventory_from_preset("kimi-k2", "BF16");
  EXPECT_EQ(find_group(kimi, "blk.1.expert.383")->bytes, 3u * 7168u * 2048u * 2u);
}

TEST(InventoryFromPreset, unknown_names_list_the_known_ones) {
  try {
    inventory_from_preset("deepseek-v9", "Q4_K_M");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("deepseek-v9"), std::string::npos);
    for (const std::string& name : inventory_preset_names())
      EXPECT_NE(std::string(e.what()).find(name), std::string::npos) << name;
  }
  try {
    inventory_from_preset("deepseek-v3", "Q3_K_M");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("Q3_K_M"), std::string::npos);
    for (const std::string& mix : inventory_quant_mixes())
      EXPECT_NE(std::string(e.what()).find(mix), std::string::npos) << mix;
  }
}

TEST(InventoryFromPreset, q2_k_mix_lowers_only_the_routed_experts) {
  const auto q2 = inventory_from_preset("deepseek-v3", "Q2_K");
  const auto q4 = inventory_from_preset("deepseek-v3", "Q4_K_M");
  // Q2_K gate/up (84 bytes per 256) and Q3_K down (110 per 256).
  EXPECT_EQ(find_group(q2, "blk.4.expert.9")->bytes, 7168u * 2048u / 256u * (2u * 84u + 110u));
  // Everything else is Q4_K_M's choice outside its "more bits" layers (layer 7 is not one).
  EXPECT_EQ(find_group(q2, "blk.7.attention")->bytes, find_group(q4, "blk.7.attention")->bytes);
  EXPECT_EQ(find_group(q2, "blk.7.shared_experts")->bytes,
            find_group(q4, "blk.7.shared_experts")->bytes);
  EXPECT_EQ(find_group(q2, "output")->bytes, find_group(q4, "output")->bytes);
}

TEST(InventoryFromPreset, dynamic_mixes_lower_the_routed_experts_to_i_quants) {
  const auto ud1 = inventory_from_preset("deepseek-v3", "UD-IQ1_S");
  const auto ud2 = inventory_from_preset("deepseek-v3", "UD-IQ2_XXS");
  const auto q4 = inventory_from_preset("deepseek-v3", "Q4_K_M");
  // IQ1_S gate/up (50 bytes per 256) and IQ2_XXS down (66); IQ2_XXS gate/up and IQ3_XXS (98).
  EXPECT_EQ(find_group(ud1, "blk.7.expert.9")->bytes, 7168u * 2048u / 256u * (2u * 50u + 66u));
  EXPECT_EQ(find_group(ud2, "blk.7.expert.9")->bytes, 7168u * 2048u / 256u * (2u * 66u + 98u));
  EXPECT_EQ(find_group(ud1, "blk.7.attention")->bytes, find_group(q4, "blk.7.attention")->bytes);
  EXPECT_EQ(find_group(ud1, "output")->bytes, find_group(q4, "output")->bytes);
}

TEST(InventoryWorkBuffers, grow_linearly_with_tokens_and_include_the_logits) {
  const auto inv = inventory_from_preset("deepseek-v3", "Q4_K_M");
  const uint64_t one = inv.work_buffer_bytes(1);
  EXPECT_EQ(inv.work_buffer_bytes(512), 512 * one);
  EXPECT_EQ(inv.work_buffer_bytes(0), 0u);
  // At least the logits row and the FFN gate/up (2 x 18432) in F32; well under 2 MB a token.
  EXPECT_GT(one, (129280u + 2u * 18432u) * 4u);
  EXPECT_LT(one, 2u << 20);
}

}  // namespace
}  // namespace tandem::plan
