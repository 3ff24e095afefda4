#include "backends/cpu/cpu_backend.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <utility>

#include "backends/cpu/matmul.h"
#include "core/aligned_buffer.h"
#include "core/error.h"
#include "core/half.h"
#include "quant/quant.h"

namespace tandem::cpu {
namespace {

class HostBuffer final : public DeviceBuffer {
 public:
  explicit HostBuffer(size_t bytes) : buffer_(bytes) {}
  void* data() override { return buffer_.data(); }
  size_t size() const override { return buffer_.size(); }

 private:
  AlignedBuffer buffer_;
};

// Ops run before their call returns, so every event is complete when recorded.
class DoneEvent final : public Event {
 public:
  void wait() override {}
};

}  // namespace

float* grow(std::vector<float>& v, size_t n) {
  if (v.size() < n) v.resize(n);
  return v.data();
}

CpuBackend::CpuBackend(int n_threads, std::string name, bool pin_threads)
    : name_(std::move(name)), pool_(n_threads, pin_threads) {}

std::shared_ptr<Event> CpuBackend::record_event() { return std::make_shared<DoneEvent>(); }

// Another backend's event: this stream is the caller's thread, so waiting is blocking.
void CpuBackend::wait_for(std::shared_ptr<Event> event) { event->wait(); }

size_t CpuBackend::free_bytes() const { return SIZE_MAX; }

CpuBackend::~CpuBackend() = default;

std::shared_ptr<DeviceBuffer> CpuBackend::allocate(size_t bytes, const std::string& what) {
  try {
    // Not touched here: a KV cache sized for a long context only takes memory as it fills.
    return std::make_shared<HostBuffer>(bytes);
  } catch (const std::bad_alloc&) {
    fail("{}: cannot allocate {} MiB for {}; lower --ctx or free memory", name_, bytes >> 20, what);
  }
}

void CpuBackend::copy_from_host(void* device_dst, const void* host_src, size_t bytes) {
  std::memcpy(device_dst, host_src, bytes);
}

void CpuBackend::copy_to_host(void* host_dst, const void* device_src, size_t bytes) {
  std::memcpy(host_dst, device_src, bytes);
}

std::shared_ptr<DeviceBuffer> CpuBackend::allocate_host(size_t bytes, const std::string& what) {
  return allocate(bytes, what);
}

void CpuBackend::copy_to_host_async(void* host_dst, const void* device_src, size_t bytes) {
  std::memcpy(host_dst, device_src, bytes);
}

void CpuBackend::copy_from_host_async(void* device_dst, const void* host_src, size_t bytes) {
  std::memcpy(device_dst, host_src, bytes);
}

std::shared_ptr<Event> CpuBackend::host_task(std::function<void()> task) {
  task();
  return std::make_shared<DoneEvent>();
}

bool CpuBackend::can_multiply(DType type) const { return matmul_supports(type); }

void CpuBackend::get_rows(const WeightView& table, const int32_t* ids, int64_t n, float* output) {
  if (is_interleaved(table.type))
    fail("{}: a table stored as {} (16 rows interleaved) cannot be read row by row; `tandem "
         "repack` leaves lookup tables such as token_embd.weight as they are: repack the original "
         "file again",
         name_, dtype_name(table.type));
  for (int64_t i = 0; i < n; ++i) {
    TANDEM_CHECK(ids[i] >= 0 && ids[i] < table.rows);
    const auto* row = static_cast<const uint8_t*>(table.data) + uint64_t(ids[i]) * table.row_bytes;
    dequantize_row(table.type, row, output + i * table.cols, table.cols);
  }
}

cpu::MatmulArgs CpuBackend::matmul_args(const WeightView& w, const float* input, int64_t n_tokens,
                                        float* output, ActivationBits bits, KernelChoice kernels) {
  return {.weight_type = w.type,
          .weights = w.data,
          .rows = w.rows,
          .cols = w.cols,
          .input = input,
          .n_tokens = n_tokens,
          .output = output,
          .precision = bits == ActivationBits::Eight ? ActPrecision::Int8 : ActPrecision::Int16,
          .kernels = kernels};
}

void CpuBackend::matmul(const MatmulOp& op) {
  auto args_of = [&](const WeightView& w, float* output) {
    return matmul_args(w, op.input, op.n_tokens, output, op.activations, op.kernels);
  };
  if (op.second.data) {
    // MatmulOp::second: both products in one parallel job (each as its own matmul computes it;
    // the input's activations prepared once when the two take the same).
    matmul_args_.assign({args_of(op.weight, op.output), args_of(op.second, op.second_output)});
    cpu::matmul_many(matmul_args_, pool_);
  } else {
    cpu::matmul(args_of(op.weight, op.output), pool_);
  }
  if (op.bias)
    for (int64_t t = 0; t < op.n_tokens; ++t)
      add(op.output + t * op.weight.rows, op.bias, op.weight.rows);
}

void CpuBackend::rms_norm(const RmsNormOp& op) {
  if (op.residual) {  // the fused residual add (RmsNormOp::residual), all of it first
    TANDEM_CHECK(op.input == op.residual && op.add);
    for (int64_t r = 0; r < op.n_rows; ++r)
      add(op.residual + r * op.input_stride, op.add + r * op.input_stride, op.dim);
  }
  for (int64_t r = 0; r < op.n_rows; ++r) {
    const float* x = op.input + r * op.input_stride;
    float* y = op.output + r * op.output_stride;
    double sum_sq = 0;
    for (int64_t i = 0; i < op.dim; ++i) sum_sq += double(x[i]) * x[i];
    const float scale = float(1.0 / std::sqrt(sum_sq / double(op.dim) + op.eps));
    for (int64_t i = 0; i < op.dim; ++i) y[i] = x[i] * scale * op.weight[i];
  }
}

void CpuBackend::add(float* y, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += x[i];
}

void CpuBackend::add_parts(float* y, std::span<const float* const> parts, int64_t n) {
  if (parts.empty()) return;
  for (int64_t i = 0; i < n; ++i) {
    float sum = y[i];
    for (const float* part : parts) sum += part[i];
    y[i] = sum;
  }
}

void CpuBackend::zero(float* y, int64_t n) {
  std::fill(y, y + n, 0.0f);
}

void CpuBackend::copy_rows(float* dst, int64_t dst_stride, const float* src, int64_t src_stride,
                           int64_t n_rows, int64_t row_len) {
  for (int64_t r = 0; r < n_rows; ++r)
    std::memcpy(dst + r * dst_stride, src + r * src_stride, size_t(row_len) * sizeof(float));
}

void CpuBackend::kv_store(const KvStoreOp& op) {
  const KvLayerView& c = op.cache;
  const int64_t row = c.row();
  // Latent rows are stored whole; key/value rows from their two halves.
  const int64_t first_part = op.values ? c.k_dims : row;
  TANDEM_CHECK((op.values != nullptr) == (c.k_dims > 0));
  TANDEM_CHECK(can_cache(c.type));
  // F32 values copied, BF16 ones rounded to nearest even.
  auto store = [&](void* dst, int64_t at, const float* src, int64_t n) {
    if (c.type == DType::F32) {
      std::memcpy(static_cast<float*>(dst) + at, src, size_t(n) * sizeof(float));
    } else {
      uint16_t* d = static_cast<uint16_t*>(dst) + at;
      for (int64_t i = 0; i < n; ++i) d[i] = f32_to_bf16(src[i]);
    }
  };
  for (int64_t t = 0; t < op.n_tokens; ++t) {
    TANDEM_CHECK(op.seq_ids[t] >= 0 && op.seq_ids[t] < c.n_seq);
    TANDEM_CHECK(op.positions[t] >= 0 && (c.ring || op.positions[t] < c.n_ctx));
    const int64_t at = (int64_t(op.seq_ids[t]) * c.n_ctx + c.slot(op.positions[t])) * row;
    store(c.data, at, op.rows + t * first_part, first_part);
    if (op.values) store(c.data, at + c.k_dims, op.values + t * c.v_dims, c.v_dims);
  }
}

}  // namespace tandem::cpu
