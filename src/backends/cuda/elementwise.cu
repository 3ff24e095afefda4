// The small ops on the GPU: RMSNorm, residual adds, fills, strided row copies, and embedding
// lookups (any weight format, decoded by quant/block_decode.h). Each is a pass over memory; their
// launches, not their bytes, are what costs at decode, which is why decode steps are graphs.
#include <algorithm>
#include <cstdint>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/kernels.h"
#include "backends/cuda/launch.cuh"
#include "backends/cuda/row_steps.cuh"
#include "quant/block_decode.h"

namespace tandem::cuda {
namespace {

unsigned blocks_for(int64_t n, int threads) {
  const int64_t blocks = (n + threads - 1) / threads;
  return unsigned(blocks < 4096 ? (blocks > 0 ? blocks : 1) : 4096);
}

// One block per row: y = x * scale * w with the CPU's two roundings (block_rms_scale), after
// the fused residual add when there is one (add_kernel's sum; each thread adds the elements it
// then reads, so no barrier between).
__global__ void __launch_bounds__(kNormThreads) rms_norm_kernel(RmsNormOp op) {
  const int64_t r = blockIdx.x;
  if (op.residual) {
    float* sum = op.residual + r * op.input_stride;
    const float* add = op.add + r * op.input_stride;
    for (int64_t i = threadIdx.x; i < op.dim; i += kNormThreads) sum[i] = __fadd_rn(sum[i], add[i]);
  }
  block_rms_norm(op.input + r * op.input_stride, op.output + r * op.output_stride, op.weight,
                 op.dim, op.eps);
}

__global__ void add_kernel(float* y, const float* x, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    y[i] = __fadd_rn(y[i], x[i]);
}

// Up to eight parts by value, so a captured launch keeps them without a buffer of pointers.
struct Parts {
  static constexpr int kMax = 8;
  const float* p[kMax];
  int n;
};

__global__ void add_parts_kernel(float* y, Parts parts, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    float sum = y[i];
    for (int k = 0; k < parts.n; ++k) sum = __fadd_rn(sum, parts.p[k][i]);
    y[i] = sum;
  }
}

// out[t][r] += bias[r]: a product's bias, after the product (MatmulOp::bias).
__global__ void add_row_bias_kernel(float* out, const float* bias, int64_t n_tokens, int64_t rows) {
  const int64_t n = n_tokens * rows;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    out[i] = __fadd_rn(out[i], bias[i % rows]);
}

__global__ void fill_kernel(float* y, float value, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    y[i] = value;
}

__global__ void copy_rows_kernel(float* dst, int64_t dst_stride, const float* src,
                                 int64_t src_stride, int64_t n_rows, int64_t row_len) {
  const int64_t n = n_rows * row_len;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / row_len, c = i % row_len;
    dst[r * dst_stride + c] = src[r * src_stride + c];
  }
}

template <class Dec>
__global__ void get_rows_kernel(const uint8_t* table, uint64_t row_bytes, int64_t cols,
                                int64_t rows, const int32_t* ids, float* output) {
  constexpr int kGroupsPerBlock = Dec::kElems / 8;
  const int64_t i = blockIdx.x;
  if (ids[i] < 0 || ids[i] >= rows)
    __trap();  // checked on the host first (Deepseek2Model::forward)
  const uint8_t* row = table + uint64_t(ids[i]) * row_bytes;
  for (int64_t g = threadIdx.x; g < cols / 8; g += blockDim.x) {
    float v[8];
    Dec::decode8(row + (g / kGroupsPerBlock) * Dec::kBytes, int(g % kGroupsPerBlock), v);
    for (int k = 0; k < 8; ++k) output[i * cols + 8 * g + k] = v[k];
  }
}

}  // namespace

void rms_norm(const RmsNormOp& op, cudaStream_t stream) {
  launch("rms_norm_kernel", rms_norm_kernel, unsigned(op.n_rows), kNormThreads, 0, stream, op);
}

void add(float* y, const float* x, int64_t n, cudaStream_t stream) {
  launch("add_kernel", add_kernel, blocks_for(n, 256), 256, 0, stream, y, x, n);
}

void add_parts(float* y, std::span<const float* const> parts, int64_t n, cudaStream_t stream) {
  for (size_t first = 0; first < parts.size(); first += Parts::kMax) {
    Parts some{};
    some.n = int(std::min<size_t>(Parts::kMax, parts.size() - first));
    for (int k = 0; k < some.n; ++k) some.p[k] = parts[first + size_t(k)];
    launch("add_parts_kernel", add_parts_kernel, blocks_for(n, 256), 256, 0, stream, y, some, n);
  }
}

void add_row_bias(float* out, const float* bias, int64_t n_tokens, int64_t rows,
                  cudaStream_t stream) {
  launch("add_row_bias_kernel", add_row_bias_kernel, blocks_for(n_tokens * rows, 256), 256, 0,
         stream, out, bias, n_tokens, rows);
}

void fill(float* y, float value, int64_t n, cudaStream_t stream) {
  launch("fill_kernel", fill_kernel, blocks_for(n, 256), 256, 0, stream, y, value, n);
}

void copy_rows(float* dst, int64_t dst_stride, const float* src, int64_t src_stride, int64_t n_rows,
               int64_t row_len, cudaStream_t stream) {
  launch("copy_rows_kernel", copy_rows_kernel, blocks_for(n_rows * row_len, 256), 256, 0, stream,
         dst, dst_stride, src, src_stride, n_rows, row_len);
}

void get_rows(const WeightView& table, const int32_t* ids, int64_t n, float* output,
              cudaStream_t stream) {
  const bool known = blocks::visit_decoder(table.type, [&](auto dec) {
    using Dec = decltype(dec);
    launch("get_rows_kernel", get_rows_kernel<Dec>, unsigned(n), 128, 0, stream,
           static_cast<const uint8_t*>(table.data), table.row_bytes, table.cols, table.rows, ids,
           output);
  });
  if (!known)
    cuda_failed(cudaErrorInvalidValue, "an embedding format without a GPU decoder", __FILE__,
                __LINE__);
}

}  // namespace tandem::cuda
