#pragma once
// Sampling under a JSON constraint (text/json_constraint.h): each token's bytes must continue a
// document of the schema, and leave enough tokens to finish it. The sampler draws as usual; when
// its token is not allowed, every token of the vocabulary is checked and it draws again among the
// allowed ones. Accepting the first draw when it is allowed and drawing from the allowed tokens
// otherwise gives each allowed token its probability renormalised over the allowed ones (exactly
// so without top-k/top-p, which cut the two draws' candidates differently), and costs one check
// per token when the model writes what the schema wants.
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "text/json_constraint.h"

namespace tandem {

class Sampler;
class Tokenizer;

class JsonSampling {
 public:
  JsonSampling(const Tokenizer& tokenizer, std::shared_ptr<const JsonSchema> schema);

  // The next token: `tokens_after` more may follow it (max_tokens and the context). -1 when no
  // token can continue the document within that (the budget was below the schema's shortest
  // document from the start).
  int32_t sample(Sampler& sampler, std::span<const float> logits, int64_t tokens_after);
  // Feeds a sampled token's bytes.
  void accept(int32_t token);
  // The document is whole: the reply ends here.
  bool complete() const { return state_.complete(); }

 private:
  bool allowed(int32_t token, int64_t tokens_after) const;

  const Tokenizer& tokenizer_;
  std::shared_ptr<const JsonSchema> schema_;
  JsonRecognizer state_;
  mutable JsonRecognizer trial_;
  std::vector<float> masked_;
};

}  // namespace tandem
