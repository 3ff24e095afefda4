// What a cold start must read: every weight the model binds, but of the routed experts only the
// chosen ones and none of the embedding table. Checked against the file's own tensor list and
// the routing the engine counted, so a missed tensor or a wrong expert offset fails.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>

#include "gguf/gguf_file.h"
#include "runtime/engine.h"
#include "test_support.h"

namespace tandem {
namespace {

class TouchedRanges : public testing::TestWithParam<const char*> {};

TEST_P(TouchedRanges, AreTheDenseWeightsAndExactlyTheChosenExperts) {
  Engine engine({.model_path = test::fixture(GetParam()).string(), .n_threads = 2, .n_ctx = 64});
  const gguf::GgufFile& file = engine.file();
  std::vector<float> logits;
  const std::vector<int32_t> prompt = {0, 671, 645, 1193};
  engine.evaluate(prompt, 0, 0, false, logits);

  // Expected, from the file's tensor list: (file, offset) -> bytes.
  const auto counts = engine.routing_profile().counts;
  const bool tied = file.find_tensor("output.weight") == nullptr;
  std::map<std::pair<uint32_t, uint64_t>, uint64_t> expected;
  size_t chosen = 0;
  for (const gguf::TensorInfo& t : file.tensors()) {
    if (t.name == "token_embd.weight" && !tied) continue;
    if (t.name.find("_exps.weight") == std::string::npos) {
      expected[{t.file_index, t.file_offset}] = t.n_bytes;
      continue;
    }
    const size_t layer = std::stoul(t.name.substr(4));  // "blk.N.ffn_..._exps.weight"
    const uint64_t matrix = t.n_bytes / t.shape[2];
    for (size_t e = 0; e < counts[layer].size(); ++e)
      if (counts[layer][e] > 0) {
        expected[{t.file_index, t.file_offset + e * matrix}] = matrix;
        ++chosen;
      }
  }
  ASSERT_GT(chosen, 0u);

  std::map<std::pair<uint32_t, uint64_t>, uint64_t> touched;
  for (const gguf::FileRange& r : engine.touched_file_ranges()) {
    EXPECT_TRUE(touched.emplace(std::pair(r.file_index, r.offset), r.bytes).second)
        << "range at " << r.offset << " listed twice";
  }
  EXPECT_EQ(touched, expected);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, TouchedRanges,
                         testing::Values("small-v2-Q4_K_M.gguf", "small-v3-Q4_K_M.gguf"),
                         [](const auto& info) {
                           std::string name = info.param;
                           std::replace_if(name.begin(), name.end(), [](char c) { return !std::isalnum(c); }, '_');
                           return name;
                         });

}  // namespace
}  // namespace tandem
