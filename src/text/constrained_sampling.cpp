#include "text/constrained_sampling.h"

#include <cmath>

#include "core/error.h"
#include "text/sampler.h"
#include "text/tokenizer.h"

namespace tandem {

ConstrainedSampling::ConstrainedSampling(const Tokenizer& tokenizer,
                                         std::unique_ptr<OutputConstraint> constraint)
    : tokenizer_(tokenizer), state_(std::move(constraint)), trial_(state_->clone()) {}

bool ConstrainedSampling::allowed(int32_t token, int64_t tokens_after) const {
  // The reply ends when the constraint is complete, never at an end-of-generation token; other
  // control tokens count by their text, where the constraint takes them (tool-call markers).
  if (tokenizer_.is_end_of_generation(token)) return false;
  std::string_view bytes = tokenizer_.piece_bytes(token);
  if (bytes.empty()) {
    if (!state_->takes_control_tokens()) return false;
    bytes = tokenizer_.piece_bytes(token, /*render_special=*/true);
    if (bytes.empty()) return false;
  }
  trial_->copy_from(*state_);
  if (!trial_->feed(bytes)) return false;
  // Every byte still needed is a token of its own in byte-level vocabularies.
  return trial_->complete() || trial_->min_remaining() <= tokens_after;
}

int32_t ConstrainedSampling::sample(Sampler& sampler, std::span<const float> logits,
                                    int64_t tokens_after) {
  const int32_t first = sampler.sample(logits);
  if (allowed(first, tokens_after)) return first;
  masked_.assign(logits.begin(), logits.end());
  bool any = false;
  for (int32_t id = 0; id < int32_t(masked_.size()); ++id) {
    if (allowed(id, tokens_after))
      any = true;
    else
      masked_[size_t(id)] = -INFINITY;
  }
  return any ? sampler.sample(masked_) : -1;
}

void ConstrainedSampling::accept(int32_t token) {
  std::string_view bytes = tokenizer_.piece_bytes(token);
  if (bytes.empty()) bytes = tokenizer_.piece_bytes(token, /*render_special=*/true);
  TANDEM_CHECK(state_->feed(bytes));
}

}  // namespace tandem
