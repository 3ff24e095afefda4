#include "runtime/kv_cache.h"

#include <fmt/format.h>

#include <algorithm>

#include "core/error.h"

namespace tandem {

int64_t KvCache::rows_per_sequence(const KvLayerShape& layer, int64_t n_ctx,
                                   int64_t max_step_tokens) {
  // A step stores up to max_step_tokens positions of a sequence and its first query still needs
  // the window before it: window + max_step_tokens - 1 distinct rows at most.
  if (layer.window <= 0) return n_ctx;
  return std::min(n_ctx, layer.window + max_step_tokens);
}

uint64_t KvCache::bytes_per_sequence(std::span<const KvLayerShape> layers, int64_t n_ctx,
                                     int64_t max_step_tokens) {
  uint64_t bytes = 0;
  for (const KvLayerShape& layer : layers)
    bytes += uint64_t(rows_per_sequence(layer, n_ctx, max_step_tokens) * layer.row_floats()) *
             sizeof(float);
  return bytes;
}

KvCache::KvCache(std::span<Backend* const> layer_devices, std::span<const KvLayerShape> layers,
                 int64_t n_ctx, int64_t n_seq, int64_t max_step_tokens)
    : n_ctx_(n_ctx), n_seq_(n_seq) {
  TANDEM_CHECK(layer_devices.size() == layers.size());
  for (size_t il = 0; il < layers.size(); ++il) {
    const KvLayerShape& shape = layers[il];
    const int64_t rows = rows_per_sequence(shape, n_ctx, max_step_tokens);
    const size_t bytes = size_t(n_seq * rows * shape.row_floats()) * sizeof(float);
    auto buffer = layer_devices[il]->allocate(bytes, fmt::format("KV cache of layer {}", il));
    views_.push_back({.data = buffer->floats(),
                      .n_seq = n_seq,
                      .n_ctx = rows,
                      .kv_lora_rank = shape.latent_dims,
                      .rope_dims = shape.rope_dims,
                      .k_dims = shape.k_dims,
                      .v_dims = shape.v_dims,
                      .ring = rows < n_ctx});
    windows_.push_back(rows < n_ctx ? shape.window : 0);
    buffers_.push_back(std::move(buffer));
    bytes_ += bytes;
  }
}

bool KvCache::has_rings() const {
  return std::any_of(windows_.begin(), windows_.end(), [](int64_t w) { return w > 0; });
}

int64_t KvCache::earliest_rewind(int64_t length) const {
  int64_t earliest = 0;
  for (size_t il = 0; il < views_.size(); ++il) {
    if (windows_[il] == 0) continue;
    // Position p (p <= length) can continue when the rows of (p - window, p) were not overwritten
    // by the positions stored after them: length - 1 - (p - window + 1) < ring.
    earliest = std::max(earliest, length - views_[il].n_ctx + windows_[il] - 1);
  }
  return std::max<int64_t>(earliest, 0);
}

}  // namespace tandem
