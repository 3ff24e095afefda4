// Batch invariance (what a server that batches unrelated requests needs): with the kernel choice
// fixed per kind of step (prompt steps Tiled, decode steps PerToken), a sequence's logits are
// bit-identical whether it runs alone or shares every step with seven others that joined at
// different times, with prompts of different lengths.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>

#include "backends/cpu/cpu_backend.h"
#include "gguf/gguf_file.h"
#include "model/deepseek2.h"
#include "runtime/kv_cache.h"
#include "test_support.h"

namespace tandem {
namespace {

constexpr int kSequences = 8, kDecodeSteps = 5;

std::vector<int32_t> prompt_of(int seq) {
  // Lengths 3..24: below and above the 8-token threshold of the tiled kernels and past a tile.
  std::vector<int32_t> tokens;
  for (int i = 0; i < 3 + seq * 3; ++i) tokens.push_back(int32_t(7 + (seq * 131 + i * 37) % 900));
  return tokens;
}

// Runs sequences through one model and cache, step by step, recording each sequence's logits
// rows in order. A step either takes the whole prompt of some sequences (Tiled) or one greedy
// token of every sequence that has finished its prompt (PerToken).
class Stepper {
 public:
  Stepper(const gguf::GgufFile& file, Backend& backend)
      : model_(file, backend), cache_(backend, model_.info().kv, 64, kSequences, 64) {}

  void prompts(const std::vector<int>& seqs) {
    std::vector<int32_t> tokens, positions, seq_ids, rows;
    for (int s : seqs) {
      const std::vector<int32_t> prompt = prompt_of(s);
      for (size_t i = 0; i < prompt.size(); ++i)
        tokens.push_back(prompt[i]), positions.push_back(int32_t(i)), seq_ids.push_back(s);
      rows.push_back(int32_t(tokens.size()) - 1);
      length_[s] = int32_t(prompt.size());
    }
    run(tokens, positions, seq_ids, rows, seqs, KernelChoice::Tiled);
  }

  void decode() {
    std::vector<int32_t> tokens, positions, seq_ids, rows;
    std::vector<int> seqs;
    for (auto& [s, length] : length_) {
      const std::vector<float>& last = logits_[s].back();
      tokens.push_back(int32_t(std::max_element(last.begin(), last.end()) - last.begin()));
      positions.push_back(length++);
      seq_ids.push_back(s);
      rows.push_back(int32_t(rows.size()));
      seqs.push_back(s);
    }
    run(tokens, positions, seq_ids, rows, seqs, KernelChoice::PerToken);
  }

  const std::vector<std::vector<float>>& logits(int seq) { return logits_[seq]; }

 private:
  void run(const std::vector<int32_t>& tokens, const std::vector<int32_t>& positions,
           const std::vector<int32_t>& seq_ids, const std::vector<int32_t>& rows, const std::vector<int>& seqs,
           KernelChoice kernels) {
    const size_t n_vocab = model_.hparams().n_vocab;
    std::vector<float> out(rows.size() * n_vocab);
    model_.forward({.tokens = tokens, .positions = positions, .seq_ids = seq_ids, .logit_rows = rows,
                    .kernels = kernels},
                   cache_.views(), out.data());
    for (size_t r = 0; r < rows.size(); ++r)
      logits_[seqs[r]].emplace_back(out.begin() + std::ptrdiff_t(r * n_vocab),
                                    out.begin() + std::ptrdiff_t((r + 1) * n_vocab));
  }

  Deepseek2Model model_;
  KvCache cache_;
  std::map<int, int32_t> length_;  // sequences past their prompt: tokens in the cache
  std::map<int, std::vector<std::vector<float>>> logits_;
};

class BatchInvariance : public ::testing::TestWithParam<const char*> {};

TEST_P(BatchInvariance, ASequenceGetsTheSameLogitsAloneAndAmongSevenOthers) {
  const gguf::GgufFile file = gguf::GgufFile::open(test::fixture(GetParam()).string());
  cpu::CpuBackend cpu(2);

  // Together: four sequences start, decode twice, four more join, then all decode together.
  Stepper together(file, cpu);
  together.prompts({0, 1, 2, 3});
  together.decode();
  together.decode();
  together.prompts({4, 5, 6, 7});
  for (int step = 0; step < kDecodeSteps; ++step) together.decode();

  for (int s = 0; s < kSequences; ++s) {
    Stepper alone(file, cpu);
    alone.prompts({s});
    const size_t steps = together.logits(s).size() - 1;
    for (size_t step = 0; step < steps; ++step) alone.decode();
    ASSERT_EQ(alone.logits(s).size(), together.logits(s).size());
    for (size_t step = 0; step < alone.logits(s).size(); ++step) {
      const std::vector<float>& a = alone.logits(s)[step];
      const std::vector<float>& b = together.logits(s)[step];
      EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0)
          << "sequence " << s << ", step " << step << " (0 = prompt): logits differ alone and batched";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, BatchInvariance,
                         ::testing::Values("small-v2-Q4_K_M.gguf", "small-v3-Q4_K_M.gguf"),
                         [](const auto& info) {
                           std::string name = info.param;
                           name = name.substr(0, name.find(".gguf"));
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

}  // namespace
}  // namespace tandem
