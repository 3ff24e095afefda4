#pragma once
// The host CPU as a Backend: ops run on the calling thread plus a persistent thread pool, on
// host memory, so weights are used in place from the mmap'd GGUF file.
#include <memory>
#include <vector>

#include "backends/cpu/matmul.h"
#include "core/backend.h"
#include "core/thread_pool.h"

namespace tandem::cpu {

class CpuBackend final : public Backend {
 public:
  // `name` lets a simulated device reuse these ops under its own name.
  // `pin_threads`: see ThreadPool.
  explicit CpuBackend(int n_threads, std::string name = "cpu", bool pin_threads = false);
  ~CpuBackend() override;

  std::string name() const override { return name_; }
  bool uses_host_memory() const override { return true; }
  int n_threads() const { return pool_.size(); }
  ThreadPool& pool() { return pool_; }

  std::shared_ptr<DeviceBuffer> allocate(size_t bytes, const std::string& what) override;
  void copy_from_host(void* device_dst, const void* host_src, size_t bytes) override;
  void copy_to_host(void* host_dst, const void* device_src, size_t bytes) override;
  std::shared_ptr<DeviceBuffer> allocate_host(size_t bytes, const std::string& what) override;
  void copy_to_host_async(void* host_dst, const void* device_src, size_t bytes) override;
  void copy_from_host_async(void* device_dst, const void* host_src, size_t bytes) override;
  // The task runs before the call returns, like every op here.
  std::shared_ptr<Event> host_task(std::function<void()> task) override;
  void synchronize() override {}
  std::shared_ptr<Event> record_event() override;
  void wait_for(std::shared_ptr<Event> event) override;
  size_t free_bytes() const override;
  bool can_multiply(DType type) const override;
  bool can_cache(DType type) const override { return type == DType::F32 || type == DType::BF16; }

  void get_rows(const WeightView& table, const int32_t* ids, int64_t n, float* output) override;
  void matmul(const MatmulOp& op) override;
  void rms_norm(const RmsNormOp& op) override;
  void rope(const RopeOp& op) override;
  void kv_store(const KvStoreOp& op) override;
  void mla_attention(const MlaAttentionOp& op) override;
  void attention(const AttentionOp& op) override;
  void moe_route(const MoeRouteOp& op) override;
  void moe(const MoeOp& op) override;
  void moe_reduce(const MoeReduceOp& op) override;
  void pick_replicas(const ReplicaPickOp& op) override;
  void add(float* y, const float* x, int64_t n) override;
  void add_parts(float* y, std::span<const float* const> parts, int64_t n) override;
  void zero(float* y, int64_t n) override;
  void copy_rows(float* dst, int64_t dst_stride, const float* src, int64_t src_stride,
                 int64_t n_rows, int64_t row_len) override;

 private:
  // cpu::matmul's arguments for the weights `w` (ActivationBits as the op says, mapped to the
  // kernels' precision).
  static cpu::MatmulArgs matmul_args(const WeightView& w, const float* input, int64_t n_tokens,
                                     float* output, ActivationBits bits, KernelChoice kernels);

  std::string name_;
  ThreadPool pool_;
  // Scratch that only grows: ops allocate nothing once the largest batch has been seen.
  std::vector<float> scratch_a_, scratch_b_, scratch_c_, scratch_d_;
  std::vector<int32_t> index_scratch_;
  std::vector<int32_t> first_key_scratch_;  // attention: each token's first key
  std::vector<int32_t> expert_fill_;
  std::vector<MatmulArgs> matmul_args_;
};

// Grows `v` to at least n elements (never shrinks) and returns its data.
float* grow(std::vector<float>& v, size_t n);

}  // namespace tandem::cpu
