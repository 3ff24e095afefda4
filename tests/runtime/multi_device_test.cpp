// One forward pass spread over several devices (simulated ones here) must give exactly the
// logits of the single-CPU run, whatever the plan: layer splits, experts of one layer over three
// devices, the head elsewhere, everything on one simulated device.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>

#include "backends/cpu/cpu_backend.h"
#include "backends/sim/sim_backend.h"
#include "core/error.h"
#include "gguf/gguf_file.h"
#include "model/deepseek2.h"
#include "runtime/kv_cache.h"
#include "greedy_steps.h"
#include "test_support.h"

namespace tandem {
namespace {

constexpr size_t kSimMemory = size_t(64) << 20;

struct Machine {
  cpu::CpuBackend cpu{2};
  sim::SimBackend sim0{0, kSimMemory}, sim1{1, kSimMemory};
};

// Logits of the prompt (every position) and then of `n_decode` greedy steps, one token each.
std::vector<float> run_plan(const gguf::GgufFile& file, const DevicePlan& plan, int n_decode) {
  Deepseek2Model model(file, plan);
  return test::prompt_then_greedy(model, plan.layers, n_decode);
}

class MultiDevice : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    file_ = std::make_unique<gguf::GgufFile>(gguf::GgufFile::open(test::fixture(GetParam()).string()));
    hp_ = read_deepseek2_hparams(*file_);
    n_layers_ = hp_.n_layer - hp_.n_nextn_layers;
    reference_ = run_plan(*file_, DevicePlan::single(m_.cpu, n_layers_, hp_.n_expert), 4);
  }
  DevicePlan all_on(Backend& b) { return DevicePlan::single(b, n_layers_, hp_.n_expert); }
  void expect_identical(const DevicePlan& plan) {
    const std::vector<float> logits = run_plan(*file_, plan, 4);
    ASSERT_EQ(logits.size(), reference_.size());
    EXPECT_EQ(std::memcmp(logits.data(), reference_.data(), logits.size() * sizeof(float)), 0)
        << "logits differ from the single-CPU run";
  }

  Machine m_;
  std::unique_ptr<gguf::GgufFile> file_;
  Deepseek2Hparams hp_;
  uint32_t n_layers_ = 0;
  std::vector<float> reference_;
};

TEST_P(MultiDevice, EverythingOnOneSimulatedDevice) { expect_identical(all_on(m_.sim0)); }

TEST_P(MultiDevice, LayersSplitAcrossDevicesWithActivationCopiesAtEachCut) {
  DevicePlan plan = all_on(m_.cpu);
  for (uint32_t il = 0; il < n_layers_; ++il) {
    Backend* device = il < n_layers_ / 2 ? static_cast<Backend*>(&m_.sim0) : &m_.sim1;
    plan.layers[il] = device;
    for (auto& e : plan.experts[il]) e = device;
  }
  plan.output = &m_.sim1;
  expect_identical(plan);
}

TEST_P(MultiDevice, ExpertsOfEveryLayerSplitOverThreeDevices) {
  DevicePlan plan = all_on(m_.cpu);
  Backend* three[] = {&m_.cpu, &m_.sim0, &m_.sim1};
  for (auto& layer : plan.experts)
    for (size_t e = 0; e < layer.size(); ++e) layer[e] = three[e % 3];
  expect_identical(plan);
}

TEST_P(MultiDevice, ExpertsOnOneDeviceAttentionOnAnother) {
  DevicePlan plan = all_on(m_.sim0);
  for (auto& layer : plan.experts)
    for (auto& e : layer) e = &m_.cpu;
  plan.embeddings = &m_.cpu;
  expect_identical(plan);
}

TEST_P(MultiDevice, AlternatingLayersWithTheHeadOnTheHost) {
  DevicePlan plan = all_on(m_.cpu);
  for (uint32_t il = 0; il < n_layers_; ++il) {
    Backend* device = il % 2 ? static_cast<Backend*>(&m_.sim1) : &m_.cpu;
    plan.layers[il] = device;
    for (size_t e = 0; e < plan.experts[il].size(); ++e) plan.experts[il][e] = e < 3 ? &m_.sim0 : device;
  }
  expect_identical(plan);
}

// Head-split attention adds the partial output projections of the shares in another order than
// one device's matmul: the logits may differ by rounding (within 1e-3), the greedy tokens not.
TEST_P(MultiDevice, AttentionHeadsSplitOverDevices) {
  const uint32_t heads = hp_.n_head;
  ASSERT_GE(heads, 4u);
  DevicePlan plan = all_on(m_.cpu);
  const int32_t quarter = int32_t(heads / 4);
  for (uint32_t il = 0; il < n_layers_; ++il) {
    // Odd layers: three shares, the layer on the host; even: two shares, the layer on sim0.
    if (il % 2) {
      plan.heads[il] = {{&m_.cpu, 0, quarter}, {&m_.sim0, quarter, 2 * quarter},
                        {&m_.sim1, 3 * quarter, int32_t(heads) - 3 * quarter}};
    } else {
      plan.layers[il] = &m_.sim0;
      plan.heads[il] = {{&m_.sim0, 0, 3 * quarter}, {&m_.sim1, 3 * quarter, int32_t(heads) - 3 * quarter}};
    }
  }
  std::vector<float> logits;
  try {
    logits = run_plan(*file_, plan, 4);
  } catch (const Error& e) {
    // A quantized attn_output whose blocks span two heads cannot be cut between them.
    ASSERT_TRUE(std::string(GetParam()).find("F32") == std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("cut its blocks"), std::string::npos) << e.what();
    return;
  }
  ASSERT_EQ(logits.size(), reference_.size());
  double worst = 0;
  for (size_t i = 0; i < logits.size(); ++i)
    worst = std::max(worst, double(std::abs(logits[i] - reference_[i])));
  EXPECT_LE(worst, 1e-3) << "head-split logits drift from the single-CPU run";
  EXPECT_GT(worst, 0.0) << "the partial outputs were expected to round differently";
  // The same greedy token at every position.
  const size_t vocab = hp_.n_vocab;
  for (size_t row = 0; row < logits.size() / vocab; ++row) {
    const float* a = logits.data() + row * vocab;
    const float* b = reference_.data() + row * vocab;
    EXPECT_EQ(std::max_element(a, a + vocab) - a, std::max_element(b, b + vocab) - b) << "row " << row;
  }
}

TEST_P(MultiDevice, HeadSharesThatDoNotCoverTheHeadsAreRefused) {
  DevicePlan plan = all_on(m_.cpu);
  plan.heads[0] = {{&m_.cpu, 0, 1}, {&m_.sim0, 2, int32_t(hp_.n_head) - 2}};  // head 1 missing
  try {
    Deepseek2Model model(*file_, plan);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("must cover heads"), std::string::npos) << e.what();
  }
  plan.heads[0] = {{&m_.cpu, 0, 1}, {&m_.sim0, 1, 1}, {&m_.cpu, 2, int32_t(hp_.n_head) - 2}};
  try {
    Deepseek2Model model(*file_, plan);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cpu has two head shares"), std::string::npos) << e.what();
  }
}

// Copies of experts (the planner's hot experts on a second GPU): every step each device of a
// layer gives each chosen expert to one of its holders by the same rule, so each slot is
// computed once (twice or never would change the sums) and the logits keep the single-CPU bits.
// Homes on the host and two devices, copies between the two; the layer on the host (odd layers)
// or on a device that holds experts (even layers: it starts each step busy with the shared ones).
TEST_P(MultiDevice, ExpertsWithCopiesOnASecondDevice) {
  DevicePlan plan = all_on(m_.cpu);
  plan.expert_copies.assign(n_layers_, {});
  for (uint32_t il = 0; il < n_layers_; ++il) {
    if (il % 2 == 0) plan.layers[il] = &m_.sim0;
    std::vector<Backend*>& homes = plan.experts[il];
    plan.expert_copies[il].assign(homes.size(), {});
    for (size_t e = 0; e < homes.size(); ++e) {
      if (e % 4 == 3) continue;  // stays on the host, without a copy
      homes[e] = e % 2 ? &m_.sim1 : &m_.sim0;
      if (e % 3 != 0) plan.expert_copies[il][e].push_back(e % 2 ? &m_.sim0 : &m_.sim1);
    }
  }
  expect_identical(plan);
}

TEST_P(MultiDevice, CopiesOfExpertsOnTheHostOrAnotherKindAreRefused) {
  DevicePlan plan = all_on(m_.sim0);
  plan.expert_copies.assign(n_layers_, std::vector<std::vector<Backend*>>(hp_.n_expert));
  const uint32_t moe_layer = hp_.n_leading_dense;
  plan.expert_copies[moe_layer][1] = {&m_.cpu};
  try {
    Deepseek2Model model(*file_, plan);
    FAIL() << "no error";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("a copy on cpu beside its home on sim:0"), std::string::npos) << what;
  }
}

TEST_P(MultiDevice, ADeviceThatIsTooSmallFailsLikeAnOutOfMemoryGpu) {
  sim::SimBackend tiny(7, 64 << 10);
  try {
    Deepseek2Model model(*file_, all_on(tiny));
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("sim:7: out of memory"), std::string::npos) << e.what();
  }
  EXPECT_EQ(tiny.used_bytes(), 0u);  // nothing leaked from the failed load
}

INSTANTIATE_TEST_SUITE_P(Fixtures, MultiDevice, ::testing::Values("micro-v2-F32.gguf", "micro-v3-F32.gguf", "small-v3-Q4_K_M.gguf"),
                         [](const auto& info) {
                           std::string name = info.param;
                           for (char& c : name) c = std::isalnum(uint8_t(c)) ? c : '_';
                           return name;
                         });

}  // namespace
}  // namespace tandem
