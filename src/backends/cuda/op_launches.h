#pragma once
// The kernels of each Backend op, as the CUDA backend enqueues them: CudaBackend's ops are its
// checks, then these. Nothing here touches the GPU but the launches (launch.cuh) and the scratch
// it asks `scratch` for, so under RecordLaunches (launch_record.h), with host memory for scratch,
// these run on any machine and list what the GPU would be asked to do for an op: the host-side
// record of a step's launches (tests/cuda/cuda_launch_test.cpp).
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>

#include "core/backend.h"

namespace tandem::blocks {
struct ActQ8;  // quant/block_dot_q8.h
}  // namespace tandem::blocks

namespace tandem::cuda {

// The kernels' own scratch (CudaBackend keeps each in device memory, grown on demand, zeroed
// when allocated).
enum class Scratch {
  QueryLatent,
  OutputLatent,
  AttentionSplits,
  Order,
  ExpertOf,
  Counters,
  TileFirst,
  TileCount,
  Gate,
  Up,
  Act,
  InputQ8,
  ActQ8,
  RouteDone,  // router_then_route's counter: 0 when allocated, left 0
  Count
};
using ScratchFn = std::function<void*(Scratch which, size_t bytes)>;

class OpLaunches {
 public:
  OpLaunches(cudaStream_t stream, ScratchFn scratch)
      : stream_(stream), scratch_(std::move(scratch)) {}

  void get_rows(const WeightView& table, const int32_t* ids, int64_t n, float* output);
  void matmul(const MatmulOp& op);
  void rms_norm(const RmsNormOp& op);
  void rope(const RopeOp& op);
  void kv_store(const KvStoreOp& op);
  void store_latent(const LatentStoreOp& op);
  void mla_attention(const MlaAttentionOp& op);
  void attention(const AttentionOp& op);
  void moe_route(const MoeRouteOp& op);
  void moe(const MoeOp& op);
  void moe_reduce(const MoeReduceOp& op);
  void pick_replicas(const ReplicaPickOp& op);
  void add(float* y, const float* x, int64_t n);
  void add_parts(float* y, std::span<const float* const> parts, int64_t n);
  void zero(float* y, int64_t n);
  void copy_rows(float* dst, int64_t dst_stride, const float* src, int64_t src_stride,
                 int64_t n_rows, int64_t row_len);

 private:
  template <class T>
  T* scratch(Scratch which, int64_t n) {
    return static_cast<T*>(scratch_(which, size_t(n) * sizeof(T)));
  }
  // The experts' quantized input (Scratch::InputQ8) for `n` floats.
  blocks::ActQ8* input_q8(int64_t n);
  cudaStream_t stream_;
  ScratchFn scratch_;
  // What the last moe_route quantized into input_q8 (MoeRouteOp::prepare_experts_input), for the
  // moe after it; null when nothing is.
  const float* prepared_input_ = nullptr;
  int64_t prepared_floats_ = 0;
};

}  // namespace tandem::cuda
