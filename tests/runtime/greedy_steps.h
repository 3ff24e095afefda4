#pragma once
// The runs the multi-device tests compare: the fixture prompt p1's first tokens as one batch
// (logits at every position), then greedy steps of one token each.
#include <algorithm>
#include <functional>
#include <span>
#include <vector>

#include "model/deepseek2.h"
#include "runtime/kv_cache.h"

namespace tandem::test {

inline const std::vector<int32_t> kPromptTokens = {0,  671, 645,  1193, 291, 1072,
                                                   80, 285, 1876, 597,  395};

// All the logits, prompt rows then one row per step. `around_step(false)` runs before each
// decode step and `around_step(true)` after it (a test's bookkeeping per step). `n_ctx`: the
// cache's length (what attention kernels size their key splits by).
inline std::vector<float> prompt_then_greedy(
    Deepseek2Model& model, std::span<Backend* const> layer_devices, int n_decode,
    const std::function<void(bool after)>& around_step = {}, int64_t n_ctx = 64) {
  const auto& hp = model.hparams();
  KvCache cache(layer_devices, model.info().kv, n_ctx, 1, 64);
  std::vector<int32_t> tokens = kPromptTokens, positions, seq(tokens.size(), 0), rows;
  for (size_t i = 0; i < tokens.size(); ++i)
    positions.push_back(int32_t(i)), rows.push_back(int32_t(i));
  std::vector<float> all(tokens.size() * hp.n_vocab);
  model.forward({.tokens = tokens, .positions = positions, .seq_ids = seq, .logit_rows = rows},
                cache.views(), all.data());
  for (int step = 0; step < n_decode; ++step) {
    const float* last = all.data() + all.size() - hp.n_vocab;
    const int32_t next = int32_t(std::max_element(last, last + hp.n_vocab) - last);
    const int32_t pos = int32_t(tokens.size()), zero = 0;
    tokens.push_back(next);
    std::vector<float> one(hp.n_vocab);
    if (around_step) around_step(false);
    model.forward({.tokens = {&tokens.back(), 1},
                   .positions = {&pos, 1},
                   .seq_ids = {&zero, 1},
                   .logit_rows = {&zero, 1}},
                  cache.views(), one.data());
    if (around_step) around_step(true);
    all.insert(all.end(), one.begin(), one.end());
  }
  return all;
}

}  // namespace tandem::test
