#include "text/sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <vector>

#include "core/error.h"

namespace tandem {
namespace {

SamplerParams greedy_params() {
  SamplerParams p;
  p.temperature = 0;
  return p;
}

int32_t sample_once(const SamplerParams& params, const std::vector<float>& logits) {
  Sampler sampler(params, int32_t(logits.size()));
  return sampler.sample(logits);
}

// Expects construction with `params` to fail with a message naming `name`.
void expect_rejected(const SamplerParams& params, const std::string& name) {
  try {
    Sampler sampler(params, 10);
    ADD_FAILURE() << name << " was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(name), std::string::npos) << e.what();
  }
}

TEST(Sampler, GreedyIsArgmaxWithTiesToLowestId) {
  EXPECT_EQ(sample_once(greedy_params(), {0.1f, 3.0f, -2.0f, 2.9f}), 1);
  EXPECT_EQ(sample_once(greedy_params(), {1.0f, 5.0f, 5.0f, 5.0f}), 1);
  EXPECT_EQ(sample_once(greedy_params(), {7.0f, 7.0f}), 0);
}

TEST(Sampler, GreedyIgnoresFiltersAndNaN) {
  SamplerParams p = greedy_params();
  p.top_k = 2;
  p.top_p = 0.5f;
  p.min_p = 0.3f;
  EXPECT_EQ(sample_once(p, {NAN, 1.0f, 4.0f, NAN}), 2);
}

TEST(Sampler, TinyTemperatureMatchesGreedy) {
  const std::vector<float> logits = {0.5f, 2.0f, 1.9f, -1.0f, 1.99f, 1.95f};
  const int32_t greedy = sample_once(greedy_params(), logits);
  ASSERT_EQ(greedy, 1);
  SamplerParams p;
  p.temperature = 1e-4f;  // the runner-up's weight is exp(-0.01 / 1e-4) = exp(-100)
  p.seed = 11;
  Sampler sampler(p, int32_t(logits.size()));
  for (int i = 0; i < 200; ++i) EXPECT_EQ(sampler.sample(logits), greedy);
}

TEST(Sampler, TopKOneIsAlwaysArgmax) {
  SamplerParams p;
  p.top_k = 1;
  p.temperature = 5.0f;
  p.seed = 3;
  const std::vector<float> logits = {1.0f, 1.2f, 1.1f, 0.9f, 1.19f};
  Sampler sampler(p, int32_t(logits.size()));
  for (int i = 0; i < 500; ++i) EXPECT_EQ(sampler.sample(logits), 1);
}

TEST(Sampler, TopKKeepsOnlyTheKBest) {
  SamplerParams p;
  p.top_k = 2;
  p.temperature = 10.0f;  // nearly uniform among survivors
  p.seed = 5;
  const std::vector<float> logits = {0.0f, 3.0f, 1.0f, 2.9f, 2.0f};
  Sampler sampler(p, int32_t(logits.size()));
  int seen[5] = {};
  for (int i = 0; i < 2000; ++i) ++seen[sampler.sample(logits)];
  EXPECT_EQ(seen[0] + seen[2] + seen[4], 0);
  EXPECT_GT(seen[1], 800);
  EXPECT_GT(seen[3], 800);
}

TEST(Sampler, TinyTopPIsArgmax) {
  SamplerParams p;
  p.top_p = 1e-6f;
  p.temperature = 3.0f;
  p.seed = 9;
  std::vector<float> logits(1000);
  for (size_t i = 0; i < logits.size(); ++i) logits[i] = float((i * 37) % 101) * 0.01f;
  logits[640] = 1.5f;
  Sampler sampler(p, int32_t(logits.size()));
  for (int i = 0; i < 300; ++i) EXPECT_EQ(sampler.sample(logits), 640);
}

TEST(Sampler, TopPKeepsTheSmallestHeadReachingP) {
  // Probabilities 0.5, 0.3, 0.2 (untempered). top_p = 0.75 keeps {0, 1}; temperature is
  // applied afterwards and only reshapes the draw among them.
  const std::vector<float> logits = {std::log(0.5f), std::log(0.3f), std::log(0.2f)};
  SamplerParams p;
  p.top_p = 0.75f;
  p.temperature = 4.0f;
  p.seed = 21;
  Sampler sampler(p, 3);
  int seen[3] = {};
  for (int i = 0; i < 3000; ++i) ++seen[sampler.sample(logits)];
  EXPECT_EQ(seen[2], 0);
  EXPECT_GT(seen[0], 0);
  EXPECT_GT(seen[1], 0);
}

TEST(Sampler, TopPOverALargeVocabularyFindsTheHead) {
  // Vocabulary of DeepSeek size, without top_k: the incremental ranking must reach far enough.
  const int32_t n_vocab = 129280;
  std::vector<float> logits(size_t(n_vocab), 0.0f);
  for (int32_t i = 0; i < 1000; ++i) logits[size_t((i * 7919) % n_vocab)] = 6.0f;
  // 1000 tokens with weight e^6 against 128280 with weight 1: the head holds ~75.9% of the mass.
  SamplerParams p;
  p.top_p = 0.7f;
  p.seed = 4;
  Sampler sampler(p, n_vocab);
  for (int i = 0; i < 200; ++i) EXPECT_EQ(logits[size_t(sampler.sample(logits))], 6.0f);
}

TEST(Sampler, TopPWithoutTopKKeepsExactlyTheSortedHead) {
  // Ten strong tokens scattered over a 20000-token vocabulary of weak ones. The expected set is
  // computed here by sorting everything; the sampler must reach it without a full sort.
  const int32_t n_vocab = 20000;
  std::vector<float> logits(static_cast<size_t>(n_vocab));
  uint64_t state = 77;
  for (float& l : logits) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    l = -5.0f + 5.0f * float(state >> 40) / float(1 << 24);
  }
  for (int j = 0; j < 10; ++j) logits[size_t((j * 1999 + 123) % n_vocab)] = 10.0f - 0.1f * j;
  const float top_p = 0.5f;

  std::vector<int32_t> order(static_cast<size_t>(n_vocab));
  for (int32_t i = 0; i < n_vocab; ++i) order[size_t(i)] = i;
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return logits[size_t(a)] != logits[size_t(b)] ? logits[size_t(a)] > logits[size_t(b)] : a < b;
  });
  double total = 0;
  for (float l : logits) total += std::exp(double(l) - 10.0);
  std::set<int32_t> expected;
  double cumulative = 0;
  for (int32_t id : order) {
    expected.insert(id);
    cumulative += std::exp(double(logits[size_t(id)]) - 10.0);
    if (cumulative >= top_p * total) break;
  }
  ASSERT_GE(expected.size(), 3u);

  SamplerParams p;
  p.top_p = top_p;
  p.seed = 99;
  Sampler sampler(p, n_vocab);
  std::set<int32_t> drawn;
  for (int i = 0; i < 1000; ++i) drawn.insert(sampler.sample(logits));
  EXPECT_EQ(drawn, expected);
}

TEST(Sampler, MinPFiltersRelativeToTheBest) {
  // Relative probabilities 1, 0.5, 0.05: min_p 0.1 removes the last one.
  const std::vector<float> logits = {0.0f, std::log(0.5f), std::log(0.05f)};
  SamplerParams p;
  p.min_p = 0.1f;
  p.temperature = 5.0f;
  p.seed = 8;
  Sampler sampler(p, 3);
  int seen[3] = {};
  for (int i = 0; i < 3000; ++i) ++seen[sampler.sample(logits)];
  EXPECT_EQ(seen[2], 0);
  EXPECT_GT(seen[1], 0);
}

TEST(Sampler, RepeatPenaltyDividesPositiveAndMultipliesNegative) {
  SamplerParams p = greedy_params();
  p.repeat_penalty = 2.0f;
  {
    // 3.0 / 2 = 1.5 < 2.0: the repeated positive logit loses.
    Sampler sampler(p, 3);
    sampler.accept(0);
    EXPECT_EQ(sampler.sample(std::vector<float>{3.0f, 2.0f, -5.0f}), 1);
  }
  {
    // -1 * 2 = -2 < -1.5: a repeated negative logit becomes more negative.
    Sampler sampler(p, 3);
    sampler.accept(0);
    EXPECT_EQ(sampler.sample(std::vector<float>{-1.0f, -1.5f, -9.0f}), 1);
  }
}

TEST(Sampler, PresenceAndFrequencyFollowTheOpenAIFormula) {
  // logit -= presence * (count > 0) + frequency * count
  const std::vector<float> logits = {5.0f, 4.0f, 3.2f};
  SamplerParams p = greedy_params();
  p.presence_penalty = 0.5f;
  {
    Sampler sampler(p, 3);
    sampler.accept(std::vector<int32_t>{0, 0, 0, 1});
    // 4.5, 3.5, 3.2: presence alone does not overturn the lead.
    EXPECT_EQ(sampler.sample(logits), 0);
  }
  p.frequency_penalty = 0.6f;
  {
    Sampler sampler(p, 3);
    sampler.accept(std::vector<int32_t>{0, 0, 0, 1});
    // 5 - 0.5 - 1.8 = 2.7, 4 - 0.5 - 0.6 = 2.9, 3.2: the unseen token wins.
    EXPECT_EQ(sampler.sample(logits), 2);
  }
}

TEST(Sampler, PenaltiesOnlySeeTheLastNTokens) {
  SamplerParams p = greedy_params();
  p.frequency_penalty = 2.0f;
  p.repeat_last_n = 3;
  Sampler sampler(p, 4);
  const std::vector<float> logits = {1.0f, 0.5f, 0.0f, 0.0f};
  sampler.accept(0);
  EXPECT_EQ(sampler.sample(logits), 1);  // 0 penalised to -1
  sampler.accept(std::vector<int32_t>{2, 3, 2});
  EXPECT_EQ(sampler.sample(logits), 0);  // 0 has left the window
  sampler.reset();
  EXPECT_EQ(sampler.sample(logits), 0);
}

TEST(Sampler, SameSeedSameDrawsDifferentSeedDifferentDraws) {
  std::vector<float> logits(50);
  for (size_t i = 0; i < logits.size(); ++i) logits[i] = float(i % 7) * 0.3f;
  SamplerParams p;
  p.seed = 1234;
  Sampler a(p, 50), b(p, 50);
  p.seed = 1235;
  Sampler c(p, 50);
  std::vector<int32_t> draws_a, draws_c;
  for (int i = 0; i < 1000; ++i) {
    const int32_t ta = a.sample(logits);
    EXPECT_EQ(ta, b.sample(logits));
    draws_a.push_back(ta);
    draws_c.push_back(c.sample(logits));
  }
  EXPECT_NE(draws_a, draws_c);
  a.reset();
  for (int i = 0; i < 1000; ++i) ASSERT_EQ(a.sample(logits), draws_a[size_t(i)]) << i;
}

TEST(Sampler, DrawsFollowTheTemperedSoftmax) {
  const std::vector<float> logits = {1.0f, 0.2f, -0.5f, 2.0f, 0.0f};
  const float temperature = 0.7f;
  SamplerParams p;
  p.temperature = temperature;
  p.seed = 20240607;
  Sampler sampler(p, 5);
  const int n_draws = 20000;
  int seen[5] = {};
  for (int i = 0; i < n_draws; ++i) ++seen[sampler.sample(logits)];

  double z = 0;
  for (float l : logits) z += std::exp(double(l) / temperature);
  for (size_t i = 0; i < logits.size(); ++i) {
    const double prob = std::exp(double(logits[i]) / temperature) / z;
    const double standard_error = std::sqrt(prob * (1 - prob) / n_draws);
    EXPECT_NEAR(double(seen[i]) / n_draws, prob, 4 * standard_error) << "token " << i;
  }
}

TEST(Sampler, RejectsOutOfRangeParameters) {
  SamplerParams p;
  p.temperature = -0.1f;
  expect_rejected(p, "temperature");
  p = {};
  p.temperature = INFINITY;
  expect_rejected(p, "temperature");
  p = {};
  p.top_k = -1;
  expect_rejected(p, "top_k");
  p = {};
  p.top_p = 0.0f;
  expect_rejected(p, "top_p");
  p.top_p = 1.5f;
  expect_rejected(p, "top_p");
  p = {};
  p.min_p = -0.1f;
  expect_rejected(p, "min_p");
  p = {};
  p.repeat_penalty = 0.0f;
  expect_rejected(p, "repeat_penalty");
  p = {};
  p.repeat_last_n = -1;
  expect_rejected(p, "repeat_last_n");
  p = {};
  p.presence_penalty = 2.5f;
  expect_rejected(p, "presence_penalty");
  p = {};
  p.frequency_penalty = NAN;
  expect_rejected(p, "frequency_penalty");
  try {
    p = {};
    p.top_p = 2.0f;
    validate(p);
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("(0, 1]"), std::string::npos) << e.what();
  }
  EXPECT_THROW(Sampler(SamplerParams{}, 0), Error);
  Sampler sampler(SamplerParams{}, 4);
  EXPECT_THROW(sampler.accept(4), Error);
  EXPECT_THROW(sampler.accept(-1), Error);
}

TEST(TopLogprobs, ReturnsLogSoftmaxOfTheBest) {
  const std::vector<float> logits = {1.0f, 3.0f, 2.0f, 3.0f, -1.0f};
  const auto top = top_logprobs(logits, 3);
  ASSERT_EQ(top.size(), 3u);
  double z = 0;
  for (float l : logits) z += std::exp(double(l));
  EXPECT_EQ(top[0].first, 1);  // tie with 3: lower id first
  EXPECT_EQ(top[1].first, 3);
  EXPECT_EQ(top[2].first, 2);
  EXPECT_NEAR(top[0].second, 3.0 - std::log(z), 1e-5);
  EXPECT_NEAR(top[2].second, 2.0 - std::log(z), 1e-5);
  EXPECT_EQ(top_logprobs(logits, 99).size(), logits.size());
  EXPECT_TRUE(top_logprobs(logits, 0).empty());
}

}  // namespace
}  // namespace tandem
