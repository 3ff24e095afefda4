// Backend::add_parts is how a layer's device adds the partial results other devices sent (expert
// slots, head shares' outputs): it must round exactly as one add() per part in order, so that a
// gather in one op gives the bits the executor had when it added the parts one at a time.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "backends/cpu/cpu_backend.h"

namespace tandem {
namespace {

std::vector<float> gaussian(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng) * (1.0f + float(seed % 7) * 1e3f);  // mixed magnitudes round
  return v;
}

TEST(AddParts, RoundsAsOneAddPerPartInOrder) {
  cpu::CpuBackend cpu(1);
  uint32_t seed = 40;
  for (size_t n_parts : {size_t(0), size_t(1), size_t(2), size_t(7), size_t(11)}) {
    for (int64_t n : {int64_t(1), int64_t(17), int64_t(7168 * 8 + 3)}) {
      std::vector<std::vector<float>> parts;
      std::vector<const float*> pointers;
      for (size_t p = 0; p < n_parts; ++p) {
        parts.push_back(gaussian(size_t(n), ++seed));
        pointers.push_back(parts.back().data());
      }
      const std::vector<float> y0 = gaussian(size_t(n) + 1, ++seed);  // one guard element
      std::vector<float> one_by_one = y0, at_once = y0;
      for (const float* part : pointers) cpu.add(one_by_one.data(), part, n);
      cpu.add_parts(at_once.data(), pointers, n);
      EXPECT_EQ(std::memcmp(one_by_one.data(), at_once.data(), at_once.size() * sizeof(float)), 0)
          << n_parts << " parts of " << n;
      // Not a test that cannot fail: with parts, the order of the adds changes the bits.
      if (n_parts >= 7 && n > 1000) {
        std::vector<float> reversed = y0;
        for (size_t p = n_parts; p-- > 0;) cpu.add(reversed.data(), pointers[p], n);
        EXPECT_NE(std::memcmp(reversed.data(), at_once.data(), at_once.size() * sizeof(float)), 0);
      }
    }
  }
}

}  // namespace
}  // namespace tandem
