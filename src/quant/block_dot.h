#pragma once
// Dot products of 32 consecutive weights with F32 activations, straight from the quantized
// blocks: the inner step of the GPU's decode kernel (backends/cuda/matmul.cu), written once for
// host and device like block_decode.h and tested on the host against dequantize_row.
//
// Why not decode8 and a multiply per weight: a decode step streams every weight once, so the
// kernel must spend only a few instructions per weight to keep up with the GPU's memory (an
// H200 reads ~8.5e12 Q4_K weights a second: ~4 instructions per weight per SM cycle budget).
// So, per 32 weights:
// - the block's scales are decoded once, not once per 8 weights;
// - the quants become floats without the conversion unit (a quarter of the FMA rate on Hopper):
//   the float with bits 0x4B000000 | u is 2^23 + u exactly, and one subtraction gives u (minus
//   an offset) exactly (hd::biased_to_float);
// - a sub-block's scale and min multiply sums, not weights: Σ (d·q − m)·x = d·Σ q·x − m·Σ x;
// - the bytes come in as 16-byte loads where the format's blocks are 16-byte aligned (Q4_K,
//   Q5_K: 144 and 176 bytes) and as 2-byte loads elsewhere (every block size is even).
// The sums are F32 in element order; the result is within F32 rounding of the exact dot product
// (the test's bound), not bit-equal to the CPU's kernels, which quantize activations.
#include <cstdint>
#include <type_traits>

#include "core/blocks.h"
#include "core/dtype.h"
#include "core/host_device.h"
#include "quant/block_decode.h"

namespace tandem::blocks {

// u - bias as a float, for 0 <= u < 2^23 and a small bias: exact. On the device without I2F.
TANDEM_HD float biased_to_float(uint32_t u, int bias) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(__uint_as_float(0x4B000000u | u), 8388608.0f + float(bias));
#else
  return float(int(u) - bias);
#endif
}

// `n` little-endian words from p: 16-byte vector loads on the device when `kAligned16` (the
// caller's blocks guarantee it), 2-byte loads otherwise; bytes on the host.
template <bool kAligned16, int n>
TANDEM_HD void load_words(const uint8_t* p, uint32_t (&w)[n]) {
#if defined(__CUDA_ARCH__)
  if constexpr (kAligned16 && n % 4 == 0) {
    TANDEM_UNROLL
    for (int i = 0; i < n / 4; ++i) {
      const uint4 v = reinterpret_cast<const uint4*>(p)[i];
      w[4 * i] = v.x, w[4 * i + 1] = v.y, w[4 * i + 2] = v.z, w[4 * i + 3] = v.w;
    }
  } else {
    const auto* h = reinterpret_cast<const uint16_t*>(p);
    TANDEM_UNROLL
    for (int i = 0; i < n; ++i) w[i] = uint32_t(h[2 * i]) | (uint32_t(h[2 * i + 1]) << 16);
  }
#else
  for (int i = 0; i < n; ++i) w[i] = hd::load_u32(p + 4 * i);
#endif
}

TANDEM_HD uint32_t byte_of(const uint32_t* w, int i) {
  return (w[i / 4] >> (8 * (i % 4))) & 0xFF;
}

// a · b + c: one fused instruction on the device, two roundings on the host (g++ in ISO mode does
// not fuse). The two sides agree within rounding, not to the bit.
TANDEM_HD float madd(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return fmaf(a, b, c);
#else
  return a * b + c;
#endif
}

// k_scale_min of block_decode.h on the 12 scale bytes held in three words, picking bytes with
// selects rather than an index into an array (a run-time index would put the words in local
// memory on the device).
TANDEM_HD KScaleMin k_scale_min_words(uint32_t w0, uint32_t w1, uint32_t w2, int sub) {
  auto byte = [&](int i) { return int(((i < 4 ? w0 : i < 8 ? w1 : w2) >> (8 * (i % 4))) & 0xFF); };
  if (sub < 4) return {byte(sub) & 63, byte(sub + 4) & 63};
  return {(byte(sub + 4) & 0xF) | ((byte(sub - 4) >> 6) << 4),
          (byte(sub + 4) >> 4) | ((byte(sub) >> 6) << 4)};
}

// acc[t] += Σ_g scale[g] · Σ_{i in g} q[i] · x[t][i] + offset[g] · Σ_{i in g} x[t][i] over the
// 32 / kGroup groups of kGroup elements (offset null: none).
template <int kGroup, int NT, class X>
TANDEM_HD void scaled_sums(const float (&q)[32], const float* scale, const float* offset,
                           const X& x, float (&acc)[NT]) {
  TANDEM_UNROLL
  for (int t = 0; t < NT; ++t) {
    TANDEM_UNROLL
    for (int g = 0; g < 32 / kGroup; ++g) {
      float qx = 0.0f, sx = 0.0f;
      TANDEM_UNROLL
      for (int i = kGroup * g; i < kGroup * (g + 1); ++i) {
        qx = madd(q[i], x[t][i], qx);
        if (offset) sx += x[t][i];
      }
      acc[t] = madd(scale[g], qx, acc[t]);
      if (offset) acc[t] = madd(offset[g], sx, acc[t]);
    }
  }
}

// The 32-weight step of each quantized format: dot32<NT>(block, chunk, x, acc) adds the products
// of elements [32 chunk, 32 chunk + 32) of `block` with x[t][0..31] to acc[t] (x: pointers to
// each token's 32 activations, or the activations themselves staged in registers). kChunks is
// the number of 32-weight chunks of a block; 0 for the formats without this step (F32, F16,
// BF16: eight at a time through decode8).
template <DType T>
struct BlockDot {
  static constexpr int kChunks = 0;
};

// Q4_0: d · (q − 8).
template <>
struct BlockDot<DType::Q4_0> {
  static constexpr int kChunks = 1;
  template <int NT, class X>
  TANDEM_HD static void dot32(const uint8_t* block, int, const X& x, float (&acc)[NT]) {
    const float d = hd::f16_to_f32(hd::load_u16(block + offsetof(BlockQ4_0, d)));
    uint32_t w[4];
    load_words<false>(block + offsetof(BlockQ4_0, qs), w);
    float q[32];
    TANDEM_UNROLL
    for (int i = 0; i < 16; ++i) {
      q[i] = biased_to_float(byte_of(w, i) & 0xF, 8);
      q[i + 16] = biased_to_float(byte_of(w, i) >> 4, 8);
    }
    scaled_sums<32>(q, &d, nullptr, x, acc);
  }
};

// Q5_0 / Q5_1: the nibble as Q4_0 plus bit e of qh; d · (q − 16), or d · q + m.
template <int kBias, int kQs, int kQh>
TANDEM_HD void q5_quants32(const uint8_t* block, float (&q)[32]) {
  uint32_t w[4];
  load_words<false>(block + kQs, w);
  const uint32_t high =
      uint32_t(hd::load_u16(block + kQh)) | (uint32_t(hd::load_u16(block + kQh + 2)) << 16);
  TANDEM_UNROLL
  for (int i = 0; i < 16; ++i) {
    q[i] = biased_to_float((byte_of(w, i) & 0xF) | (((high >> i) & 1) << 4), kBias);
    q[i + 16] = biased_to_float((byte_of(w, i) >> 4) | (((high >> (i + 16)) & 1) << 4), kBias);
  }
}

template <>
struct BlockDot<DType::Q5_0> {
  static constexpr int kChunks = 1;
  template <int NT, class X>
  TANDEM_HD static void dot32(const uint8_t* block, int, const X& x, float (&acc)[NT]) {
    const float d = hd::f16_to_f32(hd::load_u16(block + offsetof(BlockQ5_0, d)));
    float q[32];
    q5_quants32<16, offsetof(BlockQ5_0, qs), offsetof(BlockQ5_0, qh)>(block, q);
    scaled_sums<32>(q, &d, nullptr, x, acc);
  }
};

template <>
struct BlockDot<DType::Q5_1> {
  static constexpr int kChunks = 1;
  template <int NT, class X>
  TANDEM_HD static void dot32(const uint8_t* block, int, const X& x, float (&acc)[NT]) {
    const float d = hd::f16_to_f32(hd::load_u16(block + offsetof(BlockQ5_1, d)));
    const float m = hd::f16_to_f32(hd::load_u16(block + offsetof(BlockQ5_1, m)));
    float q[32];
    q5_quants32<0, offsetof(BlockQ5_1, qs), offsetof(BlockQ5_1, qh)>(block, q);
    scaled_sums<32>(q, &d, &m, x, acc);
  }
};

// Q8_0: d · q, q signed.
template <>
struct BlockDot<DType::Q8_0> {
  static constexpr int kChunks = 1;
  template <int NT, class X>
  TANDEM_HD static void dot32(const uint8_t* block, int, const X& x, float (&acc)[NT]) {
    const float d = hd::f16_to_f32(hd::load_u16(block + offsetof(BlockQ8_0, d)));
    uint32_t w[8];
    load_words<false>(block + offsetof(BlockQ8_0, qs), w);
    float q[32];
    TANDEM_UNROLL
    for (int i = 0; i < 32; ++i) q[i] = biased_to_float(byte_of(w, i) ^ 0x80, 128);  // int8 + 128
    scaled_sums<32>(q, &d, nullptr, x, acc);
  }
};

// Q2_K: two sub-blocks of 16 per chunk, each (d · (sc & 15)) · q − dmin · (sc >> 4).
template <>
struct BlockDot<DType::Q2_K> {
  static constexpr int kChunks = 8;
  template <int NT, class X>
  TANDEM_HD static void dot32(const uint8_t* block, int chunk, const X& x, float (&acc)[NT]) {
    const float d = hd::f16_to_f32(hd::load_u16(block + offsetof(BlockQ2_K, d)));
    const float dmin = hd::f16_to_f32(hd::load_u16(block + offsetof(BlockQ2_K, dmin)));
    float scale[2], offset[2];
    TANDEM_UNROLL
    for (int s = 0; s < 2; ++s) {
      const uint32_t sc = block[offsetof(BlockQ2_K, scales) + 2 * chunk + s];
      scale[s] = hd::mul_rn(d, float(sc & 0xF));
      offset[s] = -hd::mul_rn(dmin, float(sc >> 4));
    }
    // Element e = 32 chunk + i: byte 32 (e / 128) + e % 32 = 32 (chunk / 4) + i, bits 2 (chunk %
    // 4).
    uint32_t w[8];
    load_words<false>(block + offsetof(BlockQ2_K, qs) + 32 * (chunk / 4), w);
    const int shift = 2 * (chunk % 4);
    float q[32];
    TANDEM_UNROLL
    for (int i = 0; i < 32; ++i) q[i] = biased_to_float((byte_of(w, i) >> shift) & 3, 0);
    scaled_sums<16>(q, scale, offset, x, acc);
  }
};

// Q3_K: two sub-blocks of 16 per chunk, each (d · sc) · (q − 4 · !high).
template <>
struct BlockDot<DType::Q3_K> {
  static constexpr int kChunks = 8;
  template <int NT, class X>
  TANDEM_HD static void dot32(const uint8_t* block, int chunk, const X& x, float (&acc)[NT]) {
    const float d = hd::f16_to_f32(hd::load_u16(block + offsetof(BlockQ3_K, d)));
    float scale[2];
    TANDEM_UNROLL
    for (int s = 0; s < 2; ++s)
      scale[s] = hd::mul_rn(d, float(Decoder<DType::Q3_K>::scale(
                                   block + offsetof(BlockQ3_K, scales), 2 * chunk + s)));
    uint32_t low[8], high[8];
    load_words<false>(block + offsetof(BlockQ3_K, qs) + 32 * (chunk / 4), low);
    load_words<false>(block + offsetof(BlockQ3_K, hmask), high);  // bit chunk of hmask[i]
    const int shift = 2 * (chunk % 4);
    float q[32];
    TANDEM_UNROLL
    for (int i = 0; i < 32; ++i)
      q[i] = biased_to_float(
          ((byte_of(low, i) >> shift) & 3) | (((byte_of(high, i) >> chunk) & 1) << 2), 4);
    scaled_sums<16>(q, scale, nullptr, x, acc);
  }
};

// Q4_K / Q5_K: chunk = sub-block s: (d · sc_s) · q − dmin · m_s; sub-blocks 2c and 2c + 1 share
// the 32 bytes qs[32c ..] (low and high nibbles); Q5_K's fifth bit is bit s of qh[i].
template <DType T, int kQh>
struct KQuantDot {
  static constexpr int kChunks = 8;
  using Block = std::conditional_t<T == DType::Q4_K, BlockQ4_K, BlockQ5_K>;
  template <int NT, class X>
  TANDEM_HD static void dot32(const uint8_t* block, int chunk, const X& x, float (&acc)[NT]) {
    uint32_t header[4];  // d, dmin, 12 scale bytes
    load_words<true>(block, header);
    const float d = hd::f16_to_f32(uint16_t(header[0] & 0xFFFF));
    const float dmin = hd::f16_to_f32(uint16_t(header[0] >> 16));
    const KScaleMin sm = k_scale_min_words(header[1], header[2], header[3], chunk);
    const float scale = hd::mul_rn(d, float(sm.scale));
    const float offset = -hd::mul_rn(dmin, float(sm.min));
    uint32_t w[8];
    load_words<true>(block + offsetof(Block, qs) + 32 * (chunk / 2), w);
    const int shift = 4 * (chunk % 2);
    float q[32];
    if constexpr (kQh >= 0) {
      uint32_t h[8];
      load_words<true>(block + kQh, h);
      TANDEM_UNROLL
      for (int i = 0; i < 32; ++i)
        q[i] = biased_to_float(
            ((byte_of(w, i) >> shift) & 0xF) | (((byte_of(h, i) >> chunk) & 1) << 4), 0);
    } else {
      TANDEM_UNROLL
      for (int i = 0; i < 32; ++i) q[i] = biased_to_float((byte_of(w, i) >> shift) & 0xF, 0);
    }
    scaled_sums<32>(q, &scale, &offset, x, acc);
  }
};
template <>
struct BlockDot<DType::Q4_K> : KQuantDot<DType::Q4_K, -1> {};
template <>
struct BlockDot<DType::Q5_K> : KQuantDot<DType::Q5_K, int(offsetof(BlockQ5_K, qh))> {};

// Q6_K: chunk c = elements 128 h + 32 k + l (h = c / 4, k = c % 4, l < 32): nibble in
// ql[64 h + 32 (k & 1) + l] (high for k >= 2), top bits at 2k of qh[32 h + l]; two sub-blocks
// of 16, each (d · sc) · (q − 32).
template <>
struct BlockDot<DType::Q6_K> {
  static constexpr int kChunks = 8;
  template <int NT, class X>
  TANDEM_HD static void dot32(const uint8_t* block, int chunk, const X& x, float (&acc)[NT]) {
    const int h = chunk / 4, k = chunk % 4;
    const float d = hd::f16_to_f32(hd::load_u16(block + offsetof(BlockQ6_K, d)));
    float scale[2];
    TANDEM_UNROLL
    for (int s = 0; s < 2; ++s)
      scale[s] = hd::mul_rn(d, float(int8_t(block[offsetof(BlockQ6_K, scales) + 2 * chunk + s])));
    uint32_t low[8], high[8];
    load_words<false>(block + offsetof(BlockQ6_K, ql) + 64 * h + 32 * (k & 1), low);
    load_words<false>(block + offsetof(BlockQ6_K, qh) + 32 * h, high);
    const int low_shift = 4 * (k >> 1), high_shift = 2 * k;
    float q[32];
    TANDEM_UNROLL
    for (int i = 0; i < 32; ++i)
      q[i] = biased_to_float(
          ((byte_of(low, i) >> low_shift) & 0xF) | (((byte_of(high, i) >> high_shift) & 3) << 4),
          32);
    scaled_sums<16>(q, scale, nullptr, x, acc);
  }
};

// IQ4_NL / IQ4_XS: a run of 32 indices into the levels, times d (IQ4_NL) or d * (scale - 32)
// (IQ4_XS, chunk = sub-block). The level + 128 (1..241) goes through biased_to_float.
template <int NT, class X>
TANDEM_HD void iq4_dot32(const uint8_t* qs, float scale, const X& x, float (&acc)[NT]) {
  uint32_t w[4];
  load_words<false>(qs, w);
  float q[32];
  TANDEM_UNROLL
  for (int i = 0; i < 16; ++i) {
    q[i] = biased_to_float(uint32_t(iq4_level(byte_of(w, i) & 0xF) + 128), 128);
    q[i + 16] = biased_to_float(uint32_t(iq4_level(byte_of(w, i) >> 4) + 128), 128);
  }
  scaled_sums<32>(q, &scale, nullptr, x, acc);
}

template <>
struct BlockDot<DType::IQ4_NL> {
  static constexpr int kChunks = 1;
  template <int NT, class X>
  TANDEM_HD static void dot32(const uint8_t* block, int, const X& x, float (&acc)[NT]) {
    const float d = hd::f16_to_f32(hd::load_u16(block + offsetof(BlockIQ4_NL, d)));
    iq4_dot32(block + offsetof(BlockIQ4_NL, qs), d, x, acc);
  }
};

template <>
struct BlockDot<DType::IQ4_XS> {
  static constexpr int kChunks = 8;
  template <int NT, class X>
  TANDEM_HD static void dot32(const uint8_t* block, int chunk, const X& x, float (&acc)[NT]) {
    const float d = hd::f16_to_f32(hd::load_u16(block + offsetof(BlockIQ4_XS, d)));
    iq4_dot32(block + offsetof(BlockIQ4_XS, qs) + 16 * chunk,
              hd::mul_rn(d, float(iq4_xs_scale(block, chunk))), x, acc);
  }
};

// Q4_1: d · q + m, the min through the sum of the activations.
template <>
struct BlockDot<DType::Q4_1> {
  static constexpr int kChunks = 1;
  template <int NT, class X>
  TANDEM_HD static void dot32(const uint8_t* block, int, const X& x, float (&acc)[NT]) {
    const float d = hd::f16_to_f32(hd::load_u16(block + offsetof(BlockQ4_1, d)));
    const float m = hd::f16_to_f32(hd::load_u16(block + offsetof(BlockQ4_1, m)));
    uint32_t w[4];
    load_words<false>(block + offsetof(BlockQ4_1, qs), w);
    float q[32];
    TANDEM_UNROLL
    for (int i = 0; i < 16; ++i) {
      q[i] = biased_to_float(byte_of(w, i) & 0xF, 0);
      q[i + 16] = biased_to_float(byte_of(w, i) >> 4, 0);
    }
    scaled_sums<32>(q, &d, &m, x, acc);
  }
};

// MXFP4: the doubled E2M1 values (+ 12 through biased_to_float) times the power of two.
template <>
struct BlockDot<DType::MXFP4> {
  static constexpr int kChunks = 1;
  template <int NT, class X>
  TANDEM_HD static void dot32(const uint8_t* block, int, const X& x, float (&acc)[NT]) {
    const float d = mxfp4_scale_hd(block[offsetof(BlockMXFP4, e)]);
    uint32_t w[4];
    load_words<false>(block + offsetof(BlockMXFP4, qs), w);
    float q[32];
    TANDEM_UNROLL
    for (int i = 0; i < 16; ++i) {
      q[i] = biased_to_float(uint32_t(e2m1_doubled(byte_of(w, i) & 0xF) + 12), 12);
      q[i + 16] = biased_to_float(uint32_t(e2m1_doubled(byte_of(w, i) >> 4) + 12), 12);
    }
    scaled_sums<32>(q, &d, nullptr, x, acc);
  }
};

// TQ1_0 / TQ2_0: chunk `chunk`'s quants less one, times d.
template <class Block, int (*kQuantAt)(const uint8_t*, int)>
struct TernaryBlockDot {
  static constexpr int kChunks = 8;
  template <int NT, class X>
  TANDEM_HD static void dot32(const uint8_t* block, int chunk, const X& x, float (&acc)[NT]) {
    const float d = hd::f16_to_f32(hd::load_u16(block + offsetof(Block, d)));
    float q[32];
    TANDEM_UNROLL
    for (int i = 0; i < 32; ++i) q[i] = biased_to_float(uint32_t(kQuantAt(block, 32 * chunk + i)), 1);
    scaled_sums<32>(q, &d, nullptr, x, acc);
  }
};

template <>
struct BlockDot<DType::TQ1_0> : TernaryBlockDot<BlockTQ1_0, tq1_0_quant_at> {};
template <>
struct BlockDot<DType::TQ2_0> : TernaryBlockDot<BlockTQ2_0, tq2_0_quant_at> {};

// The grid i-quants: chunk `chunk`'s 32 integer weights (core/iq_blocks.h), + 128 through
// biased_to_float, times one scale (groups of 32) or two (groups of 16).
template <class Block>
struct IqBlockDot {
  static constexpr int kChunks = 8;
  template <int NT, class X>
  TANDEM_HD static void dot32(const uint8_t* block, int chunk, const X& x, float (&acc)[NT]) {
    const IqChunk c = iq_chunk(IqTag<Block>{}, block, chunk);
    float q[32];
    TANDEM_UNROLL
    for (int i = 0; i < 32; ++i) q[i] = biased_to_float(uint32_t(iq_chunk_weight<Block>(c, i) + 128), 128);
    if constexpr (kIqGroup<Block> == 32) {
      const float scale = iq_group_scale(IqTag<Block>{}, block, chunk);
      scaled_sums<32>(q, &scale, nullptr, x, acc);
    } else {
      const float scale[2] = {iq_group_scale(IqTag<Block>{}, block, 2 * chunk),
                              iq_group_scale(IqTag<Block>{}, block, 2 * chunk + 1)};
      scaled_sums<16>(q, scale, nullptr, x, acc);
    }
  }
};

template <>
struct BlockDot<DType::IQ1_S> : IqBlockDot<BlockIQ1_S> {};
template <>
struct BlockDot<DType::IQ1_M> : IqBlockDot<BlockIQ1_M> {};
template <>
struct BlockDot<DType::IQ2_XXS> : IqBlockDot<BlockIQ2_XXS> {};
template <>
struct BlockDot<DType::IQ2_XS> : IqBlockDot<BlockIQ2_XS> {};
template <>
struct BlockDot<DType::IQ2_S> : IqBlockDot<BlockIQ2_S> {};
template <>
struct BlockDot<DType::IQ3_XXS> : IqBlockDot<BlockIQ3_XXS> {};
template <>
struct BlockDot<DType::IQ3_S> : IqBlockDot<BlockIQ3_S> {};

// The formats with a 32-weight step (the quantized ones; F32/F16/BF16 go eight at a time through
// decode8): calls fn(Decoder<T>{}, BlockDot<T>{}) and returns true, or returns false.
template <class Fn>
bool visit_block_dot(DType type, Fn&& fn) {
  switch (type) {
    case DType::Q4_0:
      fn(Decoder<DType::Q4_0>{}, BlockDot<DType::Q4_0>{});
      return true;
    case DType::Q5_0:
      fn(Decoder<DType::Q5_0>{}, BlockDot<DType::Q5_0>{});
      return true;
    case DType::Q5_1:
      fn(Decoder<DType::Q5_1>{}, BlockDot<DType::Q5_1>{});
      return true;
    case DType::Q8_0:
      fn(Decoder<DType::Q8_0>{}, BlockDot<DType::Q8_0>{});
      return true;
    case DType::Q2_K:
      fn(Decoder<DType::Q2_K>{}, BlockDot<DType::Q2_K>{});
      return true;
    case DType::Q3_K:
      fn(Decoder<DType::Q3_K>{}, BlockDot<DType::Q3_K>{});
      return true;
    case DType::Q4_K:
      fn(Decoder<DType::Q4_K>{}, BlockDot<DType::Q4_K>{});
      return true;
    case DType::Q5_K:
      fn(Decoder<DType::Q5_K>{}, BlockDot<DType::Q5_K>{});
      return true;
    case DType::Q6_K:
      fn(Decoder<DType::Q6_K>{}, BlockDot<DType::Q6_K>{});
      return true;
    case DType::IQ4_NL:
      fn(Decoder<DType::IQ4_NL>{}, BlockDot<DType::IQ4_NL>{});
      return true;
    case DType::IQ4_XS:
      fn(Decoder<DType::IQ4_XS>{}, BlockDot<DType::IQ4_XS>{});
      return true;
    case DType::Q4_1:
      fn(Decoder<DType::Q4_1>{}, BlockDot<DType::Q4_1>{});
      return true;
    case DType::MXFP4:
      fn(Decoder<DType::MXFP4>{}, BlockDot<DType::MXFP4>{});
      return true;
    case DType::TQ1_0:
      fn(Decoder<DType::TQ1_0>{}, BlockDot<DType::TQ1_0>{});
      return true;
    case DType::TQ2_0:
      fn(Decoder<DType::TQ2_0>{}, BlockDot<DType::TQ2_0>{});
      return true;
    default:  // the grid i-quants, or none
      return visit_iq_grid(type, [&](auto f) {
        constexpr DType kType = decltype(f)::kType;
        fn(Decoder<kType>{}, BlockDot<kType>{});
      });
  }
}

}  // namespace tandem::blocks
