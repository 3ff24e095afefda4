// Portable kernels: plain C++ for every format, and the activation preparation used by every
// instruction set. The quantized kernels compute the same integer sums per block as the SIMD
// ones, so the levels differ only in the order of float additions.
#include <cstring>

#include "backends/cpu/kernels.h"
#include "backends/cpu/kscales.h"
#include "core/blocks.h"
#include "core/dtype.h"
#include "core/half.h"
#include "core/iq_blocks.h"

namespace tandem::cpu {
namespace {

// Round to nearest, ties to even, for |v| < 2^22: adding 1.5 * 2^23 pushes the fraction bits
// out of the mantissa. Exact float arithmetic (no libm call, vectorizable), and the same result
// as cvtps2dq under the default rounding mode, so SIMD preparation can match it bit for bit.
inline float round_nearest_even(float v) {
  return (v + 0x1.8p23f) - 0x1.8p23f;
}

// Symmetric 8-bit quantization of n values with one scale: q = round(x * 127 / amax).
// Returns the scale; writes qs and returns Σ qs through `sum`.
float quantize_block_q8(const float* x, int n, int8_t* qs, int32_t* sum) {
  float amax = 0.0f;
  for (int i = 0; i < n; ++i) {
    const float a = x[i] < 0 ? -x[i] : x[i];
    amax = a > amax ? a : amax;
  }
  const float inverse = amax > 0.0f ? 127.0f / amax : 0.0f;
  int32_t total = 0;
  for (int i = 0; i < n; ++i) {
    const int q = int(round_nearest_even(x[i] * inverse));
    qs[i] = int8_t(q);
    total += q;
  }
  *sum = total;
  return amax / 127.0f;
}

void prepare_q8(const float* x, void* act_row, int64_t cols) {
  auto* blocks = static_cast<ActBlockQ8*>(act_row);
  for (int64_t b = 0; b < cols / 32; ++b)
    blocks[b].d = quantize_block_q8(x + b * 32, 32, blocks[b].qs, &blocks[b].sum);
}

void prepare_q8_k(const float* x, void* act_row, int64_t cols) {
  auto* blocks = static_cast<BlockQ8_K*>(act_row);
  for (int64_t b = 0; b < cols / kQK_K; ++b) {
    BlockQ8_K& block = blocks[b];
    int32_t unused;
    block.d = quantize_block_q8(x + b * kQK_K, kQK_K, block.qs, &unused);
    for (int g = 0; g < kQK_K / 16; ++g) {
      int32_t s = 0;
      for (int i = 0; i < 16; ++i) s += block.qs[g * 16 + i];
      block.bsums[g] = int16_t(s);
    }
  }
}

void prepare_bf16(const float* x, void* act_row, int64_t cols) {
  auto* out = static_cast<uint16_t*>(act_row);
  for (int64_t i = 0; i < cols; ++i) out[i] = f32_to_bf16(x[i]);
}

// ---- float formats: x in place ----

float dot_f32(const void* w, const void* a, int64_t cols) {
  const auto* wr = static_cast<const float*>(w);
  const auto* x = static_cast<const float*>(a);
  float sum = 0.0f;
  for (int64_t i = 0; i < cols; ++i) sum += wr[i] * x[i];
  return sum;
}

float dot_f16(const void* w, const void* a, int64_t cols) {
  const auto* wr = static_cast<const uint16_t*>(w);
  const auto* x = static_cast<const float*>(a);
  float sum = 0.0f;
  for (int64_t i = 0; i < cols; ++i) sum += f16_to_f32(wr[i]) * x[i];
  return sum;
}

float dot_bf16(const void* w, const void* a, int64_t cols) {
  const auto* wr = static_cast<const uint16_t*>(w);
  const auto* x = static_cast<const float*>(a);
  float sum = 0.0f;
  for (int64_t i = 0; i < cols; ++i) sum += bf16_to_f32(wr[i]) * x[i];
  return sum;
}

// ---- 32-element formats against ActBlockQ8 ----

float dot_q8_0(const void* w, const void* a, int64_t cols) {
  const auto* wb = static_cast<const BlockQ8_0*>(w);
  const auto* xb = static_cast<const ActBlockQ8*>(a);
  float sum = 0.0f;
  for (int64_t b = 0; b < cols / 32; ++b) {
    int32_t dot = 0;
    for (int i = 0; i < 32; ++i) dot += wb[b].qs[i] * xb[b].qs[i];
    sum += f16_to_f32(wb[b].d) * xb[b].d * float(dot);
  }
  return sum;
}

float dot_q4_0(const void* w, const void* a, int64_t cols) {
  const auto* wb = static_cast<const BlockQ4_0*>(w);
  const auto* xb = static_cast<const ActBlockQ8*>(a);
  float sum = 0.0f;
  for (int64_t b = 0; b < cols / 32; ++b) {
    int32_t dot = 0;
    for (int i = 0; i < 16; ++i)
      dot += (wb[b].qs[i] & 15) * xb[b].qs[i] + (wb[b].qs[i] >> 4) * xb[b].qs[i + 16];
    dot -= 8 * xb[b].sum;  // the -8 offset of every weight
    sum += f16_to_f32(wb[b].d) * xb[b].d * float(dot);
  }
  return sum;
}

// Σ q x of the 5-bit quants of a Q5_0 / Q5_1 block (q in 0..31, offset not applied).
inline int32_t dot_5bit(const uint8_t* qs, const uint8_t* qh_bytes, const int8_t* x) {
  uint32_t qh;
  std::memcpy(&qh, qh_bytes, sizeof(qh));
  int32_t dot = 0;
  for (int i = 0; i < 16; ++i) {
    const int lo = (qs[i] & 15) | int((qh >> i) & 1) << 4;
    const int hi = (qs[i] >> 4) | int((qh >> (i + 16)) & 1) << 4;
    dot += lo * x[i] + hi * x[i + 16];
  }
  return dot;
}

float dot_q5_0(const void* w, const void* a, int64_t cols) {
  const auto* wb = static_cast<const BlockQ5_0*>(w);
  const auto* xb = static_cast<const ActBlockQ8*>(a);
  float sum = 0.0f;
  for (int64_t b = 0; b < cols / 32; ++b) {
    const int32_t dot = dot_5bit(wb[b].qs, wb[b].qh, xb[b].qs) - 16 * xb[b].sum;
    sum += f16_to_f32(wb[b].d) * xb[b].d * float(dot);
  }
  return sum;
}

float dot_q5_1(const void* w, const void* a, int64_t cols) {
  const auto* wb = static_cast<const BlockQ5_1*>(w);
  const auto* xb = static_cast<const ActBlockQ8*>(a);
  float sum = 0.0f;
  for (int64_t b = 0; b < cols / 32; ++b) {
    const int32_t dot = dot_5bit(wb[b].qs, wb[b].qh, xb[b].qs);
    sum += xb[b].d * (f16_to_f32(wb[b].d) * float(dot) + f16_to_f32(wb[b].m) * float(xb[b].sum));
  }
  return sum;
}

// ---- k-quants against BlockQ8_K ----

float dot_q2_k(const void* w, const void* a, int64_t cols) {
  const auto* wb = static_cast<const BlockQ2_K*>(w);
  const auto* xb = static_cast<const BlockQ8_K*>(a);
  float sum = 0.0f;
  for (int64_t b = 0; b < cols / kQK_K; ++b) {
    const BlockQ2_K& block = wb[b];
    // Sub-block k (elements 16k..16k+15) lives in qs[32*(k/8) + 16*(k%2) ..] at bit 2*((k/2)%4).
    int32_t dot = 0, mins = 0;
    for (int k = 0; k < 16; ++k) {
      const uint8_t* q = block.qs + 32 * (k / 8) + 16 * (k % 2);
      const int shift = 2 * ((k / 2) % 4);
      const int8_t* x = xb[b].qs + 16 * k;
      int32_t s = 0;
      for (int i = 0; i < 16; ++i) s += ((q[i] >> shift) & 3) * x[i];
      dot += (block.scales[k] & 15) * s;
      mins += (block.scales[k] >> 4) * xb[b].bsums[k];
    }
    sum += xb[b].d * (f16_to_f32(block.d) * float(dot) - f16_to_f32(block.dmin) * float(mins));
  }
  return sum;
}

float dot_q3_k(const void* w, const void* a, int64_t cols) {
  const auto* wb = static_cast<const BlockQ3_K*>(w);
  const auto* xb = static_cast<const BlockQ8_K*>(a);
  float sum = 0.0f;
  for (int64_t b = 0; b < cols / kQK_K; ++b) {
    const BlockQ3_K& block = wb[b];
    int8_t scales[16];
    unpack_q3_k_scales(block.scales, scales);
    // Sub-block k as in Q2_K; its high bits are bit (k/2) of hmask[16*(k%2) ..].
    int32_t dot = 0;
    for (int k = 0; k < 16; ++k) {
      const uint8_t* q = block.qs + 32 * (k / 8) + 16 * (k % 2);
      const uint8_t* h = block.hmask + 16 * (k % 2);
      const int shift = 2 * ((k / 2) % 4);
      const int hbit = k / 2;
      const int8_t* x = xb[b].qs + 16 * k;
      int32_t s = 0;
      for (int i = 0; i < 16; ++i) {
        const int q3 = ((q[i] >> shift) & 3) - (((h[i] >> hbit) & 1) ? 0 : 4);
        s += q3 * x[i];
      }
      dot += scales[k] * s;
    }
    sum += xb[b].d * f16_to_f32(block.d) * float(dot);
  }
  return sum;
}

// Q4_K and Q5_K: 64 elements per 32 bytes of qs, the low nibbles sub-block 2c, the high ones
// 2c + 1; Q5_K's fifth bit of sub-block j is bit j of qh[i].
template <bool kFifthBit, class Block>
float dot_q4_q5_k(const void* w, const void* a, int64_t cols) {
  const auto* wb = static_cast<const Block*>(w);
  const auto* xb = static_cast<const BlockQ8_K*>(a);
  float sum = 0.0f;
  for (int64_t b = 0; b < cols / kQK_K; ++b) {
    const Block& block = wb[b];
    KScales s = unpack_k_scales(block.scales);
    int32_t dot = 0, mins = 0;
    for (int c = 0; c < 4; ++c) {
      const uint8_t* q = block.qs + 32 * c;
      const int8_t* x = xb[b].qs + 64 * c;
      int32_t lo = 0, hi = 0;
      for (int i = 0; i < 32; ++i) {
        int q_lo = q[i] & 15, q_hi = q[i] >> 4;
        if constexpr (kFifthBit) {
          q_lo |= ((block.qh[i] >> (2 * c)) & 1) << 4;
          q_hi |= ((block.qh[i] >> (2 * c + 1)) & 1) << 4;
        }
        lo += q_lo * x[i];
        hi += q_hi * x[i + 32];
      }
      dot += s.scale[2 * c] * lo + s.scale[2 * c + 1] * hi;
    }
    for (int j = 0; j < 8; ++j) mins += s.min[j] * (xb[b].bsums[2 * j] + xb[b].bsums[2 * j + 1]);
    sum += xb[b].d * (f16_to_f32(block.d) * float(dot) - f16_to_f32(block.dmin) * float(mins));
  }
  return sum;
}

float dot_q6_k(const void* w, const void* a, int64_t cols) {
  const auto* wb = static_cast<const BlockQ6_K*>(w);
  const auto* xb = static_cast<const BlockQ8_K*>(a);
  float sum = 0.0f;
  for (int64_t b = 0; b < cols / kQK_K; ++b) {
    const BlockQ6_K& block = wb[b];
    // Per half of 128: element 32*p + i (p = 0..3) has its low 4 bits in ql[32*(p%2) + i]
    // (low nibble for p < 2, high for p >= 2) and its high 2 bits at bit 2p of qh[i].
    int32_t dot = 0, offsets = 0;
    for (int half = 0; half < 2; ++half) {
      const uint8_t* ql = block.ql + 64 * half;
      const uint8_t* qh = block.qh + 32 * half;
      for (int p = 0; p < 4; ++p) {
        const int8_t* x = xb[b].qs + 128 * half + 32 * p;
        for (int g = 0; g < 2; ++g) {
          int32_t s = 0;
          for (int i = 16 * g; i < 16 * g + 16; ++i) {
            const int low = p < 2 ? ql[32 * p + i] & 15 : ql[32 * (p - 2) + i] >> 4;
            s += (low | ((qh[i] >> (2 * p)) & 3) << 4) * x[i];
          }
          dot += block.scales[8 * half + 2 * p + g] * s;
        }
      }
    }
    // The -32 offset of every weight, through the activation sums of each sub-block.
    for (int k = 0; k < 16; ++k) offsets += block.scales[k] * xb[b].bsums[k];
    sum += xb[b].d * f16_to_f32(block.d) * float(dot - 32 * offsets);
  }
  return sum;
}

// The grid i-quants against BlockQ8_K: per group of 16 or 32, the integer sum of the signed
// weights (core/iq_blocks.h) and the quants, times the group's scale and the activations' d.
template <class Block>
float dot_iq_grid_q8(const void* w, const void* a, int64_t cols) {
  constexpr int kGroup = kIqGroup<Block>;
  const auto* wb = static_cast<const Block*>(w);
  const auto* xb = static_cast<const BlockQ8_K*>(a);
  IqWeights weights;
  float sum = 0.0f;
  for (int64_t b = 0; b < cols / kQK_K; ++b) {
    iq_weights(wb[b], weights);
    for (int g = 0; g < kQK_K / kGroup; ++g) {
      int32_t dot = 0;
      for (int i = kGroup * g; i < kGroup * (g + 1); ++i) dot += weights.w[i] * xb[b].qs[i];
      sum += weights.scale[g] * xb[b].d * float(dot);
    }
  }
  return sum;
}

}  // namespace

void fill_portable_kernels(KernelTable& table) {
  // Float formats serve both precisions; the 8-bit kernels only Int8.
  auto set = [&](DType type, ActKind act, RowDotFn dot) {
    table.formats[size_t(ActPrecision::Int8)][size_t(type)] = {act, dot};
    if (act == ActKind::F32) table.formats[size_t(ActPrecision::Int16)][size_t(type)] = {act, dot};
  };
  set(DType::F32, ActKind::F32, dot_f32);
  set(DType::F16, ActKind::F32, dot_f16);
  set(DType::BF16, ActKind::F32, dot_bf16);
  set(DType::Q8_0, ActKind::Q8, dot_q8_0);
  set(DType::Q4_0, ActKind::Q8, dot_q4_0);
  set(DType::Q5_0, ActKind::Q8, dot_q5_0);
  set(DType::Q5_1, ActKind::Q8, dot_q5_1);
  set(DType::Q2_K, ActKind::Q8_K, dot_q2_k);
  set(DType::Q3_K, ActKind::Q8_K, dot_q3_k);
  set(DType::Q4_K, ActKind::Q8_K, dot_q4_q5_k<false, BlockQ4_K>);
  set(DType::Q5_K, ActKind::Q8_K, dot_q4_q5_k<true, BlockQ5_K>);
  set(DType::Q6_K, ActKind::Q8_K, dot_q6_k);
  for (DType type : kIqGridFormats)
    visit_iq_grid(type, [&](auto f) { set(type, ActKind::Q8_K, dot_iq_grid_q8<typename decltype(f)::Block>); });
  table.prepare[size_t(ActKind::BF16)] = prepare_bf16;
  table.prepare[size_t(ActKind::Q8)] = prepare_q8;
  table.prepare[size_t(ActKind::Q8_K)] = prepare_q8_k;
}

}  // namespace tandem::cpu
