#include "text/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/error.h"

namespace tandem {
namespace {

constexpr int32_t kMaxRepeatLastN = 1 << 20;
// Top-p histogram: 4096 bins over the 32 logits below the best (a bin is ~0.008 wide); a
// token further down has relative probability < 1e-13 and shares the last bin.
constexpr int kTopPBins = 4096;
constexpr float kTopPRangeLogits = 32.0f;

// The ranking used everywhere: higher logit first, then lower id. It is a total order, so
// partial_sort and friends give the same prefix with every standard library.
struct RankHigherFirst {
  template <class C>
  bool operator()(const C& a, const C& b) const {
    if (a.logit != b.logit) return a.logit > b.logit;
    return a.id < b.id;
  }
};

uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

uint64_t rotl(uint64_t x, int k) {
  return (x << k) | (x >> (64 - k));
}

void check_finite(const char* name, float value) {
  if (!std::isfinite(value))
    fail("sampling parameter {} must be a finite number, got {}", name, value);
}

}  // namespace

void validate(const SamplerParams& p) {
  check_finite("temperature", p.temperature);
  if (p.temperature < 0)
    fail("sampling parameter temperature must be >= 0 (0 = greedy), got {}", p.temperature);
  if (p.top_k < 0) fail("sampling parameter top_k must be >= 0 (0 = off), got {}", p.top_k);
  if (!(p.top_p > 0 && p.top_p <= 1))
    fail("sampling parameter top_p must be in (0, 1] (1 = off), got {}", p.top_p);
  if (!(p.min_p >= 0 && p.min_p <= 1))
    fail("sampling parameter min_p must be in [0, 1] (0 = off), got {}", p.min_p);
  check_finite("repeat_penalty", p.repeat_penalty);
  if (p.repeat_penalty <= 0)
    fail("sampling parameter repeat_penalty must be > 0 (1 = off), got {}", p.repeat_penalty);
  if (p.repeat_last_n < 0 || p.repeat_last_n > kMaxRepeatLastN)
    fail("sampling parameter repeat_last_n must be in [0, {}] (0 = no penalties), got {}",
         kMaxRepeatLastN, p.repeat_last_n);
  if (!(p.presence_penalty >= -2 && p.presence_penalty <= 2))
    fail("sampling parameter presence_penalty must be in [-2, 2] (0 = off), got {}",
         p.presence_penalty);
  if (!(p.frequency_penalty >= -2 && p.frequency_penalty <= 2))
    fail("sampling parameter frequency_penalty must be in [-2, 2] (0 = off), got {}",
         p.frequency_penalty);
}

Sampler::Sampler(const SamplerParams& params, int32_t n_vocab)
    : params_(params), n_vocab_(n_vocab) {
  validate(params_);
  if (n_vocab_ <= 0) fail("sampler needs a vocabulary of at least one token, got {}", n_vocab_);
  candidates_.resize(size_t(n_vocab_));
  weights_.resize(size_t(n_vocab_));
  if (params_.top_p < 1.0f) bin_mass_.resize(kTopPBins);
  if (penalties_active()) {
    counts_.assign(size_t(n_vocab_), 0);
    window_.assign(size_t(params_.repeat_last_n), 0);
  }
  reset();
}

bool Sampler::penalties_active() const {
  return params_.repeat_last_n > 0 &&
         (params_.repeat_penalty != 1.0f || params_.presence_penalty != 0.0f ||
          params_.frequency_penalty != 0.0f);
}

void Sampler::reset() {
  std::fill(counts_.begin(), counts_.end(), 0);
  window_next_ = 0;
  window_size_ = 0;
  uint64_t state = params_.seed;
  for (uint64_t& word : rng_) word = splitmix64(state);
}

void Sampler::accept(int32_t token) {
  if (token < 0 || token >= n_vocab_)
    fail("token id {} is outside the vocabulary [0, {})", token, n_vocab_);
  if (window_.empty()) return;
  if (window_size_ == window_.size()) {
    --counts_[size_t(window_[window_next_])];  // the oldest token leaves the window
  } else {
    ++window_size_;
  }
  window_[window_next_] = token;
  ++counts_[size_t(token)];
  window_next_ = (window_next_ + 1) % window_.size();
}

double Sampler::next_uniform() {
  // xoshiro256** (Blackman & Vigna), then the top 53 bits as a fraction: exact, in [0, 1).
  const uint64_t result = rotl(rng_[1] * 5, 7) * 9;
  const uint64_t t = rng_[1] << 17;
  rng_[2] ^= rng_[0];
  rng_[3] ^= rng_[1];
  rng_[1] ^= rng_[2];
  rng_[0] ^= rng_[3];
  rng_[2] ^= t;
  rng_[3] = rotl(rng_[3], 45);
  return double(result >> 11) * 0x1.0p-53;
}

// candidates_ is in id order here. Each distinct token of the window is penalised once: its
// count is negated while visited so that repeats in the ring are skipped, then restored.
void Sampler::apply_penalties() {
  const size_t n = window_size_;
  for (size_t i = 0; i < n; ++i) {
    const int32_t token = window_[i];
    int32_t& count = counts_[size_t(token)];
    if (count <= 0) continue;  // already done
    float& logit = candidates_[size_t(token)].logit;
    if (params_.repeat_penalty != 1.0f) {
      logit = logit > 0 ? logit / params_.repeat_penalty : logit * params_.repeat_penalty;
    }
    logit -= float(count) * params_.frequency_penalty + params_.presence_penalty;
    count = -count;
  }
  for (size_t i = 0; i < n; ++i) {
    int32_t& count = counts_[size_t(window_[i])];
    if (count < 0) count = -count;
  }
}

// Keeps the smallest set of best-ranked candidates whose probability (untempered) reaches
// top_p. Returns the new count; cand[0, n) is reordered deterministically.
size_t Sampler::apply_top_p(size_t n, float max_logit, bool ranked) {
  Candidate* cand = candidates_.data();
  float* weight = weights_.data();
  if (ranked) {  // top-k already sorted the candidates: walk the ranking
    double total = 0;
    for (size_t i = 0; i < n; ++i) {
      weight[i] = std::exp(cand[i].logit - max_logit);
      total += weight[i];
    }
    const double target = double(params_.top_p) * total;
    double cumulative = 0;
    for (size_t i = 0; i < n; ++i) {
      cumulative += weight[i];
      if (cumulative >= target) return i + 1;
    }
    return n;
  }

  // Without top-k, sorting the vocabulary would cost milliseconds. Instead, histogram the
  // probability mass by distance below the best logit; every bin above the bin where the mass
  // reaches top_p is kept whole, and only that one bin is sorted to find the exact cut.
  const float bins_per_logit = float(kTopPBins) / kTopPRangeLogits;
  auto bin_of = [&](float logit) {
    const float bin = (max_logit - logit) * bins_per_logit;  // >= 0, +inf for -inf logits
    return bin < float(kTopPBins - 1) ? size_t(bin) : size_t(kTopPBins - 1);
  };
  std::fill(bin_mass_.begin(), bin_mass_.end(), 0.0);
  double total = 0;
  for (size_t i = 0; i < n; ++i) {
    const float w = std::exp(cand[i].logit - max_logit);
    total += w;
    bin_mass_[bin_of(cand[i].logit)] += w;
  }
  const double target = double(params_.top_p) * total;
  size_t cut_bin = 0;
  double before_cut = 0;  // mass of the bins kept whole
  for (; cut_bin + 1 < size_t(kTopPBins); ++cut_bin) {
    if (before_cut + bin_mass_[cut_bin] >= target) break;
    before_cut += bin_mass_[cut_bin];
  }

  // Bins above the cut to the front (their order stays id order), then the cut bin's tokens.
  size_t n_whole = 0;
  for (size_t i = 0; i < n; ++i)
    if (bin_of(cand[i].logit) < cut_bin) std::swap(cand[n_whole++], cand[i]);
  size_t n_boundary = n_whole;
  for (size_t i = n_whole; i < n; ++i)
    if (bin_of(cand[i].logit) == cut_bin) std::swap(cand[n_boundary++], cand[i]);
  std::sort(cand + n_whole, cand + n_boundary, RankHigherFirst{});

  double cumulative = before_cut;
  for (size_t i = n_whole; i < n_boundary; ++i) {
    cumulative += std::exp(cand[i].logit - max_logit);
    if (cumulative >= target) return i + 1;
  }
  return n_boundary;
}

int32_t Sampler::sample(std::span<const float> logits) {
  TANDEM_CHECK(logits.size() == size_t(n_vocab_));
  const size_t n_vocab = size_t(n_vocab_);
  const bool penalise = penalties_active();
  constexpr float kMinusInf = -std::numeric_limits<float>::infinity();

  // Greedy without penalties reads the logits in place. NaN never wins a strict comparison.
  if (params_.temperature == 0.0f && !penalise) {
    float best_logit = kMinusInf;
    size_t best = 0;
    for (size_t i = 0; i < n_vocab; ++i) {
      if (logits[i] > best_logit) {
        best_logit = logits[i];
        best = i;
      }
    }
    return int32_t(best);
  }

  Candidate* cand = candidates_.data();
  // NaN would break the ranking's total order; it ranks as "impossible" instead.
  for (size_t i = 0; i < n_vocab; ++i)
    cand[i] = {std::isnan(logits[i]) ? kMinusInf : logits[i], int32_t(i)};
  if (penalise) apply_penalties();

  // Greedy, and the fallback when nothing has a finite weight. Uses the ranking, so it gives
  // the best (ties: lowest id) token whatever order cand[] is in.
  auto best_ranked = [&](size_t n) {
    size_t best = 0;
    for (size_t i = 1; i < n; ++i)
      if (RankHigherFirst{}(cand[i], cand[best])) best = i;
    return cand[best].id;
  };
  if (params_.temperature == 0.0f) return best_ranked(n_vocab);

  size_t n = n_vocab;
  bool ranked = false;  // cand[0, n) sorted best first
  if (params_.top_k > 0 && size_t(params_.top_k) < n) {
    n = size_t(params_.top_k);
    std::partial_sort(cand, cand + n, cand + n_vocab, RankHigherFirst{});
    ranked = true;
  }

  float max_logit = kMinusInf;
  for (size_t i = 0; i < n; ++i) max_logit = std::max(max_logit, cand[i].logit);
  if (!std::isfinite(max_logit)) return best_ranked(n);

  if (params_.top_p < 1.0f) n = apply_top_p(n, max_logit, ranked);

  if (params_.min_p > 0.0f) {
    // p_i / p_max = exp(logit_i - max_logit) >= min_p, compared in logit space (no exp);
    // the maximum itself always survives. Survivors keep their order.
    const float cut = max_logit + std::log(params_.min_p);
    size_t kept = 0;
    for (size_t i = 0; i < n; ++i)
      if (cand[i].logit >= cut || cand[i].logit == max_logit) cand[kept++] = cand[i];
    n = kept;
  }

  // Temperature shapes only the draw among the survivors.
  const float inv_temperature = 1.0f / params_.temperature;
  float* weight = weights_.data();
  double total = 0;
  for (size_t i = 0; i < n; ++i) {
    weight[i] = std::exp((cand[i].logit - max_logit) * inv_temperature);
    total += weight[i];
  }
  if (!(total > 0) || !std::isfinite(total)) return best_ranked(n);
  const double threshold = next_uniform() * total;
  double cumulative = 0;
  for (size_t i = 0; i < n; ++i) {
    cumulative += weight[i];
    if (cumulative > threshold) return cand[i].id;
  }
  // Rounding left the threshold just above the last partial sum: take the last with weight.
  for (size_t i = n; i-- > 0;)
    if (weight[i] > 0) return cand[i].id;
  return cand[0].id;
}

std::vector<std::pair<int32_t, float>> top_logprobs(std::span<const float> logits, size_t n) {
  struct Entry {
    float logit;
    int32_t id;
  };
  n = std::min(n, logits.size());
  if (n == 0) return {};
  float max_logit = -std::numeric_limits<float>::infinity();
  for (float logit : logits) max_logit = std::max(max_logit, logit);
  double sum = 0;
  for (float logit : logits) sum += std::exp(double(logit) - double(max_logit));
  const double log_sum = double(max_logit) + std::log(sum);

  // A heap of the best n seen so far, worst on top: O(vocab log n), no vocabulary-sized copy.
  std::vector<Entry> heap;
  heap.reserve(n);
  const RankHigherFirst better;
  for (size_t i = 0; i < logits.size(); ++i) {
    const Entry e{logits[i], int32_t(i)};
    if (std::isnan(e.logit)) continue;
    if (heap.size() < n) {
      heap.push_back(e);
      std::push_heap(heap.begin(), heap.end(), better);
    } else if (better(e, heap.front())) {
      std::pop_heap(heap.begin(), heap.end(), better);
      heap.back() = e;
      std::push_heap(heap.begin(), heap.end(), better);
    }
  }
  std::sort(heap.begin(), heap.end(), better);
  std::vector<std::pair<int32_t, float>> result;
  result.reserve(heap.size());
  for (const Entry& e : heap) result.emplace_back(e.id, float(double(e.logit) - log_sum));
  return result;
}

}  // namespace tandem
