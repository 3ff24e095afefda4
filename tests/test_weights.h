#pragma once
// Random activations and weights for the kernel tests of every backend (CPU, CUDA) and of the
// block functions: one generator, so that a format's test data means the same everywhere.
#include <cstdint>
#include <random>
#include <vector>

#include "core/blocks.h"
#include "core/dtype.h"
#include "core/half.h"
#include "core/iq_blocks.h"
#include "quant/quant.h"

namespace tandem::test {

inline std::vector<float> gaussian(size_t n, uint32_t seed, float sigma = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, sigma);
  std::vector<float> v(n);
  for (float& f : v) f = normal(rng);
  return v;
}

// The formats quantize_row cannot write, and the grid i-quants (their writer uses few of their
// grid points; random blocks reach them all): their tests use random blocks.
inline bool written_raw(DType type) {
  return (can_dequantize(type) && !can_quantize(type)) || is_iq_grid(type);
}

// `rows` x `cols` weights of `type`. Formats quantize_row writes are quantized from Gaussian
// values of deviation `sigma`; the others get random bytes (every quant pattern is valid) with
// sane f16 scales, and `sigma` does not apply: kernels must agree with dequantize_row, not with
// any quantizer.
inline std::vector<uint8_t> make_weights(DType type, int64_t rows, int64_t cols, uint32_t seed,
                                         float sigma = 1.0f) {
  const size_t stride = row_bytes(type, uint64_t(cols));
  std::vector<uint8_t> bytes(size_t(rows) * stride);
  if (!written_raw(type)) {
    const std::vector<float> values = gaussian(size_t(rows * cols), seed, sigma);
    for (int64_t r = 0; r < rows; ++r)
      quantize_row(type, values.data() + r * cols, bytes.data() + size_t(r) * stride, cols);
    return bytes;
  }
  std::mt19937 rng(seed);
  for (uint8_t& b : bytes) b = uint8_t(rng());
  std::uniform_real_distribution<float> scale(0.5f, 1.5f);
  auto put = [](uint16_t* field, float value) { *field = f32_to_f16(value); };
  const int64_t n_blocks = rows * cols / int64_t(dtype_info(type).block_elems);
  for (int64_t b = 0; b < n_blocks; ++b) {
    if (type == DType::Q2_K) {
      auto* block = reinterpret_cast<BlockQ2_K*>(bytes.data()) + b;
      put(&block->d, 0.02f * scale(rng));
      put(&block->dmin, 0.02f * scale(rng));
    } else if (type == DType::Q3_K) {
      put(&reinterpret_cast<BlockQ3_K*>(bytes.data())[b].d, 0.01f * scale(rng));
    } else if (type == DType::Q5_1) {
      auto* block = reinterpret_cast<BlockQ5_1*>(bytes.data()) + b;
      put(&block->d, 0.05f * scale(rng));
      put(&block->m, -0.8f * scale(rng));
    } else if (type == DType::Q4_1) {
      auto* block = reinterpret_cast<BlockQ4_1*>(bytes.data()) + b;
      put(&block->d, 0.1f * scale(rng));
      put(&block->m, -0.8f * scale(rng));
    } else if (type == DType::IQ4_NL) {
      put(&reinterpret_cast<BlockIQ4_NL*>(bytes.data())[b].d, 0.01f * scale(rng));
    } else if (type == DType::IQ4_XS) {
      put(&reinterpret_cast<BlockIQ4_XS*>(bytes.data())[b].d, 0.001f * scale(rng));
    } else if (type == DType::TQ1_0) {
      put(&reinterpret_cast<BlockTQ1_0*>(bytes.data())[b].d, 0.5f * scale(rng));
    } else if (type == DType::TQ2_0) {
      put(&reinterpret_cast<BlockTQ2_0*>(bytes.data())[b].d, 0.5f * scale(rng));
    } else if (type == DType::IQ1_M) {  // d: the top nibbles of the four scale words
      auto* block = reinterpret_cast<BlockIQ1_M*>(bytes.data()) + b;
      const uint16_t d = f32_to_f16(0.05f * scale(rng));
      for (int w = 0; w < 4; ++w) {
        block->scales[2 * w + 1] = uint8_t((block->scales[2 * w + 1] & 0x0F) | ((d >> (4 * w)) & 0xF) << 4);
      }
    } else if (is_iq_grid(type)) {
      // The other grid formats start with their f16 d.
      put(reinterpret_cast<uint16_t*>(bytes.data() + size_t(b) * dtype_info(type).block_bytes),
          0.02f * scale(rng));
    } else {  // MXFP4: block scales 2^-5 .. 2^2
      reinterpret_cast<BlockMXFP4*>(bytes.data())[b].e = uint8_t(122 + rng() % 8);
    }
  }
  return bytes;
}

}  // namespace tandem::test
