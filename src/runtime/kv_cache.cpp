#include "runtime/kv_cache.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstddef>

#include "core/error.h"

namespace tandem {

int64_t KvCache::rows_per_sequence(const KvLayerShape& layer, int64_t n_ctx,
                                   int64_t max_step_tokens) {
  // A step stores up to max_step_tokens positions of a sequence and its first query still needs
  // the window before it: window + max_step_tokens - 1 distinct rows at most.
  if (layer.window <= 0) return n_ctx;
  return std::min(n_ctx, layer.window + max_step_tokens);
}

namespace {
uint64_t value_bytes(DType type) {
  TANDEM_CHECK(type == DType::F32 || type == DType::BF16);
  return dtype_info(type).block_bytes;
}
}  // namespace

uint64_t KvCache::bytes_per_sequence(std::span<const KvLayerShape> layers, int64_t n_ctx,
                                     int64_t max_step_tokens, DType type) {
  uint64_t bytes = 0;
  for (const KvLayerShape& layer : layers)
    bytes += uint64_t(rows_per_sequence(layer, n_ctx, max_step_tokens) * layer.row_floats()) *
             value_bytes(type);
  return bytes;
}

KvCache::KvCache(std::span<Backend* const> layer_devices, std::span<const KvLayerShape> layers,
                 int64_t n_ctx, int64_t n_seq, int64_t max_step_tokens, DType type)
    : n_ctx_(n_ctx), n_seq_(n_seq), type_(type) {
  TANDEM_CHECK(layer_devices.size() == layers.size());
  for (size_t il = 0; il < layers.size(); ++il) {
    const KvLayerShape& shape = layers[il];
    const int64_t rows = rows_per_sequence(shape, n_ctx, max_step_tokens);
    // A layer another rank runs (null device) has its cache there.
    const size_t bytes =
        layer_devices[il] ? size_t(n_seq * rows * shape.row_floats()) * value_bytes(type) : 0;
    // Copies between sequences go as rows of floats (Backend::copy_rows): whole 4-byte words.
    TANDEM_CHECK(shape.row_floats() * value_bytes(type) % 4 == 0);
    std::shared_ptr<DeviceBuffer> buffer;
    if (layer_devices[il])
      buffer = layer_devices[il]->allocate(bytes, fmt::format("KV cache of layer {}", il));
    views_.push_back({.data = buffer ? buffer->data() : nullptr,
                      .n_seq = n_seq,
                      .n_ctx = rows,
                      .kv_lora_rank = shape.latent_dims,
                      .rope_dims = shape.rope_dims,
                      .k_dims = shape.k_dims,
                      .v_dims = shape.v_dims,
                      .ring = rows < n_ctx,
                      .type = type});
    windows_.push_back(rows < n_ctx ? shape.window : 0);
    buffers_.push_back(std::move(buffer));
    devices_.push_back(layer_devices[il]);
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

int64_t KvCache::max_window() const {
  return *std::max_element(windows_.begin(), windows_.end());
}

int64_t KvCache::min_ring_rows() const {
  int64_t rows = n_ctx_;
  for (size_t il = 0; il < views_.size(); ++il)
    if (windows_[il] > 0) rows = std::min(rows, views_[il].n_ctx);
  return rows;
}

uint64_t KvCache::bytes_of_rows(int64_t n, bool rings) const {
  uint64_t bytes = 0;
  for (size_t il = 0; il < views_.size(); ++il)
    if (rings || windows_[il] == 0) bytes += uint64_t(n * views_[il].row_bytes());
  return bytes;
}

uint64_t KvCache::stored_bytes_of_rows(int64_t n, bool rings) const {
  uint64_t bytes = 0;
  for (size_t il = 0; il < views_.size(); ++il)
    if (devices_[il] && (rings || windows_[il] == 0)) bytes += uint64_t(n * views_[il].row_bytes());
  return bytes;
}

template <class Copy>
void KvCache::for_each_run(int64_t seq, int64_t first, int64_t n, bool rings, Copy&& copy) const {
  TANDEM_CHECK(seq >= 0 && seq < n_seq_ && first >= 0 && n >= 0 && first + n <= n_ctx_);
  int64_t offset = 0;  // bytes of the host rows before this layer's
  for (size_t il = 0; il < views_.size(); ++il) {
    const KvLayerView& v = views_[il];
    if ((windows_[il] > 0 && !rings) || !devices_[il]) continue;  // null: another rank's layer
    TANDEM_CHECK(n <= v.n_ctx);
    for (int64_t done = 0; done < n;) {
      const int64_t slot = v.slot(first + done);
      const int64_t run = std::min(n - done, v.n_ctx - slot);  // up to the ring's end
      copy(il, (seq * v.n_ctx + slot) * v.row_bytes(), offset + done * v.row_bytes(),
           run * v.row_bytes());
      done += run;
    }
    offset += n * v.row_bytes();
  }
}

void KvCache::read_rows(int64_t seq, int64_t first, int64_t n, bool rings, void* dst) const {
  for_each_run(seq, first, n, rings, [&](size_t il, int64_t at, int64_t host_at, int64_t bytes) {
    devices_[il]->copy_to_host(static_cast<std::byte*>(dst) + host_at,
                               static_cast<const std::byte*>(views_[il].data) + at, size_t(bytes));
  });
}

void KvCache::write_rows(int64_t seq, int64_t first, int64_t n, bool rings, const void* src) {
  for_each_run(seq, first, n, rings, [&](size_t il, int64_t at, int64_t host_at, int64_t bytes) {
    devices_[il]->copy_from_host(static_cast<std::byte*>(views_[il].data) + at,
                                 static_cast<const std::byte*>(src) + host_at, size_t(bytes));
  });
}

void KvCache::copy_sequence(int64_t from, int64_t to, int64_t length) {
  TANDEM_CHECK(from >= 0 && from < n_seq_ && to >= 0 && to < n_seq_ && length <= n_ctx_);
  for (size_t il = 0; il < views_.size(); ++il) {
    const KvLayerView& v = views_[il];
    if (!devices_[il]) continue;  // another rank's layer
    const int64_t rows = v.ring ? v.n_ctx : length, words = v.row_bytes() / 4;  // floats' worth
    float* values = static_cast<float*>(v.data);
    devices_[il]->copy_rows(values + to * v.n_ctx * words, words, values + from * v.n_ctx * words,
                            words, rows, words);
  }
}

}  // namespace tandem
