#include "model/synthetic_model.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "core/error.h"
#include "core/thread_pool.h"
#include "gguf/gguf_file.h"
#include "quant/quant.h"

namespace tandem {
namespace {

class SyntheticModelTest : public ::testing::Test {
 protected:
  std::filesystem::path dir_ = std::filesystem::temp_directory_path() /
                               ("tandem-synthetic-" + std::to_string(::getpid()));
  ThreadPool pool_{2};
  void SetUp() override { std::filesystem::create_directories(dir_); }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string write(const std::string& name, SyntheticOptions options) {
    options.output_path = (dir_ / name).string();
    options.show_progress = false;
    write_synthetic_model(options, pool_);
    return options.output_path;
  }
};

std::string file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

// Standard deviation of a tensor's dequantized values.
double tensor_std(const gguf::TensorInfo& t) {
  std::vector<float> values(t.n_elements);
  dequantize_row(t.type, t.data, values.data(), int64_t(t.n_elements));
  double sum = 0, sum_sq = 0;
  for (float v : values) sum += v, sum_sq += double(v) * v;
  const double mean = sum / double(values.size());
  return std::sqrt(sum_sq / double(values.size()) - mean * mean);
}

TEST_F(SyntheticModelTest, MicroQ4KMReadsBackWithThePresetsHparams) {
  const auto file = gguf::GgufFile::open(write("micro.gguf", {.preset = "micro", .format = "Q4_K_M"}));
  const Deepseek2Hparams hp = read_deepseek2_hparams(file);
  const Deepseek2Hparams& want =
      std::get<Deepseek2Hparams>(find_synthetic_preset("micro").shape.hparams());
  EXPECT_EQ(hp.n_layer, want.n_layer);
  EXPECT_EQ(hp.n_embd, want.n_embd);
  EXPECT_EQ(hp.kv_lora_rank, want.kv_lora_rank);
  EXPECT_EQ(hp.qk_nope_dim, want.qk_nope_dim);
  EXPECT_EQ(hp.n_expert, want.n_expert);
  EXPECT_EQ(hp.n_vocab, file.get_array("tokenizer.ggml.tokens", gguf::ValueType::String).items.size());
  EXPECT_GT(file.get_array("tokenizer.ggml.merges", gguf::ValueType::String).items.size(), 200u);
  EXPECT_NE(file.get_string("tokenizer.chat_template").find("<｜Assistant｜>"), std::string::npos);

  // The Q4_K_M mix: Q4_K by default, Q6_K head, Q5_0 for rows shorter than a super-block.
  EXPECT_EQ(file.find_tensor("blk.1.ffn_gate_exps.weight")->type, DType::Q5_0);  // row 128
  EXPECT_EQ(file.find_tensor("output.weight")->type, DType::Q8_0);  // Q6_K falls back on row 128
  EXPECT_EQ(file.find_tensor("blk.1.ffn_gate_inp.weight")->type, DType::F32);
  EXPECT_EQ(file.find_tensor("blk.1.ffn_norm.weight")->type, DType::F32);
  EXPECT_EQ(file.find_tensor("blk.1.ffn_down_exps.weight")->shape,
            (std::vector<uint64_t>{64, 128, 8}));
  EXPECT_EQ(file.find_tensor("blk.0.ffn_down.weight")->shape, (std::vector<uint64_t>{384, 128}));
}

TEST_F(SyntheticModelTest, LongRowsUseQ4KAndQ6K) {
  // Three layers of micro with a wider hidden size would be slow to set up; the v3-layer preset
  // is far too big, so check the mix through the lite preset's tensor rules on a 2-layer model
  // with rows of 2048 would still be 1.4 GB. Instead: micro's dense FFN down rows are 384 long
  // (not a multiple of 256) and everything else is 128 or less, so look at F16 and Q8_0 mixes.
  const auto q8 = gguf::GgufFile::open(write("q8.gguf", {.preset = "micro", .format = "Q8_0"}));
  EXPECT_EQ(q8.find_tensor("blk.0.ffn_down.weight")->type, DType::Q8_0);
  EXPECT_EQ(q8.find_tensor("output.weight")->type, DType::Q8_0);
  const auto bf16 = gguf::GgufFile::open(write("bf16.gguf", {.preset = "micro", .format = "BF16"}));
  EXPECT_EQ(bf16.find_tensor("token_embd.weight")->type, DType::BF16);
  EXPECT_EQ(bf16.find_tensor("output_norm.weight")->type, DType::F32);
}

TEST_F(SyntheticModelTest, SameSeedSameBytesOtherSeedOtherBytes) {
  const std::string a = file_bytes(write("a.gguf", {.preset = "micro", .format = "Q8_0", .seed = 7}));
  const std::string b = file_bytes(write("b.gguf", {.preset = "micro", .format = "Q8_0", .seed = 7}));
  const std::string c = file_bytes(write("c.gguf", {.preset = "micro", .format = "Q8_0", .seed = 8}));
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  EXPECT_EQ(a.size(), c.size());
}

TEST_F(SyntheticModelTest, WeightsHaveTheIntendedScale) {
  const auto file = gguf::GgufFile::open(write("f32.gguf", {.preset = "micro", .format = "F32"}));
  EXPECT_NEAR(tensor_std(*file.find_tensor("token_embd.weight")), 1.0, 0.03);
  const double fan_in = 1.0 / std::sqrt(128.0);
  EXPECT_NEAR(tensor_std(*file.find_tensor("blk.1.ffn_up_exps.weight")), fan_in, 0.03 * fan_in);
  // Decisive routing: router rows are 6x larger than the other matrices.
  EXPECT_NEAR(tensor_std(*file.find_tensor("blk.1.ffn_gate_inp.weight")), 6 * fan_in, 0.1 * fan_in);
  EXPECT_NEAR(tensor_std(*file.find_tensor("output.weight")), 10 * fan_in, 0.3 * fan_in);
}

TEST_F(SyntheticModelTest, LayerOverrideChangesBlockCount) {
  SyntheticOptions options{.preset = "micro", .format = "F16"};
  options.n_layers = 5;
  const auto file = gguf::GgufFile::open(write("five.gguf", options));
  EXPECT_EQ(read_deepseek2_hparams(file).n_layer, 5u);
  EXPECT_NE(file.find_tensor("blk.4.ffn_up_exps.weight"), nullptr);
}

TEST_F(SyntheticModelTest, UnknownPresetOrFormatIsAnErrorThatListsTheChoices) {
  try {
    write("x.gguf", {.preset = "huge"});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("micro, lite, v3-layer"), std::string::npos) << e.what();
  }
  try {
    write("y.gguf", {.preset = "micro", .format = "Q3_K_S"});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("Q4_K_M, IQ4_XS, Q8_0"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace tandem
