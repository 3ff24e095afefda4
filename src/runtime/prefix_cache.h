#pragma once
// The prefix cache: KV rows of evaluated prompts kept in host memory in blocks of kBlockTokens
// tokens, each block found by its tokens and the block before it (a chain from the start of the
// prompt, so a block stands for its whole prefix). A new request copies the rows of its longest
// cached prefix into its sequence slot and evaluates only the rest: a chat's next turn evaluates
// the previous reply and the new message, not the history.
//
// Only rows that prompt steps computed are kept, never the rows of generated tokens: those come
// from the decode kernels, whose bits differ from the prompt kernels' (KernelChoice), and a reply
// must be the same bits with its prefix cached or evaluated again. A conversation's previous reply
// is therefore evaluated once more as part of the next prompt, and cached from then on.
//
// Bounded by a byte budget; when full, the least recently used block with no cached successor
// goes first. Layers with a sliding window keep only their last rows, so a block holds their rows
// only when the slot still had them; a prefix is reused only up to where the window before its
// end is complete.
//
// Over several ranks each rank keeps its layers' rows of the same blocks: the budget counts every
// layer's rows, so that the same calls make the same choices on every rank.
#include <cstddef>
#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

namespace tandem {

class KvCache;

class PrefixCache {
 public:
  static constexpr int64_t kBlockTokens =
      16;  // vLLM's block size: the last partial block is evaluated again

  struct Stats {
    uint64_t bytes = 0, blocks = 0;
    uint64_t hit_tokens = 0;  // prompt tokens copied from the cache instead of evaluated
    uint64_t lookups = 0, hits = 0;
    uint64_t evicted_blocks = 0;
  };

  PrefixCache(KvCache& cache, uint64_t budget_bytes);

  // Copies the rows of the longest cached prefix of `tokens` no longer than `limit` tokens into
  // sequence `seq` at positions 0, 1, ...; returns its length (a multiple of kBlockTokens, or 0).
  int64_t restore(std::span<const int32_t> tokens, int64_t limit, int32_t seq);
  // Keeps the rows of the whole blocks of `tokens` (all of them evaluated by prompt steps and
  // still in sequence `seq`) that are not cached yet, as far as the budget allows.
  void store(std::span<const int32_t> tokens, int32_t seq);

  const Stats& stats() const { return stats_; }
  uint64_t budget_bytes() const { return budget_; }

 private:
  struct Key {
    uint64_t parent;  // the block before (0: the start of a prompt)
    std::vector<int32_t> tokens;
    bool operator==(const Key&) const = default;
  };
  struct KeyHash {
    size_t operator()(const Key& key) const;
  };
  struct Block {
    uint64_t id = 0;
    Key key;
    std::vector<std::byte> rows;  // KvCache::read_rows order
    uint64_t bytes = 0;           // counted against the budget: every rank's rows (bytes_of_rows)
    bool has_ring_rows = false;
    uint64_t last_use = 0;
    int32_t children = 0;
  };

  // The cached blocks that begin `tokens`, in order (at most limit / kBlockTokens of them).
  std::vector<Block*> chain(std::span<const int32_t> tokens, int64_t limit);
  // Frees least recently used leaves not used at `now` until `bytes` more fit; false if they don't.
  bool make_room(uint64_t bytes, uint64_t now);
  void erase(Block& block);

  KvCache& cache_;
  const uint64_t budget_;
  const int64_t window_;                              // widest sliding window (0: none)
  const int64_t ring_rows_;                           // rows the smallest ring keeps per sequence
  std::unordered_map<Key, uint64_t, KeyHash> index_;  // key -> block id
  std::unordered_map<uint64_t, Block> blocks_;
  uint64_t next_id_ = 1, clock_ = 0;
  Stats stats_;
};

}  // namespace tandem
