#include <gtest/gtest.h>
#include <linux/magic.h>
#include <sys/vfs.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "cli_runner.h"
#include "core/mapped_file.h"
#include "test_support.h"

namespace tandem {
namespace {

using Result = CliResult;
Result run(const std::string& args) { return run_tandem(args); }

class CliTest : public ::testing::Test {
 protected:
  std::filesystem::path dir_ =
      std::filesystem::temp_directory_path() / ("tandem-cli-" + std::to_string(::getpid()));
  void SetUp() override { std::filesystem::create_directories(dir_); }
  void TearDown() override { std::filesystem::remove_all(dir_); }
};

TEST_F(CliTest, InspectPrintsTheTensorTableAndGroupsOfAFixture) {
  const Result r = run("inspect " + test::fixture("small-v3-Q4_K_M.gguf").string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("architecture: deepseek2"), std::string::npos);
  EXPECT_NE(r.output.find("blk.1.ffn_down_exps.weight"), std::string::npos);
  EXPECT_NE(r.output.find("256 x 256 x 16"), std::string::npos);
  EXPECT_NE(r.output.find("routed experts"), std::string::npos);
  EXPECT_NE(r.output.find("Q6_K"), std::string::npos);
  EXPECT_NE(r.output.find("2 of 4 groups"), std::string::npos);
  EXPECT_NE(r.output.find("chat template: 2301 characters, deepseek3"), std::string::npos)
      << r.output;
}

TEST_F(CliTest, InspectJsonIsOneObjectWithEveryTensor) {
  const Result r = run("inspect --json " + test::fixture("micro-v2-F32.gguf").string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto json = nlohmann::json::parse(r.output);
  EXPECT_EQ(json["architecture"], "deepseek2");
  EXPECT_EQ(json["hparams"]["kv_lora_rank"], 64);
  EXPECT_EQ(json["tokenizer"]["n_tokens"], 4111);
  EXPECT_EQ(json["metadata"]["tokenizer.ggml.tokens"]["length"], 4111);
  uint64_t sum = 0;
  for (const auto& t : json["tensors"]) sum += t["bytes"].get<uint64_t>();
  EXPECT_EQ(sum, json["tensor_bytes"].get<uint64_t>());
  EXPECT_GT(json["weight_groups"]["routed experts"]["bytes"].get<uint64_t>(), 0u);
}

TEST_F(CliTest, GenModelThenInspectRoundTrips) {
  const std::string path = (dir_ / "new-folder" / "micro.gguf").string();  // folder created
  const Result gen = run("gen-model --preset micro --format Q8_0 --seed 3 --no-progress -o " + path);
  ASSERT_EQ(gen.exit_code, 0) << gen.output;
  EXPECT_NE(gen.output.find("wrote"), std::string::npos);
  const Result r = run("inspect --json " + path);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto json = nlohmann::json::parse(r.output);
  EXPECT_EQ(json["hparams"]["n_layer"], 3);
  EXPECT_TRUE(json["formats"].contains("Q8_0"));
  EXPECT_EQ(json["metadata"]["general.file_type"], 7);
}

// `tandem repack`: matrices interleaved, lookup tables not, the copy runs, and it is refused as
// an input (already repacked) and as its own output.
TEST_F(CliTest, RepackInterleavesTheMatricesAndTheCopyRuns) {
  const std::string original = test::fixture("small-v2-Q4_K_M.gguf").string();
  const std::string path = (dir_ / "r16.gguf").string();
  const Result repack = run("repack --no-progress " + original + " " + path);
  ASSERT_EQ(repack.exit_code, 0) << repack.output;
  EXPECT_NE(repack.output.find("tensors interleaved"), std::string::npos) << repack.output;
  // The copy has left the page cache, so that its first use reads it in 2 MiB pages (a tmpfs
  // keeps its pages whatever is asked: nothing to check there).
  struct statfs fs {};
  if (::statfs(path.c_str(), &fs) == 0 && fs.f_type != TMPFS_MAGIC) {
    const MappedFile copy(path);
    EXPECT_LT(copy.cached_bytes(0, copy.size()), copy.size() / 10);
  }
  const Result r = run("inspect --json " + path);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto json = nlohmann::json::parse(r.output);
  EXPECT_TRUE(json["formats"].contains("Q4_K_R16")) << json["formats"].dump();
  EXPECT_TRUE(json["metadata"].contains("tandem.repacked"));
  for (const auto& t : json["tensors"])
    if (t["name"] == "token_embd.weight") {
      EXPECT_EQ(t["type"], "Q4_K");
    }

  // At 16 bits both files' products differ only in the order of their sums (logits within
  // ~1e-3). By default the original's experts take 8-bit activations and the interleaved
  // kernels 16-bit ones: logits ~0.3 apart, and this random model has near ties (0.03) that a
  // change of rounding anywhere can flip.
  const Result a = run("run --precision int16 --temp 0 -n 8 -p 'Hello there' " + original);
  const Result b = run("run --precision int16 --temp 0 -n 8 -p 'Hello there' " + path);
  ASSERT_EQ(b.exit_code, 0) << b.output;
  EXPECT_EQ(a.output.substr(0, a.output.find('\n')), b.output.substr(0, b.output.find('\n')));
  // Without AVX-512 the groups are taken apart at every use: a note says so, and the text is
  // the original file's on the same kernels (the plain kernels on the same rows: same bits).
  ::setenv("TANDEM_ISA", "avx2", 1);
  const Result plain_avx2 = run("run --temp 0 -n 8 -p 'Hello there' " + original);
  const Result avx2 = run("run --temp 0 -n 8 -p 'Hello there' " + path);
  ::unsetenv("TANDEM_ISA");
  ASSERT_EQ(avx2.exit_code, 0) << avx2.output;
  EXPECT_NE(avx2.output.find("rewritten by `tandem repack` for AVX-512"), std::string::npos) << avx2.output;
  const std::string text = plain_avx2.output.substr(0, plain_avx2.output.find('\n'));
  EXPECT_NE(avx2.output.find(text), std::string::npos) << avx2.output;

  const Result again = run("repack --no-progress " + path + " " + (dir_ / "twice.gguf").string());
  EXPECT_NE(again.exit_code, 0);
  EXPECT_NE(again.output.find("already repacked"), std::string::npos) << again.output;
  EXPECT_FALSE(std::filesystem::exists(dir_ / "twice.gguf"));
  const Result self = run("repack --no-progress " + path + " " + path);
  EXPECT_NE(self.exit_code, 0);
  EXPECT_NE(self.output.find("overwrite the input"), std::string::npos) << self.output;
}

// The generated text of a `run`: its first line that is not a note (stderr is merged).
std::string generated_text(const std::string& output) {
  size_t start = 0;
  while (start < output.size()) {
    const size_t end = std::min(output.find('\n', start), output.size());
    const std::string line = output.substr(start, end - start);
    if (!line.starts_with("tandem:") && !line.starts_with("repacking ")) return line;
    start = end + 1;
  }
  return "";
}

// `--repack`: the first run writes the repacked copy beside the model and loads it, the next
// loads it directly (the same tokens as the copy run by name), a changed model gets a new copy,
// and a CPU without AVX-512 runs the file as it is (no copy).
TEST_F(CliTest, RepackFlagMakesTheCopyOnceAndReusesItWhileTheModelIsUnchanged) {
  const std::filesystem::path model = dir_ / "model.gguf";
  const std::filesystem::path copy = dir_ / "model.tandem-r16.gguf";
  std::filesystem::copy_file(test::fixture("small-v3-Q4_K_M.gguf"), model);
  const std::string args = "run --temp 0 -n 8 -p 'Hello there' --repack " + model.string();
  ::setenv("TANDEM_ISA", "avx2", 1);
  const Result plain = run(args);
  ::unsetenv("TANDEM_ISA");
  ASSERT_EQ(plain.exit_code, 0) << plain.output;
  EXPECT_NE(plain.output.find("this CPU has no AVX-512"), std::string::npos) << plain.output;
  EXPECT_FALSE(std::filesystem::exists(copy));

  const Result first = run(args);
  ASSERT_EQ(first.exit_code, 0) << first.output;
  if (first.output.find("this CPU has no AVX-512") != std::string::npos)
    GTEST_SKIP() << "no AVX-512 here: --repack makes no copy";
  EXPECT_NE(first.output.find("--repack: wrote " + copy.string()), std::string::npos)
      << first.output;
  const Result inspect = run("inspect --json " + copy.string());
  ASSERT_EQ(inspect.exit_code, 0) << inspect.output;
  EXPECT_TRUE(nlohmann::json::parse(inspect.output)["formats"].contains("Q4_K_R16"));
  const Result second = run(args);
  ASSERT_EQ(second.exit_code, 0) << second.output;
  EXPECT_NE(second.output.find("--repack: loading " + copy.string()), std::string::npos)
      << second.output;
  EXPECT_EQ(second.output.find("--repack: wrote"), std::string::npos) << second.output;
  const Result by_name = run("run --temp 0 -n 8 -p 'Hello there' " + copy.string());
  EXPECT_EQ(generated_text(second.output), generated_text(by_name.output));
  EXPECT_EQ(generated_text(first.output), generated_text(by_name.output));

  // Another model under the same name: a copy of its own.
  std::filesystem::remove(model);
  std::filesystem::copy_file(test::fixture("small-v2-Q4_K_M.gguf"), model);
  const Result changed = run(args);
  ASSERT_EQ(changed.exit_code, 0) << changed.output;
  EXPECT_NE(changed.output.find("--repack: wrote " + copy.string()), std::string::npos)
      << changed.output;
}

// --repack-in-memory: the same copy made in RAM, nothing written beside the model, the same
// tokens as the copy on disk.
TEST_F(CliTest, RepackInMemoryRunsTheCopyWithoutWritingAFile) {
  const std::filesystem::path model = dir_ / "model.gguf";
  std::filesystem::copy_file(test::fixture("small-v3-Q4_K_M.gguf"), model);
  const std::string prompt = "run --temp 0 -n 8 -p 'Hello there' ";
  const Result in_memory = run(prompt + "--repack-in-memory " + model.string());
  ASSERT_EQ(in_memory.exit_code, 0) << in_memory.output;
  if (in_memory.output.find("this CPU has no AVX-512") != std::string::npos)
    GTEST_SKIP() << "no AVX-512 here: --repack-in-memory makes no copy";
  EXPECT_NE(in_memory.output.find("--repack-in-memory: repacked " + model.string() + " in RAM"),
            std::string::npos)
      << in_memory.output;
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir_), {}), 1);  // the model only
  const std::filesystem::path copy = dir_ / "copy.gguf";
  ASSERT_EQ(run("repack --no-progress " + model.string() + " " + copy.string()).exit_code, 0);
  EXPECT_EQ(generated_text(in_memory.output), generated_text(run(prompt + copy.string()).output));
  const Result both = run(prompt + "--repack --repack-in-memory " + model.string());
  EXPECT_NE(both.exit_code, 0);
  EXPECT_NE(both.output.find("choose one"), std::string::npos) << both.output;
}

TEST_F(CliTest, CorruptFileIsAOneLineErrorNamingTheFile) {
  const std::string path = (dir_ / "bad.gguf").string();
  std::ofstream(path) << "GGUF\x03garbage";
  const Result r = run("inspect " + path);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.output.rfind("tandem: error: ", 0), 0u) << r.output;
  EXPECT_NE(r.output.find("bad.gguf"), std::string::npos) << r.output;
  EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;
}

TEST_F(CliTest, MissingFileAndBadPresetAreErrors) {
  Result r = run("inspect " + (dir_ / "nope.gguf").string());
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("nope.gguf: cannot open"), std::string::npos) << r.output;
  r = run("gen-model --preset giant -o " + (dir_ / "x.gguf").string());
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("unknown preset 'giant'"), std::string::npos) << r.output;
}

TEST_F(CliTest, HelpNamesTheSubcommands) {
  const Result r = run("--help");
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_NE(r.output.find("inspect"), std::string::npos);
  EXPECT_NE(r.output.find("gen-model"), std::string::npos);
}

}  // namespace
}  // namespace tandem
