#pragma once
// Conversion between a plain format's rows and tandem's 16-row interleaved formats
// (DType::*_R16, layouts in core/blocks.h). Exact both ways: take_apart(interleave(rows))
// gives back the same bytes. `tandem repack` interleaves; the CPU matmul takes a group apart
// where it has no interleaved kernel (other instruction sets, the many-token path), and the
// tests take groups apart to compare against the plain format's reference.
#include <cstdint>

#include "core/dtype.h"

namespace tandem {

// The interleaved format of `base`, if tandem has one (Q8_0, Q5_0, Q4_K).
bool has_interleaved_format(DType base);
DType interleaved_format(DType base);

// 16 consecutive rows of `cols` elements in the base format (16 * row_bytes(base, cols) bytes)
// into one group of the interleaved format `type` (16 * row_bytes(type, cols) bytes: the same
// for Q8_0_R16, 148 instead of 144 bytes per row and super-block for Q4_K_R16, whose 6-bit
// scales and mins are stored as bytes), and back.
void interleave_rows(DType type, const void* rows, int64_t cols, void* group);
void take_apart_rows(DType type, const void* group, int64_t cols, void* rows);

// A whole interleaved tensor of `rows` rows (a multiple of 16) taken apart and dequantized to
// f32: the reference the interleaved kernels are tested against.
void dequantize_interleaved(DType type, const void* data, int64_t rows, int64_t cols, float* out);

}  // namespace tandem
