// The GPU's decode products (matmul_rows; one token, or up to 8 with --tokens, where the kernel
// keeps its own rows per warp) on the shapes of a DeepSeek-V2-Lite layer, each with one, two and
// four rows a warp: microseconds a launch (best of 50, CUDA events)
// and the weight bytes streamed per second, beside the device's copy bandwidth. It says which
// rows-per-warp the kernels should take for which shape; results do not depend on the choice.
//
// Usage: cuda_matmul_bench [--tokens N]      (needs a GPU; built with the CUDA backend)
#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/kernels.h"
#include "core/dtype.h"
#include "core/error.h"
#include "quant/quant.h"

namespace {

using namespace tandem;

struct Shape {
  const char* what;
  DType type;
  int64_t rows, cols, n_mats;
};

// A lite-shaped layer (tandem gen-model --preset lite --format Q4_K_M) and its output head.
const Shape kShapes[] = {
    {"router (F32)", DType::F32, 64, 2048, 1},
    {"kv_a", DType::Q4_K, 576, 2048, 1},
    {"q", DType::Q4_K, 3072, 2048, 1},
    {"attn_output", DType::Q4_K, 2048, 2048, 1},
    {"shared gate", DType::Q4_K, 2816, 2048, 1},
    {"shared down (Q6_K)", DType::Q6_K, 2048, 2816, 1},
    {"6 experts' gate", DType::Q4_K, 1408, 2048, 6},
    {"6 experts' down (Q8_0)", DType::Q8_0, 2048, 1408, 6},
    {"6 experts' down (Q5_0)", DType::Q5_0, 2048, 1408, 6},
    {"6 experts' down (Q6_K)", DType::Q6_K, 2048, 1408, 6},
    {"dense up", DType::Q4_K, 10944, 2048, 1},
    {"output head (Q6_K)", DType::Q6_K, 102400, 2048, 1},
};

#define CHECK(call)                                                            \
  do {                                                                         \
    const cudaError_t e = (call);                                              \
    if (e != cudaSuccess) fail("{} failed: {}", #call, cudaGetErrorString(e)); \
  } while (0)

double best_us(cudaStream_t stream, int repeats, const std::function<void()>& launch) {
  cudaEvent_t start, stop;
  CHECK(cudaEventCreate(&start));
  CHECK(cudaEventCreate(&stop));
  launch();  // warm: first launch loads the module
  CHECK(cudaStreamSynchronize(stream));
  float best = 1e30f;
  for (int i = 0; i < repeats; ++i) {
    CHECK(cudaEventRecord(start, stream));
    launch();
    CHECK(cudaEventRecord(stop, stream));
    CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    CHECK(cudaEventElapsedTime(&ms, start, stop));
    best = std::min(best, ms);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return double(best) * 1e3;
}

int run(int n_tokens) {
  cuda::CudaBackend gpu(0);
  cudaStream_t stream;
  CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  std::mt19937 rng(11);
  std::normal_distribution<float> normal;
  fmt::print(
      "{:<24} {:>6} {:>10} {:>10} {:>10} {:>10}  (us a launch, GB/s of weights; {} token{})\n",
      "shape", "type", "MB", "1 row/warp", "2 rows", "4 rows", n_tokens, n_tokens == 1 ? "" : "s");
  for (const Shape& shape : kShapes) {
    const uint64_t row = row_bytes(shape.type, uint64_t(shape.cols));
    const uint64_t matrix = row * uint64_t(shape.rows);
    const uint64_t bytes = matrix * uint64_t(shape.n_mats);
    // A buffer past the L2 so that each launch reads its weights from memory: the shapes rotate
    // through copies of their matrices.
    const int copies = int(std::max<uint64_t>(1, (uint64_t(256) << 20) / bytes));
    std::vector<uint8_t> host(matrix);
    std::vector<float> values(size_t(shape.cols));
    for (int64_t r = 0; r < shape.rows; ++r) {
      for (float& v : values) v = normal(rng);
      quantize_row(shape.type, values.data(), host.data() + r * row, shape.cols);
    }
    auto weights = gpu.allocate(bytes * uint64_t(copies), "bench weights");
    for (int64_t m = 0; m < shape.n_mats * copies; ++m)
      gpu.copy_from_host(static_cast<uint8_t*>(weights->data()) + m * matrix, host.data(), matrix);
    std::vector<float> x(size_t(shape.cols * shape.n_mats * n_tokens));
    for (float& v : x) v = normal(rng);
    auto input = gpu.allocate(x.size() * sizeof(float), "bench input");
    gpu.copy_from_host(input->data(), x.data(), x.size() * sizeof(float));
    auto output =
        gpu.allocate(size_t(shape.rows * shape.n_mats * n_tokens) * sizeof(float), "bench output");
    std::string line = fmt::format("{:<24} {:>6} {:>10.2f}", shape.what, dtype_name(shape.type),
                                   double(bytes) / 1e6);
    for (int r : {1, 2, 4}) {
      int next = 0;
      const double us = best_us(stream, 50, [&] {
        cuda::matmul_rows(
            {.type = shape.type,
             .weights = static_cast<uint8_t*>(weights->data()) + uint64_t(next) * bytes,
             .rows = shape.rows,
             .cols = shape.cols,
             .row_bytes = row,
             .mat_bytes = matrix,
             .input = input->floats(),
             .input_stride = shape.cols * shape.n_mats,
             .input_mat_stride = shape.cols,
             .output = output->floats(),
             .output_stride = shape.rows * shape.n_mats,
             .output_mat_stride = shape.rows,
             .n_tokens = n_tokens,
             .n_mats = shape.n_mats,
             .rows_per_warp = r},
            stream);
        next = (next + 1) % copies;
      });
      line += fmt::format(" {:>5.1f} {:>4.0f}", us, double(bytes) / us * 1e-3);
    }
    fmt::print("{}\n", line);
  }
  cudaStreamDestroy(stream);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  int n_tokens = 1;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--tokens") == 0 && i + 1 < argc) {
      n_tokens = std::atoi(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: %s [--tokens N]\n", argv[0]);
      return 2;
    }
  }
  try {
    return run(std::clamp(n_tokens, 1, 8));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cuda_matmul_bench: %s\n", e.what());
    return 1;
  }
}
