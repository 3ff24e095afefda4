// The hybrid step as a GPU runs it, with a simulated device standing in for the GPU: attention,
// router, shared experts and some routed experts on the device, the other routed experts on the
// CPU through a host task on the device's stream, decode steps captured as graphs. Checked here:
// - the order of what the device is asked to do in a MoE layer (route on the device, copies to
//   host buffers, the host task, the shared and own experts while it runs, then the join, the
//   copy back and the sum), and that the CPU's experts run on the host-task thread;
// - that replaying a captured step runs the CPU's part again (the host task is in the graph)
//   while nothing else is submitted from the host, and that every step gives the single-CPU
//   run's bits, captured or not;
// - that a repacked (CPU-only layout) model runs on a device without those kernels, taken apart
//   at load, with the original file's bits.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "backends/sim/sim_backend.h"
#include "core/thread_pool.h"
#include "gguf/gguf_file.h"
#include "greedy_steps.h"
#include "model/deepseek2.h"
#include "model/model.h"
#include "model/repack.h"
#include "runtime/kv_cache.h"
#include "test_support.h"

namespace tandem {
namespace {

// What was asked of a backend, in order, and from which thread.
struct Call {
  std::string device, op;
  std::thread::id thread;
};

class CallLog {
 public:
  void add(const std::string& device, const std::string& op) {
    std::lock_guard lock(mutex_);
    calls_.push_back({device, op, std::this_thread::get_id()});
  }
  std::vector<Call> take() {
    std::lock_guard lock(mutex_);
    return std::exchange(calls_, {});
  }

 private:
  std::mutex mutex_;
  std::vector<Call> calls_;
};

// A backend that records every call and passes it on.
class Recording final : public Backend {
 public:
  Recording(Backend& inner, CallLog& log) : inner_(inner), log_(log) {}
  std::string name() const override { return inner_.name(); }
  bool uses_host_memory() const override { return inner_.uses_host_memory(); }
  std::shared_ptr<DeviceBuffer> allocate(size_t bytes, const std::string& what) override {
    return inner_.allocate(bytes, what);
  }
  void copy_from_host(void* dst, const void* src, size_t bytes) override {
    note("copy_from_host"), inner_.copy_from_host(dst, src, bytes);
  }
  void copy_to_host(void* dst, const void* src, size_t bytes) override {
    note("copy_to_host"), inner_.copy_to_host(dst, src, bytes);
  }
  std::shared_ptr<DeviceBuffer> allocate_host(size_t bytes, const std::string& what) override {
    return inner_.allocate_host(bytes, what);
  }
  void copy_to_host_async(void* dst, const void* src, size_t bytes) override {
    note("copy_to_host_async"), inner_.copy_to_host_async(dst, src, bytes);
  }
  void copy_from_host_async(void* dst, const void* src, size_t bytes) override {
    note("copy_from_host_async"), inner_.copy_from_host_async(dst, src, bytes);
  }
  void upload_weights(void* dst, const void* src, size_t bytes,
                      std::shared_ptr<Event> after) override {
    note(after ? "upload_weights(after)" : "upload_weights"),
        inner_.upload_weights(dst, src, bytes, std::move(after));
  }
  std::shared_ptr<Event> host_task(std::function<void()> task) override {
    note("host_task");
    return inner_.host_task(std::move(task));
  }
  void synchronize() override { note("synchronize"), inner_.synchronize(); }
  void set_spin_waits(bool spin) override {
    note(spin ? "set_spin_waits(spin)" : "set_spin_waits(sleep)"), inner_.set_spin_waits(spin);
  }
  std::shared_ptr<Event> record_event() override {
    return note("record_event"), inner_.record_event();
  }
  void wait_for(std::shared_ptr<Event> event) override {
    note("wait_for"), inner_.wait_for(std::move(event));
  }
  size_t free_bytes() const override { return inner_.free_bytes(); }
  bool can_multiply(DType type) const override { return inner_.can_multiply(type); }
  bool can_capture() const override { return inner_.can_capture(); }
  void begin_capture() override { note("begin_capture"), inner_.begin_capture(); }
  std::unique_ptr<Graph> end_capture() override {
    return note("end_capture"), inner_.end_capture();
  }
  void replay(Graph& graph) override { note("replay"), inner_.replay(graph); }
  void get_rows(const WeightView& t, const int32_t* ids, int64_t n, float* out) override {
    note("get_rows"), inner_.get_rows(t, ids, n, out);
  }
  void matmul(const MatmulOp& op) override { note("matmul"), inner_.matmul(op); }
  void rms_norm(const RmsNormOp& op) override { note("rms_norm"), inner_.rms_norm(op); }
  void rope(const RopeOp& op) override { note("rope"), inner_.rope(op); }
  void kv_store(const KvStoreOp& op) override { note("kv_store"), inner_.kv_store(op); }
  void mla_attention(const MlaAttentionOp& op) override {
    note("mla_attention"), inner_.mla_attention(op);
  }
  void attention(const AttentionOp& op) override { note("attention"), inner_.attention(op); }
  void moe_route(const MoeRouteOp& op) override { note("moe_route"), inner_.moe_route(op); }
  void moe(const MoeOp& op) override {
    note(op.n_expert == 1      ? "moe(shared)"
         : op.shared.gate.data ? "moe(routed+shared)"
                               : "moe(routed)"),
        inner_.moe(op);
  }
  void moe_reduce(const MoeReduceOp& op) override { note("moe_reduce"), inner_.moe_reduce(op); }
  void pick_replicas(const ReplicaPickOp& op) override {
    note("pick_replicas"), inner_.pick_replicas(op);
  }
  void add(float* y, const float* x, int64_t n) override { note("add"), inner_.add(y, x, n); }
  void zero(float* y, int64_t n) override { note("zero"), inner_.zero(y, n); }
  void copy_rows(float* d, int64_t ds, const float* s, int64_t ss, int64_t r, int64_t l) override {
    note("copy_rows"), inner_.copy_rows(d, ds, s, ss, r, l);
  }

 private:
  void note(const char* op) { log_.add(inner_.name(), op); }
  Backend& inner_;
  CallLog& log_;
};

constexpr size_t kSimMemory = size_t(64) << 20;
// The decode steps' calls, one list per step.
std::vector<float> run(Deepseek2Model& model, const std::vector<Backend*>& layer_devices,
                       int n_decode, CallLog* log = nullptr,
                       std::vector<std::vector<Call>>* per_step = nullptr) {
  return test::prompt_then_greedy(model, layer_devices, n_decode, [&](bool after) {
    if (!log) return;
    std::vector<Call> calls = log->take();  // before a step: the prompt's and the last step's
    if (after) per_step->push_back(std::move(calls));
  });
}

class HybridStep : public ::testing::Test {
 protected:
  void SetUp() override {
    file_ = std::make_unique<gguf::GgufFile>(
        gguf::GgufFile::open(test::fixture("small-v3-Q4_K_M.gguf").string()));
    hp_ = read_deepseek2_hparams(*file_);
    n_layers_ = hp_.n_layer - hp_.n_nextn_layers;
    Deepseek2Model reference(*file_, cpu_);
    reference_ = run(reference, std::vector<Backend*>(n_layers_, &cpu_), kDecodeSteps);
  }
  // Everything on `device` but the embeddings and every other routed expert, on the CPU.
  DevicePlan hybrid(Backend& device, Backend& host) const {
    DevicePlan plan = DevicePlan::single(device, n_layers_, hp_.n_expert);
    plan.embeddings = &host;
    for (auto& layer : plan.experts)
      for (size_t e = 0; e < layer.size(); e += 2) layer[e] = &host;
    return plan;
  }
  void expect_reference_bits(const std::vector<float>& logits) const {
    ASSERT_EQ(logits.size(), reference_.size());
    EXPECT_EQ(std::memcmp(logits.data(), reference_.data(), logits.size() * sizeof(float)), 0)
        << "logits differ from the single-CPU run";
  }

  static constexpr int kDecodeSteps = 6;
  cpu::CpuBackend cpu_{2};
  std::unique_ptr<gguf::GgufFile> file_;
  Deepseek2Hparams hp_;
  uint32_t n_layers_ = 0;
  std::vector<float> reference_;
};

TEST_F(HybridStep, HostExpertsRunInAHostTaskWhileTheDeviceComputesTheSharedExperts) {
  CallLog log;
  sim::SimBackend sim(0, kSimMemory);
  Recording device(sim, log), host(cpu_, log);
  Deepseek2Model model(*file_, hybrid(device, host));
  model.set_graphs_enabled(false);
  std::vector<std::vector<Call>> steps;
  expect_reference_bits(
      run(model, std::vector<Backend*>(n_layers_, &device), kDecodeSteps, &log, &steps));

  // The first MoE layer of a decode step, as the device was asked: from its routing to its sum.
  const std::vector<Call>& calls = steps.front();
  auto route =
      std::find_if(calls.begin(), calls.end(), [](const Call& c) { return c.op == "moe_route"; });
  ASSERT_NE(route, calls.end());
  std::vector<std::string> device_ops;
  for (auto it = route; it != calls.end(); ++it) {
    if (it->device == "cpu") continue;  // the host task's, whenever its thread got to it
    device_ops.push_back(it->op);
    if (it->op == "moe_reduce" && device_ops.size() > 8) break;  // the routed sum ends the layer
  }
  const std::vector<std::string> expected = {"moe_route",
                                             "zero",
                                             "copy_to_host_async",
                                             "copy_to_host_async",
                                             "host_task",
                                             "moe(routed+shared)",
                                             "wait_for",
                                             "copy_from_host_async",
                                             "add",
                                             "moe_reduce"};
  EXPECT_EQ(device_ops, expected);
  // The CPU computed experts once per MoE layer, each time on another thread (besides the
  // lookup of the embeddings and their copy to the device, on this one).
  std::vector<const Call*> host_calls;
  for (const Call& c : calls)
    if (c.device == "cpu" && c.op.starts_with("moe")) host_calls.push_back(&c);
  ASSERT_EQ(host_calls.size(), size_t(n_layers_ - hp_.n_leading_dense));
  for (const Call* c : host_calls) {
    EXPECT_EQ(c->op, "moe(routed)");
    EXPECT_NE(c->thread, std::this_thread::get_id())
        << "the CPU's experts ran on the submitting thread";
  }
}

// A prompt chunk of at least DevicePlan::stream_experts_min_tokens streams the CPU's experts to
// the device group by group (copies, then the group's moe op into the device's own slots), with
// no host task; smaller steps (decode) keep the host task. The bits are the single-CPU run's,
// with one expert a group (the two buffers taken in turn) and with several, with the device
// holding half the experts and none. A copy into a buffer waits for the op that read it last,
// across layers: only the step's first two copies go without.
TEST_F(HybridStep, APromptChunkStreamsTheHostExpertsToTheDeviceByChunkSize) {
  const int moe_layers = int(n_layers_ - hp_.n_leading_dense);
  auto count = [](const std::vector<Call>& calls, const std::string& device,
                  const std::string& op) {
    return int(std::count_if(calls.begin(), calls.end(),
                             [&](const Call& c) { return c.device == device && c.op == op; }));
  };
  // The largest expert of the file, and room for its parts' alignment.
  uint64_t expert_bytes = 0;
  for (uint32_t il = hp_.n_leading_dense; il < n_layers_; ++il) {
    uint64_t bytes = 3 * 256;
    for (const char* stack : {"ffn_gate_exps.weight", "ffn_up_exps.weight", "ffn_down_exps.weight"})
      bytes +=
          file_->find_tensor("blk." + std::to_string(il) + "." + stack)->n_bytes / hp_.n_expert;
    expert_bytes = std::max(expert_bytes, bytes);
  }
  for (const bool all_on_host : {false, true})
    for (const uint64_t group_bytes : {uint64_t(1), 3 * expert_bytes}) {
      SCOPED_TRACE(std::string(all_on_host ? "every expert" : "half the experts") +
                   " on the host, " +
                   (group_bytes == 1 ? "one expert a group" : "three experts a group"));
      const int host_experts = all_on_host ? int(hp_.n_expert) : int(hp_.n_expert + 1) / 2;
      CallLog log;
      sim::SimBackend sim(0, kSimMemory);
      Recording device(sim, log), host(cpu_, log);
      DevicePlan plan = hybrid(device, host);
      if (all_on_host)
        for (auto& layer : plan.experts) std::fill(layer.begin(), layer.end(), &host);
      plan.stream_experts_min_tokens = 2;  // the prompt (11 tokens), not a decode step
      plan.stream_group_bytes = group_bytes;
      Deepseek2Model model(*file_, plan);
      model.set_graphs_enabled(false);
      std::vector<std::vector<Call>> steps;
      std::vector<Call> prompt;
      bool first = true;
      expect_reference_bits(test::prompt_then_greedy(
          model, std::vector<Backend*>(n_layers_, &device), kDecodeSteps, [&](bool after) {
            std::vector<Call> calls = log.take();
            if (first) prompt = std::move(calls), first = false;
            if (after) steps.push_back(std::move(calls));
          }));
      // The prompt: no host task, no expert computed on the CPU, three stacks copied a group,
      // the first of them after the buffer's last reader but for the step's first two groups.
      const int groups = count(prompt, "sim:0", "moe(routed)");
      EXPECT_EQ(count(prompt, "sim:0", "host_task"), 0);
      EXPECT_EQ(count(prompt, "cpu", "moe(routed)"), 0);
      EXPECT_EQ(count(prompt, "sim:0", "upload_weights(after)"), groups - 2);
      EXPECT_EQ(count(prompt, "sim:0", "upload_weights"), 2 * groups + 2);
      if (group_bytes == 1) {
        EXPECT_EQ(groups, host_experts * moe_layers);
      } else {
        EXPECT_GE(groups, 2 * moe_layers);
        EXPECT_LE(groups, (host_experts + 2) / 3 * moe_layers);
      }
      if (all_on_host) continue;
      // Its first MoE layer on the device: route, zero, its own and shared experts, each
      // streamed group's copies and op, then the sum (no copy back, no host part added).
      auto route = std::find_if(prompt.begin(), prompt.end(),
                                [](const Call& c) { return c.op == "moe_route"; });
      ASSERT_NE(route, prompt.end());
      std::vector<std::string> device_ops;
      for (auto it = route; it != prompt.end(); ++it) {
        if (it->device != "sim:0") continue;
        device_ops.push_back(it->op);
        if (it->op == "moe_reduce") break;
      }
      std::vector<std::string> expected = {"moe_route", "zero", "moe(routed+shared)"};
      const int layer_groups = group_bytes == 1 ? host_experts : int(device_ops.size() - 4) / 5;
      for (int g = 0; g < layer_groups; ++g)
        for (const char* op : {g < 2 ? "upload_weights" : "upload_weights(after)", "upload_weights",
                               "upload_weights", "moe(routed)", "record_event"})
          expected.push_back(op);
      expected.push_back("moe_reduce");
      EXPECT_EQ(device_ops, expected);
      // Decode steps: the host task as before.
      for (const std::vector<Call>& calls : steps) {
        EXPECT_EQ(count(calls, "sim:0", "host_task"), moe_layers);
        EXPECT_EQ(count(calls, "sim:0", "upload_weights"), 0);
      }
    }
}

// gpt-oss's experts carry biases: streamed, their rows go with the weights (offset by the group's
// first expert) and the prompt's logits are the single-CPU run's, every expert on the host and
// streamed one and two experts a group.
TEST(HybridStreaming, ExpertBiasesStreamWithTheirExperts) {
  const gguf::GgufFile file =
      gguf::GgufFile::open(test::fixture("gpt-oss-micro-F32.gguf").string());
  cpu::CpuBackend cpu(2);
  auto prompt_logits = [&](const DevicePlan& plan, Backend& layers) {
    const std::unique_ptr<Model> model = load_model(file, plan);
    model->set_graphs_enabled(false);
    const ModelInfo& info = model->info();
    const std::vector<Backend*> layer_devices(info.kv.size(), &layers);
    KvCache cache(layer_devices, info.kv, 64, 1, 64);
    std::vector<int32_t> tokens, positions, seq, rows;
    for (int32_t i = 0; i < 12; ++i) {
      tokens.push_back(int32_t((7 + 13 * i) % int32_t(info.n_vocab)));
      positions.push_back(i), seq.push_back(0), rows.push_back(i);
    }
    std::vector<float> logits(tokens.size() * info.n_vocab);
    model->forward({.tokens = tokens, .positions = positions, .seq_ids = seq, .logit_rows = rows},
                   cache.views(), logits.data());
    return logits;
  };
  const std::unique_ptr<Model> shape = load_model(file, cpu);
  const uint32_t n_layers = shape->info().n_layer, n_expert = shape->info().n_expert;
  const std::vector<float> reference =
      prompt_logits(DevicePlan::single(cpu, n_layers, n_expert), cpu);
  for (const uint64_t group_bytes : {uint64_t(1), uint64_t(3 * 3 * 64 * 32 * 4 + 6 * 256)}) {
    SCOPED_TRACE(group_bytes == 1 ? "one expert a group" : "two experts a group");
    CallLog log;
    sim::SimBackend sim(0, kSimMemory);
    Recording device(sim, log);
    DevicePlan plan = DevicePlan::single(device, n_layers, n_expert);
    for (auto& layer : plan.experts) std::fill(layer.begin(), layer.end(), &cpu);
    plan.stream_experts_min_tokens = 2;
    plan.stream_group_bytes = group_bytes;
    const std::vector<float> logits = prompt_logits(plan, device);
    ASSERT_EQ(logits.size(), reference.size());
    EXPECT_EQ(std::memcmp(logits.data(), reference.data(), logits.size() * sizeof(float)), 0)
        << "logits differ from the single-CPU run";
    const std::vector<Call> calls = log.take();
    const auto moe_ops = std::count_if(calls.begin(), calls.end(),
                                       [](const Call& c) { return c.op == "moe(routed)"; });
    // Six copies a group: three stacks and their biases.
    const auto uploads = std::count_if(calls.begin(), calls.end(), [](const Call& c) {
      return c.op.starts_with("upload_weights");
    });
    EXPECT_EQ(uploads, 6 * moe_ops);
    EXPECT_GE(moe_ops, group_bytes == 1 ? n_expert * n_layers : 2 * n_layers);
  }
}

// A step that runs as a graph never streams (its replays could not copy from the weights' pageable
// memory, and the op-by-op step that sized the graph must compute as they do), even when every
// chunk size would: the prompt here (11 tokens with a logit row each: a graph's shape) and the
// decode steps keep the host task.
TEST_F(HybridStep, StepsThatRunAsGraphsNeverStream) {
  CallLog log;
  sim::SimBackend sim(0, kSimMemory);
  Recording device(sim, log), host(cpu_, log);
  DevicePlan plan = hybrid(device, host);
  plan.stream_experts_min_tokens = 1;
  Deepseek2Model model(*file_, plan);
  ASSERT_TRUE(model.captures_steps());
  expect_reference_bits(run(model, std::vector<Backend*>(n_layers_, &device), kDecodeSteps));
  for (const Call& c : log.take()) EXPECT_FALSE(c.op.starts_with("upload_weights")) << c.op;
}

TEST_F(HybridStep, ACapturedStepReplaysTheHostTaskAndSubmitsNothingElse) {
  CallLog log;
  sim::SimBackend sim(0, kSimMemory);
  Recording device(sim, log), host(cpu_, log);
  Deepseek2Model model(*file_, hybrid(device, host));
  ASSERT_TRUE(model.captures_steps());
  std::vector<std::vector<Call>> steps;
  expect_reference_bits(
      run(model, std::vector<Backend*>(n_layers_, &device), kDecodeSteps, &log, &steps));

  // Step 0 runs op by op (it sizes the buffers), step 1 captures then replays, later steps replay.
  auto count = [](const std::vector<Call>& calls, const std::string& device,
                  const std::string& op) {
    return std::count_if(calls.begin(), calls.end(),
                         [&](const Call& c) { return c.device == device && c.op == op; });
  };
  const int moe_layers = int(n_layers_ - hp_.n_leading_dense);
  EXPECT_EQ(count(steps[0], "sim:0", "host_task"), moe_layers);
  EXPECT_EQ(count(steps[1], "sim:0", "begin_capture"), 1);
  EXPECT_EQ(count(steps[1], "sim:0", "replay"), 1);
  for (size_t s = 2; s < steps.size(); ++s) {
    const std::vector<Call>& calls = steps[s];
    EXPECT_EQ(count(calls, "sim:0", "replay"), 1);
    EXPECT_EQ(count(calls, "sim:0", "matmul"), 0)
        << "step " << s << " submitted ops instead of replaying";
    EXPECT_EQ(count(calls, "sim:0", "host_task"), 0);
    // The host task is part of the graph: the CPU's experts ran again, once per MoE layer.
    EXPECT_EQ(count(calls, "cpu", "moe(routed)"), moe_layers) << "step " << s;
  }
}

// Once captured, a decode step asks the device for two things: the replay and one wait (a spin
// where the host has nothing else to do, a sleep where it computes experts). The
// step's inputs are written into page-locked buffers beforehand and copied by the graph's first
// nodes, the embeddings are looked up inside it (on the device) or by the host into a
// page-locked buffer the graph copies in (hybrid), and the logits are read after the wait.
TEST_F(HybridStep, AReplayedStepIsOneReplayAndOneWaitWithItsInputsInsideTheGraph) {
  for (const bool hybrid_plan : {false, true}) {
    SCOPED_TRACE(hybrid_plan ? "hybrid, embeddings on the host" : "everything on the device");
    CallLog log;
    sim::SimBackend sim(0, kSimMemory);
    Recording device(sim, log), host(cpu_, log);
    Deepseek2Model model(*file_, hybrid_plan ? hybrid(device, host)
                                             : DevicePlan::single(device, n_layers_, hp_.n_expert));
    ASSERT_TRUE(model.captures_steps());
    // The device is waited for by spinning unless the host has a share of the step.
    const std::vector<Call> loading = log.take();
    EXPECT_EQ(std::count_if(loading.begin(), loading.end(),
                            [&](const Call& c) {
                              return c.device == "sim:0" &&
                                     c.op == (hybrid_plan ? "set_spin_waits(sleep)"
                                                          : "set_spin_waits(spin)");
                            }),
              1);
    std::vector<std::vector<Call>> steps;
    expect_reference_bits(
        run(model, std::vector<Backend*>(n_layers_, &device), kDecodeSteps, &log, &steps));
    for (size_t s = 2; s < steps.size(); ++s) {  // 0 sizes, 1 captures, then replays
      std::vector<std::string> device_ops, host_lookups;
      for (const Call& c : steps[s]) {
        if (c.device == "sim:0") device_ops.push_back(c.op);
        if (c.device == "cpu" && c.op == "get_rows") host_lookups.push_back(c.op);
      }
      EXPECT_EQ(device_ops, (std::vector<std::string>{"replay", "synchronize"})) << "step " << s;
      EXPECT_EQ(host_lookups.size(), hybrid_plan ? 1u : 0u) << "step " << s;
    }
  }
}

TEST_F(HybridStep, GraphsAndOpByOpGiveTheSameBitsOnEveryPlanTheyCapture) {
  for (bool graphs : {false, true}) {
    SCOPED_TRACE(graphs ? "graphs" : "op by op");
    sim::SimBackend sim(0, kSimMemory);
    {
      Deepseek2Model model(*file_, hybrid(sim, cpu_));
      model.set_graphs_enabled(graphs);
      expect_reference_bits(run(model, std::vector<Backend*>(n_layers_, &sim), kDecodeSteps));
    }
    {
      Deepseek2Model model(*file_, DevicePlan::single(sim, n_layers_, hp_.n_expert));
      model.set_graphs_enabled(graphs);
      EXPECT_EQ(model.captures_steps(), graphs);
      expect_reference_bits(run(model, std::vector<Backend*>(n_layers_, &sim), kDecodeSteps));
    }
  }
}

TEST_F(HybridStep, ARepackedModelRunsOnADeviceWithoutInterleavedKernelsWithTheOriginalBits) {
  const std::filesystem::path repacked =
      std::filesystem::temp_directory_path() /
      ("tandem-hybrid-repacked-" + std::to_string(::getpid()) + ".gguf");
  ThreadPool pool(2);
  repack_model({.input_path = test::fixture("small-v3-Q4_K_M.gguf").string(),
                .output_path = repacked.string(),
                .show_progress = false},
               pool);
  {
    const gguf::GgufFile file = gguf::GgufFile::open(repacked.string());
    sim::SimBackend gpu_like(0, kSimMemory, /*n_threads=*/1, /*interleaved_formats=*/false);
    Deepseek2Model model(file, DevicePlan::single(gpu_like, n_layers_, hp_.n_expert));
    expect_reference_bits(run(model, std::vector<Backend*>(n_layers_, &gpu_like), kDecodeSteps));
  }
  std::filesystem::remove(repacked);
}

}  // namespace
}  // namespace tandem
