#pragma once
// The latent KV cache: per layer, per sequence slot, per position one row of kv_lora_rank
// compressed values plus the rope dims of the shared key — not expanded K and V, which would be
// n_head * (nope + rope + v_head) values (about 70x more for DeepSeek-V2).
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "core/backend.h"

namespace tandem {

class KvCache {
 public:
  // One layer's cache on each of `layer_devices` (the device that runs that layer's attention).
  KvCache(std::span<Backend* const> layer_devices, int64_t kv_lora_rank, int64_t rope_dims,
          int64_t n_ctx, int64_t n_seq);
  KvCache(Backend& backend, int64_t n_layers, int64_t kv_lora_rank, int64_t rope_dims, int64_t n_ctx,
          int64_t n_seq)
      : KvCache(std::vector<Backend*>(size_t(n_layers), &backend), kv_lora_rank, rope_dims, n_ctx, n_seq) {}

  std::span<const KvLayerView> views() const { return views_; }
  int64_t n_ctx() const { return n_ctx_; }
  int64_t n_seq() const { return n_seq_; }
  uint64_t bytes() const { return bytes_; }
  static uint64_t bytes_per_token(int64_t n_layers, int64_t kv_lora_rank, int64_t rope_dims) {
    return uint64_t(n_layers * (kv_lora_rank + rope_dims)) * sizeof(float);
  }

 private:
  int64_t n_ctx_, n_seq_;
  uint64_t bytes_ = 0;
  std::vector<std::shared_ptr<DeviceBuffer>> buffers_;
  std::vector<KvLayerView> views_;
};

}  // namespace tandem
