#pragma once
// A Backend that passes every call to another: the base of the tests' recording backends, which
// override the calls they watch and call these to run them.
#include <functional>
#include <memory>
#include <span>
#include <string>

#include "core/backend.h"

namespace tandem::test {

class ForwardingBackend : public Backend {
 public:
  explicit ForwardingBackend(Backend& inner) : inner_(inner) {}
  std::string name() const override { return inner_.name(); }
  bool uses_host_memory() const override { return inner_.uses_host_memory(); }
  std::shared_ptr<DeviceBuffer> allocate(size_t bytes, const std::string& what) override {
    return inner_.allocate(bytes, what);
  }
  void copy_from_host(void* dst, const void* src, size_t bytes) override {
    inner_.copy_from_host(dst, src, bytes);
  }
  void copy_to_host(void* dst, const void* src, size_t bytes) override {
    inner_.copy_to_host(dst, src, bytes);
  }
  std::shared_ptr<DeviceBuffer> allocate_host(size_t bytes, const std::string& what) override {
    return inner_.allocate_host(bytes, what);
  }
  void copy_to_host_async(void* dst, const void* src, size_t bytes) override {
    inner_.copy_to_host_async(dst, src, bytes);
  }
  void copy_from_host_async(void* dst, const void* src, size_t bytes) override {
    inner_.copy_from_host_async(dst, src, bytes);
  }
  void upload_weights(void* dst, const void* src, size_t bytes,
                      std::shared_ptr<Event> after) override {
    inner_.upload_weights(dst, src, bytes, std::move(after));
  }
  std::shared_ptr<Event> host_task(std::function<void()> task) override {
    return inner_.host_task(std::move(task));
  }
  void synchronize() override { inner_.synchronize(); }
  void set_spin_waits(bool spin) override { inner_.set_spin_waits(spin); }
  std::shared_ptr<Event> record_event() override { return inner_.record_event(); }
  void wait_for(std::shared_ptr<Event> event) override { inner_.wait_for(std::move(event)); }
  size_t free_bytes() const override { return inner_.free_bytes(); }
  bool can_multiply(DType type) const override { return inner_.can_multiply(type); }
  bool can_cache(DType type) const override { return inner_.can_cache(type); }
  bool can_capture() const override { return inner_.can_capture(); }
  void begin_capture() override { inner_.begin_capture(); }
  std::unique_ptr<Graph> end_capture() override { return inner_.end_capture(); }
  void replay(Graph& graph) override { inner_.replay(graph); }
  void get_rows(const WeightView& t, const int32_t* ids, int64_t n, float* out) override {
    inner_.get_rows(t, ids, n, out);
  }
  void matmul(const MatmulOp& op) override { inner_.matmul(op); }
  void rms_norm(const RmsNormOp& op) override { inner_.rms_norm(op); }
  void rope(const RopeOp& op) override { inner_.rope(op); }
  void kv_store(const KvStoreOp& op) override { inner_.kv_store(op); }
  void store_latent(const LatentStoreOp& op) override { inner_.store_latent(op); }
  void mla_attention(const MlaAttentionOp& op) override { inner_.mla_attention(op); }
  void attention(const AttentionOp& op) override { inner_.attention(op); }
  void moe_route(const MoeRouteOp& op) override { inner_.moe_route(op); }
  void moe(const MoeOp& op) override { inner_.moe(op); }
  void moe_reduce(const MoeReduceOp& op) override { inner_.moe_reduce(op); }
  void pick_replicas(const ReplicaPickOp& op) override { inner_.pick_replicas(op); }
  void add(float* y, const float* x, int64_t n) override { inner_.add(y, x, n); }
  void add_parts(float* y, std::span<const float* const> parts, int64_t n) override {
    inner_.add_parts(y, parts, n);
  }
  void zero(float* y, int64_t n) override { inner_.zero(y, n); }
  void copy_rows(float* d, int64_t ds, const float* s, int64_t ss, int64_t r, int64_t l) override {
    inner_.copy_rows(d, ds, s, ss, r, l);
  }

 protected:
  Backend& inner_;
};

}  // namespace tandem::test
