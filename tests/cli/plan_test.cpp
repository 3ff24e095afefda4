// `tandem plan` end to end: exit codes, the JSON fields scripts rely on, and rule-file output.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "cli_runner.h"
#include "test_support.h"

namespace tandem {
namespace {

TEST(Plan, FittingPresetExitsZeroWithTheJsonFields) {
  const CliResult r = run_tandem("plan --preset deepseek-v3 --quant Q4_K_M --gpu 24GiB --ram 512GiB --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto json = nlohmann::json::parse(r.output);
  EXPECT_TRUE(json["fits"].get<bool>());
  ASSERT_GE(json["devices"].size(), 2u);
  for (const auto& device : json["devices"])
    EXPECT_LE(device["used_bytes"].get<uint64_t>(), device["capacity_bytes"].get<uint64_t>()) << device;
  EXPECT_GT(json["predicted"]["decode_tokens_per_s"].get<double>(), 0.0);
  EXPECT_GT(json["predicted"]["prefill_tokens_per_s"].get<double>(), 0.0);
  EXPECT_TRUE(json["problems"].empty());
}

// A BF16 KV cache is planned at its own size on a CPU-only machine, and refused with GPUs (the
// CUDA backend's cache is F32: `run` would refuse the plan).
TEST(Plan, ABf16CacheHalvesTheKvCacheAndIsRefusedWithGpus) {
  const std::string base = "plan --preset deepseek-coder-v2-lite --ram 64GiB --ctx 32768 --json";
  const CliResult f32 = run_tandem(base);
  const CliResult bf16 = run_tandem(base + " --cache-type-k bf16 --cache-type-v bf16");
  ASSERT_EQ(f32.exit_code, 0) << f32.output;
  ASSERT_EQ(bf16.exit_code, 0) << bf16.output;
  const auto a = nlohmann::json::parse(f32.output), b = nlohmann::json::parse(bf16.output);
  EXPECT_EQ(b["workload"]["cache_type"], "BF16") << b["workload"];
  EXPECT_EQ(2 * b["devices"][0]["kv_bytes"].get<uint64_t>(),
            a["devices"][0]["kv_bytes"].get<uint64_t>());
  const CliResult gpu = run_tandem(base + " --gpu 24GiB --cache-type-k bf16 --cache-type-v bf16");
  EXPECT_NE(gpu.exit_code, 0);
  EXPECT_NE(gpu.output.find("KV cache in F32"), std::string::npos) << gpu.output;
  const CliResult mixed = run_tandem(base + " --cache-type-k bf16");
  EXPECT_NE(mixed.exit_code, 0);
  EXPECT_NE(mixed.output.find("give both the same"), std::string::npos) << mixed.output;
}

// --host-bandwidth describes the host's memory: its prediction comes from it even where the rest
// of the machine is this one (no --gpu or --ram). Before, this machine's measured decode kernel
// rate, which the cost model prefers to the bandwidth, replaced it: lite on "16 cores at 80 GB/s"
// was predicted at 1 token/s from a 2-core machine's busy measurement, and at the same speed
// whatever bandwidth was given.
TEST(Plan, AGivenHostBandwidthSetsTheHostsPredictionOnThisMachine) {
  const test::ScopedCacheDir cache("plan");  // this machine's rates measured into its own folder
  const std::string base =
      "plan --preset deepseek-v2-lite --quant IQ1_S --cpu-cores 16 --json --host-bandwidth ";
  const CliResult slow = run_tandem(base + "40"), fast = run_tandem(base + "80");
  ASSERT_EQ(slow.exit_code, 0) << slow.output;
  ASSERT_EQ(fast.exit_code, 0) << fast.output;
  const auto a = nlohmann::json::parse(slow.output), b = nlohmann::json::parse(fast.output);
  if (a["devices"].size() != 1) GTEST_SKIP() << "GPUs here: the plan puts the model on them";
  // A CPU decode step is nearly all weight reads: twice the bandwidth, close to twice the speed.
  EXPECT_GT(b["predicted"]["decode_tokens_per_s"].get<double>(),
            1.3 * a["predicted"]["decode_tokens_per_s"].get<double>());
}

TEST(Plan, ModelThatDoesNotFitExitsThreeAndSaysWhatWould) {
  const CliResult r = run_tandem("plan --preset deepseek-coder-v2 --gpu 24GiB --gpu 24GiB --ram 64GiB");
  EXPECT_EQ(r.exit_code, 3) << r.output;
  EXPECT_NE(r.output.find("GiB"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("Q2_K"), std::string::npos) << r.output;
}

TEST(Plan, JsonListsTheCandidatesWithOneChosenAndTheMachinesLinkAndReserve) {
  const std::string gpus = " --gpu a100-80g --gpu a100-80g --gpu a100-80g --gpu a100-80g";
  const CliResult r = run_tandem("plan --preset deepseek-v3" + gpus + gpus +
                                 " --ram 1TiB --link nvlink --ram-reserve 64GiB --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto json = nlohmann::json::parse(r.output);
  ASSERT_GE(json["candidates"].size(), 2u);
  EXPECT_EQ(json["candidates"][0]["name"], "layer split");
  int chosen = 0;
  double best = 0;
  for (const auto& c : json["candidates"]) {
    chosen += c["chosen"].get<bool>();
    best = std::max(best, c["decode_tokens_per_s"].get<double>());
    EXPECT_GT(c["prefill_tokens_per_s"].get<double>(), 0.0) << c;
  }
  EXPECT_EQ(chosen, 1);
  EXPECT_DOUBLE_EQ(json["predicted"]["decode_tokens_per_s"].get<double>(), best);
  EXPECT_EQ(json["machine"]["gpu_link"], "nvlink");
  EXPECT_EQ(json["machine"]["link_source"], "given");
  EXPECT_EQ(json["machine"]["ram_reserve_bytes"].get<uint64_t>(), uint64_t(64) << 30);
  EXPECT_EQ(json["devices"][0]["capacity_bytes"].get<uint64_t>(), uint64_t(1024 - 64) << 30);
  EXPECT_FALSE(json["explanation"].empty());
}

TEST(Plan, ExplainShowsTheCandidatesAndWhyPcieIsSlower) {
  const std::string gpus = " --gpu a100-80g --gpu a100-80g --gpu a100-80g --gpu a100-80g";
  const CliResult r =
      run_tandem("plan --preset deepseek-v3" + gpus + gpus + " --ram 1TiB --explain");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("candidates weighed"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("layer split"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("expert parallel over"), std::string::npos) << r.output;
  // No --link: PCIe 4 is assumed, and said; the explanation says what NVLink would give.
  EXPECT_NE(r.output.find("assumed PCIe 4"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("over NVLink, which would predict"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("kept free for the system"), std::string::npos) << r.output;
  const CliResult bad =
      run_tandem("plan --preset deepseek-v3 --gpu 24GiB --ram 512GiB --link pcie3");
  EXPECT_NE(bad.exit_code, 0);
  const CliResult bad_reserve =
      run_tandem("plan --preset deepseek-v3 --gpu 24GiB --ram 512GiB --ram-reserve lots");
  EXPECT_EQ(bad_reserve.exit_code, 1) << bad_reserve.output;
  EXPECT_NE(bad_reserve.output.find("--ram-reserve 'lots'"), std::string::npos)
      << bad_reserve.output;
}

// Issue 32's acceptance: V3 at 8 bits over two 8xA100 machines fits, beats one machine, and
// prints each candidate with its speed; Kimi-K2 at Q4_K_M on two machines of 8x48 GiB too; a plan
// that does not fit says how many machines would.
TEST(Plan, NodesPlanOverSeveralMachinesAndSayHowManyWouldFit) {
  std::string a100s, gpus48;
  for (int i = 0; i < 8; ++i) a100s += " --gpu a100-80g", gpus48 += " --gpu 48GiB";
  const std::string host = " --ram 1TiB --cpu-cores 64 --host-bandwidth 200 --link nvlink";
  auto decode = [](const CliResult& r) {
    return nlohmann::json::parse(r.output)["predicted"]["decode_tokens_per_s"].get<double>();
  };
  const CliResult v3_one =
      run_tandem("plan --preset deepseek-v3 --quant Q8_0" + a100s + host + " --json");
  const CliResult v3_two =
      run_tandem("plan --preset deepseek-v3 --quant Q8_0" + a100s + host + " --nodes 2 --json");
  ASSERT_EQ(v3_two.exit_code, 0) << v3_two.output;
  EXPECT_GT(decode(v3_two), decode(v3_one));
  EXPECT_EQ(nlohmann::json::parse(v3_two.output)["machine"]["nodes"], 2);
  const CliResult text =
      run_tandem("plan --preset deepseek-v3 --quant Q8_0" + a100s + host + " --nodes 2");
  EXPECT_NE(text.output.find("candidates weighed"), std::string::npos) << text.output;
  EXPECT_NE(text.output.find("pipeline: layer split"), std::string::npos) << text.output;
  EXPECT_NE(text.output.find("node1:cuda:7"), std::string::npos) << text.output;

  const CliResult kimi_one =
      run_tandem("plan --preset kimi-k2 --quant Q4_K_M" + gpus48 + host + " --json");
  const CliResult kimi_two =
      run_tandem("plan --preset kimi-k2 --quant Q4_K_M" + gpus48 + host + " --nodes 2 --json");
  ASSERT_EQ(kimi_two.exit_code, 0) << kimi_two.output;
  EXPECT_GT(decode(kimi_two), decode(kimi_one));

  const CliResult short_of_ram =
      run_tandem("plan --preset kimi-k2 --quant Q8_0" + gpus48 + " --ram 256GiB --link nvlink");
  EXPECT_EQ(short_of_ram.exit_code, 3) << short_of_ram.output;
  // Two such machines hold it: the second's RAM too.
  EXPECT_NE(short_of_ram.output.find("it would fit on 2 machines like this one (plan --nodes 2)"),
            std::string::npos)
      << short_of_ram.output;
}

// A cluster file of two like machines plans what --nodes 2 plans; one of unlike machines names
// each machine's GPUs; it stands instead of --gpu and the other machine options.
TEST(Plan, ClusterFilePlansLikeNodesAndTakesUnlikeMachines) {
  const auto dir = std::filesystem::temp_directory_path();
  const auto like = dir / ("tandem-cluster-like-" + std::to_string(::getpid()) + ".yaml");
  const auto unlike = dir / ("tandem-cluster-unlike-" + std::to_string(::getpid()) + ".yaml");
  std::ofstream(like) << "machines:\n"
                         "  - {gpus: [8x a100-80g], link: nvlink, ram: 1TiB, cpu_cores: 64,"
                         " host_bandwidth: 200}\n"
                         "  - {gpus: [8x a100-80g], link: nvlink}\n";
  std::ofstream(unlike) << "machines:\n"
                           "  - {gpus: [4090, 4090], ram: 256GiB, host_bandwidth: 80}\n"
                           "  - {gpus: [8x 48GiB], link: pcie5}\n"
                           "network: eth100\n";
  std::string a100s;
  for (int i = 0; i < 8; ++i) a100s += " --gpu a100-80g";
  auto decode = [](const CliResult& r) {
    return nlohmann::json::parse(r.output)["predicted"]["decode_tokens_per_s"].get<double>();
  };
  const CliResult nodes = run_tandem("plan --preset deepseek-v3 --quant Q8_0" + a100s +
                                     " --ram 1TiB --cpu-cores 64 --host-bandwidth 200 --link "
                                     "nvlink --nodes 2 --json");
  const CliResult file =
      run_tandem("plan --preset deepseek-v3 --quant Q8_0 --cluster " + like.string() + " --json");
  ASSERT_EQ(file.exit_code, 0) << file.output;
  EXPECT_DOUBLE_EQ(decode(file), decode(nodes));
  EXPECT_EQ(nlohmann::json::parse(file.output)["machine"]["nodes"], 2);

  const CliResult mixed =
      run_tandem("plan --preset kimi-k2 --quant Q4_K_M --cluster " + unlike.string());
  EXPECT_EQ(mixed.exit_code, 0) << mixed.output;
  EXPECT_NE(mixed.output.find("node1:cuda:7 "), std::string::npos) << mixed.output;
  EXPECT_NE(mixed.output.find("given: eth100"), std::string::npos) << mixed.output;
  EXPECT_NE(mixed.output.find("candidates weighed"), std::string::npos) << mixed.output;

  const CliResult both =
      run_tandem("plan --preset kimi-k2 --gpu 4090 --cluster " + unlike.string());
  EXPECT_NE(both.exit_code, 0);
  EXPECT_NE(both.output.find("excludes"), std::string::npos) << both.output;
  std::filesystem::remove(like);
  std::filesystem::remove(unlike);
}

TEST(Plan, RulesOutWritesAFileThatPlansTheSame) {
  const auto rules = std::filesystem::temp_directory_path() / ("tandem-rules-" + std::to_string(::getpid()) + ".yaml");
  const std::string model = test::fixture("small-v3-Q4_K_M.gguf").string();
  const CliResult first = run_tandem("plan " + model + " --gpu 1GiB --ram 1GiB --json --rules-out " + rules.string());
  ASSERT_EQ(first.exit_code, 0) << first.output;
  const CliResult second = run_tandem("plan " + model + " --gpu 1GiB --ram 1GiB --json --rules " + rules.string());
  ASSERT_EQ(second.exit_code, 0) << second.output;
  // The note about the written file goes to stderr, which the runner merges: take the object.
  auto object = [](const std::string& out) {
    const size_t begin = out.find('{'), end = out.rfind('}');
    return nlohmann::json::parse(out.substr(begin, end - begin + 1));
  };
  const auto a = object(first.output), b = object(second.output);
  EXPECT_EQ(a["devices"], b["devices"]);
  std::filesystem::remove(rules);
}

}  // namespace
}  // namespace tandem
