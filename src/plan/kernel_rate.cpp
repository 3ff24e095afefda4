#include "plan/kernel_rate.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <random>
#include <vector>

#include "backends/cpu/matmul.h"
#include "core/aligned_buffer.h"
#include "core/thread_pool.h"
#include "quant/interleave.h"
#include "quant/quant.h"

namespace tandem::plan {

double measure_decode_kernel_bytes_per_s(int32_t threads, uint64_t available_ram_bytes,
                                         bool interleaved) {
  constexpr int64_t kRows = 1408, kCols = 2048;
  constexpr DType kPlain = DType::Q4_K;  // the format of most weights in a Q4_K_M file
  const DType type = interleaved ? interleaved_format(kPlain) : kPlain;
  const size_t row = row_bytes(type, kCols), matrix = row * kRows;
  uint64_t total = uint64_t(256) << 20;
  if (available_ram_bytes > 0) total = std::min(total, available_ram_bytes / 4);
  const size_t n_matrices = std::max<size_t>(8, size_t(total / matrix));

  // One random matrix, quantized, copied into every slot: the kernel's speed does not depend
  // on the values, and quantizing 256 MiB would take longer than the measurement.
  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  std::vector<float> w(static_cast<size_t>(kCols)), x(static_cast<size_t>(kCols)), y(static_cast<size_t>(kRows));
  AlignedBuffer weights(matrix * n_matrices);
  const size_t plain_row = row_bytes(kPlain, kCols);
  std::vector<uint8_t> plain(plain_row * kRows);
  for (int64_t r = 0; r < kRows; ++r) {
    for (float& v : w) v = normal(rng);
    quantize_row(kPlain, w.data(), plain.data() + size_t(r) * plain_row, kCols);
  }
  if (interleaved) {
    for (int64_t g = 0; g < kRows / 16; ++g)
      interleave_rows(type, plain.data() + size_t(g) * 16 * plain_row, kCols,
                      weights.data() + size_t(g) * 16 * row);
  } else {
    std::memcpy(weights.data(), plain.data(), matrix);
  }
  for (size_t m = 1; m < n_matrices; ++m)
    std::memcpy(weights.data() + m * matrix, weights.data(), matrix);
  for (float& v : x) v = normal(rng);

  ThreadPool pool(threads);
  auto pass = [&] {
    for (size_t m = 0; m < n_matrices; ++m)
      cpu::matmul({.weight_type = type,
                   .weights = weights.data() + m * matrix,
                   .rows = kRows,
                   .cols = kCols,
                   .input = x.data(),
                   .n_tokens = 1,
                   .output = y.data(),
                   .precision = cpu::ActPrecision::Int8},  // the FFNs' default (ffn-int8)
                  pool);
  };
  pass();  // pages touched, kernels chosen
  double best = 1e30, spent = 0;
  for (int rep = 0; rep < 20 && (rep < 3 || spent < 1.0); ++rep) {
    const auto start = std::chrono::steady_clock::now();
    pass();
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    best = std::min(best, seconds);
    spent += seconds;
  }
  return double(matrix * n_matrices) / best;
}

}  // namespace tandem::plan
