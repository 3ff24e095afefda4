#include "backends/sim/sim_backend.h"

#include <fmt/format.h>

#include <unistd.h>

#include <cstring>
#include <span>
#include <vector>

#include "core/aligned_buffer.h"
#include "core/error.h"
#include "core/progress.h"
#include "core/transport.h"

namespace tandem::sim {

// Bytes in use, shared with the buffers so that a buffer outliving its backend stays valid.
struct SimBackend::Budget {
  std::mutex mutex;
  size_t used = 0;
};

namespace {

class SimBuffer final : public DeviceBuffer {
 public:
  SimBuffer(size_t bytes, std::function<void(size_t)> release)
      : buffer_(bytes), release_(std::move(release)) {}
  ~SimBuffer() override { release_(buffer_.size()); }
  void* data() override { return buffer_.data(); }
  size_t size() const override { return buffer_.size(); }

 private:
  AlignedBuffer buffer_;
  std::function<void(size_t)> release_;
};

class SimGraph final : public Graph {
 public:
  std::vector<std::function<void()>> ops;
  std::vector<bool> always;
  std::vector<std::shared_ptr<void>> events;  // SimBackend::SimEvent, reset before each replay
};

}  // namespace

// Completed by its stream (or host task) when reached. An event recorded during a capture is
// not armed until its graph is replayed: waiting on it before then would wait forever on a real
// GPU, so it fails here instead.
class SimBackend::SimEvent final : public Event {
 public:
  explicit SimEvent(bool armed) : armed_(armed) {}
  void complete() {
    std::lock_guard lock(mutex_);
    done_ = true;
    cv_.notify_all();
  }
  void rearm() {
    std::lock_guard lock(mutex_);
    armed_ = true;
    done_ = false;
  }
  void wait() override {
    std::unique_lock lock(mutex_);
    TANDEM_CHECK(armed_ && "waited on the host for an event recorded during a capture");
    cv_.wait(lock, [&] { return done_; });
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  bool armed_;
  bool done_ = false;
};

SimBackend::SimBackend(int index, size_t memory_bytes, int n_threads, bool interleaved_formats)
    : name_(fmt::format("sim:{}", index)),
      memory_bytes_(memory_bytes),
      interleaved_formats_(interleaved_formats),
      budget_(std::make_shared<Budget>()),
      compute_(n_threads, name_) {
  stream_.thread = std::thread([this] { run_lane(stream_); });
  host_tasks_.thread = std::thread([this] { run_lane(host_tasks_); });
}

// The stream first: it may still hand tasks to the host-task thread, which stops after it.
SimBackend::~SimBackend() {
  for (Lane* lane : {&stream_, &host_tasks_}) {
    {
      std::lock_guard lock(mutex_);
      lane->stop = true;
    }
    work_ready_.notify_all();
    lane->thread.join();
  }
}

size_t SimBackend::used_bytes() const {
  std::lock_guard lock(budget_->mutex);
  return budget_->used;
}

size_t SimBackend::free_bytes() const { return memory_bytes_ - used_bytes(); }

bool SimBackend::can_multiply(DType type) const {
  return cpu::matmul_supports(type) && (interleaved_formats_ || !is_interleaved(type));
}

void SimBackend::check_not_capturing(const char* what) const {
  if (capturing_)
    fail("{}: {} while capturing a graph (a CUDA stream refuses it: \"operation not permitted "
         "when stream is capturing\")",
         name_, what);
}

std::shared_ptr<DeviceBuffer> SimBackend::allocate(size_t bytes, const std::string& what) {
  check_not_capturing("allocate");
  {
    std::lock_guard lock(budget_->mutex);
    if (budget_->used + bytes > memory_bytes_)
      fail("{}: out of memory: {} requested for {}, {} free of {}", name_, format_bytes(bytes), what,
           format_bytes(memory_bytes_ - budget_->used), format_bytes(memory_bytes_));
    budget_->used += bytes;
  }
  std::shared_ptr<Budget> budget = budget_;
  return std::make_shared<SimBuffer>(bytes, [budget](size_t n) {
    std::lock_guard lock(budget->mutex);
    budget->used -= n;
  });
}

// Host memory is not the device's: it costs nothing from the budget.
std::shared_ptr<DeviceBuffer> SimBackend::allocate_host(size_t bytes, const std::string&) {
  return std::make_shared<SimBuffer>(bytes, [](size_t) {});
}

void SimBackend::submit(std::function<void()> work, bool always) {
  {
    std::lock_guard lock(mutex_);
    if (capturing_) {
      captured_.push_back({std::move(work), always});
      return;
    }
    stream_.queue.push_back({std::move(work), always});
  }
  work_ready_.notify_all();
}

bool SimBackend::failed() {
  std::lock_guard lock(mutex_);
  return error_ != nullptr;
}

void SimBackend::run_lane(Lane& lane) {
  for (;;) {
    Work work;
    {
      std::unique_lock lock(mutex_);
      work_ready_.wait(lock, [&] { return lane.stop || !lane.queue.empty(); });
      if (lane.queue.empty()) return;  // stopping, and everything submitted has run
      work = std::move(lane.queue.front());
      lane.queue.pop_front();
      lane.busy = true;
    }
    // After a failure later ops are skipped (synchronize() reports it), but not event completions.
    const bool skip = !work.always && failed();
    try {
      if (!skip) work.run();
    } catch (...) {
      std::lock_guard lock(mutex_);
      if (!error_) error_ = std::current_exception();
    }
    {
      std::lock_guard lock(mutex_);
      lane.busy = false;
    }
    work_done_.notify_all();
  }
}

void SimBackend::synchronize() {
  check_not_capturing("synchronize");
  std::unique_lock lock(mutex_);
  work_done_.wait(lock, [&] {
    return stream_.queue.empty() && !stream_.busy && host_tasks_.queue.empty() && !host_tasks_.busy;
  });
  if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
}

std::shared_ptr<SimBackend::SimEvent> SimBackend::new_event() {
  auto event = std::make_shared<SimEvent>(/*armed=*/!capturing_);
  if (capturing_) captured_events_.push_back(event);
  return event;
}

std::shared_ptr<Event> SimBackend::record_event() {
  auto event = new_event();
  submit([event] { event->complete(); }, /*always=*/true);
  return event;
}

void SimBackend::wait_for(std::shared_ptr<Event> event) {
  submit([event] { event->wait(); });
}

// The stream hands the task to the host-task thread and goes on; the event completes when the
// task has run (also when it threw: the error waits for synchronize()).
std::shared_ptr<Event> SimBackend::host_task(std::function<void()> task) {
  auto event = new_event();
  submit(
      [this, task = std::move(task), event] {
        {
          std::lock_guard lock(mutex_);
          host_tasks_.queue.push_back({[this, task, event] {
                                         struct Complete {
                                           SimEvent& event;
                                           ~Complete() { event.complete(); }
                                         } complete{*event};
                                         if (!failed()) task();
                                       },
                                       /*always=*/true});
        }
        work_ready_.notify_all();
      },
      /*always=*/true);
  return event;
}

void SimBackend::begin_capture() {
  check_not_capturing("begin_capture");
  std::lock_guard lock(mutex_);
  capturing_ = true;
  captured_.clear();
  captured_events_.clear();
}

std::unique_ptr<Graph> SimBackend::end_capture() {
  std::lock_guard lock(mutex_);
  TANDEM_CHECK(capturing_);
  capturing_ = false;
  auto graph = std::make_unique<SimGraph>();
  for (Work& work : captured_) {
    graph->ops.push_back(std::move(work.run));
    graph->always.push_back(work.always);
  }
  graph->events.assign(captured_events_.begin(), captured_events_.end());
  captured_.clear();
  captured_events_.clear();
  return graph;
}

// The previous replay has finished before the events are re-armed (a real GPU needs no such
// wait; here it keeps a late waiter of the last replay from seeing the event reset).
void SimBackend::replay(Graph& graph) {
  check_not_capturing("replay");
  auto& sim_graph = dynamic_cast<SimGraph&>(graph);
  synchronize();
  for (const std::shared_ptr<void>& event : sim_graph.events) static_cast<SimEvent*>(event.get())->rearm();
  for (size_t i = 0; i < sim_graph.ops.size(); ++i) submit(sim_graph.ops[i], sim_graph.always[i]);
}

// Copies are synchronous for the caller, like a plain cudaMemcpy: the host buffer may be reused
// as soon as they return.
void SimBackend::copy_from_host(void* device_dst, const void* host_src, size_t bytes) {
  check_not_capturing("copy_from_host");
  submit([=] { std::memcpy(device_dst, host_src, bytes); });
  synchronize();
}

void SimBackend::copy_to_host(void* host_dst, const void* device_src, size_t bytes) {
  check_not_capturing("copy_to_host");
  submit([=] { std::memcpy(host_dst, device_src, bytes); });
  synchronize();
}

void SimBackend::copy_to_host_async(void* host_dst, const void* device_src, size_t bytes) {
  submit([=] { std::memcpy(host_dst, device_src, bytes); });
}

void SimBackend::copy_from_host_async(void* device_dst, const void* host_src, size_t bytes) {
  submit([=] { std::memcpy(device_dst, host_src, bytes); });
}

namespace {

// NCCL's shape without NCCL: opening passes an id from the sending rank to the receiving one
// (which checks it, as NCCL would refuse a wrong one), and each buffer goes out of the device,
// over the host transport and into the other device, in stream order. A send returns when the
// peer has the bytes (it answers each with a byte), as NCCL's does: a rank that sends what the
// other does not expect waits here, in the CPU tests too, instead of only on GPUs.
class SimRankChannel final : public RankChannel {
 public:
  SimRankChannel(SimBackend& device, Transport& host, int32_t peer, bool sends,
                 std::string_view what)
      : device_(device), host_(host), peer_(peer) {
    const std::string id_for = fmt::format("the sim channel's id for {}", what);
    if (sends) {
      host.send(peer, std::as_bytes(std::span(&kId, 1)), id_for);
    } else {
      host.receive(peer, std::as_writable_bytes(std::span(&id_, 1)), id_for);
      if (id_ != kId)
        fail("rank {} opening a sim channel for {} from rank {}: it sent {:#x}, not a channel id",
             host.rank(), what, peer, id_);
    }
  }
  void send(const void* device_src, size_t bytes, std::string_view what) override {
    staged_.resize(bytes);
    device_.copy_to_host(staged_.data(), device_src, bytes);
    host_.send(peer_, staged_, what);
    host_.receive(peer_, std::as_writable_bytes(std::span(&answer_, 1)), what);
  }
  void receive(void* device_dst, size_t bytes, std::string_view what) override {
    staged_.resize(bytes);
    host_.receive(peer_, staged_, what);
    device_.copy_from_host(device_dst, staged_.data(), bytes);
    host_.send(peer_, std::as_bytes(std::span(&kAnswer, 1)), what);
  }

 private:
  static constexpr uint64_t kId = 0x73696d6368616e6e;  // "simchann"
  static constexpr std::byte kAnswer{1};
  SimBackend& device_;
  Transport& host_;
  int32_t peer_;
  // Members, not locals: a send that timed out may read its buffer until the run ends.
  uint64_t id_ = 0;
  std::byte answer_{};
  std::vector<std::byte> staged_;
};

}  // namespace

// A process's sim devices are its own: never another rank's, even on one machine.
RankChannelEnd SimBackend::rank_channel_end() const {
  return {.kind = RankChannelKind::Simulated,
          .version = 1,
          .device_id = device_id_on_this_machine(fmt::format("{}/{}", getpid(), name_))};
}

std::unique_ptr<RankChannel> SimBackend::open_rank_channel(Transport& host, int32_t peer,
                                                           bool sends, std::string_view what) {
  return std::make_unique<SimRankChannel>(*this, host, peer, sends, what);
}

void SimBackend::get_rows(const WeightView& table, const int32_t* ids, int64_t n, float* output) {
  submit([=, this] { compute_.get_rows(table, ids, n, output); });
}
void SimBackend::matmul(const MatmulOp& op) { submit([=, this] { compute_.matmul(op); }); }
void SimBackend::rms_norm(const RmsNormOp& op) { submit([=, this] { compute_.rms_norm(op); }); }
void SimBackend::rope(const RopeOp& op) { submit([=, this] { compute_.rope(op); }); }
void SimBackend::kv_store(const KvStoreOp& op) { submit([=, this] { compute_.kv_store(op); }); }
void SimBackend::mla_attention(const MlaAttentionOp& op) {
  submit([=, this] { compute_.mla_attention(op); });
}
void SimBackend::attention(const AttentionOp& op) {
  submit([=, this] { compute_.attention(op); });
}
void SimBackend::moe_route(const MoeRouteOp& op) { submit([=, this] { compute_.moe_route(op); }); }
void SimBackend::moe(const MoeOp& op) { submit([=, this] { compute_.moe(op); }); }
void SimBackend::moe_reduce(const MoeReduceOp& op) { submit([=, this] { compute_.moe_reduce(op); }); }
void SimBackend::pick_replicas(const ReplicaPickOp& op) {
  submit([=, this] { compute_.pick_replicas(op); });
}
void SimBackend::add(float* y, const float* x, int64_t n) { submit([=, this] { compute_.add(y, x, n); }); }
void SimBackend::add_parts(float* y, std::span<const float* const> parts, int64_t n) {
  if (parts.empty()) return;
  submit([=, this, parts = std::vector<const float*>(parts.begin(), parts.end())] {
    compute_.add_parts(y, parts, n);
  });
}
void SimBackend::zero(float* y, int64_t n) { submit([=, this] { compute_.zero(y, n); }); }
void SimBackend::copy_rows(float* dst, int64_t dst_stride, const float* src, int64_t src_stride,
                           int64_t n_rows, int64_t row_len) {
  submit([=, this] { compute_.copy_rows(dst, dst_stride, src, src_stride, n_rows, row_len); });
}

}  // namespace tandem::sim
