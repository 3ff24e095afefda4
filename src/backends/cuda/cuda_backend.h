#pragma once
// An NVIDIA GPU as a Backend (core/backend.h): ops are kernels enqueued on one stream of the
// device (the launchers in kernels.h), weights live in device memory in their GGUF formats,
// events are CUDA events, host tasks are cudaLaunchHostFunc on a second stream (so the CPU's
// share of a step runs while this stream goes on), and graphs are CUDA graphs captured from the
// stream. Built only with a CUDA toolkit; the rest of tandem reaches it through cuda_devices.h.
#include <cuda_runtime_api.h>

#include <atomic>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "backends/cuda/op_launches.h"
#include "core/backend.h"

namespace tandem::cuda {

class CudaBackend final : public Backend {
 public:
  // Throws tandem::Error when the device cannot be used (index out of range, no driver).
  explicit CudaBackend(int device);
  ~CudaBackend() override;
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  std::string name() const override { return name_; }
  bool uses_host_memory() const override { return false; }
  int device() const { return device_; }
  cudaStream_t stream() const { return stream_; }

  std::shared_ptr<DeviceBuffer> allocate(size_t bytes, const std::string& what) override;
  // Large copies go through two page-locked staging buffers in turn, so that reading the source
  // (pages of the mmap'd model coming from disk) overlaps the DMA of the previous piece.
  void copy_from_host(void* device_dst, const void* host_src, size_t bytes) override;
  void copy_to_host(void* host_dst, const void* device_src, size_t bytes) override;
  // Another GPU's memory: cudaMemcpyPeerAsync (direct over NVLink/PCIe where the two can reach
  // each other, staged by the driver otherwise), ordered by events on both streams.
  bool copy_from_peer(Backend& from, void* device_dst, const void* peer_src, size_t bytes) override;
  bool copy_to_peer(Backend& to, void* peer_dst, const void* src, size_t bytes) override;
  // Another rank's GPU: NCCL (nccl_rank_channel.cpp) where libnccl.so.2 loads, each channel
  // a communicator of the two GPUs.
  RankChannelEnd rank_channel_end() const override;
  std::unique_ptr<RankChannel> open_rank_channel(Transport& host, int32_t peer, bool sends,
                                                 std::string_view what) override;
  std::shared_ptr<DeviceBuffer> allocate_host(size_t bytes, const std::string& what) override;
  void copy_to_host_async(void* host_dst, const void* device_src, size_t bytes) override;
  void copy_from_host_async(void* device_dst, const void* host_src, size_t bytes) override;
  // On a copy stream of its own, so that a streamed expert's copy overlaps the product before
  // it; refused inside a capture (not yet run on a GPU).
  void upload_weights(void* device_dst, const void* host_src, size_t bytes,
                      std::shared_ptr<Event> after) override;
  std::shared_ptr<Event> host_task(std::function<void()> task) override;
  void synchronize() override;
  void set_spin_waits(bool spin) override { spin_waits_ = spin; }
  std::shared_ptr<Event> record_event() override;
  void wait_for(std::shared_ptr<Event> event) override;
  size_t free_bytes() const override;
  bool can_multiply(DType type) const override;

  bool can_capture() const override { return true; }
  void begin_capture() override;
  std::unique_ptr<Graph> end_capture() override;
  void replay(Graph& graph) override;

  void get_rows(const WeightView& table, const int32_t* ids, int64_t n, float* output) override;
  void matmul(const MatmulOp& op) override;
  void rms_norm(const RmsNormOp& op) override;
  void rope(const RopeOp& op) override;
  void kv_store(const KvStoreOp& op) override;
  void store_latent(const LatentStoreOp& op) override;  // one launch (Backend's: three or four)
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

  // Called by a host task that threw; synchronize() rethrows the first.
  void record_task_error(std::exception_ptr error);

 private:
  struct HostTask;
  // Kernels' own scratch (op_launches.h), grown on demand and never inside a capture (the
  // executor runs a step's shape once op by op before capturing it).
  void* scratch(Scratch which, size_t bytes);
  void activate() const;  // makes this device current for the calling thread
  void rethrow_task_error();
  void check_columns(const WeightView& w, const char* what) const;
  void check_cache(const KvLayerView& cache) const;
  void check_not_capturing(const char* what) const;
  void synchronous_copy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind);

  int device_;
  std::string name_;
  cudaStream_t stream_ = nullptr;  // every op
  cudaStream_t side_ = nullptr;    // host tasks, forked from and joined back into stream_
  cudaStream_t copy_ = nullptr;    // upload_weights, made on first use
  cudaEvent_t uploaded_ = nullptr;  // the last upload's end, which stream_ waits for
  bool capturing_ = false;
  bool spin_waits_ = false;  // synchronize() polls instead of sleeping (set_spin_waits)
  std::shared_ptr<DeviceBuffer> scratch_[size_t(Scratch::Count)];
  std::unique_ptr<OpLaunches> ops_;  // every op's kernels, on stream_
  // Host tasks submitted since the last synchronize (freed there) or during a capture (owned by
  // the graph: its host nodes call them at every replay).
  std::vector<std::unique_ptr<HostTask>> pending_tasks_, captured_tasks_;
  std::mutex error_mutex_;
  std::exception_ptr task_error_;
  std::atomic<bool> task_failed_{false};
  // copy_from_host's staging: two page-locked buffers and the events of their last copies.
  std::shared_ptr<DeviceBuffer> staging_[2];
  cudaEvent_t staging_done_[2] = {nullptr, nullptr};
  std::mutex peer_mutex_;
  void enable_peer_access(int peer_device);
  std::vector<int> peers_enabled_;  // devices whose memory this one was given access to (or asked)
};

}  // namespace tandem::cuda
