// CPU matmul at decode shapes (one token): GB/s of weights streamed, per format, activation
// precision (int16, the default, and int8 for quantized formats), shape and thread count, next to
// a STREAM-style triad as the machine's measured memory bandwidth.
//
// Shapes are DeepSeek-V2-Lite's: expert up/gate [1408, 2048], expert down [2048, 1408], output
// head [102400, 2048]. A k-quant row must be a whole number of 256-element super-blocks, so
// k-quants skip the 1408-column shape (GGUF files store those tensors as Q5_0 / Q8_0).
// Small matrices are cycled through copies totalling >= 256 MB so the weights come from DRAM,
// as routed experts do at decode, not from cache.
#include <benchmark/benchmark.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "backends/cpu/cpu_features.h"
#include "backends/cpu/matmul.h"
#include "core/aligned_buffer.h"
#include "core/blocks.h"
#include "core/half.h"
#include "quant/interleave.h"

namespace tandem::cpu {
namespace {

constexpr size_t kMinWorkingSetBytes = size_t(256) << 20;

struct Shape {
  int64_t rows;
  int64_t cols;
  const char* what;
};
constexpr Shape kExpertUp = {1408, 2048, "expert_up"};

// Random bytes with every scale field (and every F16/BF16 element) set to a moderate value, so
// no NaN, infinity or subnormal changes the timing. The values do not matter for speed.
void fill_weights(DType type, uint8_t* bytes, size_t size) {
  uint64_t state = 0x9e3779b97f4a7c15ull;
  for (size_t i = 0; i + 8 <= size; i += 8) {
    state ^= state << 13, state ^= state >> 7, state ^= state << 17;
    std::memcpy(bytes + i, &state, 8);
  }
  const uint16_t one_f16 = f32_to_f16(0.01f);
  auto set_u16 = [&](size_t offset, uint16_t value) { std::memcpy(bytes + offset, &value, 2); };
  auto fix_u16 = [&](size_t offset, uint16_t keep_mask, uint16_t set_bits) {
    uint16_t v;
    std::memcpy(&v, bytes + offset, 2);
    set_u16(offset, uint16_t((v & keep_mask) | set_bits));
  };
  const size_t block = dtype_info(type).block_bytes;
  for (size_t b = 0; b + block <= size; b += block) {
    switch (type) {
      case DType::BF16:
        fix_u16(b, 0x807f, 0x3f00);  // sign and mantissa kept, |x| in [0.5, 1)
        break;
      case DType::F16:
        fix_u16(b, 0x83ff, 0x3800);
        break;
      case DType::Q4_0:
      case DType::Q5_0:
      case DType::Q8_0:
      case DType::IQ4_NL:
      case DType::IQ4_XS:
      case DType::IQ1_S:
      case DType::IQ2_XXS:
      case DType::IQ2_XS:
      case DType::IQ2_S:
      case DType::IQ3_XXS:
      case DType::IQ3_S:
        set_u16(b, one_f16);
        break;
      case DType::Q4_K:
      case DType::Q5_K:
        set_u16(b, one_f16);
        set_u16(b + 2, one_f16);
        break;
      case DType::Q6_K:
        set_u16(b + offsetof(BlockQ6_K, d), one_f16);
        break;
      case DType::MXFP4:
        bytes[b] = 120;  // 2^-7
        break;
      case DType::Q4_1:
        set_u16(b, one_f16);
        set_u16(b + 2, one_f16);
        break;
      case DType::TQ1_0:
        set_u16(b + offsetof(BlockTQ1_0, d), one_f16);
        break;
      case DType::TQ2_0:
        set_u16(b + offsetof(BlockTQ2_0, d), one_f16);
        break;
      default:
        break;
    }
  }
}

struct Weights {
  AlignedBuffer buffer;
  size_t matrix_bytes = 0;
  int copies = 0;
};

// One set of weights at a time: consecutive benchmarks (1 and 2 threads) share it.
const Weights& weights_for(DType type, const Shape& shape) {
  static Weights current;
  static DType current_type;
  static int64_t current_rows = -1, current_cols = -1;
  if (current_rows == shape.rows && current_cols == shape.cols && current_type == type)
    return current;
  current = Weights{};  // free the previous set first
  const size_t matrix_bytes = size_t(shape.rows) * row_bytes(type, uint64_t(shape.cols));
  const int copies =
      int(std::max<size_t>(1, (kMinWorkingSetBytes + matrix_bytes - 1) / matrix_bytes));
  current.buffer = AlignedBuffer(matrix_bytes * size_t(copies));
  if (is_interleaved(type)) {
    // Plain rows of the base format, interleaved 16 at a time.
    const DType base = dtype_info(type).base;
    const size_t plain_group = 16 * row_bytes(base, uint64_t(shape.cols));
    const size_t group = 16 * row_bytes(type, uint64_t(shape.cols));
    AlignedBuffer plain(plain_group * size_t(shape.rows / 16));
    fill_weights(base, plain.data(), plain.size());
    for (int64_t g = 0; g < shape.rows / 16; ++g)
      interleave_rows(type, plain.data() + size_t(g) * plain_group, shape.cols,
                      current.buffer.data() + size_t(g) * group);
  } else {
    fill_weights(type, current.buffer.data(), matrix_bytes);
  }
  for (int c = 1; c < copies; ++c)
    std::memcpy(current.buffer.data() + size_t(c) * matrix_bytes, current.buffer.data(),
                matrix_bytes);
  current.matrix_bytes = matrix_bytes;
  current.copies = copies;
  current_type = type;
  current_rows = shape.rows;
  current_cols = shape.cols;
  return current;
}

ThreadPool& pool_of(int n_threads) {
  static ThreadPool one(1), two(2);
  return n_threads == 1 ? one : two;
}

void bm_matmul(benchmark::State& state, DType type, ActPrecision precision, Shape shape,
               int n_threads) {
  const Weights& weights = weights_for(type, shape);
  ThreadPool& pool = pool_of(n_threads);
  std::vector<float> x(size_t(shape.cols)), y(size_t(shape.rows));
  for (size_t i = 0; i < x.size(); ++i) x[i] = float(int(i % 17) - 8) * 0.125f;
  int copy = 0;
  for (auto _ : state) {
    matmul({.weight_type = type,
            .weights = weights.buffer.data() + size_t(copy) * weights.matrix_bytes,
            .rows = shape.rows,
            .cols = shape.cols,
            .input = x.data(),
            .n_tokens = 1,
            .output = y.data(),
            .precision = precision},
           pool);
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
    copy = copy + 1 == weights.copies ? 0 : copy + 1;
  }
  state.counters["GB/s"] = benchmark::Counter(
      double(weights.matrix_bytes) * double(state.iterations()) / 1e9, benchmark::Counter::kIsRate);
}

// A decode step's expert products as the MoE op issues them: the gate and up matrices of six
// experts (twelve matrices, one token) in one matmul_many, from DRAM. Set beside matmul/ on one
// matrix of the same shape, it shows what sharing out a dozen matrices costs the threads.
void bm_experts(benchmark::State& state, DType type, ActPrecision precision, int n_threads) {
  constexpr int kMatrices = 12;
  const Weights& weights = weights_for(type, kExpertUp);
  ThreadPool& pool = pool_of(n_threads);
  std::vector<float> x(size_t(kExpertUp.cols)), y(size_t(kExpertUp.rows) * kMatrices);
  for (size_t i = 0; i < x.size(); ++i) x[i] = float(int(i % 17) - 8) * 0.125f;
  std::vector<MatmulArgs> args(kMatrices);
  int copy = 0;
  for (auto _ : state) {
    for (int m = 0; m < kMatrices; ++m) {
      args[size_t(m)] = {.weight_type = type,
                         .weights = weights.buffer.data() + size_t(copy) * weights.matrix_bytes,
                         .rows = kExpertUp.rows,
                         .cols = kExpertUp.cols,
                         .input = x.data(),
                         .n_tokens = 1,
                         .output = y.data() + size_t(m) * size_t(kExpertUp.rows),
                         .precision = precision};
      copy = copy + 1 == weights.copies ? 0 : copy + 1;
    }
    matmul_many(args, pool);
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  state.counters["GB/s"] = benchmark::Counter(
      double(weights.matrix_bytes) * kMatrices * double(state.iterations()) / 1e9,
      benchmark::Counter::kIsRate);
}

// One expert matrix (cache-resident after the first pass) against n tokens: microseconds per
// token. Below kLanesMinTokens this is the row-dot path, from it on the token-lanes path;
// the per-token cost on either side is what sets that threshold (kLanesMinTokens in matmul.h).
void bm_tokens(benchmark::State& state, DType type, ActPrecision precision, int64_t n_tokens,
               int n_threads, Shape shape) {
  const uint8_t* weights = weights_for(type, shape).buffer.data();  // its first copy only
  ThreadPool& pool = pool_of(n_threads);
  std::vector<float> x(size_t(shape.cols * n_tokens)), y(size_t(shape.rows * n_tokens));
  for (size_t i = 0; i < x.size(); ++i) x[i] = float(int(i % 17) - 8) * 0.125f;
  for (auto _ : state) {
    matmul({.weight_type = type,
            .weights = weights,
            .rows = shape.rows,
            .cols = shape.cols,
            .input = x.data(),
            .n_tokens = n_tokens,
            .output = y.data(),
            .precision = precision},
           pool);
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  state.counters["us/token"] = benchmark::Counter(
      double(n_tokens) * double(state.iterations()),
      benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}

// STREAM triad a = b + s * c over 3 x 128 MB, split over the pool like the matmul rows. Counted
// as STREAM counts it: 3 arrays per pass (the write-allocate read of `a` is not counted).
void bm_triad(benchmark::State& state, int n_threads) {
  constexpr int64_t n = int64_t(32) << 20;
  static std::unique_ptr<float[]> a(new float[n]), b(new float[n]), c(new float[n]);
  for (int64_t i = 0; i < n; ++i) a[i] = 0.0f, b[i] = 1.0f, c[i] = 2.0f;
  ThreadPool& pool = pool_of(n_threads);
  constexpr int64_t chunk = int64_t(1) << 18;
  for (auto _ : state) {
    pool.parallel_for(n / chunk, [&](int64_t task, int) {
      float* pa = a.get() + task * chunk;
      const float* pb = b.get() + task * chunk;
      const float* pc = c.get() + task * chunk;
      for (int64_t i = 0; i < chunk; ++i) pa[i] = pb[i] + 3.0f * pc[i];
    });
    benchmark::ClobberMemory();
  }
  state.counters["GB/s"] = benchmark::Counter(
      3.0 * 4.0 * double(n) * double(state.iterations()) / 1e9, benchmark::Counter::kIsRate);
}

void register_all() {
  const Shape shapes[] = {
      {1408, 2048, "expert_up"}, {2048, 1408, "expert_down"}, {102400, 2048, "output_head"}};
  const DType types[] = {DType::Q4_K, DType::Q4_K_R16, DType::Q8_0, DType::Q8_0_R16,
                         DType::Q6_K, DType::Q5_0, DType::Q5_0_R16,
                         DType::Q5_K, DType::Q4_0, DType::IQ4_XS, DType::IQ4_NL, DType::MXFP4,
                         DType::Q4_1,   DType::TQ1_0, DType::TQ2_0, DType::BF16,
                         DType::IQ1_S,  DType::IQ1_M, DType::IQ2_XXS, DType::IQ2_XS,
                         DType::IQ2_S,  DType::IQ3_XXS, DType::IQ3_S};
  for (int n_threads : {1, 2})
    benchmark::RegisterBenchmark(("triad/threads:" + std::to_string(n_threads)).c_str(), bm_triad,
                                 n_threads)
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond);
  for (DType type : {DType::Q4_K, DType::Q4_K_R16})
    for (int n_threads : {1, 2}) {
      const std::string name = "experts/" + std::string(dtype_name(type)) +
                               "/int8/12x1408x2048/threads:" + std::to_string(n_threads);
      benchmark::RegisterBenchmark(name.c_str(), bm_experts, type, ActPrecision::Int8, n_threads)
          ->UseRealTime()
          ->Unit(benchmark::kMicrosecond);
    }
  // Per-token cost by token count: row dots below kLanesMinTokens, token lanes from there on.
  for (DType type : {DType::Q4_K, DType::Q8_0, DType::Q6_K, DType::IQ4_XS, DType::TQ1_0, DType::TQ2_0,
                     DType::IQ2_XXS}) {
    for (ActPrecision precision : {ActPrecision::Int16, ActPrecision::Int8}) {
      for (int64_t n_tokens : {1, 2, 4, 6, 7, 8, 16, 64}) {
        const std::string name = "tokens/" + std::string(dtype_name(type)) +
                                 (precision == ActPrecision::Int16 ? "/int16" : "/int8") +
                                 "/1408x2048/n:" + std::to_string(n_tokens) + "/threads:1";
        benchmark::RegisterBenchmark(name.c_str(), bm_tokens, type, precision, n_tokens, 1,
                                     kExpertUp)
            ->UseRealTime()
            ->Unit(benchmark::kMicrosecond);
      }
    }
  }
  // One token against 256 rows that stay in L2: the decode kernels' own rate (what sets decode
  // wherever memory is faster than they are), the interleaved formats beside their base formats.
  for (DType type : {DType::Q4_K, DType::Q4_K_R16, DType::Q8_0, DType::Q8_0_R16, DType::Q5_0,
                     DType::Q5_0_R16, DType::Q6_K})
    for (ActPrecision precision : {ActPrecision::Int16, ActPrecision::Int8}) {
      const std::string name = "l2/" + std::string(dtype_name(type)) +
                               (precision == ActPrecision::Int16 ? "/int16" : "/int8") +
                               "/256x2048/n:1/threads:1";
      benchmark::RegisterBenchmark(name.c_str(), bm_tokens, type, precision, 1, 1,
                                   Shape{256, 2048, "l2"})
          ->UseRealTime()
          ->Unit(benchmark::kMicrosecond);
    }
  // Prompt chunks on the interleaved formats of `tandem repack` against their base formats.
  for (DType type : {DType::Q4_K, DType::Q4_K_R16, DType::Q8_0, DType::Q8_0_R16})
    for (ActPrecision precision : {ActPrecision::Int16, ActPrecision::Int8})
      for (int64_t n_tokens : {48, 64, 512}) {
        const std::string name = "prompt/" + std::string(dtype_name(type)) +
                                 (precision == ActPrecision::Int16 ? "/int16" : "/int8") +
                                 "/1408x2048/n:" + std::to_string(n_tokens) + "/threads:2";
        benchmark::RegisterBenchmark(name.c_str(), bm_tokens, type, precision, n_tokens, 2,
                                     kExpertUp)
            ->UseRealTime()
            ->Unit(benchmark::kMicrosecond);
      }
  for (DType type : types) {
    for (const Shape& shape : shapes) {
      if (shape.cols % dtype_info(type).block_elems != 0) continue;
      // BF16's int8 row is its bf16-rounded-x dot (AVX-512); F32/F16 have one kernel.
      for (ActPrecision precision : {ActPrecision::Int16, ActPrecision::Int8}) {
        for (int n_threads : {1, 2}) {
          const std::string name = "matmul/" + std::string(dtype_name(type)) + "/" +
                                   (precision == ActPrecision::Int16 ? "int16/" : "int8/") +
                                   std::to_string(shape.rows) + "x" + std::to_string(shape.cols) +
                                   "/threads:" + std::to_string(n_threads);
          benchmark::RegisterBenchmark(name.c_str(), bm_matmul, type, precision, shape, n_threads)
              ->UseRealTime()
              ->Unit(benchmark::kMicrosecond);
        }
      }
    }
  }
}

}  // namespace
}  // namespace tandem::cpu

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::AddCustomContext("cpu_isa",
                              std::string(tandem::cpu::cpu_isa_name(tandem::cpu::best_cpu_isa())));
  tandem::cpu::register_all();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
