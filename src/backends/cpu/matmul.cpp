#include "backends/cpu/matmul.h"

#include <algorithm>
#include <span>
#include <vector>

#include "backends/cpu/act_q16.h"
#include "backends/cpu/kernels.h"
#include "core/aligned_buffer.h"
#include "core/error.h"
#include "core/iq_blocks.h"
#include "quant/interleave.h"

namespace tandem::cpu {
namespace {

KernelTable build_table(CpuIsa isa) {
  KernelTable table;
  fill_portable_kernels(table);
  fill_portable_q16_kernels(table);
  table.key_scores_16 = key_scores_16_portable;
  table.weighted_sums_64 = weighted_sums_64_portable;
  table.softmax_block = softmax_block_portable;
  table.scale_add = scale_add_portable;
  table.key_scores_16_bf16 = key_scores_16_bf16_portable;
  table.weighted_sums_64_bf16 = weighted_sums_64_bf16_portable;
  table.silu_mul = silu_mul_portable;
  if (int(isa) >= int(CpuIsa::Avx2)) {
    fill_avx2_kernels(table);
    fill_avx2_q16_kernels(table);
  }
  if (int(isa) >= int(CpuIsa::Avx512)) {
    fill_avx512_kernels(table);
    fill_avx512_q16_kernels(table);
    fill_avx512_group_kernels(table);
    fill_avx512_group8_kernels(table);
    fill_avx512_few_query_attention(table);
    fill_avx512_activations(table);
  }
  // The token-lanes path where it beats the row dots: AVX-512 VNNI, and the portable level (its
  // only other kernels are scalar too). AVX2 keeps its row dots.
  if (isa == CpuIsa::Portable) {
    fill_portable_lanes_kernels(table);
    fill_portable_lanes8_kernels(table);
  }
  if (isa == CpuIsa::Avx512) {
    fill_avx512_lanes_kernels(table);
    fill_avx512_lanes8_kernels(table);
  }
  // The IQ4 formats, MXFP4, Q4_1 and the ternary ones have no 8-bit row dots: at Int8 their row
  // dots are the 16-bit ones (their token lanes are 8-bit). An 8-bit IQ4 row dot on ActBlockQ8
  // activations measured 1.1-1.3x slower than the 16-bit one (matmul_bench), so none is kept.
  // The grid i-quants have 8-bit ones (Q8_K activations; IQ2_XXS's is 1.7x its 16-bit one).
  for (DType type : {DType::IQ4_NL, DType::IQ4_XS, DType::MXFP4, DType::Q4_1, DType::TQ1_0,
                     DType::TQ2_0})
    table.formats[size_t(ActPrecision::Int8)][size_t(type)] = table.formats[size_t(ActPrecision::Int16)][size_t(type)];
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

// One matmul made ready to run: its kernel, where its prepared activations are, and its shape.
struct ReadyMatmul {
  LanesRowsFn lanes = nullptr;  // set: the token-lanes path, with `tiles`
  const uint8_t* tiles = nullptr;
  DType type = DType::F32;         // the weights' format
  DType row_type = DType::F32;     // the format of one row: `type`, or its base if interleaved
  GroupDotFn group_dot = nullptr;  // interleaved `type` with a kernel for whole groups
  LanesRowsFn group_lanes = nullptr;  // interleaved `type`, token-lanes path reading groups
  RowDotFn dot = nullptr;
  const uint8_t* act = nullptr;
  size_t act_stride = 0;
  const float* input = nullptr;  // what `act` (and `tiles`) were prepared from
  ActKind act_kind = ActKind::F32;
  const uint8_t* weights = nullptr;
  size_t weight_stride = 0;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t n_tokens = 0;
  float* output = nullptr;
};

// Whether a matmul of `args`' token count and kernel choice takes the token-lanes path at
// `precision` (where the format has such a kernel).
bool takes_lanes(const MatmulArgs& args, ActPrecision precision) {
  switch (args.kernels) {
    case KernelChoice::PerToken:
      return false;
    case KernelChoice::Tiled:
      return true;
    case KernelChoice::ByTokenCount:
      break;
  }
  return args.n_tokens >= (precision == ActPrecision::Int8 ? kLanes8MinTokens : kLanesMinTokens);
}

// The precision a matmul runs at: as asked, except that an Int8 matmul of an interleaved format
// whose path (row dots or token lanes) has 16-bit kernels reading whole groups but no 8-bit ones
// runs the 16-bit ones: taking each group apart for 8-bit kernels cost more than the 8 bits save
// (decode at half the speed). Every level that has group kernels has both precisions for the
// three interleaved formats today; this keeps a format added with 16-bit ones only fast.
ActPrecision precision_of(const KernelTable& table, const MatmulArgs& args) {
  const size_t base = size_t(dtype_info(args.weight_type).base);
  if (args.precision == ActPrecision::Int8 && base != size_t(args.weight_type) &&
      (table.group_dots[base] || table.group_lanes[base]) &&
      !(table.lanes8[base] && takes_lanes(args, ActPrecision::Int8)) &&
      !(table.group_dots8[base] && !takes_lanes(args, ActPrecision::Int8)))
    return ActPrecision::Int16;
  return args.precision;
}

// The token-lanes path a matmul takes, if any: its kernel, the activations it is built from, and
// its tiles (gemm_q16.h for Int16, gemm_q8.h for Int8).
struct LanesPath {
  LanesRowsFn rows = nullptr;  // nullptr: row dots
  ActKind act = ActKind::Q16;
  BuildTileFn build_tile = nullptr;
  size_t tile_bytes = 0;
};

LanesPath lanes_path(const KernelTable& table, const MatmulArgs& args) {
  const ActPrecision precision = precision_of(table, args);
  const bool int8 = precision == ActPrecision::Int8;
  if (!takes_lanes(args, precision)) return {};
  const size_t base = size_t(dtype_info(args.weight_type).base);
  if (int8) {
    if (!table.lanes8[base]) return {};
    return {table.lanes8[base], ActKind::Q8, table.build_tile8, lanes8_tile_bytes(args.cols)};
  }
  if (!table.lanes[base]) return {};
  return {table.lanes[base], ActKind::Q16, build_lanes_tile, lanes_tile_bytes(args.cols)};
}

// Checks the arguments and returns the kernel of `args` (for an interleaved format, its base
// format's, which runs on groups taken apart); nullptr when there is nothing to do.
const FormatKernel* checked_kernel(const KernelTable& table, const MatmulArgs& args) {
  const DType type = args.weight_type;
  if (!matmul_supports(type))
    fail(
        "matmul on the CPU: weight format {} is not supported (supported: F32, F16, BF16, "
        "Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS, TQ1_0, "
        "TQ2_0, MXFP4, IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, Q8_0_R16, "
        "Q5_0_R16, Q4_K_R16)",
        dtype_name(type));
  const DTypeInfo& info = dtype_info(type);
  if (args.cols % info.block_elems != 0)
    fail("matmul on the CPU: a {} row of {} elements is not a whole number of {}-element blocks",
         dtype_name(type), args.cols, info.block_elems);
  if (args.rows % info.row_group != 0)
    fail("matmul on the CPU: {} stores rows in groups of {}, but the matrix has {} rows",
         dtype_name(type), info.row_group, args.rows);
  TANDEM_CHECK(args.rows >= 0 && args.cols >= 0 && args.n_tokens >= 0);
  if (args.rows == 0 || args.n_tokens == 0) return nullptr;
  TANDEM_CHECK(args.weights != nullptr && args.input != nullptr && args.output != nullptr);
  TANDEM_CHECK(args.precision == ActPrecision::Int16 || args.precision == ActPrecision::Int8);
  return &table.formats[size_t(precision_of(table, args))][size_t(info.base)];
}

int64_t lanes_tiles(int64_t n_tokens) {
  return (n_tokens + 15) / 16;
}

// The activations a matmul prepares: its lanes path's, else its row dots'.
ActKind prepared_kind(const FormatKernel& kernel, const LanesPath& lanes) {
  return lanes.rows ? lanes.act : kernel.act;
}

size_t prepared_bytes(const KernelTable& table, const FormatKernel& kernel, const MatmulArgs& args) {
  const LanesPath lanes = lanes_path(table, args);
  const ActKind act = prepared_kind(kernel, lanes);
  if (act == ActKind::F32) return 0;
  return act_row_bytes(act, args.cols) * size_t(args.n_tokens) +
         lanes.tile_bytes * size_t(lanes.rows ? lanes_tiles(args.n_tokens) : 0);
}

// Activations are used in place by float kernels, else prepared into `scratch` (the calling
// thread for one token, all threads for several), or taken from `previous` when it prepared the
// same input the same way (a MoE's gate and up projections share theirs).
ReadyMatmul make_ready(const KernelTable& table, const FormatKernel& kernel,
                       const MatmulArgs& args, uint8_t* scratch, ThreadPool& pool,
                       const ReadyMatmul* previous = nullptr) {
  const DType row_type = dtype_info(args.weight_type).base;
  ReadyMatmul ready{.type = args.weight_type,
                    .row_type = row_type,
                    .dot = kernel.dot,
                    .act = reinterpret_cast<const uint8_t*>(args.input),
                    .act_stride = size_t(args.cols) * sizeof(float),
                    .weights = static_cast<const uint8_t*>(args.weights),
                    .weight_stride = row_bytes(args.weight_type, uint64_t(args.cols)),
                    .rows = args.rows,
                    .cols = args.cols,
                    .n_tokens = args.n_tokens,
                    .output = args.output};
  const LanesPath lanes = lanes_path(table, args);
  const ActKind act = prepared_kind(kernel, lanes);
  ready.input = args.input;
  ready.act_kind = act;
  if (act != ActKind::F32) {
    ready.act_stride = act_row_bytes(act, args.cols);
    if (previous && previous->input == args.input && previous->act_kind == act &&
        previous->n_tokens == args.n_tokens && previous->cols == args.cols &&
        (previous->tiles != nullptr) == (lanes.rows != nullptr)) {
      ready.act = previous->act;
      ready.tiles = previous->tiles;
      ready.lanes = lanes.rows;
      scratch = nullptr;  // nothing to prepare
    }
  }
  if (act != ActKind::F32 && scratch) {
    const PrepareActFn prepare = table.prepare[size_t(act)];
    if (args.n_tokens == 1) {
      prepare(args.input, scratch, args.cols);
    } else {
      pool.parallel_for(args.n_tokens, [&](int64_t token, int) {
        prepare(args.input + token * args.cols, scratch + size_t(token) * ready.act_stride,
                args.cols);
      });
    }
    ready.act = scratch;
    if (lanes.rows) {
      uint8_t* tiles = scratch + ready.act_stride * size_t(args.n_tokens);
      pool.parallel_for(lanes_tiles(args.n_tokens), [&](int64_t tile, int) {
        lanes.build_tile(ready.act, ready.act_stride, tile * 16,
                         std::min<int64_t>(16, args.n_tokens - tile * 16), args.cols,
                         tiles + size_t(tile) * lanes.tile_bytes);
      });
      ready.lanes = lanes.rows;
      ready.tiles = tiles;
    }
  }
  // Interleaved formats: the kernels that read groups whole where the level has them (row dots
  // and token lanes at either precision; precision_of sends an Int8 matmul by row dots with only
  // 16-bit ones to those); elsewhere the groups are taken apart into plain rows.
  if (act != ActKind::F32 && row_type != args.weight_type) {
    const bool int8 = precision_of(table, args) == ActPrecision::Int8;
    if (ready.lanes)
      ready.group_lanes = (int8 ? table.group_lanes8 : table.group_lanes)[size_t(row_type)];
    else
      ready.group_dot = (int8 ? table.group_dots8 : table.group_dots)[size_t(row_type)];
  }
  return ready;
}

LanesMatmul lanes_args(const ReadyMatmul& m) {
  return {.type = m.row_type,
          .weights = m.weights,
          .weight_stride = m.weight_stride,
          .rows = m.rows,
          .cols = m.cols,
          .tiles = m.tiles,
          .n_tokens = m.n_tokens,
          .output = m.output};
}

// Rows [first, last) of `m` for all its tokens, a block of tokens at a time: the block's
// activations stay in L2 while every row passes over them, each row from L1 for the block's
// tokens. (Row by row over all tokens streamed a prompt's activations, 4 MiB of F32 for 512
// tokens of 2048, from memory once per row: Qwen3's F32 router of 128 rows spent 3.6% of a
// prompt there.) Each output is one dot, whatever the order.
void run_plain_rows(const ReadyMatmul& m, int64_t first, int64_t last) {
  if (m.lanes) {
    m.lanes(lanes_args(m), first, last);
    return;
  }
  constexpr size_t kBlockActBytes = 128 * 1024;
  const int64_t block =
      std::max<int64_t>(1, int64_t(kBlockActBytes / std::max<size_t>(m.act_stride, 1)));
  for (int64_t first_token = 0; first_token < m.n_tokens; first_token += block) {
    const int64_t last_token = std::min(m.n_tokens, first_token + block);
    for (int64_t row = first; row < last; ++row) {
      const uint8_t* weight_row = m.weights + size_t(row) * m.weight_stride;
      for (int64_t token = first_token; token < last_token; ++token)
        m.output[token * m.rows + row] =
            m.dot(weight_row, m.act + size_t(token) * m.act_stride, m.cols);
    }
  }
}

// Rows [first, last) of an interleaved matrix (multiples of 16): by the kernels that read groups
// where the level has them, else taken apart into plain rows in a scratch buffer that the plain
// kernels then run on (the output pointer moved so that the scratch's row 0 lands on the first
// row): on the token-lanes path up to 256 rows at once, so that each token tile passes over as
// many rows as with the plain format; by row dots a group at a time.
void run_interleaved_rows(const ReadyMatmul& m, int64_t first, int64_t last) {
  constexpr int64_t kGroup = 16;
  if (m.group_lanes) {
    LanesMatmul args = lanes_args(m);
    args.type = m.type;
    m.group_lanes(args, first, last);
    return;
  }
  const size_t plain_stride = row_bytes(m.row_type, uint64_t(m.cols));
  thread_local AlignedBuffer plain;
  if (m.lanes) {
    // Tasks can be larger: a whole matrix on one thread, a quarter of it first on two.
    constexpr int64_t kMostRows = 256;
    const size_t bytes = size_t(std::min(last - first, kMostRows)) * plain_stride;
    if (plain.size() < bytes) plain = AlignedBuffer(bytes);
    for (int64_t part = first; part < last; part += kMostRows) {
      const int64_t end = std::min(last, part + kMostRows);
      for (int64_t row = part; row < end; row += kGroup)
        take_apart_rows(m.type, m.weights + size_t(row) * m.weight_stride, m.cols,
                        plain.data() + size_t(row - part) * plain_stride);
      LanesMatmul args = lanes_args(m);
      args.weights = plain.data();
      args.weight_stride = plain_stride;
      args.output = m.output + part;
      m.lanes(args, 0, end - part);
    }
    return;
  }
  if (!m.group_dot && plain.size() < kGroup * plain_stride) plain = AlignedBuffer(kGroup * plain_stride);
  for (int64_t row = first; row < last; row += kGroup) {
    const uint8_t* group = m.weights + size_t(row) * m.weight_stride;
    if (m.group_dot) {
      float out[kGroup];
      for (int64_t token = 0; token < m.n_tokens; ++token) {
        m.group_dot(group, m.act + size_t(token) * m.act_stride, m.cols, out);
        std::copy(out, out + kGroup, m.output + token * m.rows + row);
      }
      continue;
    }
    take_apart_rows(m.type, group, m.cols, plain.data());
    ReadyMatmul rows = m;
    rows.weights = plain.data();
    rows.weight_stride = plain_stride;
    rows.output = m.output + row;
    run_plain_rows(rows, 0, kGroup);
  }
}

void run_rows(const ReadyMatmul& m, int64_t first, int64_t last) {
  if (m.row_type != m.type) run_interleaved_rows(m, first, last);
  else run_plain_rows(m, first, last);
}

// The matmuls' row tiles in one list, claimed by the threads in order: a thread that finishes
// one matrix goes straight on to the next, with no wait for the others in between. One matmul is
// a list of one.
void run_matmul_many(const KernelTable& table, std::span<const MatmulArgs> args, ThreadPool& pool) {
  // The caller's lists, reused from call to call; named through references because a worker
  // thread naming a thread_local would get its own (empty) copy.
  thread_local std::vector<ReadyMatmul> ready_storage;
  thread_local std::vector<int64_t> rows_storage;
  thread_local std::vector<RowTask> tasks_storage;
  std::vector<ReadyMatmul>& ready = ready_storage;
  std::vector<int64_t>& rows = rows_storage;  // [ready.size()]
  std::vector<RowTask>& tasks = tasks_storage;
  ready.clear();
  rows.clear();
  thread_local std::vector<const FormatKernel*> kernels;  // nullptr: nothing to do
  kernels.clear();
  size_t scratch_bytes = 0;
  for (const MatmulArgs& a : args) {
    kernels.push_back(checked_kernel(table, a));
    if (kernels.back()) scratch_bytes += prepared_bytes(table, *kernels.back(), a);
  }
  uint8_t* scratch = activation_scratch(scratch_bytes);
  for (size_t i = 0; i < args.size(); ++i) {
    const FormatKernel* kernel = kernels[i];
    if (!kernel) continue;
    ready.push_back(make_ready(table, *kernel, args[i], scratch, pool,
                               ready.empty() ? nullptr : &ready.back()));
    scratch += prepared_bytes(table, *kernel, args[i]);
    rows.push_back(args[i].rows);
  }
  if (ready.empty()) return;
  cut_into_tasks(rows, pool.size(), tasks);
  pool.parallel_for(int64_t(tasks.size()), [&](int64_t task, int) {
    const RowTask& t = tasks[size_t(task)];
    run_rows(ready[t.matmul], t.first, t.last);
  });
}

}  // namespace

void cut_into_tasks(std::span<const int64_t> rows, int n_threads, std::vector<RowTask>& tasks) {
  TANDEM_CHECK(n_threads >= 1);
  tasks.clear();
  int64_t left = 0;
  for (int64_t r : rows) left += r;
  const int64_t share = 2 * int64_t(n_threads);
  for (size_t i = 0; i < rows.size(); ++i) {
    for (int64_t first = 0; first < rows[i];) {
      const int64_t want = n_threads == 1 ? rows[i] : ((left + share - 1) / share + 15) / 16 * 16;
      const int64_t last = std::min(rows[i], first + want);
      tasks.push_back({.matmul = i, .first = first, .last = last});
      left -= last - first;
      first = last;
    }
  }
}

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
    case DType::Q8_0_R16:
    case DType::Q5_0_R16:
    case DType::Q4_K_R16:
    case DType::IQ4_NL:
    case DType::IQ4_XS:
    case DType::MXFP4:
    case DType::Q4_1:
    case DType::TQ1_0:
    case DType::TQ2_0:
      return true;
    default:
      return is_iq_grid(weight_type);
  }
}

const KernelTable& best_kernel_table() {
  static const KernelTable& table = kernel_table(best_cpu_isa());
  return table;
}

void matmul(const MatmulArgs& args, ThreadPool& pool) {
  run_matmul_many(best_kernel_table(), std::span(&args, 1), pool);
}

void matmul_with_isa(CpuIsa isa, const MatmulArgs& args, ThreadPool& pool) {
  run_matmul_many(kernel_table(isa), std::span(&args, 1), pool);
}

void matmul_many(std::span<const MatmulArgs> args, ThreadPool& pool) {
  run_matmul_many(best_kernel_table(), args, pool);
}

void matmul_many_with_isa(CpuIsa isa, std::span<const MatmulArgs> args, ThreadPool& pool) {
  run_matmul_many(kernel_table(isa), args, pool);
}

}  // namespace tandem::cpu
