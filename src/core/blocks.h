#pragma once
// Byte layouts of the quantized block formats, exactly as GGUF stores them. Fields are in file
// order; fp16 scales are kept as raw uint16_t bits (decode with core/half.h).
#include <cstdint>

namespace tandem {

constexpr int kQK4_0 = 32;
constexpr int kQK5_0 = 32;
constexpr int kQK5_1 = 32;
constexpr int kQK8_0 = 32;
constexpr int kQK_K = 256;        // super-block of the k-quants
constexpr int kKScaleBytes = 12;  // packed 6-bit scales and mins of Q4_K / Q5_K

// x = d * (q - 8), q in 0..15; element j in the low nibble of qs[j], j+16 in the high nibble.
struct BlockQ4_0 {
  uint16_t d;
  uint8_t qs[kQK4_0 / 2];
};

// x = d * (q - 16), q 5 bits: low 4 as in Q4_0, bit 4 of element j in bit j of qh.
struct BlockQ5_0 {
  uint16_t d;
  uint8_t qh[4];
  uint8_t qs[kQK5_0 / 2];
};

// x = d * q + m, q 5 bits laid out as in Q5_0.
struct BlockQ5_1 {
  uint16_t d;
  uint16_t m;
  uint8_t qh[4];
  uint8_t qs[kQK5_1 / 2];
};

// x = d * q, q signed 8 bits.
struct BlockQ8_0 {
  uint16_t d;
  int8_t qs[kQK8_0];
};

// 16 sub-blocks of 16: x = d * (scales[i] & 15) * q - dmin * (scales[i] >> 4), q 2 bits.
struct BlockQ2_K {
  uint8_t scales[kQK_K / 16];
  uint8_t qs[kQK_K / 4];
  uint16_t d;
  uint16_t dmin;
};

// 16 sub-blocks of 16 with 6-bit signed scales packed in 12 bytes; q 3 bits (2 in qs, the high
// bit in hmask, where a cleared bit means subtract 4).
struct BlockQ3_K {
  uint8_t hmask[kQK_K / 8];
  uint8_t qs[kQK_K / 4];
  uint8_t scales[12];
  uint16_t d;
};

// 8 sub-blocks of 32: x = d * scale[i] * q - dmin * min[i], 6-bit scale/min packed in 12 bytes.
struct BlockQ4_K {
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[kKScaleBytes];
  uint8_t qs[kQK_K / 2];
};

// As Q4_K with a fifth bit per element in qh.
struct BlockQ5_K {
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[kKScaleBytes];
  uint8_t qh[kQK_K / 8];
  uint8_t qs[kQK_K / 2];
};

// 16 sub-blocks of 16: x = d * scales[i] * (q - 32), q 6 bits (4 in ql, 2 in qh).
struct BlockQ6_K {
  uint8_t ql[kQK_K / 2];
  uint8_t qh[kQK_K / 4];
  int8_t scales[kQK_K / 16];
  uint16_t d;
};

// ---- more GGUF formats (issue 16) ----
// Q4_1: x = d * q + m, q in 0..15 as in Q4_0 (low nibbles elements 0-15, high 16-31).
struct BlockQ4_1 {
  uint16_t d;
  uint16_t m;
  uint8_t qs[16];
};

// IQ4_NL's 16 levels: not a formula but a fitted table, part of the format's definition.
inline constexpr int8_t kIq4NlValues[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                            1,    13,   25,  38,  53,  69,  89,  113};

// IQ4_NL: x = d * kIq4NlValues[q], q 4 bits laid out as in Q4_0: a non-linear 4-bit grid.
struct BlockIQ4_NL {
  uint16_t d;
  uint8_t qs[16];
};

// IQ4_XS: the IQ4_NL grid over a 256-element super-block of eight sub-blocks of 32, each with a
// 6-bit scale (low 4 bits in scales_l, two per byte; high 2 bits in scales_h, two per
// sub-block): x = d * (scale - 32) * kIq4NlValues[q]; sub-block i's quants in qs[16 i ..].
struct BlockIQ4_XS {
  uint16_t d;
  uint16_t scales_h;
  uint8_t scales_l[4];
  uint8_t qs[128];
};

// Sub-block `sub`'s scale of an IQ4_XS block, its offset taken off: -32..31.
inline int iq4_xs_sub_scale(const BlockIQ4_XS& block, int sub) {
  const int low = (block.scales_l[sub / 2] >> (4 * (sub % 2))) & 0xF;
  const int high = (block.scales_h >> (2 * sub)) & 3;
  return (low | high << 4) - 32;
}

// TQ2_0: ternary, x = d * (q - 1), q 2 bits; byte m of each 32-byte half holds elements
// 128 h + 32 k + m in its bits 2k, 2k + 1.
struct BlockTQ2_0 {
  uint8_t qs[64];
  uint16_t d;
};

// A TQ2_0 block's 256 quants q (0..2: the digit + 1) in element order.
inline void tq2_0_quants(const BlockTQ2_0& block, uint8_t* q) {
  for (int half = 0; half < 2; ++half)
    for (int k = 0; k < 4; ++k)
      for (int m = 0; m < 32; ++m)
        q[128 * half + 32 * k + m] = uint8_t((block.qs[32 * half + m] >> (2 * k)) & 3);
}

// TQ1_0: ternary, five (qs) or four (qh) base-3 digits per byte stored as a fraction of 256:
// digit n of byte b is the top base-3 digit of (b * 3^n) mod 256, times 3, over 256.
struct BlockTQ1_0 {
  uint8_t qs[48];
  uint8_t qh[4];
  uint16_t d;
};

// Digit n of a TQ1_0 byte as a quant q (0..2: the digit + 1): the top base-3 digit of
// (byte * 3^n) mod 256.
inline uint8_t tq1_0_quant(uint8_t byte, int n) {
  constexpr uint8_t kPow3[5] = {1, 3, 9, 27, 81};
  return uint8_t((uint16_t(uint8_t(byte * kPow3[n])) * 3) >> 8);
}

// A TQ1_0 block's 256 quants in element order: bytes 0-31 give five digits each (160
// elements), bytes 32-47 five each (80), qh four each (16); digit n of a run of bytes before
// digit n + 1.
inline void tq1_0_quants(const BlockTQ1_0& block, uint8_t* q) {
  for (int n = 0; n < 5; ++n)
    for (int m = 0; m < 32; ++m) *q++ = tq1_0_quant(block.qs[m], n);
  for (int n = 0; n < 5; ++n)
    for (int m = 0; m < 16; ++m) *q++ = tq1_0_quant(block.qs[32 + m], n);
  for (int n = 0; n < 4; ++n)
    for (int m = 0; m < 4; ++m) *q++ = tq1_0_quant(block.qh[m], n);
}

// MXFP4 (OCP microscaling): 32 FP4 (E2M1) values sharing an 8-bit power-of-two exponent e,
// 4-bit codes laid out as in Q4_0: x = 2^(e - 127) * E2M1(q).
struct BlockMXFP4 {
  uint8_t e;
  uint8_t qs[16];
};

// FP4 E2M1 values, doubled so that they are integers: sign bit 3, exponent bits 1-2 (bias 1),
// mantissa bit 0; exponent 0 is subnormal (m * 0.5). Generated from that rule; mxfp4_scale
// halves the block's power of two to make up for the doubling.
inline constexpr struct E2M1Doubled {
  int8_t v[16];
  constexpr E2M1Doubled() : v() {
    for (int code = 0; code < 16; ++code) {
      const int e = (code >> 1) & 3, m = code & 1;
      const int doubled = e == 0 ? m : (1 << e) + m * (1 << (e - 1));
      v[code] = int8_t(code & 8 ? -doubled : doubled);
    }
  }
} kE2M1Doubled;
static_assert(kE2M1Doubled.v[7] == 12 && kE2M1Doubled.v[5] == 6 && kE2M1Doubled.v[9] == -1);

// 2^(e - 128): an MXFP4 block's power of two, halved for the doubled values. e = 0 and 1 give
// the float subnormals 2^-128 and 2^-127.
inline float mxfp4_scale(uint8_t e) {
  const uint32_t bits = e < 2 ? uint32_t(0x00200000) << e : uint32_t(e - 1) << 23;
  float f;
  __builtin_memcpy(&f, &bits, sizeof(f));
  return f;
}

// Activation format for dot products against k-quants: x = d * q, with the sums of each group
// of 16 quants precomputed (they absorb the mins of Q2_K/Q4_K/Q5_K and the offsets of Q3_K/Q6_K).
struct BlockQ8_K {
  float d;
  int8_t qs[kQK_K];
  int16_t bsums[kQK_K / 16];
};

// ---- tandem's interleaved formats (`tandem repack`; DType::*_R16) ----
// 16 rows' blocks of the same columns stored together, laid out so that one int16 vector of 32
// lanes holds the same two columns of all 16 rows: a vpdpwssd then adds those two products for 16
// rows at once against one broadcast pair of activations (backends/cpu/dot_r16_avx512.cpp).
// "Pair layout" below: byte 2r + p of a 32-byte chunk belongs to row r, column pair position p.

// 16 rows x 32 columns of Q8_0. Chunk c (qs[32c .. 32c + 31]) holds columns 2c, 2c + 1 in pair
// layout: qs[32c + 2r + p] is element 2c + p of row r's block.
struct BlockQ8_0_R16 {
  uint16_t d[16];  // row r's scale
  int8_t qs[16 * kQK8_0];
};

// 16 rows x 256 columns of Q4_K, scales and mins unpacked to bytes. Sub-block j's 256 bytes are
// 8 chunks c of 32 in pair layout: the low nibble of qs[j][32c + 2r + p] is element
// 32j + 4c + p of row r's super-block, the high nibble element 32j + 4c + 2 + p.
struct BlockQ4_K_R16 {
  uint16_t d[16];
  uint16_t dmin[16];
  uint8_t scales[8][16];  // [sub-block][row], 0..63
  uint8_t mins[8][16];
  uint8_t qs[8][256];
};

// 16 rows x 32 columns of Q5_0. The low 4 bits as in Q4_K_R16's sub-blocks: the low nibble of
// qs[c][2r + p] is element 4c + p of row r's block, the high nibble element 4c + 2 + p. The fifth
// bits in the same pair layout, as lane masks: bit 2r + p of qh[c][0] belongs to element 4c + p,
// of qh[c][1] to element 4c + 2 + p.
struct BlockQ5_0_R16 {
  uint16_t d[16];
  uint32_t qh[8][2];
  uint8_t qs[8][32];
};

static_assert(sizeof(BlockQ8_0_R16) == 16 * sizeof(BlockQ8_0));
static_assert(sizeof(BlockQ5_0_R16) == 16 * sizeof(BlockQ5_0));
static_assert(sizeof(BlockQ4_K_R16) == 16 * 148);
static_assert(sizeof(BlockQ4_0) == 18);
static_assert(sizeof(BlockQ5_0) == 22);
static_assert(sizeof(BlockQ5_1) == 24);
static_assert(sizeof(BlockQ8_0) == 34);
static_assert(sizeof(BlockQ2_K) == 84);
static_assert(sizeof(BlockQ3_K) == 110);
static_assert(sizeof(BlockQ4_K) == 144);
static_assert(sizeof(BlockQ5_K) == 176);
static_assert(sizeof(BlockQ6_K) == 210);
static_assert(sizeof(BlockQ8_K) == 292);
static_assert(sizeof(BlockQ4_1) == 20);
static_assert(sizeof(BlockIQ4_NL) == 18);
static_assert(sizeof(BlockIQ4_XS) == 136);
static_assert(sizeof(BlockTQ2_0) == 66);
static_assert(sizeof(BlockTQ1_0) == 54);
static_assert(sizeof(BlockMXFP4) == 17);

}  // namespace tandem
