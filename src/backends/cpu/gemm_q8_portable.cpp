// The 8-bit token-lanes path (gemm_q8.h) in plain C++: the reference for the AVX-512 version,
// which must give the same bits, and the path itself on CPUs without AVX-512.
#include <algorithm>
#include <cmath>

#include "backends/cpu/gemm_q8.h"
#include "backends/cpu/kernels.h"
#include "core/aligned_buffer.h"

namespace tandem::cpu {
namespace {

// Σ x over group g of `kGroup` elements, lane t, from the tile's sums per 16.
template <int kGroup>
int32_t group_sum(const Q8Tile& x, int64_t g, int t) {
  if constexpr (kGroup == 16) return x.isum16[g * kLanes + t];
  return x.isum16[(2 * g) * kLanes + t] + x.isum16[(2 * g + 1) * kLanes + t];
}

template <int kGroup, bool kMins, int kOffsetShift>
void lanes8_rows(const LanesMatmul& m, int64_t first_row, int64_t last_row) {
  const RowUnpacker8 unpacker = row_unpacker8(m.type);
  thread_local AlignedBuffer scratch;
  if (scratch.size() < unpack8_scratch_bytes(1, m.cols))
    scratch = AlignedBuffer(unpack8_scratch_bytes(1, m.cols));
  const UnpackedRow8 w = unpacked_row8(scratch.data(), 1, m.cols, 0);
  const int64_t n_groups = m.cols / kGroup;
  const size_t tile_bytes = q8_tile_bytes(m.cols);
  constexpr int32_t kOffset = kOffsetShift > 0 ? int32_t(1) << kOffsetShift : 0;
  for (int64_t row = first_row; row < last_row; ++row) {
    unpacker.unpack(m.weights + size_t(row) * m.weight_stride, m.cols, w);
    for (int64_t first = 0; first < m.n_tokens; first += kLanes) {
      const Q8Tile x = q8_tile(m.tiles + size_t(first / kLanes) * tile_bytes, m.cols);
      float out[kLanes] = {};
      for (int64_t g = 0; g < n_groups; ++g) {
        int32_t acc[kLanes];
        for (int t = 0; t < kLanes; ++t) acc[t] = -kOffset * group_sum<kGroup>(x, g, t);
        for (int64_t i = g * kGroup / 4; i < (g + 1) * kGroup / 4; ++i) {
          const uint8_t* u = w.w + 4 * i;
          for (int t = 0; t < kLanes; ++t) {
            int8_t q[4];
            std::memcpy(q, x.quads + i * kLanes + t, sizeof(q));
            acc[t] += u[0] * q[0] + u[1] * q[1] + u[2] * q[2] + u[3] * q[3];
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

}  // namespace

void fill_portable_lanes8_kernels(KernelTable& table) {
  for (DType type : kLanesFormats)
    table.lanes8[size_t(type)] = lanes8_kernel_for(row_unpacker8(type).shape, [](auto v) -> LanesRowsFn {
      using V = decltype(v);
      return lanes8_rows<V::group, V::mins, V::offset_shift>;
    });
  table.build_tile8 = build_q8_tile;
}

size_t lanes8_tile_bytes(int64_t cols) {
  return q8_tile_bytes(cols);
}

}  // namespace tandem::cpu
