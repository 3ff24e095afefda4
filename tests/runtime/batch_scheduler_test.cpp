// The continuous-batching scheduler: requests running together get exactly the tokens they get
// alone (same seed), a full queue refuses, impossible requests are errors, cancelled requests
// free their slot, stop strings and max_tokens end requests with the right reason.
#include <gtest/gtest.h>

#include <thread>

#include "core/error.h"
#include "runtime/batch_scheduler.h"
#include "runtime/engine.h"
#include "test_support.h"
#include "text/tokenizer.h"

namespace tandem {
namespace {

struct Outcome {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;  // of each token: equal bits mean equal arithmetic
  std::string text, finish_reason;
  int32_t completion_tokens = 0;
};

Outcome drain(RequestState& state) {
  Outcome out;
  RequestState::Piece piece;
  while (state.next(piece)) {
    out.text += piece.text;
    out.tokens.insert(out.tokens.end(), piece.tokens.begin(), piece.tokens.end());
    for (const TokenLogprob& t : piece.logprobs) out.logprobs.push_back(t.logprob);
  }
  out.finish_reason = state.finish_reason();
  out.completion_tokens = state.completion_tokens();
  return out;
}

class Scheduler : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    engine_ = new Engine({.model_path = test::fixture("small-v2-Q4_K_M.gguf").string(), .n_threads = 2,
                          .n_ctx = 96, .n_seq = 8});
  }
  static void TearDownTestSuite() { delete engine_; }

  CompletionRequest request(int i, int32_t max_tokens = 24) {
    CompletionRequest r;
    r.prompt = engine_->tokenizer().encode("request number " + std::to_string(i) + std::string(size_t(i * 3), '!'));
    r.options.max_tokens = max_tokens;
    r.options.sampling.temperature = i % 2 ? 0.0f : 0.9f;  // greedy and sampled
    r.options.sampling.seed = uint64_t(100 + i);
    r.top_logprobs = 2;
    return r;
  }

  static Engine* engine_;
};
Engine* Scheduler::engine_ = nullptr;

TEST_F(Scheduler, EightConcurrentRequestsGetTheTokensTheyGetAlone) {
  std::vector<Outcome> alone(8), together(8);
  {
    BatchScheduler scheduler(*engine_, 8);
    for (int i = 0; i < 8; ++i) alone[size_t(i)] = drain(*scheduler.submit(request(i)));
  }
  {
    BatchScheduler scheduler(*engine_, 8);
    std::vector<std::shared_ptr<RequestState>> states;
    std::vector<std::thread> clients;
    for (int i = 0; i < 8; ++i) {
      states.push_back(scheduler.submit(request(i)));
      ASSERT_NE(states.back(), nullptr);
      // Two joining later, so requests join a batch that is already decoding.
      if (i == 5) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    for (int i = 0; i < 8; ++i) clients.emplace_back([&, i] { together[size_t(i)] = drain(*states[size_t(i)]); });
    for (std::thread& t : clients) t.join();
  }
  for (size_t i = 0; i < 8; ++i) {
    EXPECT_FALSE(alone[i].tokens.empty());
    EXPECT_EQ(alone[i].tokens, together[i].tokens) << "request " << i;
    EXPECT_EQ(alone[i].logprobs, together[i].logprobs) << "request " << i;
    EXPECT_EQ(alone[i].text, together[i].text) << "request " << i;
    EXPECT_EQ(alone[i].finish_reason, together[i].finish_reason) << "request " << i;
  }
}

TEST_F(Scheduler, MaxTokensEndsWithLengthAndCountsTokens) {
  BatchScheduler scheduler(*engine_, 4);
  CompletionRequest r = request(1, 5);
  const Outcome out = drain(*scheduler.submit(r));
  if (out.finish_reason == "length") {
    EXPECT_EQ(out.completion_tokens, 5);
    EXPECT_EQ(out.tokens.size(), 5u);
  } else {
    EXPECT_EQ(out.finish_reason, "stop");  // the model chose to end first
  }
  r.options.max_tokens = 0;
  const Outcome none = drain(*scheduler.submit(r));
  EXPECT_EQ(none.finish_reason, "length");
  EXPECT_TRUE(none.tokens.empty());
}

TEST_F(Scheduler, AStopStringEndsTheOutputBeforeIt) {
  BatchScheduler scheduler(*engine_, 4);
  const Outcome free_run = drain(*scheduler.submit(request(1, 20)));
  ASSERT_GE(free_run.text.size(), 4u);
  CompletionRequest r = request(1, 20);
  const std::string stop = free_run.text.substr(2, 2);
  r.options.stop = {stop};
  const Outcome out = drain(*scheduler.submit(r));
  EXPECT_EQ(out.finish_reason, "stop");
  EXPECT_EQ(out.text, free_run.text.substr(0, free_run.text.find(stop)));
}

TEST_F(Scheduler, ImpossibleRequestsAreErrorsAndAFullQueueRefuses) {
  BatchScheduler scheduler(*engine_, 1);
  CompletionRequest too_long = request(0);
  too_long.prompt.assign(200, too_long.prompt[0]);
  EXPECT_THROW(scheduler.submit(too_long), Error);
  CompletionRequest empty = request(0);
  empty.prompt.clear();
  EXPECT_THROW(scheduler.submit(empty), Error);
  CompletionRequest bad = request(0);
  bad.options.sampling.top_p = 2.0f;
  EXPECT_THROW(scheduler.submit(bad), Error);

  // 8 slots + 1 waiting place: the tenth at once is refused.
  std::vector<std::shared_ptr<RequestState>> states;
  int refused = 0;
  for (int i = 0; i < 10; ++i) {
    auto state = scheduler.submit(request(i, 40));
    state ? states.push_back(state) : void(++refused);
  }
  EXPECT_GE(refused, 1);
  for (auto& state : states) state->cancel();
  for (auto& state : states) drain(*state);
  // Everything cancelled: the slots are free again.
  EXPECT_NE(scheduler.submit(request(0, 2)), nullptr);
}

TEST_F(Scheduler, ChoicesAreTheSoloRequestsWithSeedPlusTheirIndexFromOnePromptEvaluation) {
  BatchScheduler scheduler(*engine_, 4);
  CompletionRequest r = request(4, 16);  // sampled
  r.ignore_eos = true;
  std::vector<Outcome> solo;
  for (uint64_t c = 0; c < 3; ++c) {
    CompletionRequest one = r;
    one.options.sampling.seed += c;
    solo.push_back(drain(*scheduler.submit(one)));
  }
  const uint64_t prompt_tokens_before = scheduler.stats().prompt_tokens;
  r.n = 3;
  const std::shared_ptr<RequestState> state = scheduler.submit(r);
  std::vector<Outcome> choices(3);
  RequestState::Piece piece;
  while (state->next(piece)) {
    Outcome& out = choices[size_t(piece.choice)];
    out.text += piece.text;
    out.tokens.insert(out.tokens.end(), piece.tokens.begin(), piece.tokens.end());
    for (const TokenLogprob& t : piece.logprobs) out.logprobs.push_back(t.logprob);
  }
  for (size_t c = 0; c < 3; ++c) {
    EXPECT_EQ(choices[c].tokens, solo[c].tokens) << "choice " << c;
    EXPECT_EQ(choices[c].logprobs, solo[c].logprobs) << "choice " << c;
    EXPECT_EQ(choices[c].text, solo[c].text) << "choice " << c;
    EXPECT_EQ(state->finish_reason(int32_t(c)), "length");
    EXPECT_EQ(state->completion_tokens(int32_t(c)), 16);
  }
  EXPECT_NE(choices[0].tokens, choices[1].tokens);  // different seeds, different samples
  EXPECT_EQ(state->completion_tokens(), 48);
  // The prompt was evaluated once for the three.
  EXPECT_EQ(scheduler.stats().prompt_tokens - prompt_tokens_before, r.prompt.size());

  r.n = 9;  // more than the 8 slots
  EXPECT_THROW(scheduler.submit(r), Error);
}

TEST_F(Scheduler, AReplyThatFillsTheContextEndsWithLengthAndTheSlotServesAgain) {
  BatchScheduler scheduler(*engine_, 4);
  CompletionRequest r = request(3, 1000);  // more than the 96 positions of the context
  r.ignore_eos = true;
  const Outcome out = drain(*scheduler.submit(r));
  EXPECT_EQ(out.finish_reason, "length");
  EXPECT_EQ(int64_t(r.prompt.size()) + out.completion_tokens, engine_->n_ctx());
  EXPECT_EQ(drain(*scheduler.submit(request(1, 4))).tokens,
            drain(*scheduler.submit(request(1, 4))).tokens);
}

TEST_F(Scheduler, ShutdownEndsRunningRequestsAsCancelled) {
  std::shared_ptr<RequestState> state;
  {
    BatchScheduler scheduler(*engine_, 4);
    state = scheduler.submit(request(2, 80));
    RequestState::Piece piece;
    ASSERT_TRUE(state->next(piece));
  }
  const Outcome out = drain(*state);
  EXPECT_EQ(out.finish_reason, "cancelled");
}

}  // namespace
}  // namespace tandem
