#include "backends/sim/sim_backend.h"

#include <fmt/format.h>

#include <cstring>
#include <vector>

#include "core/aligned_buffer.h"
#include "core/error.h"
#include "core/progress.h"

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

class SimEvent final : public Event {
 public:
  void complete() {
    std::lock_guard lock(mutex_);
    done_ = true;
    cv_.notify_all();
  }
  void wait() override {
    std::unique_lock lock(mutex_);
    cv_.wait(lock, [&] { return done_; });
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  bool done_ = false;
};

}  // namespace

SimBackend::SimBackend(int index, size_t memory_bytes, int n_threads)
    : name_(fmt::format("sim:{}", index)),
      memory_bytes_(memory_bytes),
      budget_(std::make_shared<Budget>()),
      compute_(n_threads, name_) {
  worker_ = std::thread([this] { worker_loop(); });
}

SimBackend::~SimBackend() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  work_ready_.notify_all();
  worker_.join();
}

size_t SimBackend::used_bytes() const {
  std::lock_guard lock(budget_->mutex);
  return budget_->used;
}

size_t SimBackend::free_bytes() const { return memory_bytes_ - used_bytes(); }

std::shared_ptr<DeviceBuffer> SimBackend::allocate(size_t bytes, const std::string& what) {
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

void SimBackend::submit(std::function<void()> work) {
  {
    std::lock_guard lock(mutex_);
    queue_.push_back(std::move(work));
  }
  work_ready_.notify_one();
}

void SimBackend::worker_loop() {
  for (;;) {
    std::function<void()> work;
    {
      std::unique_lock lock(mutex_);
      work_ready_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, and everything submitted has run
      work = std::move(queue_.front());
      queue_.pop_front();
      busy_ = true;
    }
    try {
      if (!error_) work();
    } catch (...) {
      error_ = std::current_exception();  // later ops are skipped; synchronize() reports it
    }
    {
      std::lock_guard lock(mutex_);
      busy_ = false;
    }
    work_done_.notify_all();
  }
}

void SimBackend::synchronize() {
  std::unique_lock lock(mutex_);
  work_done_.wait(lock, [&] { return queue_.empty() && !busy_; });
  if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
}

std::shared_ptr<Event> SimBackend::record_event() {
  auto event = std::make_shared<SimEvent>();
  submit([event] { event->complete(); });
  return event;
}

void SimBackend::wait_for(std::shared_ptr<Event> event) {
  submit([event] { event->wait(); });
}

// Copies are synchronous for the caller, like a plain cudaMemcpy: the host buffer may be reused
// as soon as they return.
void SimBackend::copy_from_host(void* device_dst, const void* host_src, size_t bytes) {
  submit([=] { std::memcpy(device_dst, host_src, bytes); });
  synchronize();
}

void SimBackend::copy_to_host(void* host_dst, const void* device_src, size_t bytes) {
  submit([=] { std::memcpy(host_dst, device_src, bytes); });
  synchronize();
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
void SimBackend::moe_route(const MoeRouteOp& op) { submit([=, this] { compute_.moe_route(op); }); }
void SimBackend::moe(const MoeOp& op) { submit([=, this] { compute_.moe(op); }); }
void SimBackend::moe_reduce(const MoeReduceOp& op) { submit([=, this] { compute_.moe_reduce(op); }); }
void SimBackend::add(float* y, const float* x, int64_t n) { submit([=, this] { compute_.add(y, x, n); }); }
void SimBackend::zero(float* y, int64_t n) { submit([=, this] { compute_.zero(y, n); }); }
void SimBackend::copy_rows(float* dst, int64_t dst_stride, const float* src, int64_t src_stride,
                           int64_t n_rows, int64_t row_len) {
  submit([=, this] { compute_.copy_rows(dst, dst_stride, src, src_stride, n_rows, row_len); });
}

}  // namespace tandem::sim
