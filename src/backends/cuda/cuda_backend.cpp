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

// From this many tokens on, ByTokenCount takes the tensor-core tiles: below it the rows kernel
// reads each weight once per 8 tokens, above it a 64-token tile reads it once for all of them.
// A first guess until a GPU measures the crossing (matmul_bench on the device).
constexpr int64_t kTiledMinTokens = 16;

// What a step may still need beyond the planner's buffers: kernels' scratch and the allocator's
// rounding. free_bytes() keeps it out of what it offers.
constexpr size_t kScratchReserveBytes = size_t(256) << 20;

constexpr size_t kActQ8Bytes = 40;  // sizeof(blocks::ActQ8): one block of 32 activations

constexpr size_t kStagingBytes = size_t(32) << 20;
// Below this a synchronous copy goes straight from pageable memory (the driver stages it).
constexpr size_t kDirectCopyBytes = size_t(4) << 20;

bool tiled(KernelChoice kernels, int64_t n_tokens) {
  switch (kernels) {
    case KernelChoice::PerToken:
      return false;
    case KernelChoice::Tiled:
      return true;
    case KernelChoice::ByTokenCount:
      return n_tokens >= kTiledMinTokens;
  }
  return false;
}

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
  if (cudaSetDeviceFlags(cudaDeviceScheduleBlockingSync) != cudaSuccess) (void)cudaGetLastError();
  TANDEM_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  if (const cudaError_t error = cudaStreamCreateWithFlags(&side_, cudaStreamNonBlocking);
      error != cudaSuccess) {
    cudaStreamDestroy(stream_);
    cuda_failed(error, "cudaStreamCreateWithFlags", __FILE__, __LINE__);
  }
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
  std::shared_ptr<DeviceBuffer>& buffer = scratch_[which];
  if (!buffer || buffer->size() < bytes) {
    if (capturing_)
      fail(
          "{}: a kernel's scratch grew while capturing a graph; this is a bug in tandem's executor",
          name_);
    buffer.reset();
    buffer = allocate(std::max<size_t>(bytes, 256), "kernel scratch");
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
  TANDEM_CUDA_CHECK(cudaStreamSynchronize(stream_));
  TANDEM_CUDA_CHECK(cudaStreamSynchronize(side_));
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

void CudaBackend::get_rows(const WeightView& table, const int32_t* ids, int64_t n, float* output) {
  if (n == 0) return;
  activate();
  cuda::get_rows(table, ids, n, output, stream_);
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
  activate();
  const MatmulLaunch m{.type = op.weight.type,
                       .weights = op.weight.data,
                       .rows = op.weight.rows,
                       .cols = op.weight.cols,
                       .row_bytes = op.weight.row_bytes,
                       .mat_bytes = op.weight.matrix_bytes(),
                       .input = op.input,
                       .input_stride = op.weight.cols,
                       .output = op.output,
                       .output_stride = op.weight.rows,
                       .n_tokens = op.n_tokens};
  tiled(op.kernels, op.n_tokens) ? matmul_tiled(m, stream_) : matmul_rows(m, stream_);
  if (op.bias) add_row_bias(op.output, op.bias, op.n_tokens, op.weight.rows, stream_);
}

void CudaBackend::rms_norm(const RmsNormOp& op) {
  if (op.n_rows == 0) return;
  activate();
  cuda::rms_norm(op, stream_);
}

void CudaBackend::rope(const RopeOp& op) {
  if (op.n_tokens == 0) return;
  activate();
  cuda::rope(op, stream_);
}

void CudaBackend::kv_store(const KvStoreOp& op) {
  if (!can_cache(op.cache.type))
    fail("{}: the CUDA backend keeps its KV cache in F32 (--cache-type-k/v bf16 is CPU-only)",
         name_);
  if (op.n_tokens == 0) return;
  activate();
  cuda::kv_store(op, stream_);
}

void CudaBackend::store_latent(const LatentStoreOp& op) {
  if (!can_cache(op.cache.type))
    fail("{}: the CUDA backend keeps its KV cache in F32 (--cache-type-k/v bf16 is CPU-only)",
         name_);
  TANDEM_CHECK(op.cache.k_dims == 0 && op.cache.kv_lora_rank == op.norm_dims &&
               op.cache.rope_dims == op.rope.rope_dims);
  if (op.n_tokens == 0) return;
  activate();
  cuda::store_latent(op, stream_);
}

// k_b absorbed into the query per head, attention over the latent cache, v_b per head: the two
// projections are matmuls over the heads with strided inputs and outputs.
void CudaBackend::mla_attention(const MlaAttentionOp& op) {
  const int64_t T = op.n_tokens, H = op.n_heads, lora = op.cache.kv_lora_rank;
  if (T == 0) return;
  check_columns(op.k_b, "attn_k_b");
  check_columns(op.v_b, "attn_v_b");
  activate();
  const int64_t q_stride = op.nope_dims + op.cache.rope_dims;
  auto* q_lat = static_cast<float*>(scratch(kQueryLatent, size_t(T * H * lora) * sizeof(float)));
  auto* o_lat = static_cast<float*>(scratch(kOutputLatent, size_t(T * H * lora) * sizeof(float)));
  const bool use_tiles = tiled(op.kernels, T);
  const MatmulLaunch absorb{.type = op.k_b.type,
                            .weights = op.k_b.data,
                            .rows = op.k_b.rows,
                            .cols = op.k_b.cols,
                            .row_bytes = op.k_b.row_bytes,
                            .mat_bytes = op.k_b.matrix_bytes(),
                            .input = op.q,
                            .input_stride = H * q_stride,
                            .input_mat_stride = q_stride,
                            .output = q_lat,
                            .output_stride = H * lora,
                            .output_mat_stride = lora,
                            .n_tokens = T,
                            .n_mats = H};
  use_tiles ? matmul_tiled(absorb, stream_) : matmul_rows(absorb, stream_);
  const int64_t partial_floats = mla_partial_floats(op.cache, T, H);
  auto* partial =
      partial_floats
          ? static_cast<float*>(scratch(kAttentionSplits, size_t(partial_floats) * sizeof(float)))
          : nullptr;
  mla_scores_softmax_sums(q_lat, op.q, q_stride, op.nope_dims, op.cache, op.positions, op.seq_ids,
                          T, H, op.scale, o_lat, partial, stream_);
  const MatmulLaunch expand{.type = op.v_b.type,
                            .weights = op.v_b.data,
                            .rows = op.v_b.rows,
                            .cols = op.v_b.cols,
                            .row_bytes = op.v_b.row_bytes,
                            .mat_bytes = op.v_b.matrix_bytes(),
                            .input = o_lat,
                            .input_stride = H * lora,
                            .input_mat_stride = lora,
                            .output = op.output,
                            .output_stride = H * op.v_head_dims,
                            .output_mat_stride = op.v_head_dims,
                            .n_tokens = T,
                            .n_mats = H};
  use_tiles ? matmul_tiled(expand, stream_) : matmul_rows(expand, stream_);
}

void CudaBackend::attention(const AttentionOp& op) {
  if (op.n_tokens == 0) return;
  activate();
  cuda::gqa_attention(op, stream_);
}

void CudaBackend::moe_route(const MoeRouteOp& op) {
  if (op.n_tokens == 0) return;
  activate();
  cuda::moe_route(op, stream_);
}

// The slots of the experts held here, sorted by expert on the device (no host round trip), then
// gate/up with SiLU and down over the sorted entries: one launch each for all the experts.
void CudaBackend::moe(const MoeOp& op) {
  const int64_t n_slots = op.n_tokens * op.top_k, held = op.gate.n_mats;
  if (n_slots == 0) return;
  check_columns(op.gate, "an expert's gate");
  check_columns(op.down, "an expert's down projection");
  activate();
  const int64_t max_tiles = (n_slots + 63) / 64 + std::min(held, n_slots);
  const bool use_tiles = tiled(op.kernels, op.step_tokens > 0 ? op.step_tokens : op.n_tokens);
  auto ints = [&](Scratch which, int64_t n) {
    return static_cast<int32_t*>(scratch(which, size_t(n) * sizeof(int32_t)));
  };
  auto floats = [&](Scratch which, int64_t n) {
    return static_cast<float*>(scratch(which, size_t(n) * sizeof(float)));
  };
  ExpertSlots s{.order = ints(kOrder, n_slots), .expert_of = ints(kExpertOf, n_slots)};
  int32_t* counters = ints(kCounters, 2);
  s.n_active = counters;
  s.n_tiles = counters + 1;
  s.tile_first = ints(kTileFirst, max_tiles);
  s.tile_count = ints(kTileCount, max_tiles);
  s.max_slots = n_slots;
  s.max_tiles = max_tiles;
  s.top_k = op.top_k;
  moe_sort(op.expert_ids, op.local_index, n_slots, held, const_cast<int32_t*>(s.order),
           const_cast<int32_t*>(s.expert_of), counters, const_cast<int32_t*>(s.tile_first),
           const_cast<int32_t*>(s.tile_count), counters + 1, max_tiles, stream_);
  float* act = floats(kAct, n_slots * op.ffn_dims);
  float* gate_out = use_tiles ? floats(kGate, n_slots * op.ffn_dims) : nullptr;
  float* up_out = use_tiles ? floats(kUp, n_slots * op.ffn_dims) : nullptr;
  if (op.gate.type != op.up.type)
    fail(
        "{}: expert gate and up matrices stored in different formats ({} and {}) are not "
        "supported on GPUs yet; keep these experts on the CPU (--rules) or requantize them alike",
        name_, dtype_name(op.gate.type), dtype_name(op.up.type));
  const ExpertBiases biases{
      .gate = op.gate_bias, .up = op.up_bias, .down = op.down_bias, .activation = op.activation};
  // Decode with 8-bit activations where the policy allows them and the format has the step
  // (MoeOp::activations; quant/block_dot_q8.h): the inputs quantized once per product.
  const bool eight = op.activations == ActivationBits::Eight && !use_tiles;
  if (eight && matmul_supports_q8(op.gate.type) && op.dim % 32 == 0) {
    auto* input_q8 = static_cast<blocks::ActQ8*>(
        scratch(kInputQ8, size_t(op.n_tokens * (op.dim / 32)) * kActQ8Bytes));
    quantize_q8(op.input, op.n_tokens * op.dim, input_q8, stream_);
    expert_gate_up_q8(op.gate.type, op.gate.data, op.up.data, op.ffn_dims, op.dim,
                      op.gate.row_bytes, op.gate.matrix_bytes(), input_q8, s, act, biases, stream_);
  } else {
    expert_gate_up(op.gate.type, op.gate.data, op.up.data, op.ffn_dims, op.dim, op.gate.row_bytes,
                   op.gate.matrix_bytes(), op.input, s, gate_out, up_out, act, use_tiles, biases,
                   stream_);
  }
  if (eight && matmul_supports_q8(op.down.type) && op.ffn_dims % 32 == 0) {
    auto* act_q8 = static_cast<blocks::ActQ8*>(
        scratch(kActQ8, size_t(n_slots * (op.ffn_dims / 32)) * kActQ8Bytes));
    quantize_q8(act, n_slots * op.ffn_dims, act_q8, stream_);
    expert_down_q8(op.down.type, op.down.data, op.dim, op.ffn_dims, op.down.row_bytes,
                   op.down.matrix_bytes(), act_q8, s, op.slots, biases, stream_);
  } else {
    expert_down(op.down.type, op.down.data, op.dim, op.ffn_dims, op.down.row_bytes,
                op.down.matrix_bytes(), act, s, op.slots, use_tiles, biases, stream_);
  }
}

void CudaBackend::moe_reduce(const MoeReduceOp& op) {
  TANDEM_CHECK(!op.shared || op.residual);
  if (op.n_tokens == 0) return;
  activate();
  cuda::moe_reduce(op, stream_);
}

void CudaBackend::pick_replicas(const ReplicaPickOp& op) {
  activate();
  cuda::pick_replicas(op, stream_);
}

void CudaBackend::add(float* y, const float* x, int64_t n) {
  if (n == 0) return;
  activate();
  cuda::add(y, x, n, stream_);
}

void CudaBackend::add_parts(float* y, std::span<const float* const> parts, int64_t n) {
  if (n == 0 || parts.empty()) return;
  activate();
  cuda::add_parts(y, parts, n, stream_);
}

void CudaBackend::zero(float* y, int64_t n) {
  if (n == 0) return;
  activate();
  cuda::fill(y, 0.0f, n, stream_);
}

void CudaBackend::copy_rows(float* dst, int64_t dst_stride, const float* src, int64_t src_stride,
                            int64_t n_rows, int64_t row_len) {
  if (n_rows == 0 || row_len == 0) return;
  activate();
  cuda::copy_rows(dst, dst_stride, src, src_stride, n_rows, row_len, stream_);
}

}  // namespace tandem::cuda
