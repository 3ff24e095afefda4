#include "model/deepseek2_hparams.h"

#include <gtest/gtest.h>

#include "core/error.h"
#include "gguf/gguf_file.h"
#include "gguf/gguf_writer.h"
#include "test_support.h"

namespace tandem {
namespace {

using gguf::Value;
using Metadata = std::vector<std::pair<std::string, Value>>;

TEST(Deepseek2Hparams, ReadsMicroV2Fixture) {
  const auto file = gguf::GgufFile::open(test::fixture("micro-v2-F32.gguf").string());
  const Deepseek2Hparams hp = read_deepseek2_hparams(file);
  EXPECT_EQ(hp.n_layer, 3u);
  EXPECT_EQ(hp.n_embd, 128u);
  EXPECT_EQ(hp.q_lora_rank, 0u);
  EXPECT_EQ(hp.kv_lora_rank, 64u);
  EXPECT_EQ(hp.qk_nope_dim, 32u);
  EXPECT_EQ(hp.qk_rope_dim, 16u);
  EXPECT_EQ(hp.v_head_dim, 32u);
  EXPECT_EQ(hp.n_expert, 8u);
  EXPECT_EQ(hp.n_expert_used, 2u);
  EXPECT_EQ(hp.n_expert_shared, 2u);
  EXPECT_EQ(hp.gating, ExpertGating::Softmax);
  EXPECT_FALSE(hp.expert_weights_norm);  // key absent in this file
  EXPECT_EQ(hp.rope_scaling, RopeScaling::None);
  EXPECT_EQ(hp.n_vocab, 4111u);
}

TEST(Deepseek2Hparams, ReadsSmallV3FixtureWithGroupsAndYarn) {
  const auto file = gguf::GgufFile::open(test::fixture("small-v3-Q4_K_M.gguf").string());
  const Deepseek2Hparams hp = read_deepseek2_hparams(file);
  EXPECT_EQ(hp.q_lora_rank, 128u);
  EXPECT_EQ(hp.n_expert_group, 4u);
  EXPECT_EQ(hp.n_group_used, 2u);
  EXPECT_EQ(hp.gating, ExpertGating::Sigmoid);
  EXPECT_TRUE(hp.expert_weights_norm);
  EXPECT_FLOAT_EQ(hp.expert_weights_scale, 2.5f);
  EXPECT_EQ(hp.rope_scaling, RopeScaling::Yarn);
  EXPECT_FLOAT_EQ(hp.rope_scaling_factor, 40.0f);
  EXPECT_EQ(hp.rope_original_ctx, 4096u);
  EXPECT_NEAR(hp.yarn_log_multiplier, 0.1f, 1e-6);
  EXPECT_EQ(hp.qk_nope_dim, 64u);
  EXPECT_EQ(hp.kv_cache_dims(), 128u + 32u);
}

// A minimal valid set of keys, written by the same function the generator uses.
Metadata valid_metadata() {
  Deepseek2Hparams hp;
  hp.n_layer = 2, hp.n_ctx_train = 512, hp.n_embd = 64, hp.n_ff_dense = 128, hp.n_head = 2;
  hp.n_vocab = 300, hp.kv_lora_rank = 32, hp.qk_nope_dim = 16, hp.qk_rope_dim = 8, hp.v_head_dim = 16;
  hp.n_leading_dense = 1, hp.n_expert = 4, hp.n_expert_used = 2, hp.n_ff_expert = 32;
  std::vector<uint8_t> image;
  {
    gguf::GgufWriter writer(&image);
    writer.add_metadata("general.architecture", Value::string("deepseek2"));
    write_deepseek2_hparams(hp, writer);
    writer.write_header();
    writer.finish();
  }
  return gguf::GgufFile::parse_memory(image, "valid").metadata();
}

std::string error_for(const Metadata& metadata) {
  const std::vector<uint8_t> image = gguf::write_gguf_to_memory(metadata, {});
  const auto file = gguf::GgufFile::parse_memory(image, "test.gguf");
  try {
    read_deepseek2_hparams(file);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

Metadata without(Metadata metadata, const std::string& key) {
  std::erase_if(metadata, [&](const auto& kv) { return kv.first == key; });
  return metadata;
}

Metadata with(Metadata metadata, const std::string& key, Value value) {
  for (auto& kv : metadata)
    if (kv.first == key) kv.second = std::move(value);
  return metadata;
}

TEST(Deepseek2Hparams, WrittenHparamsReadBackEqual) { EXPECT_EQ(error_for(valid_metadata()), ""); }

TEST(Deepseek2Hparams, MissingRequiredKeyIsNamed) {
  const std::string message = error_for(without(valid_metadata(), "deepseek2.attention.kv_lora_rank"));
  EXPECT_NE(message.find("'deepseek2.attention.kv_lora_rank' is missing"), std::string::npos) << message;
  EXPECT_NE(message.find("test.gguf"), std::string::npos) << message;
}

TEST(Deepseek2Hparams, WrongTypeIsNamed) {
  const std::string message =
      error_for(with(valid_metadata(), "deepseek2.block_count", Value::string("many")));
  EXPECT_NE(message.find("deepseek2.block_count"), std::string::npos) << message;
}

TEST(Deepseek2Hparams, InconsistentExpertCountsAreRejected) {
  const std::string message =
      error_for(with(valid_metadata(), "deepseek2.expert_used_count", Value::u32(9)));
  EXPECT_NE(message.find("expert_used_count"), std::string::npos) << message;
}

TEST(Deepseek2Hparams, UnknownGatingFunctionIsRejected) {
  const std::string message =
      error_for(with(valid_metadata(), "deepseek2.expert_gating_func", Value::u32(7)));
  EXPECT_NE(message.find("expert_gating_func"), std::string::npos) << message;
}

TEST(Deepseek2Hparams, OtherArchitectureIsRejected) {
  const std::string message =
      error_for(with(valid_metadata(), "general.architecture", Value::string("llama")));
  EXPECT_NE(message.find("'llama' is not deepseek2"), std::string::npos) << message;
}

}  // namespace
}  // namespace tandem
