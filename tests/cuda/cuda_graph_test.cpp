// Graphs and host tasks on the CUDA backend (core/backend.h): a captured sequence of ops replays
// with the inputs written between replays and gives the bits of the same ops run directly; a host
// task runs the CPU's share of a step on pinned host memory between device ops, inside and
// outside a capture; an exception thrown by a task comes out of synchronize().
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <atomic>
#include <string>
#include <vector>

#include "core/error.h"
#include "cuda_test_support.h"

namespace tandem::test {
namespace {

// RMSNorm weights around 1.
std::vector<float> norm_weights(int64_t dim, uint32_t seed) {
  std::vector<float> w = gaussian(size_t(dim), seed, 0.1f);
  for (float& v : w) v += 1.0f;
  return w;
}

// A decode-like step over device buffers: norm, a Q4_K projection, rope with positions in device
// memory, an F32 router (tiled kernel), routing with counts, the experts (Q4_K / Q6_K) and their
// sum, and a residual add. Its inputs are x and positions; its outputs q, out, ids and counts.
class Step {
 public:
  static constexpr int64_t kTokens = 3, kDim = 256, kHeads = 4, kHeadDims = 48, kRope = 16;
  static constexpr int64_t kExperts = 8, kTopK = 2, kFfn = 256;

  explicit Step(Backend& gpu) : gpu_(gpu) {
    const float w_sigma = 1.0f / 16.0f;  // 1/sqrt(kDim): projections of order 1
    norm_w_ = to_device(gpu, norm_weights(kDim, 1));
    wq_ = to_device(gpu, make_weights(DType::Q4_K, kHeads * kHeadDims, kDim, 2, w_sigma));
    router_ = to_device(gpu, make_weights(DType::F32, kExperts, kDim, 3, 3 * w_sigma));
    gate_ = to_device(gpu, make_weights(DType::Q4_K, kExperts * kFfn, kDim, 4, w_sigma));
    up_ = to_device(gpu, make_weights(DType::Q4_K, kExperts * kFfn, kDim, 5, w_sigma));
    down_ = to_device(gpu, make_weights(DType::Q6_K, kExperts * kDim, kFfn, 6, w_sigma));
    x_ = poisoned(gpu, kTokens * kDim);
    positions_ = to_device(gpu, std::vector<int32_t>(kTokens, 0));
    h_ = poisoned(gpu, kTokens * kDim);
    q_ = poisoned(gpu, kTokens * kHeads * kHeadDims);
    logits_ = poisoned(gpu, kTokens * kExperts);
    ids_ = to_device(gpu, std::vector<int32_t>(kTokens * kTopK, 0));
    weights_ = poisoned(gpu, kTokens * kTopK);
    counts_ = to_device(gpu, std::vector<uint64_t>(kExperts, 0));
    slots_ = poisoned(gpu, kTokens * kTopK * kDim);
    out_ = poisoned(gpu, kTokens * kDim);
  }

  // Writes the inputs (outside any capture).
  void set_inputs(const std::vector<float>& x, const std::vector<int32_t>& positions) {
    gpu_.copy_from_host(x_.data(), x.data(), x.size() * sizeof(float));
    gpu_.copy_from_host(positions_.data(), positions.data(), positions.size() * sizeof(int32_t));
  }

  void submit() {
    gpu_.rms_norm({.input = x_.data(),
                   .weight = norm_w_.data(),
                   .output = h_.data(),
                   .n_rows = kTokens,
                   .dim = kDim,
                   .input_stride = kDim,
                   .output_stride = kDim,
                   .eps = 1e-6f});
    gpu_.matmul({.weight = weight_view(DType::Q4_K, wq_.data(), kHeads * kHeadDims, kDim),
                 .input = h_.data(),
                 .output = q_.data(),
                 .n_tokens = kTokens});
    gpu_.rope({.data = q_.data(),
               .positions = positions_.data(),
               .n_tokens = kTokens,
               .n_heads = kHeads,
               .head_stride = kHeadDims,
               .token_stride = kHeads * kHeadDims,
               .offset = kHeadDims - kRope,
               .params = {.rope_dims = kRope,
                          .freq_scale = 1.0f / 40.0f,
                          .ext_factor = 1.0f,
                          .original_ctx = 4096}});
    gpu_.matmul({.weight = weight_view(DType::F32, router_.data(), kExperts, kDim),
                 .input = h_.data(),
                 .output = logits_.data(),
                 .n_tokens = kTokens,
                 .kernels = KernelChoice::Tiled});
    gpu_.moe_route({.logits = logits_.data(),
                    .n_tokens = kTokens,
                    .n_expert = kExperts,
                    .top_k = kTopK,
                    .gating = MoeGating::Softmax,
                    .n_groups = 1,
                    .n_groups_used = 1,
                    .normalize = true,
                    .scale = 1.0f,
                    .expert_ids = ids_.data(),
                    .expert_weights = weights_.data(),
                    .counts = counts_.data()});
    gpu_.moe({.input = h_.data(),
              .gate = weight_view(DType::Q4_K, gate_.data(), kFfn, kDim, kExperts),
              .up = weight_view(DType::Q4_K, up_.data(), kFfn, kDim, kExperts),
              .down = weight_view(DType::Q6_K, down_.data(), kDim, kFfn, kExperts),
              .expert_ids = ids_.data(),
              .n_expert = kExperts,
              .n_tokens = kTokens,
              .top_k = kTopK,
              .dim = kDim,
              .ffn_dims = kFfn,
              .slots = slots_.data()});
    gpu_.moe_reduce({.slots = slots_.data(),
                     .weights = weights_.data(),
                     .n_tokens = kTokens,
                     .top_k = kTopK,
                     .dim = kDim,
                     .output = out_.data()});
    gpu_.add(out_.data(), x_.data(), kTokens * kDim);
  }

  struct Outputs {
    std::vector<float> q, out;
    std::vector<int32_t> ids;
  };
  Outputs outputs() { return {to_host(gpu_, q_), to_host(gpu_, out_), to_host(gpu_, ids_)}; }
  std::vector<uint64_t> counts() { return to_host(gpu_, counts_); }

 private:
  Backend& gpu_;
  DeviceArray<float> norm_w_, x_, h_, q_, logits_, weights_, slots_, out_;
  DeviceArray<uint8_t> wq_, router_, gate_, up_, down_;
  DeviceArray<int32_t> positions_, ids_;
  DeviceArray<uint64_t> counts_;
};

void count_choices(const std::vector<int32_t>& ids, std::vector<uint64_t>& counts) {
  for (int32_t e : ids) ++counts[size_t(e)];
}

// Replays give exactly what the ops give run directly (the same kernels on the same inputs), for
// two different inputs written between replays; capturing runs nothing (the counts do not move).
TEST_F(CudaBackendTest, ReplayedCaptureMatchesDirectOpsWithNewInputs) {
  ASSERT_TRUE(gpu().can_capture());
  Step step(gpu());
  const std::vector<float> x_a = gaussian(Step::kTokens * Step::kDim, 11);
  const std::vector<float> x_b = gaussian(Step::kTokens * Step::kDim, 12);
  const std::vector<int32_t> positions_a = {5, 6, 7}, positions_b = {100, 2000, 3};

  // Directly, which also sizes the kernels' scratch before the capture.
  step.set_inputs(x_a, positions_a);
  step.submit();
  const Step::Outputs direct_a = step.outputs();
  step.set_inputs(x_b, positions_b);
  step.submit();
  const Step::Outputs direct_b = step.outputs();
  ASSERT_FALSE(same_bits(direct_a.q, direct_b.q) || same_bits(direct_a.out, direct_b.out))
      << "the two inputs give the same outputs: the replays below would prove nothing";
  std::vector<uint64_t> expected_counts = step.counts();

  gpu().begin_capture();
  step.submit();
  const std::unique_ptr<Graph> graph = gpu().end_capture();
  EXPECT_EQ(step.counts(), expected_counts) << "the capture ran the routing";

  for (int replay = 0; replay < 2; ++replay) {
    const bool a = replay == 0;
    step.set_inputs(a ? x_a : x_b, a ? positions_a : positions_b);
    gpu().replay(*graph);
    const Step::Outputs replayed = step.outputs();
    const Step::Outputs& direct = a ? direct_a : direct_b;
    EXPECT_TRUE(same_bits(replayed.q, direct.q)) << "q after replay " << replay;
    EXPECT_TRUE(same_bits(replayed.out, direct.out)) << "out after replay " << replay;
    EXPECT_EQ(replayed.ids, direct.ids) << "expert ids after replay " << replay;
    count_choices(direct.ids, expected_counts);
  }
  EXPECT_EQ(step.counts(), expected_counts) << "routing counts after two replays";
}

// The CPU's share of a step as the model runs it (model/deepseek2.cpp, routed_experts): the
// device's activations copied to pinned host memory in stream order, a host task running the CPU
// backend's matmul on them, the device waiting for the task's event and copying the result back,
// then a device op on it. The result must be the bits of the CPU's matmul on the same input.
class HostShare {
 public:
  static constexpr int64_t kTokens = 3, kDim = 256, kRows = 130;

  explicit HostShare(Backend& gpu) : gpu_(gpu) {
    weights_ = make_weights(DType::Q4_K, kRows, kDim, 21, 1.0f / 16.0f);
    bias_host_ = gaussian(kTokens * kRows, 22);
    norm_w_ = to_device(gpu, norm_weights(kDim, 23));
    x_ = poisoned(gpu, kTokens * kDim);
    h_ = poisoned(gpu, kTokens * kDim);
    y_ = poisoned(gpu, kTokens * kRows);
    bias_ = to_device(gpu, bias_host_);
    pinned_in_ = gpu.allocate_host(kTokens * kDim * sizeof(float), "host task input");
    pinned_out_ = gpu.allocate_host(kTokens * kRows * sizeof(float), "host task output");
  }

  void set_input(const std::vector<float>& x) {
    gpu_.copy_from_host(x_.data(), x.data(), x.size() * sizeof(float));
  }

  void submit() {
    gpu_.rms_norm({.input = x_.data(),
                   .weight = norm_w_.data(),
                   .output = h_.data(),
                   .n_rows = kTokens,
                   .dim = kDim,
                   .input_stride = kDim,
                   .output_stride = kDim,
                   .eps = 1e-6f});
    gpu_.copy_to_host_async(pinned_in_->data(), h_.data(), kTokens * kDim * sizeof(float));
    const std::shared_ptr<Event> done = gpu_.host_task([this] {
      ++runs_;
      task_cpu_.matmul({.weight = weight_view(DType::Q4_K, weights_.data(), kRows, kDim),
                        .input = pinned_in_->floats(),
                        .output = pinned_out_->floats(),
                        .n_tokens = kTokens});
    });
    gpu_.wait_for(done);
    gpu_.copy_from_host_async(y_.data(), pinned_out_->data(), kTokens * kRows * sizeof(float));
    gpu_.add(y_.data(), bias_.data(), kTokens * kRows);
  }

  // y as the device has it, and what it must be: the CPU's matmul of the device's h, plus bias.
  std::pair<std::vector<float>, std::vector<float>> result_and_expected(cpu::CpuBackend& cpu) {
    const std::vector<float> h = to_host(gpu_, h_);
    std::vector<float> expected(kTokens * kRows, poison_value());
    cpu.matmul({.weight = weight_view(DType::Q4_K, weights_.data(), kRows, kDim),
                .input = h.data(),
                .output = expected.data(),
                .n_tokens = kTokens});
    cpu.add(expected.data(), bias_host_.data(), kTokens * kRows);
    return {to_host(gpu_, y_), expected};
  }

  int runs() const { return runs_; }

 private:
  Backend& gpu_;
  cpu::CpuBackend task_cpu_{2};  // used by the task's thread only
  std::atomic<int> runs_{0};
  std::vector<uint8_t> weights_;
  std::vector<float> bias_host_;
  DeviceArray<float> norm_w_, x_, h_, y_, bias_;
  std::shared_ptr<DeviceBuffer> pinned_in_, pinned_out_;
};

TEST_F(CudaBackendTest, HostTaskRunsTheCpusShareInsideAndOutsideCaptures) {
  HostShare share(gpu());
  const std::vector<float> x_a = gaussian(HostShare::kTokens * HostShare::kDim, 31);
  const std::vector<float> x_b = gaussian(HostShare::kTokens * HostShare::kDim, 32);

  share.set_input(x_a);
  share.submit();
  gpu().synchronize();
  EXPECT_EQ(share.runs(), 1);
  const auto [direct, expected_direct] = share.result_and_expected(cpu_);
  EXPECT_TRUE(same_bits(direct, expected_direct)) << "host task outside a capture";

  ASSERT_TRUE(gpu().can_capture());
  gpu().begin_capture();
  share.submit();
  const std::unique_ptr<Graph> graph = gpu().end_capture();
  EXPECT_EQ(share.runs(), 1) << "the task ran while being captured";
  std::vector<float> previous;
  for (int replay = 0; replay < 2; ++replay) {
    share.set_input(replay == 0 ? x_a : x_b);
    gpu().replay(*graph);
    gpu().synchronize();
    EXPECT_EQ(share.runs(), 2 + replay) << "the task runs once per replay";
    const auto [result, expected] = share.result_and_expected(cpu_);
    EXPECT_TRUE(same_bits(result, expected)) << "host task in replay " << replay;
    if (replay == 0) {
      EXPECT_TRUE(same_bits(result, direct)) << "replay of the direct run's input";
    } else {
      EXPECT_FALSE(same_bits(result, previous)) << "the replays ignored the input";
    }
    previous = result;
  }
}

// "An exception thrown by the task is rethrown by synchronize()": the tandem::Error itself, once;
// the backend goes on afterwards. The same for a task inside a graph, at its replay.
TEST_F(CudaBackendTest, AHostTaskThatThrowsFailsSynchronize) {
  const auto y = to_device(gpu(), std::vector<float>{1.0f, 2.0f});
  const auto x = to_device(gpu(), std::vector<float>{10.0f, 20.0f});
  auto expect_error_from_synchronize = [&](const std::string& context) {
    try {
      gpu().synchronize();
      ADD_FAILURE() << context << ": synchronize() did not throw";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("failed on purpose"), std::string::npos)
          << context << ": " << e.what();
    }
    EXPECT_NO_THROW(gpu().synchronize()) << context << ": the error is reported once";
  };

  gpu().wait_for(gpu().host_task([] { throw Error("host task failed on purpose"); }));
  expect_error_from_synchronize("direct");
  gpu().add(y.data(), x.data(), 2);
  EXPECT_EQ(to_host(gpu(), y), (std::vector<float>{11.0f, 22.0f})) << "an op after the error";

  gpu().begin_capture();
  gpu().wait_for(gpu().host_task([] { throw Error("captured host task failed on purpose"); }));
  const std::unique_ptr<Graph> graph = gpu().end_capture();
  EXPECT_NO_THROW(gpu().synchronize()) << "the captured task ran at capture";
  gpu().replay(*graph);
  expect_error_from_synchronize("replay");
}

}  // namespace
}  // namespace tandem::test
