#include "model/weight_groups.h"

#include <gtest/gtest.h>

#include "gguf/gguf_file.h"
#include "test_support.h"

namespace tandem {
namespace {

WeightGroup group_of(const char* name) { return classify_tensor(name, 61).group; }

TEST(WeightGroups, ClassifiesEveryDeepseek2TensorName) {
  EXPECT_EQ(group_of("token_embd.weight"), WeightGroup::Embedding);
  EXPECT_EQ(group_of("output.weight"), WeightGroup::OutputHead);
  EXPECT_EQ(group_of("output_norm.weight"), WeightGroup::Norms);
  EXPECT_EQ(group_of("blk.0.attn_norm.weight"), WeightGroup::Norms);
  EXPECT_EQ(group_of("blk.0.attn_q_a_norm.weight"), WeightGroup::Norms);
  EXPECT_EQ(group_of("blk.0.attn_kv_a_norm.weight"), WeightGroup::Norms);
  EXPECT_EQ(group_of("blk.3.attn_q_b.weight"), WeightGroup::Attention);
  EXPECT_EQ(group_of("blk.3.attn_kv_a_mqa.weight"), WeightGroup::Attention);
  EXPECT_EQ(group_of("blk.3.attn_k_b.weight"), WeightGroup::Attention);
  EXPECT_EQ(group_of("blk.3.attn_kv_b.weight"), WeightGroup::Attention);
  EXPECT_EQ(group_of("blk.3.attn_output.weight"), WeightGroup::Attention);
  EXPECT_EQ(group_of("blk.3.ffn_gate_inp.weight"), WeightGroup::Router);
  EXPECT_EQ(group_of("blk.3.exp_probs_b.bias"), WeightGroup::Router);
  EXPECT_EQ(group_of("blk.3.ffn_up_shexp.weight"), WeightGroup::SharedExperts);
  EXPECT_EQ(group_of("blk.3.ffn_down_exps.weight"), WeightGroup::RoutedExperts);
  EXPECT_EQ(group_of("blk.0.ffn_gate.weight"), WeightGroup::DenseFfn);
  EXPECT_EQ(group_of("blk.61.ffn_gate_exps.weight"), WeightGroup::NextN);  // V3's MTP block
  EXPECT_EQ(group_of("blk.x.weight"), WeightGroup::Other);
  EXPECT_EQ(classify_tensor("blk.12.attn_q_b.weight", 61).layer, 12u);
}

TEST(WeightGroups, FixtureBytesAddUpAndExpertsDominate) {
  const auto file = gguf::GgufFile::open(test::fixture("small-v2-Q8_0.gguf").string());
  const WeightBytes bytes = count_weight_bytes(file, 4);
  uint64_t sum = 0, tensors = 0;
  for (int g = 0; g < kWeightGroupCount; ++g) {
    sum += bytes.group_bytes[size_t(g)];
    tensors += bytes.group_tensors[size_t(g)];
  }
  EXPECT_EQ(sum, bytes.total_bytes);
  EXPECT_EQ(tensors, file.tensors().size());
  EXPECT_EQ(bytes.group_tensors[size_t(WeightGroup::Other)], 0u);
  EXPECT_GT(bytes.group_bytes[size_t(WeightGroup::RoutedExperts)], bytes.total_bytes / 2);
  EXPECT_EQ(bytes.format_bytes.at("Q8_0") + bytes.format_bytes.at("F32"), bytes.total_bytes);
}

}  // namespace
}  // namespace tandem
