// `tandem bench` end to end on a fixture model: the JSON keys the issue names, and cold starts.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "cli_runner.h"
#include "test_support.h"

namespace tandem {
namespace {

// The JSON object in the output (stderr may hold log lines around it).
nlohmann::json json_in(const std::string& output) {
  const size_t open = output.find('{'), close = output.rfind('}');
  if (open == std::string::npos || close == std::string::npos) return nullptr;
  return nlohmann::json::parse(output.substr(open, close - open + 1), nullptr, false);
}

TEST(Bench, JsonHasTheMeasuredSpeedsAndTheirBounds) {
  const CliResult r = run_tandem("bench " + test::fixture("micro-v3-F32.gguf").string() + " -p 16 -n 4 -r 2 -t 2 --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const nlohmann::json j = json_in(r.output);
  ASSERT_TRUE(j.is_object()) << r.output;
  for (const char* key : {"prefill_tokens_per_s", "decode_tokens_per_s", "bandwidth_gb_per_s",
                          "decode_roofline_tokens_per_s", "decode_kernel_gb_per_s", "kernel_peak_gflops"})
    EXPECT_GT(j.value(key, 0.0), 0.0) << key << " in " << r.output;
  EXPECT_FALSE(j.contains("cold_start"));
  EXPECT_EQ(j.value("stream_experts_min_tokens", -1), 0) << "no GPU: nothing to stream to";
}

// --n-depth: the tests run after that many tokens of context, the name says so as llama-bench
// writes it, and the roofline counts the KV cache a decode step reads on top of the weights.
TEST(Bench, DepthPutsContextBeforeEachTest) {
  const std::string model = test::fixture("micro-v3-F32.gguf").string();
  const CliResult r = run_tandem("bench " + model + " -p 8 -n 4 -d 40 -r 1 -t 2 --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const nlohmann::json j = json_in(r.output);
  ASSERT_TRUE(j.is_object()) << r.output;
  EXPECT_EQ(j["n_depth"], 40);
  EXPECT_GT(j.value("decode_tokens_per_s", 0.0), 0.0);
  EXPECT_GT(j["kv_cache_bytes_read_per_token"].get<uint64_t>(), 0u);
  const CliResult table = run_tandem("bench " + model + " -p 8 -n 4 -d 40 -r 1 -t 2");
  ASSERT_EQ(table.exit_code, 0) << table.output;
  EXPECT_NE(table.output.find("tg4 @ d40"), std::string::npos) << table.output;
  EXPECT_NE(table.output.find("of KV cache per token"), std::string::npos) << table.output;
  // Without context the decode test reads only its own few rows (1.5 on average here).
  const CliResult none = run_tandem("bench " + model + " -p 8 -n 4 -r 1 -t 2 --json");
  EXPECT_EQ(json_in(none.output)["kv_cache_bytes_read_per_token"].get<uint64_t>() * 41,
            j["kv_cache_bytes_read_per_token"].get<uint64_t>())
      << none.output;
}

// -d 0,40 (a list, as llama-bench takes it): every test at each depth, a row each, and each
// depth's decode against the first's; the JSON's top-level figures are the first depth's.
TEST(Bench, DepthListRunsEveryTestAtEachDepth) {
  const std::string model = test::fixture("micro-v3-F32.gguf").string();
  const CliResult table = run_tandem("bench " + model + " -p 8 -n 4 -d 0,40 -r 2 -t 2");
  ASSERT_EQ(table.exit_code, 0) << table.output;
  for (const char* test : {"pp8 ", "pp8 @ d40", "tg4 ", "tg4 @ d40", "decode at depth 40: "})
    EXPECT_NE(table.output.find(test), std::string::npos) << test << " in " << table.output;
  const CliResult r = run_tandem("bench " + model + " -p 8 -n 4 -d 40,0 -r 1 -t 2 --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const nlohmann::json j = json_in(r.output);
  ASSERT_TRUE(j.is_object()) << r.output;
  EXPECT_EQ(j["n_depth"], 40);
  ASSERT_EQ(j["depths"].size(), 2u) << r.output;
  EXPECT_EQ(j["depths"][1]["n_depth"], 0);
  EXPECT_EQ(j["depths"][0]["decode_tokens_per_s"], j["decode_tokens_per_s"]);
  EXPECT_GT(j["depths"][1]["decode_tokens_per_s"].get<double>(), 0.0);
  EXPECT_NE(run_tandem("bench " + model + " -d 0,-3").exit_code, 0);
}

// --cache-type-k/v bf16: the same tests over a BF16 KV cache, which the output names.
TEST(Bench, Bf16CacheRunsTheDepthsAndSaysSo) {
  const std::string model = test::fixture("micro-v3-F32.gguf").string();
  const CliResult table = run_tandem(
      "bench " + model + " -p 8 -n 4 -d 0,40 -r 1 -t 2 --cache-type-k bf16 --cache-type-v bf16");
  ASSERT_EQ(table.exit_code, 0) << table.output;
  EXPECT_NE(table.output.find("decode at depth 40: "), std::string::npos) << table.output;
  EXPECT_NE(table.output.find("BF16 KV cache"), std::string::npos) << table.output;
  const CliResult r = run_tandem(
      "bench " + model + " -p 8 -n 4 -r 1 -t 2 --json --cache-type-k bf16 --cache-type-v bf16");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(json_in(r.output)["cache_type"], "BF16") << r.output;
  EXPECT_EQ(
      json_in(run_tandem("bench " + model + " -p 8 -n 4 -r 1 -t 2 --json").output)["cache_type"],
      "F32");
}

// A cold start needs the model's pages dropped from the page cache; where the filesystem keeps
// them (tmpfs, another process mapping the file) the command must say so, not report nonsense.
TEST(Bench, ColdStartsReportTheBytesTheyNeeded) {
  const std::string path = test::fixture("micro-v2-F32.gguf").string();
  const CliResult r = run_tandem("bench " + path + " -p 0 -n 0 -r 2 -t 2 --cold --json");
  if (r.exit_code != 0) {
    EXPECT_NE(r.output.find("stays in the page cache"), std::string::npos) << r.output;
    return;
  }
  const nlohmann::json j = json_in(r.output);
  ASSERT_TRUE(j.is_object()) << r.output;
  ASSERT_EQ(j["cold_start"].size(), 2u) << r.output;
  const uint64_t file_bytes = std::filesystem::file_size(path);
  for (const nlohmann::json& c : j["cold_start"]) {
    EXPECT_GT(c["touched_bytes"].get<uint64_t>(), 0u);
    EXPECT_LE(c["touched_bytes"].get<uint64_t>(), file_bytes);
    EXPECT_GT(c["first_token_s"].get<double>(), 0.0);
    EXPECT_GT(c["read_touched_s"].get<double>(), 0.0);
    EXPECT_GE(c["first_token_s_sd"].get<double>(), 0.0);  // two repetitions give a spread
    EXPECT_GE(c["read_touched_s_sd"].get<double>(), 0.0);
    EXPECT_GT(c["warm_first_token_s"].get<double>(), 0.0);
  }
  EXPECT_EQ(j["cold_start"][0]["prompt_tokens"], 1);
  EXPECT_EQ(j["cold_start"][1]["prompt_tokens"], 16);
}

}  // namespace
}  // namespace tandem
