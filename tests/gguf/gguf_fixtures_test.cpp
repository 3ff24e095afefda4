// The shared fixtures (written by an independent implementation) open and make sense.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>

#include "gguf/gguf_file.h"
#include "gguf/gguf_writer.h"
#include "gguf_test_util.h"
#include "test_support.h"

namespace tandem::gguf {
namespace {

struct ModelFixture {
  const char* file;
  int64_t block_count;
  int64_t hidden;
  size_t n_tensors;  // from the file header
};

// Layer and width numbers from ../shared/fixtures/README.md; tensor counts from the headers.
const ModelFixture kModels[] = {
    {"micro-v2-F32.gguf", 3, 128, 44},    {"micro-v3-F32.gguf", 4, 128, 70},
    {"small-v2-Q4_K_M.gguf", 4, 256, 59}, {"small-v2-Q8_0.gguf", 4, 256, 59},
    {"small-v3-Q4_K_M.gguf", 4, 256, 70}, {"small-v3-Q8_0.gguf", 4, 256, 70},
};

// Every tensor's bytes lie inside its file and no two tensors overlap.
void expect_tensors_inside_files(const GgufFile& file) {
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (const TensorInfo& t : file.tensors()) {
    const uint64_t size = std::filesystem::file_size(file.paths()[t.file_index]);
    EXPECT_LE(t.file_offset + t.n_bytes, size) << t.name;
    EXPECT_EQ(t.file_offset % file.alignment(), 0u) << t.name;
    EXPECT_EQ(t.n_bytes, row_bytes(t.type, t.shape[0]) * (t.n_elements / t.shape[0])) << t.name;
    ranges.emplace_back(t.file_offset, t.file_offset + t.n_bytes);
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i) EXPECT_LE(ranges[i - 1].second, ranges[i].first);
}

class GgufModelFixture : public ::testing::TestWithParam<ModelFixture> {};

TEST_P(GgufModelFixture, opens_with_deepseek2_metadata_and_tensors_inside_the_file) {
  const ModelFixture& fx = GetParam();
  const GgufFile file = GgufFile::open(tandem::test::fixture(fx.file).string());
  EXPECT_EQ(file.version(), 3u);
  EXPECT_EQ(file.get_string("general.architecture"), "deepseek2");
  EXPECT_EQ(file.get_int("deepseek2.block_count"), fx.block_count);
  EXPECT_EQ(file.get_int("deepseek2.embedding_length"), fx.hidden);
  EXPECT_EQ(file.tensors().size(), fx.n_tensors);
  EXPECT_EQ(file.total_file_bytes(), std::filesystem::file_size(file.paths()[0]));
  expect_tensors_inside_files(file);

  const TensorInfo* embd = file.find_tensor("token_embd.weight");
  ASSERT_NE(embd, nullptr);
  EXPECT_EQ(embd->shape, (std::vector<uint64_t>{uint64_t(fx.hidden), 4111}));
  EXPECT_EQ(file.get_array("tokenizer.ggml.tokens", ValueType::String).items.size(), 4111u);

  // Norm weights are F32 in every fixture; their values must be finite, which also reads
  // bytes through the data pointer.
  const TensorInfo* norm = file.find_tensor("output_norm.weight");
  ASSERT_NE(norm, nullptr);
  ASSERT_EQ(norm->type, DType::F32);
  ASSERT_EQ(norm->shape, std::vector<uint64_t>{uint64_t(fx.hidden)});
  for (uint64_t i = 0; i < norm->n_elements; ++i) {
    float v;
    std::memcpy(&v, norm->data + 4 * i, 4);
    EXPECT_TRUE(std::isfinite(v));
  }
}

TEST_P(GgufModelFixture, rewriting_with_the_writer_gives_the_same_content) {
  const GgufFile original = GgufFile::open(tandem::test::fixture(GetParam().file).string());
  std::vector<uint8_t> out;
  {
    GgufWriter writer(&out, original.alignment());
    for (const auto& [key, value] : original.metadata()) writer.add_metadata(key, value);
    for (const TensorInfo& t : original.tensors()) writer.add_tensor(t.name, t.type, t.shape);
    for (const TensorInfo& t : original.tensors()) writer.write_tensor_data(t.name, t.bytes());
    writer.finish();
  }
  const GgufFile copy = GgufFile::parse_memory(out, "copy.gguf");
  EXPECT_EQ(copy.metadata(), original.metadata());
  ASSERT_EQ(copy.tensors().size(), original.tensors().size());
  for (size_t i = 0; i < copy.tensors().size(); ++i) {
    const TensorInfo& a = original.tensors()[i];
    const TensorInfo& b = copy.tensors()[i];
    EXPECT_EQ(a.name, b.name);
    EXPECT_EQ(a.shape, b.shape);
    EXPECT_EQ(a.type, b.type);
    // The same layout rules as the independent writer, so the same offsets.
    EXPECT_EQ(a.file_offset, b.file_offset) << a.name;
    EXPECT_TRUE(std::equal(a.data, a.data + a.n_bytes, b.data)) << a.name;
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, GgufModelFixture, ::testing::ValuesIn(kModels),
                         [](const auto& info) {
                           std::string name = info.param.file;
                           name = name.substr(0, name.size() - 5);
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

TEST(GgufFixtures, quantized_fixture_holds_the_formats_the_readme_lists) {
  const GgufFile file = GgufFile::open(tandem::test::fixture("small-v2-Q4_K_M.gguf").string());
  EXPECT_EQ(file.find_tensor("token_embd.weight")->type, DType::Q4_K);
  EXPECT_EQ(file.find_tensor("output.weight")->type, DType::Q6_K);
  EXPECT_EQ(file.find_tensor("blk.1.attn_k_b.weight")->type, DType::Q5_0);
  EXPECT_EQ(file.find_tensor("blk.1.ffn_gate_inp.weight")->type, DType::F32);
}

TEST(GgufFixtures, full_tokenizer_has_129280_tokens_and_its_special_ids) {
  const GgufFile file =
      GgufFile::open(tandem::test::fixture("tokenizer-deepseek-v3.gguf").string());
  EXPECT_EQ(file.get_string("general.architecture"), "deepseek2");
  EXPECT_TRUE(file.tensors().empty());
  EXPECT_EQ(file.get_string("tokenizer.ggml.model"), "gpt2");
  EXPECT_EQ(file.get_string("tokenizer.ggml.pre"), "deepseek-v3");
  const Array& tokens = file.get_array("tokenizer.ggml.tokens", ValueType::String);
  ASSERT_EQ(tokens.items.size(), 129280u);
  EXPECT_EQ(*tokens.items[0].as_string(), "<｜begin▁of▁sentence｜>");
  EXPECT_EQ(*tokens.items[1].as_string(), "<｜end▁of▁sentence｜>");
  EXPECT_EQ(file.get_array("tokenizer.ggml.merges", ValueType::String).items.size(), 127741u);
  EXPECT_EQ(file.get_array("tokenizer.ggml.token_type").items.size(), 129280u);
  EXPECT_EQ(file.get_int("tokenizer.ggml.bos_token_id"), 0);
  EXPECT_EQ(file.get_int("tokenizer.ggml.eos_token_id"), 1);
  EXPECT_TRUE(file.get_bool("tokenizer.ggml.add_bos_token"));
  EXPECT_NE(file.get_string("tokenizer.chat_template").find("<｜Assistant｜>"), std::string::npos);
}

}  // namespace
}  // namespace tandem::gguf
