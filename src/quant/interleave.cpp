#include "quant/interleave.h"

#include <cstring>
#include <vector>

#include "core/blocks.h"
#include "core/error.h"
#include "quant/k_scales.h"
#include "quant/quant.h"

namespace tandem {
namespace {

constexpr int kRows = 16;

// Each format's layout as element accessors: the quantized value (offsets not applied) of
// element e of a plain block, and of row r's element e in the group's block, read and written;
// and the per-row fields (scales) copied each way. Scalar and simple on purpose: this is the
// reference the interleaved kernels are tested against, and `tandem repack` runs it once.
// Positions follow core/blocks.h: pair layout puts element e of a 4-element chunk in byte
// 2r + e % 2, low nibble for e % 4 < 2.

inline int nibble(uint8_t byte, int high) { return high ? byte >> 4 : byte & 15; }
inline void put_nibble(uint8_t& byte, int high, int v) {
  byte = uint8_t(high ? (byte & 0x0F) | (v << 4) : (byte & 0xF0) | v);
}
inline int pair_byte(int r, int e) { return 2 * r + e % 2; }
inline int pair_high(int e) { return (e / 2) % 2; }

// Formats whose only per-row field is the f16 scale d (Q8_0, Q5_0).
template <class PlainBlock, class MixedBlock>
struct ScaleOnlyFields {
  static void fields_to_group(const PlainBlock& b, MixedBlock& g, int r) { g.d[r] = b.d; }
  static void fields_to_row(const MixedBlock& g, int r, PlainBlock& b) { b.d = g.d[r]; }
};

struct Q8_0Layout : ScaleOnlyFields<BlockQ8_0, BlockQ8_0_R16> {
  using Plain = BlockQ8_0;
  using Mixed = BlockQ8_0_R16;
  static constexpr int kElems = kQK8_0;
  static int get(const Plain& b, int e) { return b.qs[e]; }
  static void set(Plain& b, int e, int v) { b.qs[e] = int8_t(v); }
  static int get(const Mixed& g, int r, int e) { return g.qs[32 * (e / 2) + pair_byte(r, e)]; }
  static void set(Mixed& g, int r, int e, int v) { g.qs[32 * (e / 2) + pair_byte(r, e)] = int8_t(v); }
};

struct Q5_0Layout : ScaleOnlyFields<BlockQ5_0, BlockQ5_0_R16> {
  using Plain = BlockQ5_0;
  using Mixed = BlockQ5_0_R16;
  static constexpr int kElems = kQK5_0;
  static uint32_t high_bits(const Plain& b) {
    uint32_t qh;
    std::memcpy(&qh, b.qh, sizeof(qh));
    return qh;
  }
  static int get(const Plain& b, int e) {
    return nibble(b.qs[e % 16], e / 16) | int((high_bits(b) >> e) & 1) << 4;
  }
  static void set(Plain& b, int e, int v) {
    put_nibble(b.qs[e % 16], e / 16, v & 15);
    const uint32_t qh = (high_bits(b) & ~(1u << e)) | uint32_t(v >> 4) << e;
    std::memcpy(b.qh, &qh, sizeof(qh));
  }
  static int get(const Mixed& g, int r, int e) {
    const int c = e / 4, bit = pair_byte(r, e);
    return nibble(g.qs[c][bit], pair_high(e)) | int((g.qh[c][pair_high(e)] >> bit) & 1) << 4;
  }
  static void set(Mixed& g, int r, int e, int v) {
    const int c = e / 4, bit = pair_byte(r, e);
    put_nibble(g.qs[c][bit], pair_high(e), v & 15);
    uint32_t& qh = g.qh[c][pair_high(e)];
    qh = (qh & ~(1u << bit)) | uint32_t(v >> 4) << bit;
  }
};

struct Q4_KLayout {
  using Plain = BlockQ4_K;
  using Mixed = BlockQ4_K_R16;
  static constexpr int kElems = kQK_K;
  // GGUF: sub-block j's element i is the low (j even) or high (j odd) nibble of qs[32(j/2) + i].
  static int get(const Plain& b, int e) { return nibble(b.qs[32 * (e / 64) + e % 32], (e / 32) % 2); }
  static void set(Plain& b, int e, int v) { put_nibble(b.qs[32 * (e / 64) + e % 32], (e / 32) % 2, v); }
  static int offset(int r, int e) { return 32 * ((e % 32) / 4) + pair_byte(r, e); }
  static int get(const Mixed& g, int r, int e) { return nibble(g.qs[e / 32][offset(r, e)], pair_high(e)); }
  static void set(Mixed& g, int r, int e, int v) { put_nibble(g.qs[e / 32][offset(r, e)], pair_high(e), v); }
  static void fields_to_group(const Plain& b, Mixed& g, int r) {
    g.d[r] = b.d;
    g.dmin[r] = b.dmin;
    uint8_t scales[8], mins[8];
    unpack_q4_k_scales(b.scales, scales, mins);
    for (int j = 0; j < 8; ++j) g.scales[j][r] = scales[j], g.mins[j][r] = mins[j];
  }
  static void fields_to_row(const Mixed& g, int r, Plain& b) {
    b.d = g.d[r];
    b.dmin = g.dmin[r];
    uint8_t scales[8], mins[8];
    for (int j = 0; j < 8; ++j) scales[j] = g.scales[j][r], mins[j] = g.mins[j][r];
    pack_q4_k_scales(scales, mins, b.scales);
  }
};

// Every block column of one group: 16 rows of n_blocks plain blocks each <-> n_blocks group
// blocks. The written side is zeroed first (so every byte of it is defined), then filled.
template <class Layout>
void to_group(const void* rows, void* group, int64_t n_blocks) {
  const auto* plain = static_cast<const typename Layout::Plain*>(rows);
  auto* mixed = static_cast<typename Layout::Mixed*>(group);
  std::memset(mixed, 0, size_t(n_blocks) * sizeof(*mixed));
  for (int64_t b = 0; b < n_blocks; ++b) {
    for (int r = 0; r < kRows; ++r) {
      const auto& block = plain[r * n_blocks + b];
      Layout::fields_to_group(block, mixed[b], r);
      for (int e = 0; e < Layout::kElems; ++e) Layout::set(mixed[b], r, e, Layout::get(block, e));
    }
  }
}

template <class Layout>
void to_rows(const void* group, void* rows, int64_t n_blocks) {
  const auto* mixed = static_cast<const typename Layout::Mixed*>(group);
  auto* plain = static_cast<typename Layout::Plain*>(rows);
  std::memset(plain, 0, size_t(n_blocks) * kRows * sizeof(*plain));
  for (int64_t b = 0; b < n_blocks; ++b) {
    for (int r = 0; r < kRows; ++r) {
      auto& block = plain[r * n_blocks + b];
      Layout::fields_to_row(mixed[b], r, block);
      for (int e = 0; e < Layout::kElems; ++e) Layout::set(block, e, Layout::get(mixed[b], r, e));
    }
  }
}

// Calls fn.template operator()<Layout>() for the layout of interleaved `type`.
template <class Fn>
void with_layout(DType type, int64_t cols, Fn fn) {
  const DTypeInfo& info = dtype_info(type);
  if (info.row_group != kRows) fail("{} is not one of tandem's interleaved formats", dtype_name(type));
  if (cols <= 0 || cols % info.block_elems != 0)
    fail("{}: rows of {} elements are not a whole number of {}-element blocks", dtype_name(type),
         cols, info.block_elems);
  switch (type) {
    case DType::Q8_0_R16:
      return fn.template operator()<Q8_0Layout>();
    case DType::Q5_0_R16:
      return fn.template operator()<Q5_0Layout>();
    case DType::Q4_K_R16:
      return fn.template operator()<Q4_KLayout>();
    default:
      check_failed("with_layout: interleaved format without a layout", __FILE__, __LINE__);
  }
}

}  // namespace

bool has_interleaved_format(DType base) {
  return interleaved_of(base).has_value();
}

DType interleaved_format(DType base) {
  if (const std::optional<DType> type = interleaved_of(base)) return *type;
  fail("{} has no interleaved format (tandem has Q8_0_R16, Q5_0_R16, Q4_K_R16)", dtype_name(base));
}

void interleave_rows(DType type, const void* rows, int64_t cols, void* group) {
  with_layout(type, cols, [&]<class Layout>() { to_group<Layout>(rows, group, cols / Layout::kElems); });
}

void take_apart_rows(DType type, const void* group, int64_t cols, void* rows) {
  with_layout(type, cols, [&]<class Layout>() { to_rows<Layout>(group, rows, cols / Layout::kElems); });
}

void dequantize_interleaved(DType type, const void* data, int64_t rows, int64_t cols, float* out) {
  const DTypeInfo& info = dtype_info(type);
  if (rows % kRows != 0)
    fail("{}: {} rows are not a whole number of {}-row groups", dtype_name(type), rows, kRows);
  const uint64_t group_bytes = kRows * row_bytes(type, uint64_t(cols));
  std::vector<uint8_t> plain(kRows * row_bytes(info.base, uint64_t(cols)));
  for (int64_t g = 0; g < rows / kRows; ++g) {
    take_apart_rows(type, static_cast<const uint8_t*>(data) + uint64_t(g) * group_bytes, cols,
                    plain.data());
    dequantize_row(info.base, plain.data(), out + g * kRows * cols, kRows * cols);
  }
}

}  // namespace tandem
