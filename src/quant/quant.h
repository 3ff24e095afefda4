#pragma once
// Scalar reference implementations of every weight format: exact, portable, and the bar that
// every fast kernel is tested against. Dequantization equals the GGUF definition bit for bit.
//
// `n` counts elements and must be a multiple of the format's block size (dtype_info); the
// functions check that and throw tandem::Error otherwise. One `switch` on the format lives in
// quant.cpp; each format's arithmetic lives in its own file.
#include <cstdint>

#include "core/dtype.h"

namespace tandem {

// Formats dequantize_row accepts: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K,
// Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS, TQ1_0, TQ2_0, MXFP4 (and Q8_K, the activation format).
bool can_dequantize(DType type);
void dequantize_row(DType type, const void* src, float* dst, int64_t n);

// Formats quantize_row writes: F32, F16, BF16, Q4_0, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K, IQ4_NL,
// IQ4_XS, Q4_1, TQ1_0, TQ2_0, MXFP4, Q8_K.
// Deterministic for a given input; chosen for low error at a speed that can write a 10 GB
// model in minutes, not for equality with any other tool's quantizer.
bool can_quantize(DType type);
void quantize_row(DType type, const float* src, void* dst, int64_t n);

}  // namespace tandem
