#include "runtime/prefix_cache.h"

#include <algorithm>

#include "runtime/kv_cache.h"

namespace tandem {

size_t PrefixCache::KeyHash::operator()(const Key& key) const {
  uint64_t h = key.parent * 0x9e3779b97f4a7c15ull;  // FNV-1a over the tokens, seeded by the parent
  for (int32_t t : key.tokens) h = (h ^ uint32_t(t)) * 0x100000001b3ull;
  return size_t(h);
}

PrefixCache::PrefixCache(KvCache& cache, uint64_t budget_bytes)
    : cache_(cache),
      budget_(budget_bytes),
      window_(cache.has_rings() ? cache.max_window() : 0),
      ring_rows_(cache.min_ring_rows()) {}

std::vector<PrefixCache::Block*> PrefixCache::chain(std::span<const int32_t> tokens,
                                                    int64_t limit) {
  std::vector<Block*> found;
  Key key{.parent = 0, .tokens = {}};
  for (int64_t first = 0; first + kBlockTokens <= std::min<int64_t>(limit, int64_t(tokens.size()));
       first += kBlockTokens) {
    key.tokens.assign(tokens.begin() + first, tokens.begin() + first + kBlockTokens);
    const auto it = index_.find(key);
    if (it == index_.end()) break;
    found.push_back(&blocks_.at(it->second));
    key.parent = it->second;
  }
  return found;
}

int64_t PrefixCache::restore(std::span<const int32_t> tokens, int64_t limit, int32_t seq) {
  ++stats_.lookups;
  std::vector<Block*> blocks = chain(tokens, limit);
  const uint64_t now = ++clock_;
  for (Block* b : blocks) b->last_use = now;
  // A window layer's queries after the prefix look back `window` positions: the blocks that
  // cover them must hold the ring rows.
  const size_t ring_blocks = size_t((window_ + kBlockTokens - 1) / kBlockTokens);
  auto window_complete = [&] {
    for (size_t i = blocks.size() - std::min(blocks.size(), ring_blocks); i < blocks.size(); ++i)
      if (!blocks[i]->has_ring_rows) return false;
    return true;
  };
  while (!blocks.empty() && window_ > 0 && !window_complete()) blocks.pop_back();
  if (blocks.empty()) return 0;
  // In position order, so where a ring's slot is written twice the later position stays.
  for (size_t i = 0; i < blocks.size(); ++i)
    cache_.write_rows(seq, int64_t(i) * kBlockTokens, kBlockTokens, blocks[i]->has_ring_rows,
                      blocks[i]->rows.data());
  const int64_t length = int64_t(blocks.size()) * kBlockTokens;
  ++stats_.hits;
  stats_.hit_tokens += uint64_t(length);
  return length;
}

void PrefixCache::store(std::span<const int32_t> tokens, int32_t seq) {
  if (budget_ == 0) return;
  const int64_t length = int64_t(tokens.size());
  const uint64_t now = ++clock_;
  uint64_t parent = 0;
  for (int64_t first = 0; first + kBlockTokens <= length; first += kBlockTokens) {
    // The slot's rings still hold the last ring_rows_ positions.
    const bool rings = window_ > 0 && first >= length - ring_rows_;
    Key key{.parent = parent,
            .tokens = {tokens.begin() + first, tokens.begin() + first + kBlockTokens}};
    if (const auto it = index_.find(key); it != index_.end()) {
      Block& b = blocks_.at(it->second);
      b.last_use = now;
      parent = b.id;
      if (!rings || b.has_ring_rows) continue;
      // The block was kept without its ring rows; they are here now.
      const uint64_t more = cache_.bytes_of_rows(kBlockTokens, true) - b.bytes;
      if (!make_room(more, now)) return;
      b.rows.resize(cache_.stored_bytes_of_rows(kBlockTokens, true));
      cache_.read_rows(seq, first, kBlockTokens, true, b.rows.data());
      b.has_ring_rows = true;
      b.bytes += more;
      stats_.bytes += more;
      continue;
    }
    const uint64_t bytes = cache_.bytes_of_rows(kBlockTokens, rings);
    if (!make_room(bytes, now)) return;
    Block b{.id = next_id_++,
            .key = key,
            .rows = {},
            .bytes = bytes,
            .has_ring_rows = rings,
            .last_use = now};
    b.rows.resize(cache_.stored_bytes_of_rows(kBlockTokens, rings));
    cache_.read_rows(seq, first, kBlockTokens, rings, b.rows.data());
    if (parent) ++blocks_.at(parent).children;
    index_.emplace(std::move(key), b.id);
    parent = b.id;
    blocks_.emplace(b.id, std::move(b));
    stats_.bytes += bytes;
    ++stats_.blocks;
  }
}

bool PrefixCache::make_room(uint64_t bytes, uint64_t now) {
  if (bytes > budget_) return false;
  while (stats_.bytes + bytes > budget_) {
    // The least recently used leaf: a block no other block continues (its prefix stays usable).
    Block* victim = nullptr;
    for (auto& [id, b] : blocks_)
      if (b.children == 0 && b.last_use < now && (!victim || b.last_use < victim->last_use))
        victim = &b;
    if (!victim) return false;
    erase(*victim);
    ++stats_.evicted_blocks;
  }
  return true;
}

void PrefixCache::erase(Block& block) {
  if (block.key.parent) --blocks_.at(block.key.parent).children;
  stats_.bytes -= block.bytes;
  --stats_.blocks;
  const uint64_t id = block.id;
  index_.erase(block.key);
  blocks_.erase(id);
}

}  // namespace tandem
