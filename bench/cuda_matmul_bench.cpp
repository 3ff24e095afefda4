// The GPU's decode products on the shapes of a DeepSeek-V2-Lite layer and a DeepSeek-V3 layer in
// Q4_K_M (the formats gen-model and llama.cpp's converter give them), each as a share of the
// card's copy bandwidth measured first (a device-to-device copy, bytes read plus written: the
// figure the cost model keeps, cuda::measure_gpu_rates). Microseconds a launch are the best of 50
// (CUDA events); GB/s are weight bytes streamed.
//
// - Single matrices (attention, router, shared experts, dense FFN, head) run matmul_rows with
//   F32 activations, as a decode step does, at one, two and four rows a warp: it says which
//   rows-per-warp the kernels should take for which shape (results do not depend on the choice).
//   With --tokens above 1 the kernel keeps its own rows per warp: the three columns then time
//   the same launch.
// - The routed experts run as a decode step's MoE op runs them: one token's top-k experts read
//   straight from the routing ids, 8-bit activations (dp4a, quant/block_dot_q8.h), gate and up
//   with the activation in one launch, down in another (expert_gate_up_q8, expert_down_q8). The
//   routed experts alone: a decode step's two launches also carry the layer's shared experts
//   where their formats match the routed ones' (op_launches.cpp), measured here as single
//   matrices. Issue 27's bar: each at 60% of the copy bandwidth or more.
//
// Each launch reads weights that are not in L2: the shapes rotate through copies of their
// matrices. The values are random (a few distinct rows repeated): the kernels' speed does not
// depend on them.
//
// Usage: cuda_matmul_bench [--shapes lite|v3|all] [--tokens N] [--json FILE]   (needs a GPU;
// built with the CUDA backend by tools/gpu-bundle.sh)
#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/cuda_devices.h"
#include "backends/cuda/kernels.h"
#include "core/dtype.h"
#include "core/error.h"
#include "quant/block_dot_q8.h"
#include "quant/quant.h"

namespace {

using namespace tandem;

// n_mats matrices of [rows, cols], each with its own input and output (MLA's per-head
// projections), or one.
struct Shape {
  const char* what;
  DType type;
  int64_t rows, cols, n_mats = 1;
};

// A token's top_k experts of [ffn, dim] gate and up and [dim, ffn] down.
struct ExpertShape {
  const char* what;
  DType gate_up, down;
  int64_t dim, ffn, top_k;
};

// One product's best launch, for --json.
struct Measured {
  std::string model, what, type;
  double mb, us, gb_per_s, of_copy;
  bool expert;
};

struct ModelShapes {
  const char* name;
  std::vector<Shape> matrices;
  std::vector<ExpertShape> experts;
};

// DeepSeek-V2-Lite (tandem gen-model --preset lite --format Q4_K_M): hidden 2048, 16 heads, MLA
// with kv_lora 512, 64 experts of 1408 (6 used), 2 shared, vocabulary 102400. The experts' down
// rows (1408) are not whole 256-blocks: Q8_0 as converters write them, or Q5_0.
ModelShapes lite_shapes() {
  return {.name = "DeepSeek-V2-Lite",
          .matrices = {{"router", DType::F32, 64, 2048},
                       {"kv_a", DType::Q4_K, 576, 2048},
                       {"q", DType::Q4_K, 3072, 2048},
                       {"k_b (16 heads)", DType::Q5_0, 512, 128, 16},
                       {"v_b (16 heads)", DType::Q4_K, 128, 512, 16},
                       {"attn_output", DType::Q4_K, 2048, 2048},
                       {"shared gate", DType::Q4_K, 2816, 2048},
                       {"shared down", DType::Q6_K, 2048, 2816},
                       {"dense up", DType::Q4_K, 10944, 2048},
                       {"output head", DType::Q6_K, 102400, 2048}},
          .experts = {{"6 experts, down Q8_0", DType::Q4_K, DType::Q8_0, 2048, 1408, 6},
                      {"6 experts, down Q5_0", DType::Q4_K, DType::Q5_0, 2048, 1408, 6}}};
}

// DeepSeek-V3/R1 (gen-model --preset deepseek-v3): hidden 7168, 128 heads, q LoRA 1536, kv_lora
// 512, 256 experts of 2048 (8 used), 1 shared, dense layers of 18432, vocabulary 129280. Q4_K_M
// gives some layers' ffn_down Q6_K.
ModelShapes v3_shapes() {
  return {.name = "DeepSeek-V3",
          .matrices = {{"router", DType::F32, 256, 7168},
                       {"q_a", DType::Q4_K, 1536, 7168},
                       {"kv_a", DType::Q4_K, 576, 7168},
                       {"q_b", DType::Q4_K, 24576, 1536},
                       {"k_b (128 heads)", DType::Q5_0, 512, 128, 128},
                       {"v_b (128 heads)", DType::Q4_K, 128, 512, 128},
                       {"attn_output", DType::Q4_K, 7168, 16384},
                       {"shared gate", DType::Q4_K, 2048, 7168},
                       {"shared down", DType::Q6_K, 7168, 2048},
                       {"dense up", DType::Q4_K, 18432, 7168},
                       {"output head", DType::Q6_K, 129280, 7168}},
          .experts = {{"8 experts, down Q4_K", DType::Q4_K, DType::Q4_K, 7168, 2048, 8},
                      {"8 experts, down Q6_K", DType::Q4_K, DType::Q6_K, 7168, 2048, 8}}};
}

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

// Copies of a weight region enough to pass any L2 (50-60 MB on current parts): launches rotate
// through them.
int copies_past_l2(uint64_t bytes) {
  return int(std::max<uint64_t>(2, (uint64_t(256) << 20) / bytes));
}

// `n_matrices` [rows, cols] matrices of `type` in device memory: 64 random rows quantized once
// and repeated (quantizing a V3 head row by row would take longer than the bench).
std::shared_ptr<DeviceBuffer> random_matrices(cuda::CudaBackend& gpu, std::mt19937& rng, DType type,
                                              int64_t rows, int64_t cols, int64_t n_matrices) {
  const uint64_t row = row_bytes(type, uint64_t(cols));
  const uint64_t matrix = row * uint64_t(rows);
  constexpr int64_t kDistinctRows = 64;
  std::normal_distribution<float> normal;
  std::vector<uint8_t> distinct(row * kDistinctRows);
  std::vector<float> values(static_cast<size_t>(cols));
  for (int64_t r = 0; r < kDistinctRows; ++r) {
    for (float& v : values) v = normal(rng);
    quantize_row(type, values.data(), distinct.data() + r * row, cols);
  }
  std::vector<uint8_t> host(matrix);
  for (int64_t r = 0; r < rows; ++r)
    std::memcpy(host.data() + r * row, distinct.data() + (r % kDistinctRows) * row, row);
  auto weights = gpu.allocate(matrix * uint64_t(n_matrices), "bench weights");
  for (int64_t m = 0; m < n_matrices; ++m)
    gpu.copy_from_host(static_cast<uint8_t*>(weights->data()) + m * matrix, host.data(), matrix);
  return weights;
}

std::shared_ptr<DeviceBuffer> random_floats(cuda::CudaBackend& gpu, std::mt19937& rng, int64_t n) {
  std::normal_distribution<float> normal;
  std::vector<float> x(static_cast<size_t>(n));
  for (float& v : x) v = normal(rng);
  auto buffer = gpu.allocate(x.size() * sizeof(float), "bench activations");
  gpu.copy_from_host(buffer->data(), x.data(), x.size() * sizeof(float));
  return buffer;
}

std::string share(double bytes_per_s, double copy_bytes_per_s) {
  return fmt::format("{:.0f}%", 100.0 * bytes_per_s / copy_bytes_per_s);
}

void bench_matrices(cuda::CudaBackend& gpu, cudaStream_t stream, std::mt19937& rng,
                    const ModelShapes& model, int n_tokens, double copy_bytes_per_s,
                    std::vector<Measured>& measured) {
  fmt::print("  {:<22} {:>6} {:>8}  {:>12} {:>12} {:>12}  {:>7}\n", "matrix (F32 activations)",
             "type", "MB", "1 row/warp", "2 rows", "4 rows", "of copy");
  for (const Shape& shape : model.matrices) {
    const uint64_t row = row_bytes(shape.type, uint64_t(shape.cols));
    const uint64_t matrix = row * uint64_t(shape.rows);
    const uint64_t bytes = matrix * uint64_t(shape.n_mats);
    const int copies = copies_past_l2(bytes);
    auto weights =
        random_matrices(gpu, rng, shape.type, shape.rows, shape.cols, shape.n_mats * copies);
    auto input = random_floats(gpu, rng, shape.cols * shape.n_mats * n_tokens);
    auto output =
        gpu.allocate(size_t(shape.rows * shape.n_mats * n_tokens) * sizeof(float), "bench output");
    std::string line = fmt::format("  {:<22} {:>6} {:>8.2f} ", shape.what, dtype_name(shape.type),
                                   double(bytes) / 1e6);
    double best_rate = 0, best_time = 0;
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
      const double rate = double(bytes) / (us * 1e-6);
      if (rate > best_rate) best_rate = rate, best_time = us;
      line += fmt::format(" {:>6.1f} {:>5.0f}", us, rate / 1e9);
    }
    fmt::print("{}  {:>7}\n", line, share(best_rate, copy_bytes_per_s));
    measured.push_back({model.name, shape.what, std::string(dtype_name(shape.type)),
                        double(bytes) / 1e6, best_time, best_rate / 1e9,
                        best_rate / copy_bytes_per_s, false});
  }
}

// One token's experts as the MoE op's decode path runs them (op_launches.cpp): unsorted slots
// straight from the routing ids, the input and the activations quantized to ActQ8 blocks.
void bench_experts(cuda::CudaBackend& gpu, cudaStream_t stream, std::mt19937& rng,
                   const ModelShapes& model, double copy_bytes_per_s,
                   std::vector<Measured>& measured) {
  fmt::print("  {:<22} {:>6} {:>8}  {:>12}  {:>7}   (one token, 8-bit activations)\n", "experts",
             "type", "MB", "us    GB/s", "of copy");
  for (const ExpertShape& e : model.experts) {
    if (!cuda::matmul_supports_q8(e.gate_up) || !cuda::matmul_supports_q8(e.down))
      fail("{}: no 8-bit step for its formats", e.what);
    const uint64_t gate_row = row_bytes(e.gate_up, uint64_t(e.dim));
    const uint64_t gate_matrix = gate_row * uint64_t(e.ffn);
    const uint64_t down_row = row_bytes(e.down, uint64_t(e.ffn));
    const uint64_t down_matrix = down_row * uint64_t(e.dim);
    const uint64_t gate_up_bytes = 2 * gate_matrix * uint64_t(e.top_k);
    const uint64_t down_bytes = down_matrix * uint64_t(e.top_k);
    const int copies = copies_past_l2(std::min(gate_up_bytes, down_bytes));
    // Each copy holds top_k experts; the routing picks experts 0 .. top_k - 1 of a copy.
    auto gate = random_matrices(gpu, rng, e.gate_up, e.ffn, e.dim, e.top_k * copies);
    auto up = random_matrices(gpu, rng, e.gate_up, e.ffn, e.dim, e.top_k * copies);
    auto down = random_matrices(gpu, rng, e.down, e.dim, e.ffn, e.top_k * copies);
    std::vector<int32_t> ids(size_t(e.top_k));
    for (int64_t k = 0; k < e.top_k; ++k) ids[size_t(k)] = int32_t(k);
    auto expert_ids = gpu.allocate(ids.size() * sizeof(int32_t), "bench routing");
    gpu.copy_from_host(expert_ids->data(), ids.data(), ids.size() * sizeof(int32_t));
    auto input = random_floats(gpu, rng, e.dim);
    auto act_in = random_floats(gpu, rng, e.top_k * e.ffn);
    auto input_q8 = gpu.allocate(size_t(e.dim / 32) * sizeof(blocks::ActQ8), "bench input");
    auto act_q8 = gpu.allocate(size_t(e.top_k * e.ffn / 32) * sizeof(blocks::ActQ8), "bench act");
    cuda::quantize_q8(input->floats(), e.dim, static_cast<blocks::ActQ8*>(input_q8->data()),
                      stream);
    cuda::quantize_q8(act_in->floats(), e.top_k * e.ffn,
                      static_cast<blocks::ActQ8*>(act_q8->data()), stream);
    auto act = gpu.allocate(size_t(e.top_k * e.ffn) * sizeof(float), "bench act");
    auto slots = gpu.allocate(size_t(e.top_k * e.dim) * sizeof(float), "bench slots");
    const cuda::ExpertSlots s{.max_slots = e.top_k,
                              .top_k = e.top_k,
                              .expert_ids = static_cast<const int32_t*>(expert_ids->data())};
    int next = 0;
    const double gate_up_us = best_us(stream, 50, [&] {
      const uint64_t offset = uint64_t(next) * gate_matrix * uint64_t(e.top_k);
      cuda::expert_gate_up_q8(e.gate_up, static_cast<uint8_t*>(gate->data()) + offset,
                              static_cast<uint8_t*>(up->data()) + offset, e.ffn, e.dim, gate_row,
                              gate_matrix, static_cast<const blocks::ActQ8*>(input_q8->data()), s,
                              act->floats(), {}, stream);
      next = (next + 1) % copies;
    });
    next = 0;
    const double down_us = best_us(stream, 50, [&] {
      const uint64_t offset = uint64_t(next) * down_matrix * uint64_t(e.top_k);
      cuda::expert_down_q8(e.down, static_cast<uint8_t*>(down->data()) + offset, e.dim, e.ffn,
                           down_row, down_matrix, static_cast<const blocks::ActQ8*>(act_q8->data()),
                           s, slots->floats(), {}, stream);
      next = (next + 1) % copies;
    });
    for (const auto& [what, type, bytes, us] :
         {std::tuple{"gate+up", e.gate_up, gate_up_bytes, gate_up_us},
          std::tuple{"down", e.down, down_bytes, down_us}}) {
      const double rate = double(bytes) / (us * 1e-6);
      const std::string name = fmt::format("{}: {}", e.what, what);
      fmt::print("  {:<22} {:>6} {:>8.2f}  {:>6.1f} {:>5.0f}  {:>7}\n", name, dtype_name(type),
                 double(bytes) / 1e6, us, rate / 1e9, share(rate, copy_bytes_per_s));
      measured.push_back({model.name, name, std::string(dtype_name(type)), double(bytes) / 1e6, us,
                          rate / 1e9, rate / copy_bytes_per_s, true});
    }
  }
}

void write_json(const std::string& path, const cuda::GpuRates& rates, int n_tokens,
                const std::vector<Measured>& measured) {
  std::ofstream file(path);
  if (!file) fail("cannot write {}", path);
  file << fmt::format(
      "{{\"copy_gb_per_s\": {:.1f}, \"decode_kernel_gb_per_s\": {:.1f}, "
      "\"tokens\": {}, \"products\": [",
      rates.copy_bytes_per_s / 1e9, rates.decode_kernel_bytes_per_s / 1e9, n_tokens);
  for (size_t i = 0; i < measured.size(); ++i) {
    const Measured& m = measured[i];
    file << fmt::format(
        "{}\n  {{\"model\": \"{}\", \"product\": \"{}\", \"type\": \"{}\", \"expert\": {}, "
        "\"mb\": {:.3f}, \"us\": {:.2f}, \"gb_per_s\": {:.1f}, \"of_copy\": {:.3f}}}",
        i ? "," : "", m.model, m.what, m.type, m.expert, m.mb, m.us, m.gb_per_s, m.of_copy);
  }
  file << "\n]}\n";
}

int run(const std::vector<ModelShapes>& models, int n_tokens, const std::string& json) {
  const cuda::GpuRates rates = cuda::measure_gpu_rates(0);
  fmt::print(
      "cuda:0: copy {:.0f} GB/s (device to device, read + written); the cost model's decode "
      "kernel rate {:.0f} GB/s\n",
      rates.copy_bytes_per_s / 1e9, rates.decode_kernel_bytes_per_s / 1e9);
  cuda::CudaBackend gpu(0);
  cudaStream_t stream;
  CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  std::mt19937 rng(11);
  std::vector<Measured> measured;
  for (const ModelShapes& model : models) {
    fmt::print("\n{} shapes, Q4_K_M, {} token{}: us a launch, GB/s of weights\n", model.name,
               n_tokens, n_tokens == 1 ? "" : "s");
    bench_matrices(gpu, stream, rng, model, n_tokens, rates.copy_bytes_per_s, measured);
    if (n_tokens == 1) bench_experts(gpu, stream, rng, model, rates.copy_bytes_per_s, measured);
  }
  cudaStreamDestroy(stream);
  if (!json.empty()) write_json(json, rates, n_tokens, measured);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  int n_tokens = 1;
  std::string shapes = "all", json;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--tokens") == 0 && i + 1 < argc) {
      n_tokens = std::atoi(argv[++i]);
    } else if (std::strcmp(argv[i], "--shapes") == 0 && i + 1 < argc) {
      shapes = argv[++i];
    } else if (std::strcmp(argv[i], "--json") == 0 && i + 1 < argc) {
      json = argv[++i];
    } else {
      const bool help = std::strcmp(argv[i], "--help") == 0 || std::strcmp(argv[i], "-h") == 0;
      std::fprintf(help ? stdout : stderr,
                   "usage: %s [--shapes lite|v3|all] [--tokens N] [--json FILE]\n"
                   "  --shapes  the layers whose products are measured (default all)\n"
                   "  --tokens  1 to 8 tokens a launch for the single matrices (default 1; the\n"
                   "            experts are measured at one token only, as decode runs them)\n"
                   "  --json    also write every product's best launch to FILE\n",
                   argv[0]);
      return help ? 0 : 2;
    }
  }
  std::vector<ModelShapes> models;
  if (shapes == "lite" || shapes == "all") models.push_back(lite_shapes());
  if (shapes == "v3" || shapes == "all") models.push_back(v3_shapes());
  if (models.empty()) {
    std::fprintf(stderr, "cuda_matmul_bench: --shapes takes lite, v3 or all, not '%s'\n",
                 shapes.c_str());
    return 2;
  }
  try {
    return run(models, std::clamp(n_tokens, 1, 8), json);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cuda_matmul_bench: %s\n", e.what());
    return 1;
  }
}
