#include "runtime/session.h"

#include <algorithm>
#include <chrono>

#include "core/error.h"
#include "runtime/engine.h"
#include "runtime/output_text.h"
#include "text/tokenizer.h"

namespace tandem {
namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

GenerateResult Session::generate(std::span<const int32_t> prompt, const GenerateOptions& options,
                                 const TextCallback& on_text) {
  const auto start = std::chrono::steady_clock::now();
  if (prompt.empty()) fail("the prompt is empty");
  if (options.max_tokens < 0) fail("max tokens must be at least 0 (got {})", options.max_tokens);
  if (int64_t(prompt.size()) >= engine_.n_ctx())
    fail("the prompt has {} tokens but the context holds {}; raise --ctx or shorten the prompt",
         prompt.size(), engine_.n_ctx());
  for (const std::string& stop : options.stop)
    if (stop.empty()) fail("stop strings must not be empty");

  GenerateResult result;
  result.prompt_tokens = int32_t(prompt.size());
  // Reuse the cached prefix, but always evaluate at least the last prompt token for its logits.
  size_t reuse = 0;
  while (reuse < cached_.size() && reuse < prompt.size() && cached_[reuse] == prompt[reuse]) ++reuse;
  reuse = std::min(reuse, prompt.size() - 1);
  // A sliding-window layer's cache keeps only its last rows: going back further than it still
  // holds means evaluating the prompt again from the start.
  if (int64_t(reuse) < engine_.earliest_rewind(int64_t(cached_.size()))) reuse = 0;
  cached_.assign(prompt.begin(), prompt.begin() + std::ptrdiff_t(reuse));
  const std::span<const int32_t> fresh = prompt.subspan(reuse);
  result.prompt_tokens_evaluated = int32_t(fresh.size());
  engine_.evaluate(fresh, int32_t(reuse), seq_, false, logits_);
  cached_.insert(cached_.end(), fresh.begin(), fresh.end());
  result.prompt_seconds = seconds_since(start);

  Sampler sampler(options.sampling, int32_t(engine_.n_vocab()));
  sampler.accept(prompt);
  OutputText output(engine_.tokenizer(), options.stop);
  bool cancelled = false;
  const auto decode_start = std::chrono::steady_clock::now();
  result.finish_reason = "length";

  auto emit = [&](std::string_view text) {
    if (text.empty() || cancelled) return;
    result.text += text;
    if (!on_text(text)) cancelled = true;
  };

  for (int32_t i = 0; i < options.max_tokens; ++i) {
    const int32_t token = sampler.sample(logits_);
    if (i == 0) result.first_token_seconds = seconds_since(start);
    sampler.accept(token);
    emit(output.push(token));
    if (output.finished()) {
      result.finish_reason = "stop";
      break;
    }
    if (cancelled) {
      result.finish_reason = "cancelled";
      break;
    }
    // Feed the token back unless this was the last one we may produce or the context is full.
    if (i + 1 == options.max_tokens) break;
    if (int64_t(cached_.size()) + 1 > engine_.n_ctx()) break;
    engine_.evaluate(std::span<const int32_t>(&token, 1), int32_t(cached_.size()), seq_, false, logits_);
    cached_.push_back(token);
  }
  result.tokens = output.tokens();
  if (result.finish_reason == "length") emit(output.finish());
  result.decode_seconds = seconds_since(decode_start);
  return result;
}

}  // namespace tandem
