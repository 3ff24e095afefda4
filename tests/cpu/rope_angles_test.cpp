// rope_cos_sin (backends/rope_angles.h), the rotary angles shared by the CPU backend and the CUDA
// kernels, against the formula written out here: bit-identical for plain RoPE and for YaRN with
// DeepSeek's parameters (factor 40 over an original context of 4096, beta 32 / 1).
#include "backends/rope_angles.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <numbers>
#include <random>
#include <string>
#include <vector>

#include "backends/cpu/cpu_backend.h"

namespace tandem {
namespace {

// The angle of rotated pair i at position pos, as CpuBackend::rope computed it before
// rope_angles.h existed.
void reference_cos_sin(const RopeParams& p, float pos, int64_t i, float* c, float* s) {
  float low = 0, high = 0;
  if (p.ext_factor != 0.0f) {
    auto correction_dim = [&](float n_rot) {
      return float(p.rope_dims) *
             std::log(float(p.original_ctx) / (n_rot * 2.0f * std::numbers::pi_v<float>)) /
             (2.0f * std::log(p.freq_base));
    };
    low = std::max(0.0f, std::floor(correction_dim(p.beta_fast)));
    high = std::min(float(p.rope_dims - 1), std::ceil(correction_dim(p.beta_slow)));
  }
  const float theta_extrap = pos * std::pow(p.freq_base, -2.0f * float(i) / float(p.rope_dims));
  float theta = p.freq_scale * theta_extrap;
  if (p.ext_factor != 0.0f) {
    const float y = (float(i) - low) / std::max(0.001f, high - low);
    const float mix = (1.0f - std::min(1.0f, std::max(0.0f, y))) * p.ext_factor;
    theta = theta * (1.0f - mix) + theta_extrap * mix;
  }
  *c = std::cos(theta);
  *s = std::sin(theta);
}

const RopeParams kPlain = {.rope_dims = 64, .freq_base = 10000.0f};
const RopeParams kYarn = {.rope_dims = 64,
                          .freq_base = 10000.0f,
                          .freq_scale = 1.0f / 40.0f,
                          .ext_factor = 1.0f,
                          .original_ctx = 4096,
                          .beta_fast = 32.0f,
                          .beta_slow = 1.0f};

TEST(RopeAngles, YarnRampBoundsForDeepSeekParameters) {
  // 64 * ln(4096 / (beta * 2 pi)) / (2 ln 10000): 10.47 for beta 32, 22.5 for beta 1.
  const YarnRamp ramp = yarn_ramp(kYarn);
  EXPECT_EQ(ramp.low, 10.0f);
  EXPECT_EQ(ramp.high, 23.0f);
  const YarnRamp none = yarn_ramp(kPlain);
  EXPECT_EQ(none.low, 0.0f);
  EXPECT_EQ(none.high, 0.0f);
}

TEST(RopeAngles, CosSinMatchTheFormulaBitwise) {
  RopeParams yarn_wide = kYarn;
  yarn_wide.rope_dims = 128;
  yarn_wide.freq_base = 500000.0f;
  for (const RopeParams& p : {kPlain, kYarn, yarn_wide}) {
    const YarnRamp ramp = yarn_ramp(p);
    for (int32_t pos : {0, 1, 2, 17, 4095, 4096, 12345, 163839}) {
      for (int64_t i = 0; i < p.rope_dims / 2; ++i) {
        float c = 0, s = 0, want_c = 0, want_s = 0;
        rope_cos_sin(p, ramp.low, ramp.high, float(pos), i, &c, &s);
        reference_cos_sin(p, float(pos), i, &want_c, &want_s);
        const std::string where = "dims " + std::to_string(p.rope_dims) + " ext " +
                                  std::to_string(p.ext_factor) + " pos " + std::to_string(pos) +
                                  " pair " + std::to_string(i);
        EXPECT_EQ(std::bit_cast<uint32_t>(c), std::bit_cast<uint32_t>(want_c)) << where;
        EXPECT_EQ(std::bit_cast<uint32_t>(s), std::bit_cast<uint32_t>(want_s)) << where;
      }
    }
  }
}

// CpuBackend::rope turns each pair of each head by rope_cos_sin's angle, only inside the rotated
// span of the head.
TEST(RopeAngles, CpuRopeRotatesByRopeCosSin) {
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  cpu::CpuBackend cpu(1);
  const int64_t n_tokens = 5, n_heads = 3, head_stride = 80, offset = 8;
  const std::vector<int32_t> positions = {0, 7, 4096, 5000, 100000};
  std::vector<float> data(size_t(n_tokens * n_heads * head_stride));
  for (float& x : data) x = dist(rng);
  const std::vector<float> before = data;
  cpu.rope({.data = data.data(),
            .positions = positions.data(),
            .n_tokens = n_tokens,
            .n_heads = n_heads,
            .head_stride = head_stride,
            .token_stride = n_heads * head_stride,
            .offset = offset,
            .params = kYarn});
  const YarnRamp ramp = yarn_ramp(kYarn);
  for (int64_t t = 0; t < n_tokens; ++t) {
    for (int64_t h = 0; h < n_heads; ++h) {
      const int64_t head = (t * n_heads + h) * head_stride;
      for (int64_t d = 0; d < head_stride; ++d) {
        const int64_t i = (d - offset) / 2;
        if (d < offset || i >= kYarn.rope_dims / 2) {
          EXPECT_EQ(data[head + d], before[head + d]);
          continue;
        }
        float c = 0, s = 0;
        rope_cos_sin(kYarn, ramp.low, ramp.high, float(positions[t]), i, &c, &s);
        const float x0 = before[head + offset + 2 * i], x1 = before[head + offset + 2 * i + 1];
        const float want = (d - offset) % 2 == 0 ? x0 * c - x1 * s : x0 * s + x1 * c;
        EXPECT_EQ(std::bit_cast<uint32_t>(data[head + d]), std::bit_cast<uint32_t>(want))
            << "token " << t << " head " << h << " dim " << d;
      }
    }
  }
}

}  // namespace
}  // namespace tandem
