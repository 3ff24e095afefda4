#pragma once
// The KV cache: per layer, per sequence slot, per position one row shaped as the architecture
// says (model/model.h KvLayerShape): a compressed latent (MLA: kv_lora_rank values plus the rope
// dims of the shared key, about 70x less than DeepSeek-V2's expanded K and V), or every kv head's
// key and value (grouped-query attention). A sliding-window layer keeps only the positions its
// queries can still see: a ring of window + max_step_tokens rows per sequence. The values are F32
// or BF16 (KvLayerView).
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "core/backend.h"
#include "model/model.h"

namespace tandem {

class KvCache {
 public:
  // One layer's cache on each of `layer_devices` (the device that runs that layer's attention; null
  // for a layer another rank runs: its cache is there, and the row copies below are for one rank).
  // `max_step_tokens`: the most tokens of one sequence a forward pass may store at once (a window
  // layer's ring must hold them beside the window).
  // `type`: F32 or BF16 values.
  KvCache(std::span<Backend* const> layer_devices, std::span<const KvLayerShape> layers,
          int64_t n_ctx, int64_t n_seq, int64_t max_step_tokens, DType type = DType::F32);
  KvCache(Backend& backend, std::span<const KvLayerShape> layers, int64_t n_ctx, int64_t n_seq,
          int64_t max_step_tokens, DType type = DType::F32)
      : KvCache(std::vector<Backend*>(layers.size(), &backend), layers, n_ctx, n_seq,
                max_step_tokens, type) {}

  std::span<const KvLayerView> views() const { return views_; }
  int64_t n_ctx() const { return n_ctx_; }
  int64_t n_seq() const { return n_seq_; }
  uint64_t bytes() const { return bytes_; }
  DType type() const { return type_; }
  // Rows a layer keeps per sequence: n_ctx, or a window layer's ring when that is shorter.
  static int64_t rows_per_sequence(const KvLayerShape& layer, int64_t n_ctx,
                                   int64_t max_step_tokens);
  // Bytes of cache for `n_ctx` positions of one sequence over all `layers`, values of `type`.
  static uint64_t bytes_per_sequence(std::span<const KvLayerShape> layers, int64_t n_ctx,
                                     int64_t max_step_tokens, DType type = DType::F32);
  // True when some layer keeps fewer rows than the context (a ring): a sequence can then be cut
  // back only to a position whose window it still holds (Engine::can_rewind).
  bool has_rings() const;
  // The furthest back a sequence that has stored `length` positions may be cut to and continued:
  // a ring holds its last rows only, so cutting further loses keys a later query sees.
  int64_t earliest_rewind(int64_t length) const;
  // The widest window of the ring layers (0 when there are none).
  int64_t max_window() const;
  // The fewest rows a ring layer keeps per sequence (n_ctx when there are no rings): a sequence
  // that has stored `length` positions still holds the ring rows of [length - this, length).
  int64_t min_ring_rows() const;

  // Host copies of one sequence's rows of positions [first, first + n), layer after layer in
  // layer order, each layer's rows in position order; ring layers only when `rings` (their rows
  // must still be held), as the cache holds them (F32 or BF16). The prefix cache keeps prompts'
  // rows with these. Only this rank's layers are copied (all of them in a run of one process):
  // `stored_bytes_of_rows` bytes, where `bytes_of_rows` counts every layer's (the same on every
  // rank, so that every rank's prefix cache makes the same choices).
  uint64_t bytes_of_rows(int64_t n, bool rings) const;
  uint64_t stored_bytes_of_rows(int64_t n, bool rings) const;
  void read_rows(int64_t seq, int64_t first, int64_t n, bool rings, void* dst) const;
  void write_rows(int64_t seq, int64_t first, int64_t n, bool rings, const void* src);
  // Gives sequence `to` the rows of positions [0, length) of sequence `from` (a ring layer: its
  // whole ring), on each layer's device: choices of one prompt share its evaluation. This rank's
  // layers only.
  void copy_sequence(int64_t from, int64_t to, int64_t length);

 private:
  // Calls copy(layer, bytes from the start of the layer's view, bytes from the start of the host
  // rows, bytes) for each contiguous run of the positions' rows (a ring's run wraps at most once).
  template <class Copy>
  void for_each_run(int64_t seq, int64_t first, int64_t n, bool rings, Copy&& copy) const;

  int64_t n_ctx_, n_seq_;
  DType type_;
  uint64_t bytes_ = 0;
  std::vector<std::shared_ptr<DeviceBuffer>> buffers_;
  std::vector<Backend*> devices_;  // [layer] the device holding its buffer
  std::vector<KvLayerView> views_;
  std::vector<int64_t> windows_;  // [layer] window of each ring layer, 0 otherwise
};

}  // namespace tandem
