// What a one-token decode step launches on a GPU, read on the host: the fixture models of the
// DeepSeek-V2-Lite shape (no q LoRA, softmax routing, two shared experts) and the V3 shape (q
// LoRA, grouped sigmoid routing, one shared expert) run a decode step on a simulated device,
// and every op the device is asked for is also given to the CUDA backend's own op functions
// (op_launches.h) under RecordLaunches, which list the kernels they would launch with their
// grids. The step is cut into layers at each layer's last op (the reduce that adds the residual).
//
// The counts are today's: issue 27's target is at most 14 kernels a MoE layer, through the
// fusions core/backend.h defines. A change to what a layer launches changes them, on purpose.
#include <gtest/gtest.h>

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "backends/cuda/launch_record.h"
#include "backends/cuda/op_launches.h"
#include "backends/sim/sim_backend.h"
#include "forwarding_backend.h"
#include "gguf/gguf_file.h"
#include "model/deepseek2.h"
#include "runtime/greedy_steps.h"
#include "test_support.h"

namespace tandem {
namespace {

using cuda::KernelLaunch;

struct OpLaunchRecord {
  std::string op;
  std::vector<KernelLaunch> kernels;
};

// Runs every op on the simulated device and, while `on`, records what the CUDA backend would
// launch for it. Scratch is host memory: recorded launchers never touch it.
class LaunchRecording final : public test::ForwardingBackend {
 public:
  explicit LaunchRecording(Backend& inner)
      : ForwardingBackend(inner), cuda_ops_(nullptr, [this](cuda::Scratch which, size_t bytes) {
          std::vector<char>& s = scratch_[size_t(which)];
          if (s.size() < bytes) s.resize(bytes);
          return static_cast<void*>(s.data());
        }) {}

  bool on = false;
  std::vector<OpLaunchRecord> ops;

  void get_rows(const WeightView& t, const int32_t* ids, int64_t n, float* out) override {
    record("get_rows", [&] { cuda_ops_.get_rows(t, ids, n, out); });
    ForwardingBackend::get_rows(t, ids, n, out);
  }
  void matmul(const MatmulOp& op) override {
    record("matmul", [&] { cuda_ops_.matmul(op); });
    ForwardingBackend::matmul(op);
  }
  void rms_norm(const RmsNormOp& op) override {
    record("rms_norm", [&] { cuda_ops_.rms_norm(op); });
    ForwardingBackend::rms_norm(op);
  }
  void rope(const RopeOp& op) override {
    record("rope", [&] { cuda_ops_.rope(op); });
    ForwardingBackend::rope(op);
  }
  void kv_store(const KvStoreOp& op) override {
    record("kv_store", [&] { cuda_ops_.kv_store(op); });
    ForwardingBackend::kv_store(op);
  }
  void store_latent(const LatentStoreOp& op) override {
    record("store_latent", [&] { cuda_ops_.store_latent(op); });
    ForwardingBackend::store_latent(op);
  }
  void mla_attention(const MlaAttentionOp& op) override {
    record("mla_attention", [&] { cuda_ops_.mla_attention(op); });
    ForwardingBackend::mla_attention(op);
  }
  void attention(const AttentionOp& op) override {
    record("attention", [&] { cuda_ops_.attention(op); });
    ForwardingBackend::attention(op);
  }
  void moe_route(const MoeRouteOp& op) override {
    record("moe_route", [&] { cuda_ops_.moe_route(op); });
    ForwardingBackend::moe_route(op);
  }
  void moe(const MoeOp& op) override {
    record(op.n_expert == 1 ? "moe(shared)" : "moe(routed)", [&] { cuda_ops_.moe(op); });
    ForwardingBackend::moe(op);
  }
  void moe_reduce(const MoeReduceOp& op) override {
    record(op.residual ? "moe_reduce(+residual)" : "moe_reduce", [&] { cuda_ops_.moe_reduce(op); });
    ForwardingBackend::moe_reduce(op);
  }
  void pick_replicas(const ReplicaPickOp& op) override {
    record("pick_replicas", [&] { cuda_ops_.pick_replicas(op); });
    ForwardingBackend::pick_replicas(op);
  }
  void add(float* y, const float* x, int64_t n) override {
    record("add", [&] { cuda_ops_.add(y, x, n); });
    ForwardingBackend::add(y, x, n);
  }
  void add_parts(float* y, std::span<const float* const> parts, int64_t n) override {
    record("add_parts", [&] { cuda_ops_.add_parts(y, parts, n); });
    ForwardingBackend::add_parts(y, parts, n);
  }
  void zero(float* y, int64_t n) override {
    record("zero", [&] { cuda_ops_.zero(y, n); });
    ForwardingBackend::zero(y, n);
  }
  void copy_rows(float* d, int64_t ds, const float* s, int64_t ss, int64_t r, int64_t l) override {
    record("copy_rows", [&] { cuda_ops_.copy_rows(d, ds, s, ss, r, l); });
    ForwardingBackend::copy_rows(d, ds, s, ss, r, l);
  }

 private:
  template <class Fn>
  void record(const char* op, Fn&& launch) {
    if (!on) return;
    OpLaunchRecord& r = ops.emplace_back(OpLaunchRecord{op, {}});
    cuda::RecordLaunches recording(r.kernels);
    launch();
  }
  cuda::OpLaunches cuda_ops_;
  std::vector<char> scratch_[size_t(cuda::Scratch::Count)];
};

struct LayerLaunches {
  bool moe = false;
  std::vector<OpLaunchRecord> ops;
  size_t kernels() const {
    size_t n = 0;
    for (const OpLaunchRecord& op : ops) n += op.kernels.size();
    return n;
  }
};

// The ops of one decode step after the prompt, cut into layers (the head's ops are left out).
std::vector<LayerLaunches> decode_step_launches(const std::string& fixture) {
  const gguf::GgufFile file = gguf::GgufFile::open(test::fixture(fixture).string());
  const Deepseek2Hparams hp = read_deepseek2_hparams(file);
  const uint32_t n_layers = hp.n_layer - hp.n_nextn_layers;
  sim::SimBackend sim(0, size_t(256) << 20);
  LaunchRecording device(sim);
  Deepseek2Model model(file, DevicePlan::single(device, n_layers, hp.n_expert));
  model.set_graphs_enabled(false);  // a replayed graph submits no ops to record
  const std::vector<Backend*> layer_devices(n_layers, &device);
  // A cache of 4096 positions, as a served context: decode attention then runs in splits.
  test::prompt_then_greedy(
      model, layer_devices, 1, [&](bool after) { device.on = !after; }, /*n_ctx=*/4096);
  std::vector<LayerLaunches> layers(1);
  for (OpLaunchRecord& op : device.ops) {
    if (layers.size() > n_layers) break;  // the output head
    layers.back().moe |= op.op == "moe_route";
    const bool last = op.op == "moe_reduce(+residual)";
    layers.back().ops.push_back(std::move(op));
    if (last) layers.emplace_back();
  }
  layers.pop_back();
  EXPECT_EQ(layers.size(), n_layers) << fixture << ": the step's layers, cut at their reduce";
  return layers;
}

std::string describe(const LayerLaunches& layer) {
  std::string text;
  for (const OpLaunchRecord& op : layer.ops) {
    text += "  " + op.op + ":";
    for (const KernelLaunch& k : op.kernels)
      text += " " + k.kernel + "<<<" + std::to_string(k.grid[0]) + "x" + std::to_string(k.grid[1]) +
              "x" + std::to_string(k.grid[2]) + ", " + std::to_string(k.block[0]) + ">>>";
    text += "\n";
  }
  return text;
}

void expect_moe_layer_launches(const std::string& fixture, size_t expected) {
  const std::vector<LayerLaunches> layers = decode_step_launches(fixture);
  size_t moe_layers = 0;
  for (size_t il = 0; il < layers.size(); ++il) {
    if (!layers[il].moe) continue;
    if (++moe_layers == 1)
      std::printf("%s, one-token decode, MoE layer %zu: %zu kernels\n%s", fixture.c_str(), il,
                  layers[il].kernels(), describe(layers[il]).c_str());
    EXPECT_EQ(layers[il].kernels(), expected) << fixture << " layer " << il << " launches:\n"
                                              << describe(layers[il]);
  }
  EXPECT_GT(moe_layers, 0u) << fixture << ": no MoE layer found in the step";
}

TEST(CudaLaunchRecord, LiteShapedDecodeStepPerMoeLayer) {
  expect_moe_layer_launches("small-v2-Q4_K_M.gguf", 13);
}

TEST(CudaLaunchRecord, V3ShapedDecodeStepPerMoeLayer) {
  expect_moe_layer_launches("small-v3-Q4_K_M.gguf", 14);
}

// Recording launches nothing and needs no GPU: the launchers' choices are what is recorded.
TEST(CudaLaunchRecord, RecordingListsWhatAnOpWouldLaunch) {
  std::vector<char> scratch;
  cuda::OpLaunches ops(nullptr, [&](cuda::Scratch, size_t bytes) {
    scratch.resize(std::max(scratch.size(), bytes));
    return static_cast<void*>(scratch.data());
  });
  std::vector<KernelLaunch> launched;
  {
    cuda::RecordLaunches recording(launched);
    float y[3000] = {}, x[3000] = {};
    ops.add(y, x, 3000);
    ops.zero(y, 0);  // an empty op launches nothing
  }
  ASSERT_EQ(launched.size(), 1u);
  EXPECT_EQ(launched[0].kernel, "add_kernel");
  EXPECT_EQ(launched[0].grid[0], 12u);  // 3000 floats, 256 a block
  EXPECT_EQ(launched[0].block[0], 256u);
  EXPECT_FALSE(cuda::recording_launches());
}

}  // namespace
}  // namespace tandem
