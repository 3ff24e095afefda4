#include "runtime/batch_scheduler.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <optional>

#include "core/error.h"
#include "runtime/engine.h"
#include "runtime/kv_cache.h"
#include "runtime/output_text.h"
#include "text/constrained_sampling.h"
#include "text/sampler.h"
#include "text/tokenizer.h"

namespace tandem {
namespace {

// Prompts are evaluated in chunks at fixed offsets (0, 512, 1024, ...) whatever else is running
// and wherever the prefix cache left off, so a request's arithmetic is the same alone or batched,
// cached or not; a prompt step takes at most this many tokens in all, which bounds its
// activations and how long it holds decode up.
constexpr int64_t kPromptChunk = 512;
constexpr int64_t kPromptStepTokens = 2048;

// log softmax(logits)[token], computed in double.
float log_probability(std::span<const float> logits, int32_t token) {
  const float max = *std::max_element(logits.begin(), logits.end());
  double sum = 0;
  for (float l : logits) sum += std::exp(double(l) - max);
  return float(double(logits[size_t(token)]) - max - std::log(sum));
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Choice `choice` of a request samples with the request's seed + choice.
SamplerParams choice_sampling(SamplerParams params, int32_t choice) {
  params.seed += uint64_t(choice);
  return params;
}

}  // namespace

void RequestState::append(int32_t choice, std::string text, int32_t token, TokenLogprob* logprob) {
  std::lock_guard lock(mutex_);
  if (pieces_.empty() || pieces_.back().choice != choice || pieces_.back().text.size() >= 4096)
    pieces_.push_back({.choice = choice});
  Piece& piece = pieces_.back();  // a slow reader gets what piled up in one piece
  piece.text += text;
  if (token >= 0) piece.tokens.push_back(token);
  if (token >= 0 && logprob) piece.logprobs.push_back(std::move(*logprob));
  changed_.notify_all();
}

void RequestState::end(int32_t choice, std::string reason, int32_t completion_tokens,
                       std::string error) {
  std::lock_guard lock(mutex_);
  Choice& c = choices_[size_t(choice)];
  if (c.ended) return;
  c.completion_tokens = completion_tokens;
  c.finish_reason = std::move(reason);
  if (error_.empty()) error_ = std::move(error);
  c.ended = true;
  ++ended_;
  changed_.notify_all();
}

bool RequestState::next(Piece& piece) {
  std::unique_lock lock(mutex_);
  changed_.wait(lock, [&] { return !pieces_.empty() || ended_ == int32_t(choices_.size()); });
  if (pieces_.empty()) return false;
  piece = std::move(pieces_.front());
  pieces_.pop_front();
  return true;
}

std::string RequestState::failure() const {
  for (const char* reason : {"error", "cancelled"})
    for (const Choice& c : choices_)
      if (c.finish_reason == reason) return reason;
  return {};
}

int32_t RequestState::completion_tokens() const {
  int32_t total = 0;
  for (const Choice& c : choices_) total += c.completion_tokens;
  return total;
}

struct BatchScheduler::Slot {
  Slot(CompletionRequest r, std::shared_ptr<RequestState> s, int32_t c, const Engine& engine)
      : request(std::move(r)),
        state(std::move(s)),
        choice(c),
        sampler(choice_sampling(request.options.sampling, c), int32_t(engine.n_vocab())),
        output(engine.tokenizer(), request.options.stop, request.render_special) {
    sampler.accept(request.prompt);
    if (request.constraint)
      constraint = std::make_unique<ConstrainedSampling>(engine.tokenizer(), request.constraint());
  }
  void end(std::string reason, int32_t completion_tokens, std::string error = {}) {
    finished = true;
    state->end(choice, std::move(reason), completion_tokens, std::move(error));
  }
  CompletionRequest request;
  std::shared_ptr<RequestState> state;
  int32_t choice;
  int32_t follows = -1;  // the slot whose prompt evaluation this choice waits to copy, or -1
  Sampler sampler;
  std::unique_ptr<ConstrainedSampling> constraint;  // the reply's grammar, if any
  OutputText output;
  int64_t prompt_done = 0;  // prompt tokens in the cache
  int64_t n_past = 0;       // tokens in the cache
  int32_t generated = 0;
  int32_t next_token = -1;  // sampled, to be fed by the next decode step
  bool finished = false;
  bool in_flight = false;  // fed to a step (prompt or decode) not finished yet: kept until it is

  bool in_prompt() const { return prompt_done < int64_t(request.prompt.size()); }
};

BatchScheduler::BatchScheduler(Engine& engine, int32_t max_queued, uint64_t prefix_cache_bytes)
    : engine_(engine), max_queued_(max_queued), slots_(size_t(engine.n_seq())) {
  engine.enable_prefix_cache(prefix_cache_bytes);
  stats_.prefix_cache_budget = prefix_cache_bytes;
  thread_ = std::thread([this] { loop(); });
}

BatchScheduler::~BatchScheduler() {
  shutdown();
  thread_.join();
}

std::shared_ptr<RequestState> BatchScheduler::submit(CompletionRequest request) {
  if (request.prompt.empty()) fail("the prompt is empty");
  if (int64_t(request.prompt.size()) >= engine_.n_ctx())
    fail("the prompt has {} tokens but the context holds {}; shorten the prompt or start the server "
         "with a larger --ctx", request.prompt.size(), engine_.n_ctx());
  if (request.options.max_tokens < 0) fail("max_tokens must be at least 0 (got {})", request.options.max_tokens);
  for (const std::string& stop : request.options.stop)
    if (stop.empty()) fail("stop strings must not be empty");
  validate(request.options.sampling);
  if (request.constraint) {
    const int64_t shortest = request.constraint()->min_remaining();
    if (request.options.max_tokens < shortest)
      fail(
          "max_tokens is {} but the shortest reply the requested format allows (response_format, "
          "or a required tool call) takes up to {} tokens; raise max_tokens",
          request.options.max_tokens, shortest);
  }
  if (request.n < 1 || request.n > int32_t(slots_.size()))
    fail(
        "n is {} but the server runs {} sequences at once; ask for 1 to {} choices, or start the "
        "server with a larger --parallel",
        request.n, slots_.size(), slots_.size());
  auto state = std::make_shared<RequestState>(request.n);
  state->prompt_tokens_ = int32_t(request.prompt.size());
  std::lock_guard lock(mutex_);
  if (stopping_) fail("the server is shutting down");
  // Room: the free slots (taken at the next step) plus the waiting places.
  if (int64_t(queue_.size()) >= max_queued_ + int64_t(slots_.size()) - stats_.running) return nullptr;
  queue_.emplace_back(std::move(request), state);
  ++stats_.requests;
  stats_.queued = int64_t(queue_.size());
  work_.notify_one();
  return state;
}

void BatchScheduler::shutdown() {
  std::lock_guard lock(mutex_);
  stopping_ = true;
  work_.notify_one();
}

SchedulerStats BatchScheduler::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

void BatchScheduler::loop() {
  for (;;) {
    {
      std::unique_lock lock(mutex_);
      const auto busy = [&] {
        return std::any_of(slots_.begin(), slots_.end(), [](const auto& s) { return s != nullptr; });
      };
      work_.wait(lock, [&] { return stopping_ || !queue_.empty() || busy(); });
      if (stopping_) {
        lock.unlock();
        finish_steps(0);
        lock.lock();
        for (auto& [request, state] : queue_)
          for (int32_t c = 0; c < request.n; ++c) state->end(c, "cancelled", 0);
        queue_.clear();
        for (auto& slot : slots_)
          if (slot) slot->end("cancelled", slot->generated);
        return;
      }
    }
    admit();
    for (auto& slot : slots_)
      if (slot && slot->state->cancelled()) slot->end("cancelled", slot->generated);
    retire_finished();
    // A step is started for the slots with none in flight: prompts and decodes taking turns while
    // both wait. Over a pipeline of ranks, the oldest step is finished once as many are in flight
    // as the pipeline has stages (Engine::start_batch); elsewhere each step at once.
    const auto ready = [](const auto& s) { return s && !s->in_flight && !s->finished; };
    const bool prompts = std::any_of(slots_.begin(), slots_.end(), [&](const auto& s) {
      return ready(s) && s->in_prompt() && s->follows < 0;
    });
    const bool decodes = std::any_of(slots_.begin(), slots_.end(),
                                     [&](const auto& s) { return ready(s) && !s->in_prompt(); });
    bool started = false;
    if (prompts && (prompt_turn_ || !decodes))
      started = start_prompt_step();
    else if (decodes)
      started = start_decode_step();
    prompt_turn_ = !prompt_turn_;
    if (!steps_.empty() && (!started || steps_.size() >= size_t(engine_.steps_in_flight())))
      finish_steps(steps_.size() - 1);
    retire_finished();
  }
}

void BatchScheduler::admit() {
  std::vector<size_t> leaders;
  {
    std::lock_guard lock(mutex_);
    std::vector<size_t> free;
    for (size_t s = 0; s < slots_.size(); ++s)
      if (!slots_[s]) free.push_back(s);
    // In order of arrival: a request of n choices waits for n free slots, and those behind it wait
    // with it (no request is passed over for ever).
    size_t next_free = 0;
    while (!queue_.empty() && free.size() - next_free >= size_t(queue_.front().first.n)) {
      auto [request, state] = std::move(queue_.front());
      queue_.pop_front();
      const size_t leader = free[next_free];
      for (int32_t c = 0; c < request.n; ++c) {
        const size_t s = free[next_free++];
        slots_[s] = std::make_unique<Slot>(request, state, c, engine_);
        if (c > 0) slots_[s]->follows = int32_t(leader);
      }
      leaders.push_back(leader);
    }
    stats_.queued = int64_t(queue_.size());
    stats_.running =
        std::count_if(slots_.begin(), slots_.end(), [](const auto& s) { return s != nullptr; });
  }
  // Outside the lock: copying a long prefix's rows takes a while, and clients submit meanwhile.
  for (size_t s : leaders) restore_prefix(*slots_[s], int32_t(s));
}

void BatchScheduler::restore_prefix(Slot& slot, int32_t seq) {
  if (!engine_.has_prefix_cache()) return;
  // The last prompt token is always evaluated: its logits give the first token.
  const std::vector<int32_t>& prompt = slot.request.prompt;
  const int64_t reused = engine_.restore_prefix(prompt, int64_t(prompt.size()) - 1, seq);
  slot.prompt_done = slot.n_past = reused;
  slot.state->cached_tokens_ = int32_t(reused);
  std::lock_guard lock(mutex_);
  stats_.prefix_cache = engine_.prefix_cache_stats();
}

void BatchScheduler::retire_finished() {
  int64_t cached = 0;
  for (auto& slot : slots_)
    if (slot && slot->finished && !slot->in_flight) slot.reset();
  for (auto& slot : slots_) {
    // A choice whose leader ended before its prompt did (cancelled, failed) evaluates the prompt
    // itself.
    if (slot && slot->follows >= 0 && !slots_[size_t(slot->follows)]) slot->follows = -1;
    if (slot) cached += slot->n_past;
  }
  // Read here: only this thread evaluates. Over ranks the read is a gather of every layer's counts,
  // so it comes once a second while requests run, and when the last one has ended.
  const int64_t running =
      std::count_if(slots_.begin(), slots_.end(), [](const auto& s) { return s != nullptr; });
  const auto now = std::chrono::steady_clock::now();
  std::optional<std::vector<std::pair<std::string, uint64_t>>> choices;
  if (running == 0 || now - choices_read_ >= std::chrono::seconds(1)) {
    choices = engine_.routing_counts_by_device();
    choices_read_ = now;
  }
  std::lock_guard lock(mutex_);
  stats_.running = running;
  stats_.cached_tokens = cached;
  if (choices) stats_.expert_choices = std::move(*choices);
}

bool BatchScheduler::start_prompt_step() {
  tokens_.clear(), positions_.clear(), seq_ids_.clear(), rows_.clear();
  Step step{.prompt = true};
  for (size_t s = 0; s < slots_.size(); ++s) {
    Slot* slot = slots_[s].get();
    if (!slot || !slot->in_prompt() || slot->follows >= 0 || slot->in_flight || slot->finished)
      continue;
    const int64_t first = slot->prompt_done;
    const int64_t last = std::min<int64_t>((first / kPromptChunk + 1) * kPromptChunk,
                                           int64_t(slot->request.prompt.size()));
    if (!tokens_.empty() && int64_t(tokens_.size()) + (last - first) > kPromptStepTokens) break;
    for (int64_t i = first; i < last; ++i) {
      tokens_.push_back(slot->request.prompt[size_t(i)]);
      positions_.push_back(int32_t(i));
      seq_ids_.push_back(int32_t(s));
    }
    step.fed.push_back(slot);
    step.chunks.push_back(last - first);
    if (last == int64_t(slot->request.prompt.size())) {
      rows_.push_back(int32_t(tokens_.size()) - 1);
      step.ending.push_back(s);
    }
  }
  if (step.fed.empty()) return false;
  const auto start = std::chrono::steady_clock::now();
  try {
    step.id = engine_.start_batch(tokens_, positions_, seq_ids_, rows_, KernelChoice::Tiled);
  } catch (const std::exception& e) {
    end_with_error(step, e.what());
    return false;
  }
  for (size_t i = 0; i < step.fed.size(); ++i) {  // each slot past its chunk: in the cache
    Slot& slot = *step.fed[i];
    slot.prompt_done += step.chunks[i];
    slot.n_past = slot.prompt_done;
    slot.in_flight = true;
  }
  std::lock_guard lock(mutex_);
  stats_.prompt_seconds += seconds_since(start);
  stats_.prompt_tokens += tokens_.size();
  if (!steps_.empty()) ++stats_.overlapped_steps;
  steps_.push_back(std::move(step));
  return true;
}

bool BatchScheduler::take_logits(const Step& step, double SchedulerStats::*seconds) {
  const auto start = std::chrono::steady_clock::now();
  try {
    engine_.finish_batch(step.id, logits_);
  } catch (const std::exception& e) {
    end_with_error(step, e.what());
    return false;
  }
  std::lock_guard lock(mutex_);
  stats_.*seconds += seconds_since(start);
  return true;
}

void BatchScheduler::finish_prompt_step(const Step& step) {
  if (!take_logits(step, &SchedulerStats::prompt_seconds)) return;
  if (engine_.has_prefix_cache() && !step.ending.empty()) {
    // Before decoding writes past the prompts (and over the oldest rows of window layers' rings).
    for (size_t s : step.ending) engine_.store_prefix(slots_[s]->request.prompt, int32_t(s));
    std::lock_guard lock(mutex_);
    stats_.prefix_cache = engine_.prefix_cache_stats();
  }
  const size_t n_vocab = size_t(engine_.n_vocab());
  for (size_t r = 0; r < step.ending.size(); ++r) {
    if (slots_[step.ending[r]]->finished) continue;  // cancelled meanwhile
    start_followers(step.ending[r], logits_.data() + r * n_vocab);
    sample_and_emit(*slots_[step.ending[r]], logits_.data() + r * n_vocab);
  }
}

void BatchScheduler::end_with_error(const Step& step, const std::string& error) {
  for (Slot* slot : step.fed) {
    slot->end("error", slot->generated, error);
    if (!step.prompt) continue;
    for (auto& other : slots_)  // the choices waiting to copy its prompt
      if (other && other->follows >= 0 && slots_[size_t(other->follows)].get() == slot)
        other->end("error", other->generated, error);
  }
}

void BatchScheduler::start_followers(size_t leader, const float* logits) {
  const int64_t length = slots_[leader]->n_past;
  for (size_t s = 0; s < slots_.size(); ++s) {
    Slot* slot = slots_[s].get();
    if (!slot || slot->follows != int32_t(leader)) continue;
    engine_.copy_sequence(int32_t(leader), int32_t(s), length);
    slot->prompt_done = slot->n_past = length;
    slot->follows = -1;
    sample_and_emit(*slot, logits);
  }
}

bool BatchScheduler::start_decode_step() {
  // Over a pipeline the decoding slots go in as many steps as it has stages, each started as soon
  // as its last one's tokens are sampled: rank 0 computes one while later ranks compute the others.
  std::vector<Slot*> ready;
  size_t decoding = 0;
  for (auto& slot : slots_) {
    if (!slot || slot->in_prompt() || (slot->finished && !slot->in_flight)) continue;
    ++decoding;
    if (!slot->in_flight && !slot->finished) ready.push_back(slot.get());
  }
  if (ready.empty()) return false;
  const size_t groups = std::min(size_t(engine_.steps_in_flight()), decoding);
  ready.resize(std::min(ready.size(), (decoding + groups - 1) / groups));
  tokens_.clear(), positions_.clear(), seq_ids_.clear(), rows_.clear();
  for (Slot* slot : ready) {
    tokens_.push_back(slot->next_token);
    positions_.push_back(int32_t(slot->n_past));
    seq_ids_.push_back(slot_index(*slot));
    rows_.push_back(int32_t(rows_.size()));
  }
  Step step{.fed = ready};
  const auto start = std::chrono::steady_clock::now();
  try {
    step.id = engine_.start_batch(tokens_, positions_, seq_ids_, rows_, KernelChoice::PerToken);
  } catch (const std::exception& e) {
    end_with_error(step, e.what());
    return false;
  }
  for (Slot* slot : ready) slot->in_flight = true;
  std::lock_guard lock(mutex_);
  stats_.decode_seconds += seconds_since(start);
  if (!steps_.empty()) ++stats_.overlapped_steps;
  steps_.push_back(std::move(step));
  return true;
}

void BatchScheduler::finish_decode_step(const Step& step) {
  if (!take_logits(step, &SchedulerStats::decode_seconds)) return;
  {
    std::lock_guard lock(mutex_);
    stats_.decode_tokens += step.fed.size();
  }
  const size_t n_vocab = size_t(engine_.n_vocab());
  for (size_t r = 0; r < step.fed.size(); ++r) {
    Slot& slot = *step.fed[r];
    ++slot.n_past;
    if (!slot.finished) sample_and_emit(slot, logits_.data() + r * n_vocab);  // not cancelled
  }
}

void BatchScheduler::finish_steps(size_t keep) {
  while (steps_.size() > keep) {
    const Step oldest = std::move(steps_.front());
    steps_.pop_front();
    for (Slot* slot : oldest.fed) slot->in_flight = false;
    if (oldest.prompt)
      finish_prompt_step(oldest);
    else
      finish_decode_step(oldest);
  }
}

int32_t BatchScheduler::slot_index(const Slot& slot) const {
  for (size_t s = 0; s < slots_.size(); ++s)
    if (slots_[s].get() == &slot) return int32_t(s);
  check_failed("a slot the scheduler does not hold", __FILE__, __LINE__);
}

// The next token of `slot` from its logits row: hands out the text it releases and ends the
// request on a stop, at max_tokens, or when the context is full.
void BatchScheduler::sample_and_emit(Slot& slot, const float* logits) {
  const int32_t max_tokens = slot.request.options.max_tokens;
  if (slot.generated >= max_tokens) {  // max_tokens 0: the prompt only
    slot.end("length", 0);
    return;
  }
  std::span<const float> row(logits, size_t(engine_.n_vocab()));
  if (slot.request.ignore_eos) {
    // The sampler sees the end-of-generation tokens as impossible; log-probabilities too.
    const Tokenizer& tokenizer = engine_.tokenizer();
    masked_.assign(row.begin(), row.end());
    for (std::optional<int32_t> id : {tokenizer.eos_id(), tokenizer.eot_id()})
      if (id && *id >= 0 && size_t(*id) < masked_.size()) masked_[size_t(*id)] = -INFINITY;
    row = masked_;
  }
  int32_t token = -1;
  if (slot.constraint) {
    // Tokens that may follow this one: max_tokens and the context both end the reply.
    const int64_t after =
        std::min<int64_t>(max_tokens - slot.generated - 1, engine_.n_ctx() - slot.n_past - 2);
    token = slot.constraint->sample(slot.sampler, row, after);
    if (token < 0) {
      slot.end("error", slot.generated,
               "no token can continue the constrained reply within max_tokens and the context");
      return;
    }
    slot.constraint->accept(token);
  } else {
    token = slot.sampler.sample(row);
  }
  slot.sampler.accept(token);
  ++slot.generated;
  TokenLogprob logprob;
  const int32_t top = slot.request.top_logprobs;
  if (top >= 0)
    logprob = {.token = token, .logprob = log_probability(row, token),
               .top = top > 0 ? top_logprobs(row, size_t(top)) : std::vector<std::pair<int32_t, float>>{}};
  TokenLogprob* with = top >= 0 ? &logprob : nullptr;
  const bool end_of_generation = engine_.tokenizer().is_end_of_generation(token);
  std::string text = slot.output.push(token);
  if (slot.constraint && slot.constraint->complete()) {  // whole: nothing may follow
    slot.state->append(slot.choice, text + slot.output.finish(), token, with);
    slot.end("stop", slot.generated);
  } else if (slot.output.finished()) {
    // The end-of-generation token has no text of its own; a stop string's token had the text
    // before the stop string.
    if (!text.empty() || !end_of_generation)
      slot.state->append(slot.choice, std::move(text), end_of_generation ? -1 : token, with);
    slot.end("stop", slot.generated);
  } else if (slot.generated >= max_tokens || slot.n_past + 1 >= engine_.n_ctx()) {
    slot.state->append(slot.choice, text + slot.output.finish(), token, with);
    slot.end("length", slot.generated);
  } else {
    slot.state->append(slot.choice, std::move(text), token, with);
    slot.next_token = token;
  }
  std::lock_guard lock(mutex_);
  ++stats_.generated_tokens;
}

}  // namespace tandem
