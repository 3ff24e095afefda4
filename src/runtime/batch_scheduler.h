#pragma once
// Continuous batching over one Engine. Requests from any thread join the running batch at the
// next step, each on its own KV cache slot with its own sampler; a step is either the prompts of
// newly admitted requests (Tiled kernels) or one token for every running request (PerToken),
// alternating while both are waiting, so a new prompt holds running streams up for one step at
// most. Because the kernel choice is fixed per kind of step, a request's tokens do not depend on
// what else runs with it (batch invariance, see KernelChoice in core/backend.h).
//
// A prompt starts from the longest prefix another prompt left in the prefix cache (when one is
// given a budget): only the rest is evaluated, and the reply is the same bits either way.
//
// Requests beyond the free slots wait in a bounded queue; submit() refuses beyond that (the
// server answers 429). A request whose client goes away is cancelled and its slot freed at the
// next step.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "runtime/prefix_cache.h"
#include "runtime/session.h"
#include "text/output_constraint.h"

namespace tandem {

class Engine;

struct CompletionRequest {
  std::vector<int32_t> prompt;
  GenerateOptions options;    // max_tokens, sampling (with its seed), stop strings
  // Choices sampled from the one prompt, each on its own slot: the prompt is evaluated once and
  // its KV rows copied; choice i samples with seed + i, so it is the solo request with that seed.
  int32_t n = 1;
  // The grammar every choice's reply must follow (response_format's JSON, a required tool call),
  // or null: makes a fresh one per choice. The reply ends when it is whole.
  std::function<std::unique_ptr<OutputConstraint>()> constraint;
  // Control tokens' text stays in the reply (tool-call markers the server parses back).
  bool render_special = false;
  int32_t top_logprobs = -1;  // -1: no log-probabilities; else each token's and the top N's
  bool ignore_eos = false;    // never sample end-of-generation tokens (benchmarks, as llama.cpp)
};

// A generated token's log-probability under the model (softmax of the raw logits, before the
// sampler's penalties and temperature) and the N most likely alternatives.
struct TokenLogprob {
  int32_t token = -1;
  float logprob = 0;
  std::vector<std::pair<int32_t, float>> top;
};

// One request's progress, shared by the scheduler (writes) and its client (reads). The client
// waits for pieces with next(); the scheduler appends them after every step, each for one of the
// request's choices.
class RequestState {
 public:
  explicit RequestState(int32_t n_choices = 1) : choices_(size_t(n_choices)) {}

  struct Piece {
    int32_t choice = 0;                  // which of the request's choices it continues
    std::string text;                    // text released (may be empty)
    std::vector<int32_t> tokens;         // tokens generated (not the end-of-generation token)
    std::vector<TokenLogprob> logprobs;  // one per token when the request asked for them
  };

  // Blocks until there is new output or every choice has ended; returns false once everything
  // has been taken and the request is over.
  bool next(Piece& piece);
  // Asks the scheduler to stop this request at its next step (client gone, stop button).
  void cancel() { cancelled_.store(true); }
  bool cancelled() const { return cancelled_.load(); }

  // After next() returned false:
  int32_t n_choices() const { return int32_t(choices_.size()); }
  // stop, length, cancelled, error
  const std::string& finish_reason(int32_t choice = 0) const {
    return choices_[size_t(choice)].finish_reason;
  }
  // "error" or "cancelled" when some choice ended so (its reply is incomplete), else "".
  std::string failure() const;
  const std::string& error() const { return error_; }  // the first choice's error that had one
  int32_t prompt_tokens() const { return prompt_tokens_; }
  int32_t completion_tokens(int32_t choice) const {
    return choices_[size_t(choice)].completion_tokens;
  }
  int32_t completion_tokens() const;                        // of all choices
  int32_t cached_tokens() const { return cached_tokens_; }  // prompt tokens from the prefix cache

 private:
  friend class BatchScheduler;
  struct Choice {
    bool ended = false;
    std::string finish_reason;
    int32_t completion_tokens = 0;
  };
  void append(int32_t choice, std::string text, int32_t token, TokenLogprob* logprob);
  void end(int32_t choice, std::string reason, int32_t completion_tokens, std::string error = {});

  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<Piece> pieces_;
  std::vector<Choice> choices_;
  int32_t ended_ = 0;  // choices ended
  std::atomic<bool> cancelled_{false};
  std::string error_;
  int32_t prompt_tokens_ = 0;
  std::atomic<int32_t> cached_tokens_{0};  // set when the request takes its slots
};

struct SchedulerStats {
  int64_t running = 0, queued = 0;
  uint64_t requests = 0, prompt_tokens = 0, generated_tokens = 0;
  double prompt_seconds = 0, decode_seconds = 0;  // forward time of each kind of step
  uint64_t decode_tokens = 0;                     // tokens fed by decode steps
  // Steps started while another was still running on later ranks (Engine::start_batch).
  uint64_t overlapped_steps = 0;
  int64_t cached_tokens = 0;                      // KV cache rows held by running requests
  PrefixCache::Stats prefix_cache;                // all zero when there is none
  uint64_t prefix_cache_budget = 0;
  std::vector<std::pair<std::string, uint64_t>> expert_choices;  // per device, since load
};

class BatchScheduler {
 public:
  // Serves up to engine.n_seq() requests at once, `max_queued` more waiting; prompts' KV rows are
  // kept for later prompts in up to `prefix_cache_bytes` of host memory (0: no prefix cache).
  BatchScheduler(Engine& engine, int32_t max_queued, uint64_t prefix_cache_bytes = 0);
  ~BatchScheduler();  // cancels everything and joins the loop

  // Queues a request; nullptr when the queue is full. Throws tandem::Error for a request that
  // can never run (empty prompt, prompt as long as the context, bad sampling values, more choices
  // than slots). A request of n choices starts when n slots are free.
  std::shared_ptr<RequestState> submit(CompletionRequest request);
  // Stops admitting; running and queued requests end as "cancelled" at the next step.
  void shutdown();
  SchedulerStats stats() const;

 private:
  struct Slot;
  void loop();
  void admit();
  void restore_prefix(Slot& slot, int32_t seq);
  // Steps are started, and finished later (Engine::start_batch): at once in one process, or
  // once a pipeline of ranks has as many in flight as it has stages. A slot has one step in flight
  // at most. The starts return false when no slot was ready or the step failed at once.
  struct Step {
    uint64_t id = 0;              // Engine::start_batch's
    bool prompt = false;          // a prompt step (else decode)
    std::vector<Slot*> fed;       // in row order
    std::vector<int64_t> chunks;  // a prompt step: each fed slot's tokens
    std::vector<size_t> ending;   // a prompt step: the slots whose prompt it completes
  };
  bool start_prompt_step();
  bool start_decode_step();
  // The oldest steps finished until `keep` are left: logits sampled, prompts kept in the prefix
  // cache, choices started.
  void finish_steps(size_t keep);
  // The step's logits into logits_, its wait added to `seconds` of stats_; false, its requests
  // ended with the error, when it failed.
  bool take_logits(const Step& step, double SchedulerStats::*seconds);
  void finish_prompt_step(const Step& step);
  void finish_decode_step(const Step& step);
  void end_with_error(const Step& step, const std::string& error);
  int32_t slot_index(const Slot& slot) const;
  void sample_and_emit(Slot& slot, const float* logits);
  // The other choices of the request whose prompt `leader` just finished: its rows and logits.
  void start_followers(size_t leader, const float* logits);
  void retire_finished();

  Engine& engine_;
  const int32_t max_queued_;
  mutable std::mutex mutex_;  // guards queue_, stopping_, stats_
  std::condition_variable work_;
  std::deque<std::pair<CompletionRequest, std::shared_ptr<RequestState>>> queue_;
  bool stopping_ = false;
  SchedulerStats stats_;
  std::vector<std::unique_ptr<Slot>> slots_;  // [n_seq]; null = free (loop thread only)
  std::chrono::steady_clock::time_point choices_read_{};  // stats_.expert_choices last read
  bool prompt_turn_ = true;
  std::vector<int32_t> tokens_, positions_, seq_ids_, rows_;
  std::vector<float> logits_;
  std::deque<Step> steps_;     // in flight, oldest first
  std::vector<float> masked_;  // a logits row with end-of-generation removed (ignore_eos)
  std::thread thread_;
};

}  // namespace tandem
