// The token-lanes path (gemm_q16.h) in plain C++: the reference for the AVX-512 version, which
// must give the same bits, and the path itself on CPUs without AVX-512.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "backends/cpu/gemm_q16.h"
#include "backends/cpu/kernels.h"
#include "core/aligned_buffer.h"

namespace tandem::cpu {
namespace {

template <int kGroup, bool kMins>
void lanes_rows(const LanesMatmul& m, int64_t first_row, int64_t last_row) {
  const RowUnpacker unpacker = row_unpacker(m.type);
  thread_local AlignedBuffer scratch;
  if (scratch.size() < unpack_scratch_bytes(1, m.cols))
    scratch = AlignedBuffer(unpack_scratch_bytes(1, m.cols));
  const UnpackedRow w = unpacked_row(scratch.data(), 1, m.cols, 0);
  const int64_t n_groups = m.cols / kGroup;
  const size_t tile_bytes = q16_tile_bytes(m.cols);
  for (int64_t row = first_row; row < last_row; ++row) {
    unpacker.unpack(m.weights + size_t(row) * m.weight_stride, m.cols, w);
    for (int64_t first = 0; first < m.n_tokens; first += kLanes) {
      const Q16Tile x = q16_tile(m.tiles + size_t(first / kLanes) * tile_bytes, m.cols);
      float out[kLanes] = {};
      for (int64_t g = 0; g < n_groups; ++g) {
        int32_t acc[kLanes] = {};
        for (int64_t i = g * kGroup / 2; i < (g + 1) * kGroup / 2; ++i) {
          const int32_t w0 = w.w[2 * i], w1 = w.w[2 * i + 1];
          for (int t = 0; t < kLanes; ++t) {
            const int32_t pair = x.pairs[i * kLanes + t];
            acc[t] += w0 * int16_t(pair & 0xffff) + w1 * int16_t(uint32_t(pair) >> 16);
          }
        }
        const int64_t block = g * kGroup / 32;
        for (int t = 0; t < kLanes; ++t) {
          out[t] = std::fma(float(acc[t]), w.scale[g] * x.d[block * kLanes + t], out[t]);
          if constexpr (kMins) out[t] = std::fma(-w.min[g], x.sum32[block * kLanes + t], out[t]);
        }
      }
      const int64_t n = std::min<int64_t>(kLanes, m.n_tokens - first);
      for (int64_t t = 0; t < n; ++t) m.output[(first + t) * m.rows + row] = out[t];
    }
  }
}

LanesRowsFn lanes_kernel_for(UnpackShape shape) {
  if (shape.group == 16) return shape.mins ? nullptr : lanes_rows<16, false>;
  return shape.mins ? lanes_rows<32, true> : lanes_rows<32, false>;
}

}  // namespace

void fill_portable_lanes_kernels(KernelTable& table) {
  for (DType type : kLanesFormats)
    table.lanes[size_t(type)] = lanes_kernel_for(row_unpacker(type).shape);
}

void build_lanes_tile(const uint8_t* act, size_t act_stride, int64_t first, int64_t n,
                      int64_t cols, uint8_t* tile) {
  build_q16_tile(act, act_stride, first, n, cols, tile);
}

size_t lanes_tile_bytes(int64_t cols) {
  return q16_tile_bytes(cols);
}

}  // namespace tandem::cpu
