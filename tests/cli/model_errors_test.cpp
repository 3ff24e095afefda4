// Bad models and bad requests to `tandem run`: each a one-line error naming the problem, with a
// non-zero exit. The broken files are rewrites of the micro-v2 fixture.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <functional>

#include "cli_runner.h"
#include "core/blocks.h"
#include "gguf/gguf_file.h"
#include "gguf/gguf_writer.h"
#include "test_support.h"

namespace tandem {
namespace {

using Metadata = std::vector<std::pair<std::string, gguf::Value>>;

class ModelErrorTest : public ::testing::Test {
 protected:
  std::filesystem::path dir_ =
      std::filesystem::temp_directory_path() / ("tandem-model-errors-" + std::to_string(::getpid()));
  void SetUp() override { std::filesystem::create_directories(dir_); }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // Copies micro-v2-F32.gguf with its metadata and tensors edited.
  std::string rewrite(const std::string& name, const std::function<void(Metadata&)>& edit_metadata,
                      const std::function<void(std::vector<gguf::TensorToWrite>&)>& edit_tensors = {}) {
    const auto source = gguf::GgufFile::open(test::fixture("micro-v2-F32.gguf").string());
    Metadata metadata = source.metadata();
    edit_metadata(metadata);
    std::vector<gguf::TensorToWrite> tensors;
    for (const gguf::TensorInfo& t : source.tensors()) tensors.push_back({t.name, t.type, t.shape, t.bytes()});
    if (edit_tensors) edit_tensors(tensors);
    const std::string path = (dir_ / name).string();
    gguf::write_gguf(path, metadata, tensors);
    return path;
  }

  // Runs a one-token generation and expects exit 1 with a single line mentioning `needle`.
  void expect_error(const std::string& args, const std::string& needle) {
    const CliResult r = run_tandem("run " + args + " -n 1 --temp 0 -t 1");
    EXPECT_EQ(r.exit_code, 1) << r.output;
    EXPECT_EQ(r.output.rfind("tandem: error: ", 0), 0u) << r.output;
    EXPECT_NE(r.output.find(needle), std::string::npos) << r.output;
    EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;
  }
};

void erase_key(Metadata& metadata, const std::string& key) {
  std::erase_if(metadata, [&](const auto& kv) { return kv.first == key; });
}

void set_key(Metadata& metadata, const std::string& key, gguf::Value value) {
  for (auto& kv : metadata)
    if (kv.first == key) kv.second = std::move(value);
}

TEST_F(ModelErrorTest, MissingHyperparameterIsNamed) {
  const std::string path = rewrite("missing.gguf", [](Metadata& m) { erase_key(m, "deepseek2.attention.kv_lora_rank"); });
  expect_error(path + " -p hi", "metadata key 'deepseek2.attention.kv_lora_rank' is missing");
}

TEST_F(ModelErrorTest, WrongTensorShapeSaysExpectedAndFound) {
  const std::string path = rewrite("shape.gguf", [](Metadata& m) { set_key(m, "deepseek2.expert_feed_forward_length", gguf::Value::u32(96)); });
  expect_error(path + " -p hi", "has shape [128 x 64 x 8], expected [128 x 96 x 8]");
}

TEST_F(ModelErrorTest, UnsupportedWeightFormatIsNamed) {
  std::vector<uint8_t> q8_1;
  const std::string path = rewrite("format.gguf", [](Metadata&) {}, [&](std::vector<gguf::TensorToWrite>& tensors) {
    for (auto& t : tensors)
      if (t.name == "blk.0.ffn_up.weight") {
        // Q8_1: 36 bytes per block of 32; the reader knows its size, the engine cannot use it.
        q8_1.assign(t.shape[0] / 32 * 36 * t.shape[1], 0);
        t.type = DType::Q8_1;
        t.data = q8_1;
      }
  });
  expect_error(path + " -p hi", "'blk.0.ffn_up.weight' is stored as Q8_1");
}

TEST_F(ModelErrorTest, UnknownArchitectureListsTheSupportedOnes) {
  const std::string path = rewrite("arch.gguf", [](Metadata& m) { set_key(m, "general.architecture", gguf::Value::string("llama")); });
  expect_error(path + " -p hi", "architecture 'llama' is not supported; tandem runs: deepseek2");
}

TEST_F(ModelErrorTest, PromptLongerThanTheContextNamesBothLengths) {
  expect_error(test::fixture("micro-v2-F32.gguf").string() + " --ctx 8 -p 'one two three four five six seven eight nine ten'",
               "but the context holds 8");
}

TEST_F(ModelErrorTest, KvCacheTypesThatDifferOrAreNotBuiltAreNamed) {
  const std::string model = test::fixture("micro-v2-F32.gguf").string();
  expect_error(model + " -p hi --cache-type-k bf16", "tandem keeps keys and values in one type");
  // A type not built is refused by the option itself, which lists the ones there are.
  const CliResult r =
      run_tandem("run " + model + " -p hi -n 1 --cache-type-k f16 --cache-type-v f16");
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("--cache-type-k: f16 not in {f32,bf16}"), std::string::npos) << r.output;
}

TEST_F(ModelErrorTest, BadSamplingParameterIsNamed) {
  expect_error(test::fixture("micro-v2-F32.gguf").string() + " -p hi --top-p 1.5", "top_p");
}

}  // namespace
}  // namespace tandem
