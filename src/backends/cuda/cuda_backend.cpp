#include "backends/cuda/cuda_backend.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/kernels.h"
#include "core/aligned_buffer.h"
#include "core/error.h"
#include "core/progress.h"

namespace tandem::cuda {

void cuda_failed(cudaError_t error, const char* call, const char* file, int line) {
  (void)cudaGetLastError();  // a sticky launch error would fail every later call too
  fail("CUDA error {} ({}) in {} at {}:{}", cudaGetErrorName(error), cudaGetErrorString(error),
       call, file, line);
}

namespace {

// What a step may still need beyond the planner's buffers: kernels' scratch and the allocator's
// rounding. free_bytes() keeps it out of what it offers.
constexpr size_t kScratchReserveBytes = size_t(256) << 20;

constexpr size_t kStagingBytes = size_t(32) << 20;
// Below this a synchronous copy goes straight from pageable memory (the driver stages it).
constexpr size_t kDirectCopyBytes = size_t(4) << 20;

class CudaBuffer final : public DeviceBuffer {
 public:
  CudaBuffer(int device, void* data, size_t bytes) : device_(device), data_(data), bytes_(bytes) {}
  ~CudaBuffer() override {
    cudaSetDevice(device_);
    cudaFree(data_);  // errors here have nowhere to go; a failed free leaks, nothing worse
  }
  void* data() override { return data_; }
  size_t size() const override { return bytes_; }

 private:
  int device_;
  void* data_;
  size_t bytes_;
};

// Host memory on 2 MiB pages (core/aligned_buffer.h), page-locked for the device's DMA.
class PinnedBuffer final : public DeviceBuffer {
 public:
  PinnedBuffer(size_t bytes, const std::string& device, const std::string& what) : buffer_(bytes) {
    const cudaError_t error = cudaHostRegister(buffer_.data(), bytes, cudaHostRegisterPortable);
    if (error != cudaSuccess) {
      (void)cudaGetLastError();
      fail(
          "{}: cannot page-lock {} of host memory for {} ({}); raise the locked-memory limit "
          "(`ulimit -l unlimited`) or free memory",
          device, format_bytes(bytes), what, cudaGetErrorString(error));
    }
  }
  ~PinnedBuffer() override { cudaHostUnregister(buffer_.data()); }
  void* data() override { return buffer_.data(); }
  size_t size() const override { return buffer_.size(); }

 private:
  AlignedBuffer buffer_;
};

class CudaEvent final : public Event {
 public:
  explicit CudaEvent(int device) : device_(device) {
    TANDEM_CUDA_CHECK(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming));
  }
  ~CudaEvent() override {
    cudaSetDevice(device_);
    cudaEventDestroy(event_);
  }
  void wait() override { TANDEM_CUDA_CHECK(cudaEventSynchronize(event_)); }
  cudaEvent_t get() const { return event_; }

 private:
  int device_;
  cudaEvent_t event_ = nullptr;
};

class CudaGraph final : public Graph {
 public:
  cudaGraphExec_t exec = nullptr;
  // What the graph's nodes point at: its host tasks, and the kernels' scratch as it was when
  // captured (a later step may grow the backend's scratch; the graph keeps using its own).
  std::vector<std::shared_ptr<void>> keep_alive;
  int device = 0;
  ~CudaGraph() override {
    cudaSetDevice(device);
    if (exec) cudaGraphExecDestroy(exec);
  }
};

}  // namespace

struct CudaBackend::HostTask {
  std::function<void()> run;
  CudaBackend* backend;
  std::shared_ptr<Event> done;  // recorded on the side stream after the task
  static void CUDART_CB call(void* self) {
    auto* task = static_cast<HostTask*>(self);
    try {
      task->run();
    } catch (...) {
      task->backend->record_task_error(std::current_exception());
    }
  }
};

CudaBackend::CudaBackend(int device) : device_(device), name_(fmt::format("cuda:{}", device)) {
  int count = 0;
  const cudaError_t error = cudaGetDeviceCount(&count);
  if (error != cudaSuccess) {
    (void)cudaGetLastError();
    fail("{}: no usable CUDA device ({}); check the NVIDIA driver (`nvidia-smi`)", name_,
         cudaGetErrorString(error));
  }
  if (device < 0 || device >= count)
    fail("{}: this machine has {} CUDA device{}", name_, count, count == 1 ? "" : "s");
  activate();
  // A thread waiting for the GPU sleeps instead of spinning: in a hybrid step the CPU's experts
  // run on every core (a host task) while the executor waits for the step, and a spinning waiter
  // takes a core from the thread pool, whose every job then waits for the descheduled thread.
  // (The H200 run: hybrid decode at 16 t/s where 78 were predicted, ~2.3 ms a layer, the order of
  // a scheduler time slice; not yet measured with this flag.) A refusal leaves the default.
  // Plans that give the host nothing to do during a step ask for polling (set_spin_waits).
  if (cudaSetDeviceFlags(cudaDeviceScheduleBlockingSync) != cudaSuccess) (void)cudaGetLastError();
  TANDEM_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  if (const cudaError_t error = cudaStreamCreateWithFlags(&side_, cudaStreamNonBlocking);
      error != cudaSuccess) {
    cudaStreamDestroy(stream_);
    cuda_failed(error, "cudaStreamCreateWithFlags", __FILE__, __LINE__);
  }
  ops_ = std::make_unique<OpLaunches>(
      stream_, [this](Scratch which, size_t bytes) { return scratch(which, bytes); });
}

// Nothing here may throw: after a sticky device error every call fails, and the backend must
// still go away.
CudaBackend::~CudaBackend() {
  cudaSetDevice(device_);
  cudaStreamSynchronize(stream_);
  cudaStreamSynchronize(side_);
  pending_tasks_.clear();
  for (cudaEvent_t& e : staging_done_)
    if (e) cudaEventDestroy(e);
  for (auto& s : scratch_) s.reset();
  if (copy_) cudaStreamSynchronize(copy_), cudaStreamDestroy(copy_);
  if (uploaded_) cudaEventDestroy(uploaded_);
  cudaStreamDestroy(side_);
  cudaStreamDestroy(stream_);
}

void CudaBackend::activate() const {
  TANDEM_CUDA_CHECK(cudaSetDevice(device_));
}

void CudaBackend::check_not_capturing(const char* what) const {
  if (capturing_)
    fail(
        "{}: {} while capturing a graph; this is a bug in tandem's executor (every buffer of a "
        "step is sized by running its shape once before capturing it)",
        name_, what);
}

void CudaBackend::record_task_error(std::exception_ptr error) {
  std::lock_guard lock(error_mutex_);
  if (!task_error_) task_error_ = error;
  task_failed_.store(true, std::memory_order_release);
}

std::shared_ptr<DeviceBuffer> CudaBackend::allocate(size_t bytes, const std::string& what) {
  check_not_capturing("allocate");
  activate();
  void* data = nullptr;
  const cudaError_t error = cudaMalloc(&data, std::max<size_t>(bytes, 1));
  if (error != cudaSuccess) {
    (void)cudaGetLastError();
    size_t free = 0, total = 0;
    cudaMemGetInfo(&free, &total);
    fail(
        "{}: out of memory: {} requested for {}, {} free of {} ({}); plan with less on this GPU "
        "(`tandem plan`, --ctx, --parallel) or leave it to the CPU",
        name_, format_bytes(bytes), what, format_bytes(free), format_bytes(total),
        cudaGetErrorString(error));
  }
  return std::make_shared<CudaBuffer>(device_, data, bytes);
}

std::shared_ptr<DeviceBuffer> CudaBackend::allocate_host(size_t bytes, const std::string& what) {
  check_not_capturing("allocate_host");
  activate();
  return std::make_shared<PinnedBuffer>(std::max<size_t>(bytes, 1), name_, what);
}

void* CudaBackend::scratch(Scratch which, size_t bytes) {
  std::shared_ptr<DeviceBuffer>& buffer = scratch_[size_t(which)];
  if (!buffer || buffer->size() < bytes) {
    if (capturing_)
      fail(
          "{}: a kernel's scratch grew while capturing a graph; this is a bug in tandem's executor",
          name_);
    buffer.reset();
    buffer = allocate(std::max<size_t>(bytes, 256), "kernel scratch");
    // Counters start at 0 (Scratch); never inside a capture (refused above).
    TANDEM_CUDA_CHECK(cudaMemsetAsync(buffer->data(), 0, buffer->size(), stream_));
  }
  return buffer->data();
}

void CudaBackend::synchronous_copy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
  check_not_capturing(kind == cudaMemcpyHostToDevice ? "copy_from_host" : "copy_to_host");
  activate();
  TANDEM_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, kind, stream_));
  TANDEM_CUDA_CHECK(cudaStreamSynchronize(stream_));
  rethrow_task_error();  // a result that came back after a failed host task is not to be used
}

void CudaBackend::copy_from_host(void* device_dst, const void* host_src, size_t bytes) {
  if (bytes <= kDirectCopyBytes)
    return synchronous_copy(device_dst, host_src, bytes, cudaMemcpyHostToDevice);
  check_not_capturing("copy_from_host");
  activate();
  for (int i = 0; i < 2; ++i) {
    if (!staging_[i]) staging_[i] = allocate_host(kStagingBytes, "upload staging");
    if (!staging_done_[i])
      TANDEM_CUDA_CHECK(cudaEventCreateWithFlags(&staging_done_[i], cudaEventDisableTiming));
  }
  const auto* src = static_cast<const uint8_t*>(host_src);
  auto* dst = static_cast<uint8_t*>(device_dst);
  for (size_t offset = 0, piece = 0; offset < bytes; offset += kStagingBytes, ++piece) {
    const int i = int(piece % 2);
    const size_t n = std::min(kStagingBytes, bytes - offset);
    if (piece >= 2)
      TANDEM_CUDA_CHECK(cudaEventSynchronize(staging_done_[i]));  // its last DMA is done
    std::memcpy(staging_[i]->data(), src + offset,
                n);  // reads the source while the other piece flies
    TANDEM_CUDA_CHECK(
        cudaMemcpyAsync(dst + offset, staging_[i]->data(), n, cudaMemcpyHostToDevice, stream_));
    TANDEM_CUDA_CHECK(cudaEventRecord(staging_done_[i], stream_));
  }
  TANDEM_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void CudaBackend::copy_to_host(void* host_dst, const void* device_src, size_t bytes) {
  synchronous_copy(host_dst, device_src, bytes, cudaMemcpyDeviceToHost);
}

bool CudaBackend::copy_from_peer(Backend& from, void* device_dst, const void* peer_src,
                                 size_t bytes) {
  auto* peer = dynamic_cast<CudaBackend*>(&from);
  if (!peer) return false;
  if (peer == this) {
    activate();
    TANDEM_CUDA_CHECK(
        cudaMemcpyAsync(device_dst, peer_src, bytes, cudaMemcpyDeviceToDevice, stream_));
    return true;
  }
  enable_peer_access(peer->device_);
  wait_for(from.record_event());  // the source is written
  activate();
  TANDEM_CUDA_CHECK(
      cudaMemcpyPeerAsync(device_dst, device_, peer_src, peer->device_, bytes, stream_));
  from.wait_for(record_event());  // the source is not overwritten before it is read
  return true;
}

bool CudaBackend::copy_to_peer(Backend& to, void* peer_dst, const void* src, size_t bytes) {
  auto* peer = dynamic_cast<CudaBackend*>(&to);
  if (!peer) return false;
  if (peer == this) return copy_from_peer(*this, peer_dst, src, bytes);
  enable_peer_access(peer->device_);
  wait_for(to.record_event());  // the destination is no longer read by what came before
  activate();
  TANDEM_CUDA_CHECK(cudaMemcpyPeerAsync(peer_dst, peer->device_, src, device_, bytes, stream_));
  to.wait_for(record_event());  // the receiver's later ops see the copy
  return true;
}

// Direct access where the hardware allows it, asked for once per pair.
void CudaBackend::enable_peer_access(int peer_device) {
  std::lock_guard lock(peer_mutex_);
  if (std::find(peers_enabled_.begin(), peers_enabled_.end(), peer_device) != peers_enabled_.end())
    return;
  int can = 0;
  activate();
  // Refused (already on, too many peers): the driver stages the copies through the host.
  if (cudaDeviceCanAccessPeer(&can, device_, peer_device) == cudaSuccess && can)
    (void)cudaDeviceEnablePeerAccess(peer_device, 0);
  (void)cudaGetLastError();
  peers_enabled_.push_back(peer_device);
}

void CudaBackend::upload_weights(void* device_dst, const void* host_src, size_t bytes,
                                 std::shared_ptr<Event> after) {
  check_not_capturing("upload_weights");  // a graph cannot copy from pageable memory
  activate();
  if (!copy_) {
    TANDEM_CUDA_CHECK(cudaStreamCreateWithFlags(&copy_, cudaStreamNonBlocking));
    TANDEM_CUDA_CHECK(cudaEventCreateWithFlags(&uploaded_, cudaEventDisableTiming));
  }
  if (after) {
    if (const auto* event = dynamic_cast<const CudaEvent*>(after.get()))
      TANDEM_CUDA_CHECK(cudaStreamWaitEvent(copy_, event->get(), 0));
    else
      after->wait();  // another kind of device's event: the host waits for it
  }
  // Weights in pageable memory: the driver stages them through its own page-locked buffers,
  // holding this thread until the lane reaches the copy (after `after`) and the bytes are
  // staged; the DMA then runs beside stream_, so the GPU computes the group before meanwhile.
  TANDEM_CUDA_CHECK(cudaMemcpyAsync(device_dst, host_src, bytes, cudaMemcpyHostToDevice, copy_));
  TANDEM_CUDA_CHECK(cudaEventRecord(uploaded_, copy_));
  TANDEM_CUDA_CHECK(cudaStreamWaitEvent(stream_, uploaded_, 0));
}

void CudaBackend::copy_to_host_async(void* host_dst, const void* device_src, size_t bytes) {
  activate();
  TANDEM_CUDA_CHECK(cudaMemcpyAsync(host_dst, device_src, bytes, cudaMemcpyDeviceToHost, stream_));
}

void CudaBackend::copy_from_host_async(void* device_dst, const void* host_src, size_t bytes) {
  activate();
  TANDEM_CUDA_CHECK(cudaMemcpyAsync(device_dst, host_src, bytes, cudaMemcpyHostToDevice, stream_));
}

// The side stream waits for everything before the task, runs it as a host function, and records
// the event the caller joins on later; the main stream goes on meanwhile. Under capture the
// fork, the host node and the join become part of the graph.
std::shared_ptr<Event> CudaBackend::host_task(std::function<void()> task) {
  activate();
  rethrow_task_error();
  // Tasks that have run are let go here too: a device that is never synchronized (a layer
  // device beside the head's) would otherwise keep every one.
  while (!capturing_ && !pending_tasks_.empty()) {
    const cudaError_t state =
        cudaEventQuery(static_cast<CudaEvent&>(*pending_tasks_.front()->done).get());
    if (state == cudaErrorNotReady) break;
    if (state != cudaSuccess) cuda_failed(state, "cudaEventQuery", __FILE__, __LINE__);
    pending_tasks_.erase(pending_tasks_.begin());
  }
  auto fork = std::make_shared<CudaEvent>(device_);
  auto done = std::make_shared<CudaEvent>(device_);
  TANDEM_CUDA_CHECK(cudaEventRecord(fork->get(), stream_));
  TANDEM_CUDA_CHECK(cudaStreamWaitEvent(side_, fork->get(), 0));
  auto& tasks = capturing_ ? captured_tasks_ : pending_tasks_;
  tasks.push_back(std::make_unique<HostTask>(HostTask{std::move(task), this, done}));
  // Owned by the list before the driver holds a pointer to it; dropped again if the launch fails.
  if (const cudaError_t error = cudaLaunchHostFunc(side_, &HostTask::call, tasks.back().get());
      error != cudaSuccess) {
    tasks.pop_back();
    cuda_failed(error, "cudaLaunchHostFunc", __FILE__, __LINE__);
  }
  TANDEM_CUDA_CHECK(cudaEventRecord(done->get(), side_));
  return done;
}

void CudaBackend::rethrow_task_error() {
  if (!task_failed_.load(std::memory_order_acquire)) return;
  std::exception_ptr error;
  {
    std::lock_guard lock(error_mutex_);
    error = std::exchange(task_error_, nullptr);
    task_failed_.store(false, std::memory_order_release);
  }
  if (error) std::rethrow_exception(error);
}

void CudaBackend::synchronize() {
  check_not_capturing("synchronize");
  activate();
  for (cudaStream_t stream : {stream_, side_}) {
    if (spin_waits_) {  // polled: no wake-up latency, a core kept busy (nothing else wants it)
      cudaError_t state;
      while ((state = cudaStreamQuery(stream)) == cudaErrorNotReady) {
      }
      TANDEM_CUDA_CHECK(state);
    } else {
      TANDEM_CUDA_CHECK(cudaStreamSynchronize(stream));
    }
  }
  pending_tasks_.clear();
  rethrow_task_error();
}

std::shared_ptr<Event> CudaBackend::record_event() {
  activate();
  auto event = std::make_shared<CudaEvent>(device_);
  TANDEM_CUDA_CHECK(cudaEventRecord(event->get(), stream_));
  return event;
}

void CudaBackend::wait_for(std::shared_ptr<Event> event) {
  activate();
  if (auto* cuda_event = dynamic_cast<CudaEvent*>(event.get())) {
    TANDEM_CUDA_CHECK(cudaStreamWaitEvent(stream_, cuda_event->get(), 0));
    return;
  }
  // Another kind of device: its work is on the host's side, so the host waits for it.
  check_not_capturing("waiting for another device's event");
  event->wait();
}

size_t CudaBackend::free_bytes() const {
  activate();
  size_t free = 0, total = 0;
  TANDEM_CUDA_CHECK(cudaMemGetInfo(&free, &total));
  return free > kScratchReserveBytes ? free - kScratchReserveBytes : 0;
}

bool CudaBackend::can_multiply(DType type) const {
  return matmul_supports(type);
}

void CudaBackend::begin_capture() {
  check_not_capturing("begin_capture");
  activate();
  captured_tasks_.clear();
  TANDEM_CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
  capturing_ = true;
}

std::unique_ptr<Graph> CudaBackend::end_capture() {
  TANDEM_CHECK(capturing_);
  activate();
  capturing_ = false;
  // A host task nobody waited for left the side stream forked; joined here, as a capture must be.
  if (!captured_tasks_.empty()) {
    CudaEvent joined(device_);
    TANDEM_CUDA_CHECK(cudaEventRecord(joined.get(), side_));
    TANDEM_CUDA_CHECK(cudaStreamWaitEvent(stream_, joined.get(), 0));
  }
  cudaGraph_t graph = nullptr;
  TANDEM_CUDA_CHECK(cudaStreamEndCapture(stream_, &graph));
  auto result = std::make_unique<CudaGraph>();
  result->device = device_;
  const cudaError_t error = cudaGraphInstantiate(&result->exec, graph, 0);
  cudaGraphDestroy(graph);
  if (error != cudaSuccess) cuda_failed(error, "cudaGraphInstantiate", __FILE__, __LINE__);
  for (auto& task : captured_tasks_) result->keep_alive.emplace_back(std::move(task));
  captured_tasks_.clear();
  for (const auto& buffer : scratch_)
    if (buffer) result->keep_alive.push_back(buffer);
  return result;
}

void CudaBackend::replay(Graph& graph) {
  check_not_capturing("replay");
  activate();
  TANDEM_CUDA_CHECK(cudaGraphLaunch(dynamic_cast<CudaGraph&>(graph).exec, stream_));
}

// ---- ops ----

// Each op: its checks, then its kernels (op_launches.cpp) on this device.
void CudaBackend::get_rows(const WeightView& table, const int32_t* ids, int64_t n, float* output) {
  activate();
  ops_->get_rows(table, ids, n, output);
}

void CudaBackend::check_columns(const WeightView& w, const char* what) const {
  if (w.cols % 8 != 0)
    fail(
        "{}: {} with rows of {} elements: the GPU kernels take rows of a multiple of 8; keep this "
        "weight on the CPU (--rules)",
        name_, what, w.cols);
}

void CudaBackend::matmul(const MatmulOp& op) {
  if (op.n_tokens == 0) return;
  check_columns(op.weight, "a matrix");
  if (op.second.data) check_columns(op.second, "a matrix");
  activate();
  ops_->matmul(op);
}

void CudaBackend::rms_norm(const RmsNormOp& op) {
  TANDEM_CHECK(!op.residual || (op.input == op.residual && op.add));
  activate();
  ops_->rms_norm(op);
}

void CudaBackend::rope(const RopeOp& op) {
  activate();
  ops_->rope(op);
}

void CudaBackend::check_cache(const KvLayerView& cache) const {
  if (!can_cache(cache.type))
    fail("{}: the CUDA backend keeps its KV cache in F32 (--cache-type-k/v bf16 is CPU-only)",
         name_);
}

void CudaBackend::kv_store(const KvStoreOp& op) {
  check_cache(op.cache);
  activate();
  ops_->kv_store(op);
}

void CudaBackend::store_latent(const LatentStoreOp& op) {
  check_cache(op.cache);
  TANDEM_CHECK(op.cache.k_dims == 0 && op.cache.kv_lora_rank == op.norm_dims &&
               op.cache.rope_dims == op.rope.rope_dims);
  TANDEM_CHECK(!op.query_lora || (op.query_lora_norm && op.query_lora_dims > 0));
  activate();
  ops_->store_latent(op);
}

void CudaBackend::mla_attention(const MlaAttentionOp& op) {
  if (op.n_tokens == 0) return;
  check_columns(op.k_b, "attn_k_b");
  check_columns(op.v_b, "attn_v_b");
  TANDEM_CHECK(!op.rotate_queries || op.rope.rope_dims == op.cache.rope_dims);
  activate();
  ops_->mla_attention(op);
}

void CudaBackend::attention(const AttentionOp& op) {
  activate();
  ops_->attention(op);
}

void CudaBackend::moe_route(const MoeRouteOp& op) {
  if (op.router.data) check_columns(op.router, "a router");
  activate();
  ops_->moe_route(op);
}

void CudaBackend::moe(const MoeOp& op) {
  if (op.n_tokens * op.top_k == 0) return;
  auto check_ffn = [&](const WeightView& gate, const WeightView& up, const WeightView& down) {
    check_columns(gate, "an expert's gate");
    check_columns(down, "an expert's down projection");
    if (gate.type != up.type)
      fail(
          "{}: expert gate and up matrices stored in different formats ({} and {}) are not "
          "supported on GPUs yet; keep these experts on the CPU (--rules) or requantize them "
          "alike",
          name_, dtype_name(gate.type), dtype_name(up.type));
  };
  check_ffn(op.gate, op.up, op.down);
  if (op.shared.gate.data) check_ffn(op.shared.gate, op.shared.up, op.shared.down);
  activate();
  ops_->moe(op);
}

void CudaBackend::moe_reduce(const MoeReduceOp& op) {
  TANDEM_CHECK((!op.shared && !op.norm_weight) || op.residual);
  TANDEM_CHECK(!op.norm_weight || op.norm_output);
  activate();
  ops_->moe_reduce(op);
}

void CudaBackend::pick_replicas(const ReplicaPickOp& op) {
  activate();
  ops_->pick_replicas(op);
}

void CudaBackend::add(float* y, const float* x, int64_t n) {
  activate();
  ops_->add(y, x, n);
}

void CudaBackend::add_parts(float* y, std::span<const float* const> parts, int64_t n) {
  activate();
  ops_->add_parts(y, parts, n);
}

void CudaBackend::zero(float* y, int64_t n) {
  activate();
  ops_->zero(y, n);
}

void CudaBackend::copy_rows(float* dst, int64_t dst_stride, const float* src, int64_t src_stride,
                            int64_t n_rows, int64_t row_len) {
  activate();
  ops_->copy_rows(dst, dst_stride, src, src_stride, n_rows, row_len);
}

}  // namespace tandem::cuda
