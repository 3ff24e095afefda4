#include "runtime/kv_cache.h"

#include <fmt/format.h>

namespace tandem {

KvCache::KvCache(Backend& backend, int64_t n_layers, int64_t kv_lora_rank, int64_t rope_dims,
                 int64_t n_ctx, int64_t n_seq)
    : n_ctx_(n_ctx), n_seq_(n_seq) {
  const int64_t row = kv_lora_rank + rope_dims;
  for (int64_t il = 0; il < n_layers; ++il) {
    const size_t bytes = size_t(n_seq * n_ctx * row) * sizeof(float);
    auto buffer = backend.allocate(bytes, fmt::format("KV cache of layer {}", il));
    views_.push_back({.data = buffer->floats(), .n_seq = n_seq, .n_ctx = n_ctx,
                      .kv_lora_rank = kv_lora_rank, .rope_dims = rope_dims});
    buffers_.push_back(std::move(buffer));
    bytes_ += bytes;
  }
}

}  // namespace tandem
