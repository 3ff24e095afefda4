#include "backends/cpu/matmul.h"

#include <algorithm>

#include "backends/cpu/act_q16.h"
#include "backends/cpu/kernels.h"
#include "core/aligned_buffer.h"
#include "core/error.h"

namespace tandem::cpu {
namespace {

KernelTable build_table(CpuIsa isa) {
  KernelTable table;
  fill_portable_kernels(table);
  fill_portable_q16_kernels(table);
  if (int(isa) >= int(CpuIsa::Avx2)) {
    fill_avx2_kernels(table);
    fill_avx2_q16_kernels(table);
  }
  if (int(isa) >= int(CpuIsa::Avx512)) {
    fill_avx512_kernels(table);
    fill_avx512_q16_kernels(table);
  }
  return table;
}

}  // namespace

// Built on first use, and only for a level the CPU supports: filling the AVX-512 table runs
// code compiled for AVX-512.
const KernelTable& kernel_table(CpuIsa isa) {
  if (!cpu_supports(isa))
    fail("the {} CPU kernels were requested but this CPU does not support them (best: {})",
         cpu_isa_name(isa), cpu_isa_name(detected_cpu_isa()));
  switch (isa) {
    case CpuIsa::Portable: {
      static const KernelTable table = build_table(CpuIsa::Portable);
      return table;
    }
    case CpuIsa::Avx2: {
      static const KernelTable table = build_table(CpuIsa::Avx2);
      return table;
    }
    case CpuIsa::Avx512: {
      static const KernelTable table = build_table(CpuIsa::Avx512);
      return table;
    }
  }
  check_failed("kernel_table: CpuIsa value outside the enum", __FILE__, __LINE__);
}

namespace {

// Prepared activations of the calling thread's matmuls. It only grows, so steady-state calls
// allocate nothing; worker threads write into it through the pointer, never through their own.
uint8_t* activation_scratch(size_t bytes) {
  thread_local AlignedBuffer scratch;
  if (scratch.size() < bytes) scratch = AlignedBuffer(std::max(bytes, scratch.size() * 3 / 2));
  return scratch.data();
}

// Rows per task: enough tasks (8 per thread) that threads finishing early pick up the slack,
// but not so few rows that the per-task overhead shows; whole tiles of rows x all tokens, so
// each weight row is fetched from memory once and reused from L1 for every token.
int64_t rows_per_task(int64_t rows, int n_threads) {
  if (n_threads == 1) return std::max<int64_t>(rows, 1);
  const int64_t target_tasks = int64_t(n_threads) * 8;
  return std::clamp<int64_t>((rows + target_tasks - 1) / target_tasks, 4, 256);
}

void run_matmul(const KernelTable& table, const MatmulArgs& args, ThreadPool& pool) {
  const DType type = args.weight_type;
  if (!matmul_supports(type))
    fail(
        "matmul on the CPU: weight format {} is not supported (supported: F32, F16, BF16, "
        "Q4_0, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K)",
        dtype_name(type));
  const int64_t block = dtype_info(type).block_elems;
  if (args.cols % block != 0)
    fail("matmul on the CPU: a {} row of {} elements is not a whole number of {}-element blocks",
         dtype_name(type), args.cols, block);
  TANDEM_CHECK(args.rows >= 0 && args.cols >= 0 && args.n_tokens >= 0);
  if (args.rows == 0 || args.n_tokens == 0) return;
  TANDEM_CHECK(args.weights != nullptr && args.input != nullptr && args.output != nullptr);

  TANDEM_CHECK(args.precision == ActPrecision::Int16 || args.precision == ActPrecision::Int8);
  const FormatKernel kernel = table.formats[size_t(args.precision)][size_t(type)];
  const int64_t cols = args.cols;
  const int64_t n_tokens = args.n_tokens;

  // Activations: used in place for float kernels, else prepared once per call for all rows.
  const uint8_t* act = reinterpret_cast<const uint8_t*>(args.input);
  size_t act_stride = size_t(cols) * sizeof(float);
  if (kernel.act != ActKind::F32) {
    act_stride = act_row_bytes(kernel.act, cols);
    uint8_t* scratch = activation_scratch(act_stride * size_t(n_tokens));
    const PrepareActFn prepare = table.prepare[size_t(kernel.act)];
    if (n_tokens == 1) {
      prepare(args.input, scratch, cols);
    } else {
      pool.parallel_for(n_tokens, [&](int64_t token, int) {
        prepare(args.input + token * cols, scratch + size_t(token) * act_stride, cols);
      });
    }
    act = scratch;
  }

  const auto* weights = static_cast<const uint8_t*>(args.weights);
  const size_t weight_stride = row_bytes(type, uint64_t(cols));
  const int64_t rows = args.rows;
  const int64_t tile_rows = rows_per_task(rows, pool.size());
  const int64_t n_tasks = (rows + tile_rows - 1) / tile_rows;
  const RowDotFn dot = kernel.dot;
  float* output = args.output;
  pool.parallel_for(n_tasks, [&](int64_t task, int) {
    const int64_t row_end = std::min(rows, (task + 1) * tile_rows);
    for (int64_t row = task * tile_rows; row < row_end; ++row) {
      const uint8_t* weight_row = weights + size_t(row) * weight_stride;
      for (int64_t token = 0; token < n_tokens; ++token)
        output[token * rows + row] = dot(weight_row, act + size_t(token) * act_stride, cols);
    }
  });
}

}  // namespace

size_t act_row_bytes(ActKind kind, int64_t cols) {
  size_t bytes = 0;
  switch (kind) {
    case ActKind::F32:
      bytes = size_t(cols) * sizeof(float);
      break;
    case ActKind::BF16:
      bytes = size_t(cols) * sizeof(uint16_t);
      break;
    case ActKind::Q8:
      bytes = size_t(cols / 32) * sizeof(ActBlockQ8);
      break;
    case ActKind::Q8_K:
      bytes = size_t(cols / kQK_K) * sizeof(BlockQ8_K);
      break;
    case ActKind::Q16:
      bytes = q16_row_bytes(cols);
      break;
  }
  return (bytes + 63) / 64 * 64;
}

bool matmul_supports(DType weight_type) {
  switch (weight_type) {
    case DType::F32:
    case DType::F16:
    case DType::BF16:
    case DType::Q4_0:
    case DType::Q5_0:
    case DType::Q5_1:
    case DType::Q8_0:
    case DType::Q2_K:
    case DType::Q3_K:
    case DType::Q4_K:
    case DType::Q5_K:
    case DType::Q6_K:
      return true;
    default:
      return false;
  }
}

void matmul(const MatmulArgs& args, ThreadPool& pool) {
  static const KernelTable& table = kernel_table(best_cpu_isa());
  run_matmul(table, args, pool);
}

void matmul_with_isa(CpuIsa isa, const MatmulArgs& args, ThreadPool& pool) {
  run_matmul(kernel_table(isa), args, pool);
}

}  // namespace tandem::cpu
