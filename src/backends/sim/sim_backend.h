#pragma once
// A simulated device computed on the CPU. It behaves like a GPU where that matters for the
// executor: its own memory budget (allocations beyond it fail like an out-of-memory GPU),
// its own stream (a worker thread that runs ops in submission order while the host goes on),
// explicit copies in and out, host tasks on a thread of their own (as cudaLaunchHostFunc on a
// side stream), and graphs: a captured step is a list of the submitted ops, replayed as a
// whole, so host code that ran at capture time does not run again — exactly the mistake a CUDA
// graph punishes. Waiting on the host while capturing fails loudly instead of hanging.
// Multi-device plans run on machines without GPUs this way, and must give results
// bit-identical to a single-CPU run.
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "core/backend.h"

namespace tandem::sim {

class SimBackend final : public Backend {
 public:
  // `memory_bytes`: the device's budget. `n_threads`: CPU threads its kernels use.
  // `interleaved_formats` false: like a GPU, it multiplies only GGUF's own layouts, not the
  // CPU-only interleaved ones of `tandem repack` (the loader takes those apart for it).
  SimBackend(int index, size_t memory_bytes, int n_threads = 1, bool interleaved_formats = true);
  ~SimBackend() override;

  std::string name() const override { return name_; }
  bool uses_host_memory() const override { return false; }
  size_t memory_bytes() const { return memory_bytes_; }
  size_t used_bytes() const;

  std::shared_ptr<DeviceBuffer> allocate(size_t bytes, const std::string& what) override;
  void copy_from_host(void* device_dst, const void* host_src, size_t bytes) override;
  void copy_to_host(void* host_dst, const void* device_src, size_t bytes) override;
  // Another rank's sim device: a stand-in for NCCL between GPUs, so that runs over ranks on
  // machines without GPUs take the path GPU buffers take (the bytes go through host memory).
  RankChannelEnd rank_channel_end() const override;
  std::unique_ptr<RankChannel> open_rank_channel(Transport& host, int32_t peer, bool sends,
                                                 std::string_view what) override;
  std::shared_ptr<DeviceBuffer> allocate_host(size_t bytes, const std::string& what) override;
  void copy_to_host_async(void* host_dst, const void* device_src, size_t bytes) override;
  void copy_from_host_async(void* device_dst, const void* host_src, size_t bytes) override;
  std::shared_ptr<Event> host_task(std::function<void()> task) override;
  // Waits for the stream and the host tasks.
  void synchronize() override;
  std::shared_ptr<Event> record_event() override;
  void wait_for(std::shared_ptr<Event> event) override;
  size_t free_bytes() const override;
  bool can_multiply(DType type) const override;
  bool can_cache(DType type) const override { return type == DType::F32 || type == DType::BF16; }

  bool can_capture() const override { return true; }
  void begin_capture() override;
  std::unique_ptr<Graph> end_capture() override;
  void replay(Graph& graph) override;

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
  struct Budget;
  class SimEvent;
  // Work of a lane; `always` runs even after an earlier op failed (event completions, so that
  // nothing waiting on this device hangs: the failure is reported by synchronize()).
  struct Work {
    std::function<void()> run;
    bool always = false;
  };
  // A queue drained in order by one thread: the stream's worker, or the host-task thread.
  struct Lane {
    std::deque<Work> queue;
    bool busy = false;
    bool stop = false;  // leave once the queue is empty
    std::thread thread;
  };
  void submit(std::function<void()> work, bool always = false);
  bool failed();
  void run_lane(Lane& lane);
  void check_not_capturing(const char* what) const;
  std::shared_ptr<SimEvent> new_event();

  std::string name_;
  size_t memory_bytes_;
  bool interleaved_formats_;
  std::shared_ptr<Budget> budget_;
  cpu::CpuBackend compute_;  // the kernels, run on the worker thread only

  std::mutex mutex_;
  std::condition_variable work_ready_, work_done_;
  Lane stream_, host_tasks_;
  std::exception_ptr error_;  // first failure of an op or task, rethrown by synchronize()
  // Capture: submitted ops are recorded instead of run, with the events they complete.
  bool capturing_ = false;
  std::vector<Work> captured_;
  std::vector<std::shared_ptr<SimEvent>> captured_events_;
};

}  // namespace tandem::sim
