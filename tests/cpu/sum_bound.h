#pragma once
// The bound a float sum of products added in order must keep, for the attention kernels' tests.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>

namespace tandem::cpu {

// |float sum - exact| <= n * eps * Σ|terms|: the bound of adding n products in order; the exact
// sum of term(0) .. term(n - 1) in double.
template <class Term>
void expect_near_sum(double got, int64_t n, Term term, const std::string& where) {
  double exact = 0, abs_terms = 0;
  for (int64_t i = 0; i < n; ++i) exact += term(i), abs_terms += std::abs(term(i));
  EXPECT_LE(std::abs(got - exact), double(n + 1) * 1.2e-7 * abs_terms + 1e-30) << where;
}

}  // namespace tandem::cpu
