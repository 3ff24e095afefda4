#pragma once
// Dot products of 32 consecutive weights with 8-bit activations, straight from the quantized
// blocks: the GPU's decode step for the products the precision policy gives 8-bit activations
// (the feed-forward ones, model/deepseek2.h), written once for host and device and tested on the
// host against dequantize_row.
//
// Why: the F32-activation step (block_dot.h) spends ~4 instructions a weight (unpack, convert,
// multiply-add) and an H200 issues about as many as its memory delivers Q4_K weights, so that
// kernel streamed 900 GB/s of the 4200 measured. Here four weights cost one dp4a (four 8-bit
// products summed into an int32) plus about one instruction to unpack them, as the fast engines
// do it (llama.cpp's MMVQ kernels).
//
// Activations: ActQ8 blocks of 32 (x ≈ d · q, q in [-127, 127], Σ q carried for the formats
// with an offset), as the CPU's ActBlockQ8. Weights: a format's 32 quants become 8 words of
// signed bytes (element i in byte i % 4 of word i / 4) with one or two group scales (groups of
// 32 or 16) and an offset per Σ x (the k-quants' mins, Q5_1's m). The integer sums are exact;
// the float steps per group are few, so the result is within F32 rounding of Σ w · (d · q).
#include <cstdint>

#include "core/blocks.h"
#include "core/dtype.h"
#include "core/host_device.h"
#include "quant/block_decode.h"
#include "quant/block_dot.h"

namespace tandem::blocks {

// 32 activations of one token, 8-bit. Aligned and padded to 48 bytes so that a GPU lane loads a
// block in three 16-byte loads (packed in 40 bytes, 4-byte aligned, it took nine or ten
// 4-byte loads, each lane of a warp 40 bytes from the next): the padding costs 20% of the
// activations' bytes, which are about 1% of a product's weight bytes at decode.
struct alignas(16) ActQ8 {
  uint32_t qs[8];  // the 32 quants as signed bytes, element i in byte i % 4 of word i / 4
  float d;
  int32_t sum;      // Σ qs
  uint32_t unused[2];  // written as zeros (quantize_act32)
};
static_assert(sizeof(ActQ8) == 48 && alignof(ActQ8) == 16);

// x[0..31] into one block: d = max |x| / 127, q = x / d rounded to nearest even.
TANDEM_HD void quantize_act32(const float* x, ActQ8& out) {
  float amax = 0.0f;
  for (int i = 0; i < 32; ++i) amax = hd::max_f(amax, x[i] < 0 ? -x[i] : x[i]);
  const float d = amax / 127.0f;
  const float inverse = d != 0.0f ? 1.0f / d : 0.0f;
  int32_t sum = 0;
  for (int w = 0; w < 8; ++w) {
    uint32_t word = 0;
    for (int b = 0; b < 4; ++b) {
      const int q = int(hd::round_even(x[4 * w + b] * inverse));
      sum += q;
      word |= uint32_t(uint8_t(int8_t(q))) << (8 * b);
    }
    out.qs[w] = word;
  }
  out.d = d;
  out.sum = sum;
  out.unused[0] = out.unused[1] = 0;
}

// c + Σ of the four signed-byte products of a and b: one dp4a on the device.
TANDEM_HD int32_t dot4(uint32_t a, uint32_t b, int32_t c) {
#if defined(__CUDA_ARCH__)
  return __dp4a(int(a), int(b), c);
#else
  for (int i = 0; i < 4; ++i) c += int32_t(int8_t(a >> (8 * i))) * int32_t(int8_t(b >> (8 * i)));
  return c;
#endif
}

// Each byte u of `u` (u < 128) minus `bias` (<= 128) as a signed byte, without borrows between
// bytes: (u + 128 - bias) ^ 128.
TANDEM_HD uint32_t minus_bias(uint32_t u, uint32_t bias) {
  return ((u | 0x80808080u) - bias * 0x01010101u) ^ 0x80808080u;
}

// Bits 0-3 of `bits` to bit 0 of bytes 0-3.
TANDEM_HD uint32_t spread4(uint32_t bits) {
  return (bits & 1u) | ((bits & 2u) << 7) | ((bits & 4u) << 14) | ((bits & 8u) << 21);
}

// A format's 32 quants of one chunk as signed bytes, with what multiplies their sums.
struct Quants32 {
  uint32_t q[8];
  float scale[2];       // per group: [0] for 32-element groups; [0] and [1] for two of 16
  float offset = 0.0f;  // times d_x · Σ q_x (0: none)
};

template <DType T>
struct BlockDotQ8 {
  static constexpr bool kHas = false;
};

// Q4_0 / Q5_0 / Q5_1: element i < 16 is the low nibble of qs[i], i >= 16 the high nibble of
// qs[i - 16]; Q5's fifth bit is bit i of qh.
template <int kBias, int kQs, int kQh>
TANDEM_HD void q4_q5_words(const uint8_t* block, uint32_t (&q)[8]) {
  uint32_t w[4];
  load_words<false>(block + kQs, w);
  uint32_t high = 0;
  if constexpr (kQh >= 0)
    high = uint32_t(hd::load_u16(block + kQh)) | (uint32_t(hd::load_u16(block + kQh + 2)) << 16);
  TANDEM_UNROLL
  for (int j = 0; j < 4; ++j) {
    uint32_t lo = w[j] & 0x0F0F0F0Fu, hi = (w[j] >> 4) & 0x0F0F0F0Fu;
    if constexpr (kQh >= 0) {
      lo |= spread4(high >> (4 * j)) << 4;
      hi |= spread4(high >> (16 + 4 * j)) << 4;
    }
    q[j] = kBias ? minus_bias(lo, kBias) : lo;
    q[j + 4] = kBias ? minus_bias(hi, kBias) : hi;
  }
}

template <>
struct BlockDotQ8<DType::Q4_0> {
  static constexpr bool kHas = true;
  TANDEM_HD static void quants32(const uint8_t* block, int, Quants32& out) {
    q4_q5_words<8, offsetof(BlockQ4_0, qs), -1>(block, out.q);
    out.scale[0] = hd::f16_to_f32(hd::load_u16(block + offsetof(BlockQ4_0, d)));
  }
};

template <>
struct BlockDotQ8<DType::Q5_0> {
  static constexpr bool kHas = true;
  TANDEM_HD static void quants32(const uint8_t* block, int, Quants32& out) {
    q4_q5_words<16, offsetof(BlockQ5_0, qs), offsetof(BlockQ5_0, qh)>(block, out.q);
    out.scale[0] = hd::f16_to_f32(hd::load_u16(block + offsetof(BlockQ5_0, d)));
  }
};

template <>
struct BlockDotQ8<DType::Q5_1> {
  static constexpr bool kHas = true;
  TANDEM_HD static void quants32(const uint8_t* block, int, Quants32& out) {
    q4_q5_words<0, offsetof(BlockQ5_1, qs), offsetof(BlockQ5_1, qh)>(block, out.q);
    out.scale[0] = hd::f16_to_f32(hd::load_u16(block + offsetof(BlockQ5_1, d)));
    out.offset = hd::f16_to_f32(hd::load_u16(block + offsetof(BlockQ5_1, m)));
  }
};

template <>
struct BlockDotQ8<DType::Q8_0> {
  static constexpr bool kHas = true;
  TANDEM_HD static void quants32(const uint8_t* block, int, Quants32& out) {
    load_words<false>(block + offsetof(BlockQ8_0, qs), out.q);
    out.scale[0] = hd::f16_to_f32(hd::load_u16(block + offsetof(BlockQ8_0, d)));
  }
};

// Q4_K / Q5_K: chunk = sub-block s, (d · sc_s) · q − dmin · m_s (block_dot.h's KQuantDot).
template <DType T, int kQh>
struct KQuantDotQ8 {
  static constexpr bool kHas = true;
  using Block = std::conditional_t<T == DType::Q4_K, BlockQ4_K, BlockQ5_K>;
  TANDEM_HD static void quants32(const uint8_t* block, int chunk, Quants32& out) {
    uint32_t header[4];  // d, dmin, 12 scale bytes
    load_words<true>(block, header);
    const float d = hd::f16_to_f32(uint16_t(header[0] & 0xFFFF));
    const float dmin = hd::f16_to_f32(uint16_t(header[0] >> 16));
    const KScaleMin sm = k_scale_min_words(header[1], header[2], header[3], chunk);
    out.scale[0] = hd::mul_rn(d, float(sm.scale));
    out.offset = -hd::mul_rn(dmin, float(sm.min));
    uint32_t w[8];
    load_words<true>(block + offsetof(Block, qs) + 32 * (chunk / 2), w);
    const int shift = 4 * (chunk % 2);
    uint32_t h[8];
    if constexpr (kQh >= 0) load_words<true>(block + kQh, h);
    TANDEM_UNROLL
    for (int j = 0; j < 8; ++j) {
      out.q[j] = (w[j] >> shift) & 0x0F0F0F0Fu;
      if constexpr (kQh >= 0) out.q[j] |= ((h[j] >> chunk) & 0x01010101u) << 4;
    }
  }
};
template <>
struct BlockDotQ8<DType::Q4_K> : KQuantDotQ8<DType::Q4_K, -1> {};
template <>
struct BlockDotQ8<DType::Q5_K> : KQuantDotQ8<DType::Q5_K, int(offsetof(BlockQ5_K, qh))> {};

// Q6_K: two groups of 16, (d · sc) · (q − 32) (block_dot.h's layout notes).
template <>
struct BlockDotQ8<DType::Q6_K> {
  static constexpr bool kHas = true;
  TANDEM_HD static void quants32(const uint8_t* block, int chunk, Quants32& out) {
    const int h = chunk / 4, k = chunk % 4;
    const float d = hd::f16_to_f32(hd::load_u16(block + offsetof(BlockQ6_K, d)));
    TANDEM_UNROLL
    for (int s = 0; s < 2; ++s)
      out.scale[s] =
          hd::mul_rn(d, float(int8_t(block[offsetof(BlockQ6_K, scales) + 2 * chunk + s])));
    uint32_t low[8], high[8];
    load_words<false>(block + offsetof(BlockQ6_K, ql) + 64 * h + 32 * (k & 1), low);
    load_words<false>(block + offsetof(BlockQ6_K, qh) + 32 * h, high);
    const int low_shift = 4 * (k >> 1), high_shift = 2 * k;
    TANDEM_UNROLL
    for (int j = 0; j < 8; ++j)
      out.q[j] = minus_bias(((low[j] >> low_shift) & 0x0F0F0F0Fu) |
                                (((high[j] >> high_shift) & 0x03030303u) << 4),
                            32);
  }
};

// IQ4_NL / IQ4_XS: the levels (signed bytes) of 32 indices, times d or d · (scale − 32).
TANDEM_HD void iq4_words(const uint8_t* qs, uint32_t (&q)[8]) {
  uint32_t w[4];
  load_words<false>(qs, w);
  TANDEM_UNROLL
  for (int j = 0; j < 4; ++j) {
    uint32_t lo = 0, hi = 0;
    TANDEM_UNROLL
    for (int b = 0; b < 4; ++b) {
      const uint32_t byte = (w[j] >> (8 * b)) & 0xFF;
      lo |= uint32_t(uint8_t(int8_t(iq4_level(byte & 0xF)))) << (8 * b);
      hi |= uint32_t(uint8_t(int8_t(iq4_level(byte >> 4)))) << (8 * b);
    }
    q[j] = lo, q[j + 4] = hi;
  }
}

template <>
struct BlockDotQ8<DType::IQ4_NL> {
  static constexpr bool kHas = true;
  TANDEM_HD static void quants32(const uint8_t* block, int, Quants32& out) {
    iq4_words(block + offsetof(BlockIQ4_NL, qs), out.q);
    out.scale[0] = hd::f16_to_f32(hd::load_u16(block + offsetof(BlockIQ4_NL, d)));
  }
};

template <>
struct BlockDotQ8<DType::IQ4_XS> {
  static constexpr bool kHas = true;
  TANDEM_HD static void quants32(const uint8_t* block, int chunk, Quants32& out) {
    iq4_words(block + offsetof(BlockIQ4_XS, qs) + 16 * chunk, out.q);
    const float d = hd::f16_to_f32(hd::load_u16(block + offsetof(BlockIQ4_XS, d)));
    out.scale[0] = hd::mul_rn(d, float(iq4_xs_scale(block, chunk)));
  }
};

// Whether a format's 32 quants split into two groups of 16 with a scale each.
template <DType T>
constexpr bool kTwoGroups = T == DType::Q6_K;

// acc[t] += Σ_i w[i] · x_t[i] over the chunk: exact integer sums per group, then per group
// scale · (d_x · sum), then offset · (d_x · Σ q_x).
template <DType T, int NT>
TANDEM_HD void dot32_q8(const Quants32& w, const ActQ8* const (&x)[NT], float (&acc)[NT]) {
  TANDEM_UNROLL
  for (int t = 0; t < NT; ++t) {
    int32_t s0 = 0, s1 = 0;
    TANDEM_UNROLL
    for (int j = 0; j < 4; ++j) s0 = dot4(w.q[j], x[t]->qs[j], s0);
    TANDEM_UNROLL
    for (int j = 4; j < 8; ++j) s1 = dot4(w.q[j], x[t]->qs[j], s1);
    const float dx = x[t]->d;
    if constexpr (kTwoGroups<T>) {
      acc[t] = madd(hd::mul_rn(w.scale[0], dx), float(s0), acc[t]);
      acc[t] = madd(hd::mul_rn(w.scale[1], dx), float(s1), acc[t]);
    } else {
      acc[t] = madd(hd::mul_rn(w.scale[0], dx), float(s0 + s1), acc[t]);
    }
    if (w.offset != 0.0f) acc[t] = madd(hd::mul_rn(w.offset, dx), float(x[t]->sum), acc[t]);
  }
}

// The formats with an 8-bit step: calls fn(Decoder<T>{}, BlockDotQ8<T>{}) and returns true, or
// returns false (the caller keeps F32 activations).
template <class Fn>
bool visit_block_dot_q8(DType type, Fn&& fn) {
  switch (type) {
    case DType::Q4_0:
      fn(Decoder<DType::Q4_0>{}, BlockDotQ8<DType::Q4_0>{});
      return true;
    case DType::Q5_0:
      fn(Decoder<DType::Q5_0>{}, BlockDotQ8<DType::Q5_0>{});
      return true;
    case DType::Q5_1:
      fn(Decoder<DType::Q5_1>{}, BlockDotQ8<DType::Q5_1>{});
      return true;
    case DType::Q8_0:
      fn(Decoder<DType::Q8_0>{}, BlockDotQ8<DType::Q8_0>{});
      return true;
    case DType::Q4_K:
      fn(Decoder<DType::Q4_K>{}, BlockDotQ8<DType::Q4_K>{});
      return true;
    case DType::Q5_K:
      fn(Decoder<DType::Q5_K>{}, BlockDotQ8<DType::Q5_K>{});
      return true;
    case DType::Q6_K:
      fn(Decoder<DType::Q6_K>{}, BlockDotQ8<DType::Q6_K>{});
      return true;
    case DType::IQ4_NL:
      fn(Decoder<DType::IQ4_NL>{}, BlockDotQ8<DType::IQ4_NL>{});
      return true;
    case DType::IQ4_XS:
      fn(Decoder<DType::IQ4_XS>{}, BlockDotQ8<DType::IQ4_XS>{});
      return true;
    default:
      return false;
  }
}

}  // namespace tandem::blocks
