// The gated FFN's activation on every instruction set this CPU has, against double arithmetic,
// over the range FFN gates take and beyond (where e^-x overflows or vanishes), and split over a
// pool the same as on one thread.
#include "backends/cpu/activations.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

namespace tandem::cpu {
namespace {

TEST(Activations, SiluMulMatchesDoubleOnEveryIsa) {
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> gates(-30, 30), ups(-4, 4);
  std::vector<float> gate(1000), up(gate.size());
  for (size_t i = 0; i < gate.size(); ++i) gate[i] = gates(rng), up[i] = ups(rng);
  // Far ends: e^-x overflows to infinity (silu -> -0) or vanishes (silu -> x).
  gate[0] = -100, gate[1] = 100, gate[2] = 0, gate[3] = -87.5f, gate[4] = 1e-30f;
  ThreadPool pool(2);
  for (CpuIsa isa : supported_cpu_isas()) {
    for (int64_t n : {int64_t(1), int64_t(17), int64_t(gate.size())}) {
      std::vector<float> out(gate.begin(), gate.begin() + n);
      silu_mul_with_isa(isa, out.data(), up.data(), n, pool);
      for (int64_t i = 0; i < n; ++i) {
        const double g = gate[size_t(i)];
        const double expected = g / (1.0 + std::exp(-g)) * double(up[size_t(i)]);
        EXPECT_NEAR(out[size_t(i)], expected, 6e-7 * std::abs(expected) + 1e-38)
            << cpu_isa_name(isa) << " gate " << g << " up " << up[size_t(i)];
      }
    }
  }
}

// A NaN gate (a broken model or input) comes out NaN, as with the C library's exp, so that it is
// seen downstream instead of turning into a plausible number; a NaN up likewise. An infinite
// gate gives infinity (silu(x) -> x), as the C library's exp does.
TEST(Activations, SiluMulKeepsNan) {
  ThreadPool pool(1);
  for (CpuIsa isa : supported_cpu_isas()) {
    std::vector<float> gate = {NAN, INFINITY, 1.0f}, up = {1.0f, 2.0f, NAN};
    silu_mul_with_isa(isa, gate.data(), up.data(), int64_t(gate.size()), pool);
    EXPECT_TRUE(std::isnan(gate[0])) << cpu_isa_name(isa);
    EXPECT_EQ(gate[1], INFINITY) << cpu_isa_name(isa);
    EXPECT_TRUE(std::isnan(gate[2])) << cpu_isa_name(isa);
  }
}

// Past one task's worth of elements the pool splits the work; each element's result is its own.
TEST(Activations, SiluMulSplitOverThreadsGivesTheSameBits) {
  std::mt19937 rng(6);
  std::normal_distribution<float> dist(0, 3);
  std::vector<float> gate(100003), up(gate.size());
  for (size_t i = 0; i < gate.size(); ++i) gate[i] = dist(rng), up[i] = dist(rng);
  ThreadPool one(1), three(3);
  for (CpuIsa isa : supported_cpu_isas()) {
    std::vector<float> alone = gate, split = gate;
    silu_mul_with_isa(isa, alone.data(), up.data(), int64_t(gate.size()), one);
    silu_mul_with_isa(isa, split.data(), up.data(), int64_t(gate.size()), three);
    EXPECT_EQ(alone, split) << cpu_isa_name(isa);
  }
}

}  // namespace
}  // namespace tandem::cpu
