// Sliding-window layers keep a ring of window + step rows per sequence (runtime/kv_cache.h):
// gpt-oss's even layers see 8 keys in the micro model. Evaluated in steps through a ring, the
// logits are those of a cache that keeps every position; a sequence cut back further than its
// ring still holds must start again.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "gguf/gguf_file.h"
#include "model/model.h"
#include "runtime/kv_cache.h"
#include "test_support.h"

namespace tandem {
namespace {

// Logits of every position of `tokens`, fed in steps of `step` through `cache`.
std::vector<float> logits_in_steps(Model& model, KvCache& cache, const std::vector<int32_t>& tokens,
                                   int64_t step) {
  const int64_t n_vocab = model.info().n_vocab;
  std::vector<float> all, logits;
  for (size_t first = 0; first < tokens.size(); first += size_t(step)) {
    const size_t n = std::min(size_t(step), tokens.size() - first);
    std::vector<int32_t> positions(n), seqs(n, 0), rows(n);
    for (size_t i = 0; i < n; ++i) positions[i] = int32_t(first + i), rows[i] = int32_t(i);
    logits.resize(n * size_t(n_vocab));
    model.forward({.tokens = std::span(tokens).subspan(first, n),
                   .positions = positions,
                   .seq_ids = seqs,
                   .logit_rows = rows},
                  cache.views(), logits.data());
    all.insert(all.end(), logits.begin(), logits.end());
  }
  return all;
}

TEST(WindowCache, RingOfWindowPlusStepGivesTheLogitsOfAFullCache) {
  const auto file = gguf::GgufFile::open(test::fixture("gpt-oss-micro-F32.gguf").string());
  cpu::CpuBackend cpu(2);
  const std::unique_ptr<Model> model = load_model(file, cpu);
  const ModelInfo& info = model->info();
  ASSERT_EQ(info.kv[0].window, 8);  // even layers slide, odd ones see everything
  ASSERT_EQ(info.kv[1].window, 0);
  std::mt19937 rng(1);
  std::vector<int32_t> tokens(200);
  for (int32_t& t : tokens) t = int32_t(rng() % 1500);
  const int64_t n_ctx = 256, step = 5;
  KvCache full(cpu, info.kv, n_ctx, 1, /*max_step_tokens=*/n_ctx);
  KvCache ring(cpu, info.kv, n_ctx, 1, step);
  EXPECT_EQ(ring.views()[0].n_ctx, 8 + step);  // the ring: window and one step
  EXPECT_TRUE(ring.views()[0].ring);
  EXPECT_EQ(ring.views()[1].n_ctx, n_ctx);
  EXPECT_LT(ring.bytes(), full.bytes());
  const std::vector<float> want = logits_in_steps(*model, full, tokens, step);
  const std::vector<float> got = logits_in_steps(*model, ring, tokens, step);
  ASSERT_EQ(got.size(), want.size());
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i)
    worst = std::max(worst, double(std::abs(got[i] - want[i])));
  EXPECT_LT(worst, 1e-3);  // the same keys, summed in blocks cut at the ring's end
}

TEST(WindowCache, ASequenceMayBeCutBackOnlyAsFarAsItsRingHolds) {
  const std::vector<KvLayerShape> layers = {{.k_dims = 4, .v_dims = 4, .window = 8},
                                            {.k_dims = 4, .v_dims = 4}};
  cpu::CpuBackend cpu(1);
  KvCache cache(cpu, layers, 1000, 1, 16);  // ring of 24 rows
  EXPECT_TRUE(cache.has_rings());
  EXPECT_EQ(cache.earliest_rewind(10), 0);
  // 100 positions stored: rows of 76..99 are in the ring; continuing at p needs p-7 .. p-1.
  EXPECT_EQ(cache.earliest_rewind(100), 83);
  KvCache plain(cpu, std::vector<KvLayerShape>{{.k_dims = 4, .v_dims = 4}}, 1000, 1, 16);
  EXPECT_FALSE(plain.has_rings());
  EXPECT_EQ(plain.earliest_rewind(100), 0);
}

}  // namespace
}  // namespace tandem
