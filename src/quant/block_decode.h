#pragma once
// Per-block dequantization of every weight format, written once for both sides: the host tests
// run it against the scalar references of src/quant, and the CUDA kernels compile the same code
// with nvcc. Every value is bit-exact with dequantize_row (quant/quant.h): the float operations
// are the reference's, in its order, each rounded where it rounds (hd::mul_rn and friends keep
// nvcc from fusing them into FMAs). In these formats every product is in fact exact (an f16 scale
// has 11 significant bits and its integer factors multiply to at most 2^12), so only a final add
// or subtract rounds; the order still decides the sign of a zero result, which the tests compare.
//
// A kernel calls Decoder<T>::decode8 once per 8 weights, so each call reads only what those 8
// elements need: their scale (and min), their quant bits, never the whole block. Multi-byte
// fields are read byte by byte (hd::load_u16/u32) because blocks sit at any byte offset, and
// nothing here may call the standard library, which device code cannot.
//
// The functions are inline with external linkage, so keep this header out of the ISA-specific
// files (_avx2/_avx512.cpp): the linker could hand their copy to portable callers (k_scales.h).
#include <cstddef>
#include <cstdint>

#include "core/blocks.h"
#include "core/dtype.h"
#include "core/host_device.h"
#include "core/iq_blocks.h"

namespace tandem::blocks {

template <DType T>
struct Decoder;

// ---- plain float formats: blocks of 8 elements so that every format has whole groups of 8 ----

template <>
struct Decoder<DType::F32> {
  static constexpr DType kType = DType::F32;
  static constexpr int kElems = 8;
  static constexpr int kBytes = 8 * 4;
  TANDEM_HD static void decode8(const uint8_t* block, int group, float out[8]) {
    const uint8_t* x = block + 32 * group;
    for (int i = 0; i < 8; ++i) out[i] = hd::bits_to_float(hd::load_u32(x + 4 * i));
  }
};

template <>
struct Decoder<DType::F16> {
  static constexpr DType kType = DType::F16;
  static constexpr int kElems = 8;
  static constexpr int kBytes = 8 * 2;
  TANDEM_HD static void decode8(const uint8_t* block, int group, float out[8]) {
    const uint8_t* x = block + 16 * group;
    for (int i = 0; i < 8; ++i) out[i] = hd::f16_to_f32(hd::load_u16(x + 2 * i));
  }
};

template <>
struct Decoder<DType::BF16> {
  static constexpr DType kType = DType::BF16;
  static constexpr int kElems = 8;
  static constexpr int kBytes = 8 * 2;
  TANDEM_HD static void decode8(const uint8_t* block, int group, float out[8]) {
    const uint8_t* x = block + 16 * group;
    for (int i = 0; i < 8; ++i) out[i] = hd::bf16_to_f32(hd::load_u16(x + 2 * i));
  }
};

// ---- blocks of 32 ----

// Q4_0: f16 d, 16 bytes of nibbles; element j < 16 is the low nibble of qs[j], j + 16 the high
// one. x = (q - 8) * d.
template <>
struct Decoder<DType::Q4_0> {
  static constexpr DType kType = DType::Q4_0;
  static constexpr int kElems = kQK4_0;
  static constexpr int kBytes = sizeof(BlockQ4_0);
  TANDEM_HD static void decode8(const uint8_t* block, int group, float out[8]) {
    const float d = hd::f16_to_f32(hd::load_u16(block + offsetof(BlockQ4_0, d)));
    const uint8_t* qs = block + offsetof(BlockQ4_0, qs) + 8 * (group & 1);
    const int shift = 4 * (group >> 1);
    for (int i = 0; i < 8; ++i) out[i] = hd::mul_rn(float(((qs[i] >> shift) & 0xF) - 8), d);
  }
};

// The 5-bit quant of element e of a Q5_0/Q5_1 block: the nibble as in Q4_0, bit 4 from bit e of
// the little-endian qh. e = 8 * group + i.
TANDEM_HD void q5_quants8(const uint8_t* qh_bytes, const uint8_t* qs_bytes, int group, int q[8]) {
  const uint32_t high_bits = hd::load_u32(qh_bytes) >> (8 * group);
  const uint8_t* qs = qs_bytes + 8 * (group & 1);
  const int shift = 4 * (group >> 1);
  for (int i = 0; i < 8; ++i) q[i] = ((qs[i] >> shift) & 0xF) | int(((high_bits >> i) & 1) << 4);
}

// Q5_0: f16 d, 32 fifth bits in qh, nibbles as Q4_0. x = (q - 16) * d.
template <>
struct Decoder<DType::Q5_0> {
  static constexpr DType kType = DType::Q5_0;
  static constexpr int kElems = kQK5_0;
  static constexpr int kBytes = sizeof(BlockQ5_0);
  TANDEM_HD static void decode8(const uint8_t* block, int group, float out[8]) {
    const float d = hd::f16_to_f32(hd::load_u16(block + offsetof(BlockQ5_0, d)));
    int q[8];
    q5_quants8(block + offsetof(BlockQ5_0, qh), block + offsetof(BlockQ5_0, qs), group, q);
    for (int i = 0; i < 8; ++i) out[i] = hd::mul_rn(float(q[i] - 16), d);
  }
};

// Q5_1: f16 d and m, then as Q5_0. x = q * d + m, product rounded before the sum.
template <>
struct Decoder<DType::Q5_1> {
  static constexpr DType kType = DType::Q5_1;
  static constexpr int kElems = kQK5_1;
  static constexpr int kBytes = sizeof(BlockQ5_1);
  TANDEM_HD static void decode8(const uint8_t* block, int group, float out[8]) {
    const float d = hd::f16_to_f32(hd::load_u16(block + offsetof(BlockQ5_1, d)));
    const float m = hd::f16_to_f32(hd::load_u16(block + offsetof(BlockQ5_1, m)));
    int q[8];
    q5_quants8(block + offsetof(BlockQ5_1, qh), block + offsetof(BlockQ5_1, qs), group, q);
    for (int i = 0; i < 8; ++i) out[i] = hd::add_rn(hd::mul_rn(float(q[i]), d), m);
  }
};

// Q8_0: f16 d, 32 signed bytes. x = q * d.
template <>
struct Decoder<DType::Q8_0> {
  static constexpr DType kType = DType::Q8_0;
  static constexpr int kElems = kQK8_0;
  static constexpr int kBytes = sizeof(BlockQ8_0);
  TANDEM_HD static void decode8(const uint8_t* block, int group, float out[8]) {
    const float d = hd::f16_to_f32(hd::load_u16(block + offsetof(BlockQ8_0, d)));
    const uint8_t* qs = block + offsetof(BlockQ8_0, qs) + 8 * group;
    for (int i = 0; i < 8; ++i) out[i] = hd::mul_rn(float(int8_t(qs[i])), d);
  }
};

// ---- IQ4_NL, IQ4_XS: 4-bit indices into IQ4_NL's 16 levels ----

// Level q (0..15) of kIq4NlValues, from two words that hold the 16 levels as bytes: no table in
// memory, so the same code serves the host and the device (checked against the table below).
TANDEM_HD constexpr int iq4_level(uint32_t q) {
  constexpr uint64_t kLow = 0xF6EADDCFBFAD9881ull;   // levels 0..7: -127 ... -10
  constexpr uint64_t kHigh = 0x7159453526190D01ull;  // levels 8..15: 1 ... 113
  return int(int8_t(uint8_t(((q < 8 ? kLow : kHigh) >> (8 * (q & 7))) & 0xFF)));
}

constexpr bool iq4_levels_packed_right() {
  for (uint32_t q = 0; q < 16; ++q)
    if (iq4_level(q) != kIq4NlValues[q]) return false;
  return true;
}
static_assert(iq4_levels_packed_right());

// The 8 indices of group `group` (8 elements) of a 32-element IQ4 run at `qs` (16 bytes, laid out
// as Q4_0: element j < 16 the low nibble of byte j, j + 16 the high one).
TANDEM_HD void iq4_indices8(const uint8_t* qs, int group, uint32_t q[8]) {
  const uint8_t* bytes = qs + 8 * (group & 1);
  const int shift = 4 * (group >> 1);
  for (int i = 0; i < 8; ++i) q[i] = (bytes[i] >> shift) & 0xF;
}

// Sub-block `sub`'s 6-bit scale of an IQ4_XS block, less 32 (iq4_xs_sub_scale of core/blocks.h
// on the block's bytes).
TANDEM_HD int iq4_xs_scale(const uint8_t* block, int sub) {
  const int low = (block[offsetof(BlockIQ4_XS, scales_l) + sub / 2] >> (4 * (sub % 2))) & 0xF;
  const int high = (hd::load_u16(block + offsetof(BlockIQ4_XS, scales_h)) >> (2 * sub)) & 3;
  return (low | (high << 4)) - 32;
}

// IQ4_NL: f16 d, 16 bytes of indices. x = d * level.
template <>
struct Decoder<DType::IQ4_NL> {
  static constexpr DType kType = DType::IQ4_NL;
  static constexpr int kElems = 32;
  static constexpr int kBytes = sizeof(BlockIQ4_NL);
  TANDEM_HD static void decode8(const uint8_t* block, int group, float out[8]) {
    const float d = hd::f16_to_f32(hd::load_u16(block + offsetof(BlockIQ4_NL, d)));
    uint32_t q[8];
    iq4_indices8(block + offsetof(BlockIQ4_NL, qs), group, q);
    for (int i = 0; i < 8; ++i) out[i] = hd::mul_rn(d, float(iq4_level(q[i])));
  }
};

// IQ4_XS: f16 d, eight 6-bit sub-block scales, eight runs of 32 as IQ4_NL's.
// x = (d * (scale - 32)) * level, the scale's product rounded first.
template <>
struct Decoder<DType::IQ4_XS> {
  static constexpr DType kType = DType::IQ4_XS;
  static constexpr int kElems = kQK_K;
  static constexpr int kBytes = sizeof(BlockIQ4_XS);
  TANDEM_HD static void decode8(const uint8_t* block, int group, float out[8]) {
    const int sub = group / 4;
    const float d = hd::f16_to_f32(hd::load_u16(block + offsetof(BlockIQ4_XS, d)));
    const float dl = hd::mul_rn(d, float(iq4_xs_scale(block, sub)));
    uint32_t q[8];
    iq4_indices8(block + offsetof(BlockIQ4_XS, qs) + 16 * sub, group % 4, q);
    for (int i = 0; i < 8; ++i) out[i] = hd::mul_rn(dl, float(iq4_level(q[i])));
  }
};

// ---- Q4_1, MXFP4, TQ1_0, TQ2_0 ----

// Q4_1: f16 d and m, nibbles as Q4_0. x = q * d + m, the product rounded before the sum.
template <>
struct Decoder<DType::Q4_1> {
  static constexpr DType kType = DType::Q4_1;
  static constexpr int kElems = 32;
  static constexpr int kBytes = sizeof(BlockQ4_1);
  TANDEM_HD static void decode8(const uint8_t* block, int group, float out[8]) {
    const float d = hd::f16_to_f32(hd::load_u16(block + offsetof(BlockQ4_1, d)));
    const float m = hd::f16_to_f32(hd::load_u16(block + offsetof(BlockQ4_1, m)));
    const uint8_t* qs = block + offsetof(BlockQ4_1, qs) + 8 * (group & 1);
    const int shift = 4 * (group >> 1);
    for (int i = 0; i < 8; ++i) out[i] = hd::add_rn(hd::mul_rn(float((qs[i] >> shift) & 0xF), d), m);
  }
};

// Doubled E2M1 value of a 4-bit MXFP4 code (kE2M1Doubled's rule, without a table).
TANDEM_HD int e2m1_doubled(uint32_t code) {
  const int e = int(code >> 1) & 3, m = int(code & 1);
  const int doubled = e == 0 ? m : (1 << e) + m * (1 << (e - 1));
  return code & 8 ? -doubled : doubled;
}

// 2^(e - 128): mxfp4_scale of core/blocks.h (the block's power of two, halved for the doubled
// values; e = 0 and 1 the float subnormals).
TANDEM_HD float mxfp4_scale_hd(uint32_t e) {
  return hd::bits_to_float(e < 2 ? uint32_t(0x00200000) << e : (e - 1) << 23);
}

// MXFP4: 8-bit exponent e, 4-bit codes laid out as Q4_0. x = E2M1(q) * 2^(e - 127).
template <>
struct Decoder<DType::MXFP4> {
  static constexpr DType kType = DType::MXFP4;
  static constexpr int kElems = 32;
  static constexpr int kBytes = sizeof(BlockMXFP4);
  TANDEM_HD static void decode8(const uint8_t* block, int group, float out[8]) {
    const float d = mxfp4_scale_hd(block[offsetof(BlockMXFP4, e)]);
    const uint8_t* qs = block + offsetof(BlockMXFP4, qs) + 8 * (group & 1);
    const int shift = 4 * (group >> 1);
    for (int i = 0; i < 8; ++i) out[i] = hd::mul_rn(float(e2m1_doubled((qs[i] >> shift) & 0xF)), d);
  }
};

// TQ2_0 quant (0..2) of element e = 128 h + 32 k + m: bits 2k of qs[32 h + m].
TANDEM_HD int tq2_0_quant_at(const uint8_t* block, int e) {
  return (block[offsetof(BlockTQ2_0, qs) + 32 * (e / 128) + e % 32] >> (2 * ((e / 32) % 4))) & 3;
}

// TQ1_0 quant of element e (core/blocks.h: tq1_0_quants' order): digit n of byte b is the top
// base-3 digit of (b * 3^n) mod 256.
TANDEM_HD int tq1_0_quant_at(const uint8_t* block, int e) {
  int byte, n;
  if (e < 160) {
    byte = e % 32, n = e / 32;
  } else if (e < 240) {
    byte = 32 + (e - 160) % 16, n = (e - 160) / 16;
  } else {
    byte = 48 + (e - 240) % 4, n = (e - 240) / 4;  // qh follows qs
  }
  uint32_t pow3 = 1;
  for (int i = 0; i < n; ++i) pow3 *= 3;
  return int(((uint32_t(uint8_t(block[byte] * pow3))) * 3) >> 8);
}

// TQ1_0 / TQ2_0: x = (q - 1) * d, one f16 d per 256.
template <DType T, class Block, int (*kQuantAt)(const uint8_t*, int)>
struct TernaryDecoder {
  static constexpr DType kType = T;
  static constexpr int kElems = kQK_K;
  static constexpr int kBytes = sizeof(Block);
  TANDEM_HD static void decode8(const uint8_t* block, int group, float out[8]) {
    const float d = hd::f16_to_f32(hd::load_u16(block + offsetof(Block, d)));
    for (int i = 0; i < 8; ++i) out[i] = hd::mul_rn(float(kQuantAt(block, 8 * group + i) - 1), d);
  }
};

template <>
struct Decoder<DType::TQ1_0> : TernaryDecoder<DType::TQ1_0, BlockTQ1_0, tq1_0_quant_at> {};
template <>
struct Decoder<DType::TQ2_0> : TernaryDecoder<DType::TQ2_0, BlockTQ2_0, tq2_0_quant_at> {};

// ---- the grid i-quants (core/iq_blocks.h): integer weights times a scale per 16 or 32 ----

// Group `group` (8 weights) is weights 8 (group % 4) .. of chunk group / 4; x = scale * w, the
// product the reference decoder (src/quant/iq_grid_formats.cpp) takes.
template <class Block, DType T>
struct IqDecoder {
  static constexpr DType kType = T;
  static constexpr int kElems = kQK_K;
  static constexpr int kBytes = sizeof(Block);
  TANDEM_HD static void decode8(const uint8_t* block, int group, float out[8]) {
    const float scale = iq_group_scale(IqTag<Block>{}, block, 8 * group / kIqGroup<Block>);
    const IqChunk chunk = iq_chunk(IqTag<Block>{}, block, group / 4);
    for (int i = 0; i < 8; ++i)
      out[i] = hd::mul_rn(scale, float(iq_chunk_weight<Block>(chunk, 8 * (group % 4) + i)));
  }
};

template <>
struct Decoder<DType::IQ1_S> : IqDecoder<BlockIQ1_S, DType::IQ1_S> {};
template <>
struct Decoder<DType::IQ1_M> : IqDecoder<BlockIQ1_M, DType::IQ1_M> {};
template <>
struct Decoder<DType::IQ2_XXS> : IqDecoder<BlockIQ2_XXS, DType::IQ2_XXS> {};
template <>
struct Decoder<DType::IQ2_XS> : IqDecoder<BlockIQ2_XS, DType::IQ2_XS> {};
template <>
struct Decoder<DType::IQ2_S> : IqDecoder<BlockIQ2_S, DType::IQ2_S> {};
template <>
struct Decoder<DType::IQ3_XXS> : IqDecoder<BlockIQ3_XXS, DType::IQ3_XXS> {};
template <>
struct Decoder<DType::IQ3_S> : IqDecoder<BlockIQ3_S, DType::IQ3_S> {};

// ---- k-quants: super-blocks of 256 ----

// The 2-bit field of element e = 8 * group + i in the qs of Q2_K/Q3_K: byte
// 32 * (e / 128) + e % 32, bits 2 * ((e % 128) / 32). A group of 8 shares the byte run and shift.
TANDEM_HD void k_low2_quants8(const uint8_t* qs_bytes, int group, int q[8]) {
  const uint8_t* qs = qs_bytes + 32 * (group >> 4) + 8 * (group & 3);
  const int shift = 2 * ((group >> 2) & 3);
  for (int i = 0; i < 8; ++i) q[i] = (qs[i] >> shift) & 3;
}

// Q2_K: 16 scale bytes (low nibble scale, high nibble min, one per sub-block of 16), 2-bit quants,
// f16 d and dmin. x = (d * sc) * q - (dmin * m), each product rounded.
template <>
struct Decoder<DType::Q2_K> {
  static constexpr DType kType = DType::Q2_K;
  static constexpr int kElems = kQK_K;
  static constexpr int kBytes = sizeof(BlockQ2_K);
  TANDEM_HD static void decode8(const uint8_t* block, int group, float out[8]) {
    const float d = hd::f16_to_f32(hd::load_u16(block + offsetof(BlockQ2_K, d)));
    const float dmin = hd::f16_to_f32(hd::load_u16(block + offsetof(BlockQ2_K, dmin)));
    const uint8_t sc = block[offsetof(BlockQ2_K, scales) + group / 2];
    const float dl = hd::mul_rn(d, float(sc & 0xF));
    const float ml = hd::mul_rn(dmin, float(sc >> 4));
    int q[8];
    k_low2_quants8(block + offsetof(BlockQ2_K, qs), group, q);
    for (int i = 0; i < 8; ++i) out[i] = hd::sub_rn(hd::mul_rn(dl, float(q[i])), ml);
  }
};

// Q3_K: hmask (high bit of element e at bit e / 32 of hmask[e % 32]; cleared means minus 4), 2-bit
// quants as Q2_K, 16 signed 6-bit scales packed in 12 bytes, f16 d. x = (d * sc) * q.
template <>
struct Decoder<DType::Q3_K> {
  static constexpr DType kType = DType::Q3_K;
  static constexpr int kElems = kQK_K;
  static constexpr int kBytes = sizeof(BlockQ3_K);

  // Scale `sub` of the 16, as k_scales.h unpacks it: low nibble in byte sub (or the high nibble of
  // byte sub - 8), top 2 bits at bit 2 * (sub / 4) of byte 8 + sub % 4, stored offset by 32.
  TANDEM_HD static int scale(const uint8_t* packed, int sub) {
    const int low = sub < 8 ? (packed[sub] & 0xF) : (packed[sub - 8] >> 4);
    const int high = (packed[8 + sub % 4] >> (2 * (sub / 4))) & 3;
    return (low | (high << 4)) - 32;
  }

  TANDEM_HD static void decode8(const uint8_t* block, int group, float out[8]) {
    const float d = hd::f16_to_f32(hd::load_u16(block + offsetof(BlockQ3_K, d)));
    const float dl = hd::mul_rn(d, float(scale(block + offsetof(BlockQ3_K, scales), group / 2)));
    int q[8];
    k_low2_quants8(block + offsetof(BlockQ3_K, qs), group, q);
    // e % 32 = 8 * (group % 4) + i and e / 32 = group / 4.
    const uint8_t* hmask = block + offsetof(BlockQ3_K, hmask) + 8 * (group & 3);
    const int high_bit = group >> 2;
    for (int i = 0; i < 8; ++i) {
      const int high = (hmask[i] >> high_bit) & 1;
      out[i] = hd::mul_rn(dl, float(q[i] - (high ? 0 : 4)));
    }
  }
};

// Scale and min of sub-block `sub` (0..7) of Q4_K/Q5_K, as k_scales.h unpacks them: 6 bits each,
// the first four in the low bits of bytes 0..3 (scales) and 4..7 (mins), the last four with their
// low nibbles in bytes 8..11 (scale low, min high) and top 2 bits in the top of bytes 0..7.
struct KScaleMin {
  int scale, min;
};
TANDEM_HD KScaleMin k_scale_min(const uint8_t* packed, int sub) {
  if (sub < 4) return {packed[sub] & 63, packed[sub + 4] & 63};
  return {(packed[sub + 4] & 0xF) | ((packed[sub - 4] >> 6) << 4),
          (packed[sub + 4] >> 4) | ((packed[sub] >> 6) << 4)};
}

// Q4_K: f16 d and dmin, 12 bytes of 6-bit scales and mins for 8 sub-blocks of 32, then 128 bytes
// where sub-blocks 2c and 2c+1 share qs[32c ..] (low nibbles, high nibbles).
// x = (d * sc) * q - (dmin * m), each product rounded.
template <>
struct Decoder<DType::Q4_K> {
  static constexpr DType kType = DType::Q4_K;
  static constexpr int kElems = kQK_K;
  static constexpr int kBytes = sizeof(BlockQ4_K);
  TANDEM_HD static void decode8(const uint8_t* block, int group, float out[8]) {
    const int sub = group / 4;
    const float d = hd::f16_to_f32(hd::load_u16(block + offsetof(BlockQ4_K, d)));
    const float dmin = hd::f16_to_f32(hd::load_u16(block + offsetof(BlockQ4_K, dmin)));
    const KScaleMin sm = k_scale_min(block + offsetof(BlockQ4_K, scales), sub);
    const float dl = hd::mul_rn(d, float(sm.scale));
    const float ml = hd::mul_rn(dmin, float(sm.min));
    const uint8_t* qs = block + offsetof(BlockQ4_K, qs) + 32 * (sub / 2) + 8 * (group & 3);
    const int shift = 4 * (sub & 1);
    for (int i = 0; i < 8; ++i)
      out[i] = hd::sub_rn(hd::mul_rn(dl, float((qs[i] >> shift) & 0xF)), ml);
  }
};

// Q5_K: as Q4_K with 32 bytes qh between the scales and the nibbles: the fifth bit of element l of
// sub-block s (l in 0..31) is bit s of qh[l].
template <>
struct Decoder<DType::Q5_K> {
  static constexpr DType kType = DType::Q5_K;
  static constexpr int kElems = kQK_K;
  static constexpr int kBytes = sizeof(BlockQ5_K);
  TANDEM_HD static void decode8(const uint8_t* block, int group, float out[8]) {
    const int sub = group / 4;
    const float d = hd::f16_to_f32(hd::load_u16(block + offsetof(BlockQ5_K, d)));
    const float dmin = hd::f16_to_f32(hd::load_u16(block + offsetof(BlockQ5_K, dmin)));
    const KScaleMin sm = k_scale_min(block + offsetof(BlockQ5_K, scales), sub);
    const float dl = hd::mul_rn(d, float(sm.scale));
    const float ml = hd::mul_rn(dmin, float(sm.min));
    const uint8_t* qs = block + offsetof(BlockQ5_K, qs) + 32 * (sub / 2) + 8 * (group & 3);
    const uint8_t* qh = block + offsetof(BlockQ5_K, qh) + 8 * (group & 3);
    const int shift = 4 * (sub & 1);
    for (int i = 0; i < 8; ++i) {
      const int q = ((qs[i] >> shift) & 0xF) | (((qh[i] >> sub) & 1) << 4);
      out[i] = hd::sub_rn(hd::mul_rn(dl, float(q)), ml);
    }
  }
};

// Q6_K: 128 bytes ql (low nibbles), 64 bytes qh (high 2 bits), 16 signed byte scales, f16 d.
// Element e = 128 h + 32 k + l has its nibble in ql[64 h + 32 (k & 1) + l] (high nibble for
// k >= 2), its top bits at bit 2k of qh[32 h + l], and scale e / 16. x = (d * sc) * (q - 32), left
// to right as the reference: d * (sc * (q - 32)) would give +0 where the reference gives -0.
template <>
struct Decoder<DType::Q6_K> {
  static constexpr DType kType = DType::Q6_K;
  static constexpr int kElems = kQK_K;
  static constexpr int kBytes = sizeof(BlockQ6_K);
  TANDEM_HD static void decode8(const uint8_t* block, int group, float out[8]) {
    const int h = group / 16, k = (group / 4) & 3, l0 = 8 * (group & 3);
    const float d = hd::f16_to_f32(hd::load_u16(block + offsetof(BlockQ6_K, d)));
    const int sc = int8_t(block[offsetof(BlockQ6_K, scales) + group / 2]);
    const float dl = hd::mul_rn(d, float(sc));
    const uint8_t* ql = block + offsetof(BlockQ6_K, ql) + 64 * h + 32 * (k & 1) + l0;
    const uint8_t* qh = block + offsetof(BlockQ6_K, qh) + 32 * h + l0;
    const int low_shift = 4 * (k >> 1), high_shift = 2 * k;
    for (int i = 0; i < 8; ++i) {
      const int q = ((ql[i] >> low_shift) & 0xF) | (((qh[i] >> high_shift) & 3) << 4);
      out[i] = hd::mul_rn(dl, float(q - 32));
    }
  }
};

// ---- host side ----

// The one switch on the format: calls fn(Decoder<T>{}) for a format with a block decoder and
// returns true; returns false for the others (Q8_K, which only activations use, the integer
// formats, the interleaved *_R16 formats, which are decoded through their base format).
template <class Fn>
bool visit_decoder(DType type, Fn&& fn) {
  switch (type) {
    case DType::F32:
      fn(Decoder<DType::F32>{});
      return true;
    case DType::F16:
      fn(Decoder<DType::F16>{});
      return true;
    case DType::BF16:
      fn(Decoder<DType::BF16>{});
      return true;
    case DType::Q4_0:
      fn(Decoder<DType::Q4_0>{});
      return true;
    case DType::Q5_0:
      fn(Decoder<DType::Q5_0>{});
      return true;
    case DType::Q5_1:
      fn(Decoder<DType::Q5_1>{});
      return true;
    case DType::Q8_0:
      fn(Decoder<DType::Q8_0>{});
      return true;
    case DType::Q2_K:
      fn(Decoder<DType::Q2_K>{});
      return true;
    case DType::Q3_K:
      fn(Decoder<DType::Q3_K>{});
      return true;
    case DType::Q4_K:
      fn(Decoder<DType::Q4_K>{});
      return true;
    case DType::Q5_K:
      fn(Decoder<DType::Q5_K>{});
      return true;
    case DType::Q6_K:
      fn(Decoder<DType::Q6_K>{});
      return true;
    case DType::IQ4_NL:
      fn(Decoder<DType::IQ4_NL>{});
      return true;
    case DType::IQ4_XS:
      fn(Decoder<DType::IQ4_XS>{});
      return true;
    case DType::Q4_1:
      fn(Decoder<DType::Q4_1>{});
      return true;
    case DType::MXFP4:
      fn(Decoder<DType::MXFP4>{});
      return true;
    case DType::TQ1_0:
      fn(Decoder<DType::TQ1_0>{});
      return true;
    case DType::TQ2_0:
      fn(Decoder<DType::TQ2_0>{});
      return true;
    default:  // the grid i-quants, or none
      return visit_iq_grid(type, [&](auto f) { fn(Decoder<decltype(f)::kType>{}); });
  }
}

inline bool has_block_decoder(DType type) {
  return visit_decoder(type, [](auto) {});
}

// Decodes a row of n elements with decode8, block by block (tests compare it with
// dequantize_row). n must be a multiple of Decoder<type>::kElems, which is 8 for the float
// formats; type must have a block decoder.
void decode_row(DType type, const void* row, float* out, int64_t n);

}  // namespace tandem::blocks
