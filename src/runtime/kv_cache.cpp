#include "runtime/kv_cache.h"

#include <fmt/format.h>

namespace tandem {

KvCache::KvCache(std::span<Backend* const> layer_devices, int64_t kv_lora_rank, int64_t rope_dims,
                 int64_t n_ctx, int64_t n_seq)
    : n_ctx_(n_ctx), n_seq_(n_seq) {
  const int64_t row = kv_lora_rank + rope_dims;
  for (size_t il = 0; il < layer_devices.size(); ++il) {
    const size_t bytes = size_t(n_seq * n_ctx * row) * sizeof(float);
    auto buffer = layer_devices[il]->allocate(bytes, fmt::format("KV cache of layer {}", il));
    views_.push_back({.data = buffer->floats(), .n_seq = n_seq, .n_ctx = n_ctx,
                      .kv_lora_rank = kv_lora_rank, .rope_dims = rope_dims});
    buffers_.push_back(std::move(buffer));
    bytes_ += bytes;
  }
}

}  // namespace tandem
