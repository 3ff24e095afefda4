#pragma once
// The KV cache: per layer, per sequence slot, per position one row shaped as the architecture
// says (model/model.h KvLayerShape): a compressed latent (MLA: kv_lora_rank values plus the rope
// dims of the shared key, about 70x less than DeepSeek-V2's expanded K and V), or every kv head's
// key and value (grouped-query attention). A sliding-window layer keeps only the positions its
// queries can still see: a ring of window + max_step_tokens rows per sequence.
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "core/backend.h"
#include "model/model.h"

namespace tandem {

class KvCache {
 public:
  // One layer's cache on each of `layer_devices` (the device that runs that layer's attention).
  // `max_step_tokens`: the most tokens of one sequence a forward pass may store at once (a window
  // layer's ring must hold them beside the window).
  KvCache(std::span<Backend* const> layer_devices, std::span<const KvLayerShape> layers,
          int64_t n_ctx, int64_t n_seq, int64_t max_step_tokens);
  KvCache(Backend& backend, std::span<const KvLayerShape> layers, int64_t n_ctx, int64_t n_seq,
          int64_t max_step_tokens)
      : KvCache(std::vector<Backend*>(layers.size(), &backend), layers, n_ctx, n_seq,
                max_step_tokens) {}

  std::span<const KvLayerView> views() const { return views_; }
  int64_t n_ctx() const { return n_ctx_; }
  int64_t n_seq() const { return n_seq_; }
  uint64_t bytes() const { return bytes_; }
  // Rows a layer keeps per sequence: n_ctx, or a window layer's ring when that is shorter.
  static int64_t rows_per_sequence(const KvLayerShape& layer, int64_t n_ctx,
                                   int64_t max_step_tokens);
  // Bytes of cache for `n_ctx` positions of one sequence over all `layers`.
  static uint64_t bytes_per_sequence(std::span<const KvLayerShape> layers, int64_t n_ctx,
                                     int64_t max_step_tokens);
  // True when some layer keeps fewer rows than the context (a ring): a sequence can then be cut
  // back only to a position whose window it still holds (Engine::can_rewind).
  bool has_rings() const;
  // The furthest back a sequence that has stored `length` positions may be cut to and continued:
  // a ring holds its last rows only, so cutting further loses keys a later query sees.
  int64_t earliest_rewind(int64_t length) const;

 private:
  int64_t n_ctx_, n_seq_;
  uint64_t bytes_ = 0;
  std::vector<std::shared_ptr<DeviceBuffer>> buffers_;
  std::vector<KvLayerView> views_;
  std::vector<int64_t> windows_;  // [layer] window of each ring layer, 0 otherwise
};

}  // namespace tandem
