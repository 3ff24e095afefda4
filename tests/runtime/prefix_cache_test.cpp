// The prefix cache (runtime/prefix_cache.h): a chat's next turn takes its history's KV rows from
// the cache and gets the same bits as when it evaluates them again, on an MLA model and on one with
// sliding-window layers (whose rings keep only their last rows); the byte budget holds, least
// recently used blocks go first, and restored rows are the rows that were stored.
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "runtime/batch_scheduler.h"
#include "runtime/engine.h"
#include "runtime/kv_cache.h"
#include "runtime/prefix_cache.h"
#include "test_support.h"

namespace tandem {
namespace {

constexpr int64_t kBlock = PrefixCache::kBlockTokens;

// `n` token ids from a fixed sequence (ordinary ids: the prompts' text does not matter here).
std::vector<int32_t> tokens(int64_t n, uint32_t seed, int64_t n_vocab) {
  std::vector<int32_t> out;
  uint32_t x = seed * 2654435761u + 12345u;
  for (int64_t i = 0; i < n; ++i) {
    x = x * 1664525u + 1013904223u;
    out.push_back(int32_t(100 + (x >> 8) % uint32_t(n_vocab / 2)));
  }
  return out;
}

std::vector<int32_t> concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

struct Reply {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;  // equal bits mean equal arithmetic
  int32_t cached = 0;
};

Reply ask(BatchScheduler& scheduler, std::vector<int32_t> prompt, uint64_t seed) {
  CompletionRequest r;
  r.prompt = std::move(prompt);
  r.options.max_tokens = 12;
  r.options.sampling.temperature = 0.8f;
  r.options.sampling.seed = seed;
  r.top_logprobs = 0;
  r.ignore_eos = true;
  const std::shared_ptr<RequestState> state = scheduler.submit(std::move(r));
  EXPECT_NE(state, nullptr);
  Reply reply;
  RequestState::Piece piece;
  while (state->next(piece)) {
    reply.tokens.insert(reply.tokens.end(), piece.tokens.begin(), piece.tokens.end());
    for (const TokenLogprob& t : piece.logprobs) reply.logprobs.push_back(t.logprob);
  }
  EXPECT_EQ(state->finish_reason(), "length");
  reply.cached = state->cached_tokens();
  return reply;
}

// Three turns of a conversation, each prompt the previous one, its reply and a new message.
// Between turns another request takes the same slot and overwrites its rows, so a turn's history
// comes from the prefix cache or from evaluating it, never from what its slot still held.
// Returns every turn's reply.
std::vector<Reply> conversation(Engine& engine, uint64_t cache_bytes, int64_t first_prompt) {
  BatchScheduler scheduler(engine, 4, cache_bytes);
  std::vector<Reply> replies;
  std::vector<int32_t> prompt = tokens(first_prompt, 1, engine.n_vocab());
  for (uint32_t turn = 0; turn < 3; ++turn) {
    replies.push_back(ask(scheduler, prompt, 7 + turn));
    prompt = concat(concat(prompt, replies.back().tokens), tokens(37, 10 + turn, engine.n_vocab()));
    ask(scheduler, tokens(first_prompt + 200, 50 + turn, engine.n_vocab()), 1);
  }
  return replies;
}

void expect_same_replies_and_cache_hits(Engine& engine, int64_t first_prompt) {
  const std::vector<Reply> cached = conversation(engine, uint64_t(64) << 20, first_prompt);
  const std::vector<Reply> evaluated = conversation(engine, 0, first_prompt);
  int64_t prompt = first_prompt;
  for (size_t turn = 0; turn < 3; ++turn) {
    SCOPED_TRACE(testing::Message() << "turn " << turn);
    EXPECT_EQ(cached[turn].tokens, evaluated[turn].tokens);
    EXPECT_EQ(cached[turn].logprobs, evaluated[turn].logprobs);
    EXPECT_EQ(evaluated[turn].cached, 0);
    // From the second turn: the previous prompt's whole blocks come from the cache (the previous
    // reply's rows came from decode steps and are evaluated again).
    const int64_t previous = turn == 0 ? 0 : prompt;
    EXPECT_EQ(cached[turn].cached, previous / kBlock * kBlock);
    if (turn > 0) prompt += 12 + 37;
  }
}

TEST(PrefixCache, MlaRepliesAreTheSameBitsWithTheHistoryCachedOrEvaluated) {
  Engine engine({.model_path = test::fixture("small-v2-Q4_K_M.gguf").string(),
                 .n_threads = 2,
                 .n_ctx = 512,
                 .n_seq = 2});
  expect_same_replies_and_cache_hits(engine, 150);
}

TEST(PrefixCache, RowsOnSimulatedDevicesAreCopiedThroughTheirBackends) {
  // The planner puts layers, and their KV caches, on two simulated GPUs.
  Engine engine({.model_path = test::fixture("small-v2-Q4_K_M.gguf").string(),
                 .n_threads = 2,
                 .n_ctx = 512,
                 .n_seq = 2,
                 .devices = "sim:2x256MiB"});
  ASSERT_GT(engine.device_names().size(), 1u);
  expect_same_replies_and_cache_hits(engine, 150);
}

// A BF16 KV cache: the rows kept and restored are its 2-byte values, latent (MLA, on the CPU and
// on a simulated device) and keys/values with window rings (gpt-oss).
TEST(PrefixCache, Bf16CacheRepliesAreTheSameBitsWithTheHistoryCachedOrEvaluated) {
  for (const char* devices : {"cpu", "sim:2x256MiB"}) {
    SCOPED_TRACE(devices);
    Engine engine({.model_path = test::fixture("small-v2-Q4_K_M.gguf").string(),
                   .n_threads = 2,
                   .n_ctx = 512,
                   .n_seq = 2,
                   .devices = devices,
                   .cache_type_k = DType::BF16,
                   .cache_type_v = DType::BF16});
    ASSERT_EQ(engine.kv_cache().type(), DType::BF16);
    expect_same_replies_and_cache_hits(engine, 150);
  }
  Engine window({.model_path = test::fixture("gpt-oss-micro-F32.gguf").string(),
                 .n_threads = 2,
                 .n_ctx = 1024,
                 .n_seq = 2,
                 .cache_type_k = DType::BF16,
                 .cache_type_v = DType::BF16});
  ASSERT_TRUE(window.kv_cache().has_rings());
  expect_same_replies_and_cache_hits(window, 700);
}

// gpt-oss micro: window 8 on every other layer; with 1024 positions those layers keep a ring of
// 8 + 512 rows, so a history of 700 tokens has lost its first rows there.
std::unique_ptr<Engine> window_model() {
  return std::make_unique<Engine>(
      EngineOptions{.model_path = test::fixture("gpt-oss-micro-F32.gguf").string(),
                    .n_threads = 2,
                    .n_ctx = 1024,
                    .n_seq = 2});
}

TEST(PrefixCache, WindowLayersRepliesAreTheSameBitsWithTheHistoryCachedOrEvaluated) {
  const std::unique_ptr<Engine> engine = window_model();
  ASSERT_TRUE(engine->kv_cache().has_rings());
  expect_same_replies_and_cache_hits(*engine, 700);
}

TEST(PrefixCache, APrefixWhoseWindowRowsWereOverwrittenIsNotReused) {
  const std::unique_ptr<Engine> model = window_model();
  Engine& engine = *model;
  const std::vector<int32_t> history = tokens(900, 3, engine.n_vocab());
  const std::vector<int32_t> start(history.begin(), history.begin() + 300);
  BatchScheduler cached(engine, 4, uint64_t(64) << 20);
  EXPECT_EQ(ask(cached, history, 1).cached, 0);
  const std::vector<int32_t> other = tokens(600, 6, engine.n_vocab());  // overwrites the slot
  ask(cached, other, 1);
  // Its first 300 tokens' blocks were kept without the window layers' rows (the rings had moved
  // on to the last 520 positions): they cannot start another prompt...
  const Reply first = ask(cached, concat(start, tokens(20, 4, engine.n_vocab())), 2);
  EXPECT_EQ(first.cached, 0);
  // ... until a prompt that ends near them evaluated them again.
  ask(cached, other, 1);
  const Reply second = ask(cached, concat(start, tokens(20, 5, engine.n_vocab())), 3);
  EXPECT_EQ(second.cached, 300 / kBlock * kBlock);
  BatchScheduler uncached(engine, 4, 0);
  EXPECT_EQ(ask(uncached, concat(start, tokens(20, 5, engine.n_vocab())), 3).logprobs,
            second.logprobs);
}

class PrefixCacheBlocks : public ::testing::Test {
 protected:
  void SetUp() override {
    engine_ = std::make_unique<Engine>(
        EngineOptions{.model_path = test::fixture("micro-v2-F32.gguf").string(),
                      .n_threads = 2,
                      .n_ctx = 512,
                      .n_seq = 2});
  }
  // Rows of positions [0, n) of sequence `seq`, all layers.
  std::vector<float> rows(int32_t seq, int64_t n) {
    std::vector<float> out(engine_->kv_cache().bytes_of_rows(n, true) / sizeof(float));
    engine_->kv_cache().read_rows(seq, 0, n, true, out.data());
    return out;
  }
  void evaluate(const std::vector<int32_t>& prompt, int32_t seq) {
    engine_->evaluate(prompt, 0, seq, false, logits_);
  }
  uint64_t block_bytes() const { return engine_->kv_cache().bytes_of_rows(kBlock, true); }
  std::unique_ptr<Engine> engine_;
  std::vector<float> logits_;
};

TEST_F(PrefixCacheBlocks, RestoredRowsAreTheStoredRows) {
  PrefixCache cache(engine_->kv_cache(), 100 * block_bytes());
  const std::vector<int32_t> x = tokens(5 * kBlock + 10, 1, engine_->n_vocab());
  evaluate(x, 0);
  cache.store(x, 0);
  EXPECT_EQ(cache.stats().blocks, 5u);
  evaluate(tokens(5 * kBlock, 2, engine_->n_vocab()), 1);  // other rows in sequence 1
  ASSERT_NE(rows(0, 5 * kBlock), rows(1, 5 * kBlock));
  EXPECT_EQ(cache.restore(x, int64_t(x.size()) - 1, 1), 5 * kBlock);
  EXPECT_EQ(rows(0, 5 * kBlock), rows(1, 5 * kBlock));
  // The limit cuts the prefix to whole blocks below it; a different first token finds nothing.
  EXPECT_EQ(cache.restore(x, 3 * kBlock + 5, 1), 3 * kBlock);
  std::vector<int32_t> other = x;
  other[0] += 1;
  EXPECT_EQ(cache.restore(other, int64_t(other.size()), 1), 0);
  EXPECT_EQ(cache.stats().hits, 2u);
  EXPECT_EQ(cache.stats().lookups, 3u);
  EXPECT_EQ(cache.stats().hit_tokens, uint64_t(8 * kBlock));
}

TEST_F(PrefixCacheBlocks, TheBudgetHoldsAndLeastRecentlyUsedLeavesGoFirst) {
  PrefixCache cache(engine_->kv_cache(), 3 * block_bytes());
  const std::vector<int32_t> x = tokens(5 * kBlock, 1, engine_->n_vocab());
  const std::vector<int32_t> y = tokens(2 * kBlock, 2, engine_->n_vocab());
  evaluate(x, 0);
  cache.store(x, 0);  // the first three blocks fit
  EXPECT_EQ(cache.stats().blocks, 3u);
  EXPECT_LE(cache.stats().bytes, cache.budget_bytes());
  EXPECT_EQ(cache.restore(x, int64_t(x.size()), 1), 3 * kBlock);
  evaluate(y, 0);
  cache.store(y, 0);  // room for y's two blocks: x's last two go, its first block stays usable
  EXPECT_EQ(cache.stats().blocks, 3u);
  EXPECT_EQ(cache.stats().evicted_blocks, 2u);
  EXPECT_EQ(cache.restore(x, int64_t(x.size()), 1), kBlock);
  EXPECT_EQ(cache.restore(y, int64_t(y.size()), 1), 2 * kBlock);
  EXPECT_EQ(rows(0, 2 * kBlock), rows(1, 2 * kBlock));
}

TEST_F(PrefixCacheBlocks, AZeroBudgetKeepsNothing) {
  PrefixCache cache(engine_->kv_cache(), 0);
  const std::vector<int32_t> x = tokens(2 * kBlock, 1, engine_->n_vocab());
  evaluate(x, 0);
  cache.store(x, 0);
  EXPECT_EQ(cache.stats().blocks, 0u);
  EXPECT_EQ(cache.restore(x, int64_t(x.size()), 1), 0);
}

}  // namespace
}  // namespace tandem
