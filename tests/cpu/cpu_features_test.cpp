#include "backends/cpu/cpu_features.h"

#include <gtest/gtest.h>

namespace tandem::cpu {
namespace {

TEST(CpuFeatures, NamesRoundTrip) {
  for (CpuIsa isa : {CpuIsa::Portable, CpuIsa::Avx2, CpuIsa::Avx512})
    EXPECT_EQ(parse_cpu_isa(cpu_isa_name(isa)), isa);
  EXPECT_EQ(parse_cpu_isa("sse2"), std::nullopt);
  EXPECT_EQ(parse_cpu_isa(""), std::nullopt);
}

TEST(CpuFeatures, SupportedLevelsAreAPrefixEndingAtTheDetectedOne) {
  const std::vector<CpuIsa> isas = supported_cpu_isas();
  ASSERT_FALSE(isas.empty());
  EXPECT_EQ(isas.front(), CpuIsa::Portable);
  EXPECT_EQ(isas.back(), detected_cpu_isa());
  for (size_t i = 0; i < isas.size(); ++i) EXPECT_EQ(int(isas[i]), int(i));
  EXPECT_TRUE(cpu_supports(CpuIsa::Portable));
}

TEST(CpuFeatures, BestIsaIsSupported) {
  EXPECT_TRUE(cpu_supports(best_cpu_isa()));
}

}  // namespace
}  // namespace tandem::cpu
