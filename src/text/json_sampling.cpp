#include "text/json_sampling.h"

#include <cmath>

#include "core/error.h"
#include "text/sampler.h"
#include "text/tokenizer.h"

namespace tandem {

JsonSampling::JsonSampling(const Tokenizer& tokenizer, std::shared_ptr<const JsonSchema> schema)
    : tokenizer_(tokenizer), schema_(std::move(schema)), state_(*schema_), trial_(*schema_) {}

bool JsonSampling::allowed(int32_t token, int64_t tokens_after) const {
  // Control tokens (end of generation among them) have no bytes: the reply ends when the
  // document does.
  const std::string_view bytes = tokenizer_.piece_bytes(token);
  if (bytes.empty()) return false;
  trial_ = state_;
  if (!trial_.feed(bytes)) return false;
  // Every byte still needed is a token of its own in byte-level vocabularies.
  return trial_.complete() || trial_.min_remaining() <= tokens_after;
}

int32_t JsonSampling::sample(Sampler& sampler, std::span<const float> logits,
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

void JsonSampling::accept(int32_t token) {
  TANDEM_CHECK(state_.feed(tokenizer_.piece_bytes(token)));
}

}  // namespace tandem
