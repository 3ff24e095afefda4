// Portable Int16-precision kernels: every quantized format against ActKind::Q16 activations
// (act_q16.h), and the Q16 preparation that every instruction set must reproduce byte for byte.
//
// Integer sums stay per 32-element activation block (or per 16-element sub-block), where one
// activation scale applies; they are converted to float there, multiplied by the sub-block scale
// in float, and summed in float. Bounds: weights are at most 8 bits signed (|w| <= 128) and
// |q| <= 32767, so a 32-element sum is at most 32 * 128 * 32767 = 1.3e8 < 2^31. (Multiplying a
// Q6_K sum by its int8 scale in int32 could reach 2^31, hence the float.)
#include <cstring>

#include "backends/cpu/act_q16.h"
#include "backends/cpu/kernels.h"
#include "backends/cpu/kscales.h"
#include "core/blocks.h"
#include "core/half.h"
#include "core/iq_blocks.h"

namespace tandem::cpu {
namespace {

// Round to nearest, ties to even, for |v| < 2^22 (as in dot_portable.cpp): the same result as
// cvtps2dq under the default rounding mode, so the SIMD preparers can match it bit for bit.
inline float round_nearest_even(float v) {
  return (v + 0x1.8p23f) - 0x1.8p23f;
}

void prepare_q16(const float* x, void* act_row, int64_t cols) {
  const Q16RowOut row = q16_row_out(act_row, cols);
  for (int64_t b = 0; b < cols / 32; ++b) {
    const float* xb = x + 32 * b;
    float amax = 0.0f;
    for (int i = 0; i < 32; ++i) {
      const float a = xb[i] < 0 ? -xb[i] : xb[i];
      amax = a > amax ? a : amax;
    }
    const float inverse = amax > 0.0f ? kQ16Max / amax : 0.0f;
    const float d = amax / kQ16Max;
    int32_t sums[2] = {0, 0};
    for (int i = 0; i < 32; ++i) {
      const int q = int(round_nearest_even(xb[i] * inverse));
      row.q[32 * b + i] = int16_t(q);
      sums[i / 16] += q;
    }
    row.d[b] = d;
    row.sum16[2 * b] = d * float(sums[0]);
    row.sum16[2 * b + 1] = d * float(sums[1]);
  }
}

// ---- 32-element formats: one activation block per weight block ----

float dot_q8_0(const void* w, const void* a, int64_t cols) {
  const auto* wb = static_cast<const BlockQ8_0*>(w);
  const Q16Row x = q16_row(a, cols);
  float sum = 0.0f;
  for (int64_t b = 0; b < cols / 32; ++b) {
    const int16_t* q = x.q + 32 * b;
    int32_t dot = 0;
    for (int i = 0; i < 32; ++i) dot += wb[b].qs[i] * q[i];
    sum += f16_to_f32(wb[b].d) * x.d[b] * float(dot);
  }
  return sum;
}

float dot_q4_0(const void* w, const void* a, int64_t cols) {
  const auto* wb = static_cast<const BlockQ4_0*>(w);
  const Q16Row x = q16_row(a, cols);
  float sum = 0.0f;
  for (int64_t b = 0; b < cols / 32; ++b) {
    const int16_t* q = x.q + 32 * b;
    int32_t dot = 0;
    for (int i = 0; i < 16; ++i)
      dot += ((wb[b].qs[i] & 15) - 8) * q[i] + ((wb[b].qs[i] >> 4) - 8) * q[i + 16];
    sum += f16_to_f32(wb[b].d) * x.d[b] * float(dot);
  }
  return sum;
}

// Q4_1: d · q + m, q the nibble; the m part from the activations' sums.
float dot_q4_1(const void* w, const void* a, int64_t cols) {
  const auto* wb = static_cast<const BlockQ4_1*>(w);
  const Q16Row x = q16_row(a, cols);
  float sum = 0.0f;
  for (int64_t b = 0; b < cols / 32; ++b) {
    const int16_t* q = x.q + 32 * b;
    int32_t dot = 0;
    for (int i = 0; i < 16; ++i) dot += (wb[b].qs[i] & 15) * q[i] + (wb[b].qs[i] >> 4) * q[i + 16];
    sum += f16_to_f32(wb[b].d) * x.d[b] * float(dot) +
           f16_to_f32(wb[b].m) * (x.sum16[2 * b] + x.sum16[2 * b + 1]);
  }
  return sum;
}

// Σ (q - offset) x over a Q5_0 / Q5_1 block (q in 0..31).
inline int32_t dot_5bit(const uint8_t* qs, const uint8_t* qh_bytes, const int16_t* x, int offset) {
  uint32_t qh;
  std::memcpy(&qh, qh_bytes, sizeof(qh));
  int32_t dot = 0;
  for (int i = 0; i < 16; ++i) {
    const int lo = (qs[i] & 15) | int((qh >> i) & 1) << 4;
    const int hi = (qs[i] >> 4) | int((qh >> (i + 16)) & 1) << 4;
    dot += (lo - offset) * x[i] + (hi - offset) * x[i + 16];
  }
  return dot;
}

float dot_q5_0(const void* w, const void* a, int64_t cols) {
  const auto* wb = static_cast<const BlockQ5_0*>(w);
  const Q16Row x = q16_row(a, cols);
  float sum = 0.0f;
  for (int64_t b = 0; b < cols / 32; ++b) {
    const int32_t dot = dot_5bit(wb[b].qs, wb[b].qh, x.q + 32 * b, 16);
    sum += f16_to_f32(wb[b].d) * x.d[b] * float(dot);
  }
  return sum;
}

float dot_q5_1(const void* w, const void* a, int64_t cols) {
  const auto* wb = static_cast<const BlockQ5_1*>(w);
  const Q16Row x = q16_row(a, cols);
  float sum = 0.0f;
  for (int64_t b = 0; b < cols / 32; ++b) {
    const int32_t dot = dot_5bit(wb[b].qs, wb[b].qh, x.q + 32 * b, 0);
    sum += f16_to_f32(wb[b].d) * x.d[b] * float(dot) +
           f16_to_f32(wb[b].m) * (x.sum16[2 * b] + x.sum16[2 * b + 1]);
  }
  return sum;
}

// ---- k-quants: each sub-block (16 or 32 elements) lies in one activation block ----

float dot_q2_k(const void* w, const void* a, int64_t cols) {
  const auto* wb = static_cast<const BlockQ2_K*>(w);
  const Q16Row x = q16_row(a, cols);
  float sum = 0.0f;
  for (int64_t b = 0; b < cols / kQK_K; ++b) {
    const BlockQ2_K& block = wb[b];
    const float* xd = x.d + 8 * b;
    const float* xsum = x.sum16 + 16 * b;
    // Sub-block k (elements 16k..16k+15) lives in qs[32*(k/8) + 16*(k%2) ..] at bit 2*((k/2)%4).
    float dot = 0.0f, mins = 0.0f;
    for (int k = 0; k < 16; ++k) {
      const uint8_t* q = block.qs + 32 * (k / 8) + 16 * (k % 2);
      const int shift = 2 * ((k / 2) % 4);
      const int16_t* xq = x.q + kQK_K * b + 16 * k;
      int32_t s = 0;
      for (int i = 0; i < 16; ++i) s += ((q[i] >> shift) & 3) * xq[i];
      dot += float((block.scales[k] & 15) * s) * xd[k / 2];
      mins += float(block.scales[k] >> 4) * xsum[k];
    }
    sum += f16_to_f32(block.d) * dot - f16_to_f32(block.dmin) * mins;
  }
  return sum;
}

float dot_q3_k(const void* w, const void* a, int64_t cols) {
  const auto* wb = static_cast<const BlockQ3_K*>(w);
  const Q16Row x = q16_row(a, cols);
  float sum = 0.0f;
  for (int64_t b = 0; b < cols / kQK_K; ++b) {
    const BlockQ3_K& block = wb[b];
    int8_t scales[16];
    unpack_q3_k_scales(block.scales, scales);
    const float* xd = x.d + 8 * b;
    // Sub-block k as in Q2_K; its high bits are bit (k/2) of hmask[16*(k%2) ..].
    float dot = 0.0f;
    for (int k = 0; k < 16; ++k) {
      const uint8_t* q = block.qs + 32 * (k / 8) + 16 * (k % 2);
      const uint8_t* h = block.hmask + 16 * (k % 2);
      const int shift = 2 * ((k / 2) % 4);
      const int hbit = k / 2;
      const int16_t* xq = x.q + kQK_K * b + 16 * k;
      int32_t s = 0;
      for (int i = 0; i < 16; ++i) {
        const int q3 = ((q[i] >> shift) & 3) - (((h[i] >> hbit) & 1) ? 0 : 4);
        s += q3 * xq[i];
      }
      dot += float(scales[k] * s) * xd[k / 2];
    }
    sum += f16_to_f32(block.d) * dot;
  }
  return sum;
}

// Q4_K and Q5_K: sub-block j (32 elements) is activation block 8b + j.
template <bool kFifthBit, class Block>
float dot_q4_q5_k(const Block* wb, const void* a, int64_t cols) {
  const Q16Row x = q16_row(a, cols);
  float sum = 0.0f;
  for (int64_t b = 0; b < cols / kQK_K; ++b) {
    const Block& block = wb[b];
    const KScales s = unpack_k_scales(block.scales);
    const float* xd = x.d + 8 * b;
    const float* xsum = x.sum16 + 16 * b;
    // 64 elements per 32 bytes of qs: the low nibbles are sub-block 2c, the high ones 2c+1; the
    // fifth bit (Q5_K) of sub-block j is bit j of qh[i].
    float dot = 0.0f, mins = 0.0f;
    for (int c = 0; c < 4; ++c) {
      const uint8_t* q = block.qs + 32 * c;
      const int16_t* xq = x.q + kQK_K * b + 64 * c;
      int32_t lo = 0, hi = 0;
      for (int i = 0; i < 32; ++i) {
        int q_lo = q[i] & 15, q_hi = q[i] >> 4;
        if constexpr (kFifthBit) {
          q_lo |= ((block.qh[i] >> (2 * c)) & 1) << 4;
          q_hi |= ((block.qh[i] >> (2 * c + 1)) & 1) << 4;
        }
        lo += q_lo * xq[i];
        hi += q_hi * xq[i + 32];
      }
      dot += float(s.scale[2 * c]) * float(lo) * xd[2 * c] +
             float(s.scale[2 * c + 1]) * float(hi) * xd[2 * c + 1];
    }
    for (int j = 0; j < 8; ++j) mins += float(s.min[j]) * (xsum[2 * j] + xsum[2 * j + 1]);
    sum += f16_to_f32(block.d) * dot - f16_to_f32(block.dmin) * mins;
  }
  return sum;
}

float dot_q4_k(const void* w, const void* a, int64_t cols) {
  return dot_q4_q5_k<false>(static_cast<const BlockQ4_K*>(w), a, cols);
}

float dot_q5_k(const void* w, const void* a, int64_t cols) {
  return dot_q4_q5_k<true>(static_cast<const BlockQ5_K*>(w), a, cols);
}

float dot_q6_k(const void* w, const void* a, int64_t cols) {
  const auto* wb = static_cast<const BlockQ6_K*>(w);
  const Q16Row x = q16_row(a, cols);
  float sum = 0.0f;
  for (int64_t b = 0; b < cols / kQK_K; ++b) {
    const BlockQ6_K& block = wb[b];
    // Per half of 128: element 32*p + i (p = 0..3) has its low 4 bits in ql[32*(p%2) + i]
    // (low nibble for p < 2, high for p >= 2) and its high 2 bits at bit 2p of qh[i]. The -32
    // offset is applied to each weight: |q - 32| <= 32.
    float dot = 0.0f;
    for (int half = 0; half < 2; ++half) {
      const uint8_t* ql = block.ql + 64 * half;
      const uint8_t* qh = block.qh + 32 * half;
      for (int p = 0; p < 4; ++p) {
        const int16_t* xq = x.q + kQK_K * b + 128 * half + 32 * p;
        const float xd = x.d[8 * b + 4 * half + p];
        int32_t s[2] = {0, 0};
        for (int i = 0; i < 32; ++i) {
          const int low = p < 2 ? ql[32 * p + i] & 15 : ql[32 * (p - 2) + i] >> 4;
          s[i / 16] += ((low | ((qh[i] >> (2 * p)) & 3) << 4) - 32) * xq[i];
        }
        const int k = 8 * half + 2 * p;
        dot +=
            (float(block.scales[k]) * float(s[0]) + float(block.scales[k + 1]) * float(s[1])) * xd;
      }
    }
    sum += f16_to_f32(block.d) * dot;
  }
  return sum;
}

// ---- IQ4_NL, IQ4_XS: 4-bit indices into IQ4_NL's 16 levels, laid out as Q4_0 ----

inline int32_t dot_iq4_32(const uint8_t* qs, const int16_t* q) {
  int32_t dot = 0;
  for (int i = 0; i < 16; ++i)
    dot += kIq4NlValues[qs[i] & 15] * q[i] + kIq4NlValues[qs[i] >> 4] * q[i + 16];
  return dot;
}

float dot_iq4_nl(const void* w, const void* a, int64_t cols) {
  const auto* wb = static_cast<const BlockIQ4_NL*>(w);
  const Q16Row x = q16_row(a, cols);
  float sum = 0.0f;
  for (int64_t b = 0; b < cols / 32; ++b)
    sum += f16_to_f32(wb[b].d) * x.d[b] * float(dot_iq4_32(wb[b].qs, x.q + 32 * b));
  return sum;
}

float dot_iq4_xs(const void* w, const void* a, int64_t cols) {
  const auto* wb = static_cast<const BlockIQ4_XS*>(w);
  const Q16Row x = q16_row(a, cols);
  float sum = 0.0f;
  for (int64_t b = 0; b < cols / kQK_K; ++b) {
    const float d = f16_to_f32(wb[b].d);
    for (int sub = 0; sub < 8; ++sub) {
      const int64_t xb = 8 * b + sub;
      sum += d * float(iq4_xs_sub_scale(wb[b], sub)) * x.d[xb] *
             float(dot_iq4_32(wb[b].qs + 16 * sub, x.q + 32 * xb));
    }
  }
  return sum;
}

// MXFP4: 4-bit codes into the doubled E2M1 values, laid out as Q4_0, one power of two a block.
float dot_mxfp4(const void* w, const void* a, int64_t cols) {
  const auto* wb = static_cast<const BlockMXFP4*>(w);
  const Q16Row x = q16_row(a, cols);
  float sum = 0.0f;
  for (int64_t b = 0; b < cols / 32; ++b) {
    int32_t dot = 0;
    for (int i = 0; i < 16; ++i)
      dot += kE2M1Doubled.v[wb[b].qs[i] & 15] * x.q[32 * b + i] +
             kE2M1Doubled.v[wb[b].qs[i] >> 4] * x.q[32 * b + i + 16];
    sum += mxfp4_scale(wb[b].e) * x.d[b] * float(dot);
  }
  return sum;
}

// TQ1_0 / TQ2_0: d · (q - 1) over 256 elements, the quants in element order (core/blocks.h);
// one weight scale for the eight activation blocks.
template <class Block, void (*kQuants)(const Block&, uint8_t*)>
float dot_ternary(const void* w, const void* a, int64_t cols) {
  const auto* wb = static_cast<const Block*>(w);
  const Q16Row x = q16_row(a, cols);
  float sum = 0.0f;
  uint8_t q[256];
  for (int64_t b = 0; b < cols / 256; ++b) {
    kQuants(wb[b], q);
    const float d = f16_to_f32(wb[b].d);
    for (int g = 0; g < 8; ++g) {
      const int16_t* xq = x.q + 256 * b + 32 * g;
      int32_t dot = 0;
      for (int i = 0; i < 32; ++i) dot += (int(q[32 * g + i]) - 1) * xq[i];
      sum += d * x.d[8 * b + g] * float(dot);
    }
  }
  return sum;
}

// The grid i-quants: each block taken apart into integer weights and group scales
// (core/iq_blocks.h), then as Q4_0 per group of 32, or as Q6_K's pairs of 16 per activation block.
// The kernel for every level: taking a block apart costs as much as its 256 products here.
template <class Block>
float dot_iq_grid(const void* w, const void* a, int64_t cols) {
  constexpr int kGroup = kIqGroup<Block>;
  const auto* wb = static_cast<const Block*>(w);
  const Q16Row x = q16_row(a, cols);
  IqWeights weights;
  float sum = 0.0f;
  for (int64_t b = 0; b < cols / kQK_K; ++b) {
    iq_weights(wb[b], weights);
    for (int g = 0; g < kQK_K / kGroup; ++g) {
      const int16_t* xq = x.q + kQK_K * b + kGroup * g;
      const int8_t* wq = weights.w + kGroup * g;
      int32_t dot = 0;
      for (int i = 0; i < kGroup; ++i) dot += wq[i] * xq[i];
      sum += weights.scale[g] * x.d[(kQK_K * b + kGroup * g) / 32] * float(dot);
    }
  }
  return sum;
}

}  // namespace

void fill_portable_q16_kernels(KernelTable& table) {
  auto set = [&](DType type, RowDotFn dot) {
    table.formats[size_t(ActPrecision::Int16)][size_t(type)] = {ActKind::Q16, dot};
  };
  set(DType::Q8_0, dot_q8_0);
  set(DType::Q4_0, dot_q4_0);
  set(DType::Q5_0, dot_q5_0);
  set(DType::Q4_1, dot_q4_1);
  set(DType::Q5_1, dot_q5_1);
  set(DType::Q2_K, dot_q2_k);
  set(DType::Q3_K, dot_q3_k);
  set(DType::Q4_K, dot_q4_k);
  set(DType::Q5_K, dot_q5_k);
  set(DType::Q6_K, dot_q6_k);
  set(DType::IQ4_NL, dot_iq4_nl);
  set(DType::IQ4_XS, dot_iq4_xs);
  set(DType::MXFP4, dot_mxfp4);
  set(DType::TQ1_0, dot_ternary<BlockTQ1_0, tq1_0_quants>);
  set(DType::TQ2_0, dot_ternary<BlockTQ2_0, tq2_0_quants>);
  for (DType type : kIqGridFormats)
    visit_iq_grid(type, [&](auto f) { set(type, dot_iq_grid<typename decltype(f)::Block>); });
  table.prepare[size_t(ActKind::Q16)] = prepare_q16;
}

}  // namespace tandem::cpu
