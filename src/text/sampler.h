#pragma once
// Token sampling: turns one row of logits into the next token id.
//
// The parameters carry the names people know from llama.cpp and the OpenAI API. The order of
// operations is llama.cpp's default chain: penalties -> top-k -> top-p -> min-p -> temperature
// -> draw. As in llama.cpp, top-p and min-p look at the untempered distribution (softmax of the
// penalised logits) and temperature only shapes the draw among the survivors, so a cut-off
// means the same thing at every temperature. temperature = 0 is greedy: the argmax of the
// penalised logits, ties to the lowest id, with the filters skipped.
//
// Determinism: the random numbers come from our own xoshiro256** seeded through splitmix64, and
// our own 53-bit conversion to [0, 1); every ranking uses a total order (logit, then id), so
// nothing depends on unspecified standard-library behaviour. Same seed and logits give the same
// tokens on every machine (up to last-bit differences between libm's expf implementations).
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

namespace tandem {

struct SamplerParams {
  float temperature = 1.0f;  // >= 0; 0 = greedy (argmax)
  int32_t top_k = 0;         // >= 0; 0 = off
  float top_p = 1.0f;        // (0, 1]; 1 = off
  float min_p = 0.0f;        // [0, 1]; 0 = off; keeps p >= min_p * p_max
  // Penalties look at the last `repeat_last_n` accepted tokens (prompt tokens count when they
  // were accepted); repeat_last_n = 0 turns all three off, as in llama.cpp.
  float repeat_penalty = 1.0f;     // > 0; 1 = off; positive logits divided, negative multiplied
  int32_t repeat_last_n = 64;      // [0, 1048576]
  float presence_penalty = 0.0f;   // [-2, 2]; logit -= presence if the token occurred
  float frequency_penalty = 0.0f;  // [-2, 2]; logit -= frequency * occurrences
  uint64_t seed = 0;
};

// Throws tandem::Error naming the first parameter out of range and the allowed range.
void validate(const SamplerParams& params);

// One per sequence. Holds the penalty history and the random state, plus scratch sized once to
// the vocabulary so that sample() allocates nothing.
class Sampler {
 public:
  Sampler(const SamplerParams& params, int32_t n_vocab);

  // Chooses the next token from `logits` ([n_vocab]). Does not record it: call accept().
  int32_t sample(std::span<const float> logits);

  // Records a token in the penalty history (generated tokens, and prompt tokens if they should
  // be penalised too).
  void accept(int32_t token);
  void accept(std::span<const int32_t> tokens) {
    for (int32_t token : tokens) accept(token);
  }

  // Forgets the history and restarts the random sequence from the seed.
  void reset();

  const SamplerParams& params() const { return params_; }
  int32_t n_vocab() const { return n_vocab_; }

 private:
  struct Candidate {
    float logit;
    int32_t id;
  };

  bool penalties_active() const;
  void apply_penalties();
  size_t apply_top_p(size_t n, float max_logit, bool ranked);
  double next_uniform();  // [0, 1), 53 bits

  SamplerParams params_;
  int32_t n_vocab_;
  std::vector<Candidate> candidates_;  // [n_vocab] scratch, reused by every sample()
  std::vector<float> weights_;         // [n_vocab] scratch: weight of candidates_[i]
  std::vector<double> bin_mass_;       // [top-p bins] scratch; empty if top_p is off
  std::vector<int32_t> counts_;        // [n_vocab] occurrences in the window; empty if no penalty
  std::vector<int32_t> window_;        // [repeat_last_n] ring of the last accepted tokens
  size_t window_next_ = 0;             // ring position of the next write
  size_t window_size_ = 0;             // tokens currently in the ring
  uint64_t rng_[4] = {};               // xoshiro256** state
};

// The `n` most likely tokens of softmax(logits) as (id, log-probability), most likely first,
// ties to the lower id. For OpenAI-style logprobs; n is clamped to the vocabulary size.
std::vector<std::pair<int32_t, float>> top_logprobs(std::span<const float> logits, size_t n);

}  // namespace tandem
