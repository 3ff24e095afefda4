#pragma once
// Sampling under an output constraint (text/output_constraint.h: JSON of a schema, a tool call):
// each token's bytes must continue the reply, and leave enough tokens to finish it. The sampler
// draws as usual; when its token is not allowed, every token of the vocabulary is checked and it
// draws again among the allowed ones. Accepting the first draw when it is allowed and drawing
// from the allowed tokens otherwise gives each allowed token its probability renormalised over
// the allowed ones (exactly so without top-k/top-p, which cut the two draws' candidates
// differently), and costs one check per token when the model writes what the constraint wants.
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "text/output_constraint.h"

namespace tandem {

class Sampler;
class Tokenizer;

class ConstrainedSampling {
 public:
  ConstrainedSampling(const Tokenizer& tokenizer, std::unique_ptr<OutputConstraint> constraint);

  // The next token: `tokens_after` more may follow it (max_tokens and the context). -1 when no
  // token can continue the reply within that.
  int32_t sample(Sampler& sampler, std::span<const float> logits, int64_t tokens_after);
  // Feeds a sampled token's bytes.
  void accept(int32_t token);
  // The reply is whole: it ends here.
  bool complete() const { return state_->complete(); }

 private:
  bool allowed(int32_t token, int64_t tokens_after) const;

  const Tokenizer& tokenizer_;
  std::unique_ptr<OutputConstraint> state_, trial_;
  std::vector<float> masked_;
};

}  // namespace tandem
