// core/backend.h's fused ops give the bits of the sequences they replace (issue 27: GPUs launch
// them as one kernel; the CPU runs the sequence, and these tests pin down that definition): a
// MoE layer's slot sum with the residual add and the shared experts' add (MoeReduceOp::residual,
// ::shared) against moe_reduce, add, add.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "test_weights.h"

namespace tandem {
namespace {

// Magnitudes that differ from seed to seed, so that the adds round.
std::vector<float> gaussian(size_t n, uint32_t seed) {
  return test::gaussian(n, seed, 1.0f + float(seed % 5) * 100.0f);
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST(FusedOps, MoeReduceWithTheResidualAndSharedAddsIsTheSequence) {
  cpu::CpuBackend cpu(2);
  uint32_t seed = 70;
  for (int64_t n_tokens : {1, 3, 40}) {
    for (int64_t top_k : {1, 6, 8}) {
      for (bool with_shared : {false, true}) {
        const int64_t dim = 320;
        const size_t n = size_t(n_tokens * dim);
        const std::vector<float> slots = gaussian(size_t(n_tokens * top_k * dim), ++seed);
        const std::vector<float> weights = gaussian(size_t(n_tokens * top_k), ++seed);
        const std::vector<float> shared = gaussian(n, ++seed), x0 = gaussian(n, ++seed);
        const MoeReduceOp reduce{.slots = slots.data(),
                                 .weights = weights.data(),
                                 .n_tokens = n_tokens,
                                 .top_k = top_k,
                                 .dim = dim,
                                 .output = nullptr};
        std::vector<float> out_seq(n), x_seq = x0;
        MoeReduceOp plain = reduce;
        plain.output = out_seq.data();
        cpu.moe_reduce(plain);
        cpu.add(x_seq.data(), out_seq.data(), n_tokens * dim);
        if (with_shared) cpu.add(x_seq.data(), shared.data(), n_tokens * dim);

        std::vector<float> out_fused(n), x_fused = x0;
        MoeReduceOp fused = reduce;
        fused.output = out_fused.data();
        fused.residual = x_fused.data();
        fused.shared = with_shared ? shared.data() : nullptr;
        cpu.moe_reduce(fused);
        const std::string where = "n_tokens=" + std::to_string(n_tokens) +
                                  " top_k=" + std::to_string(top_k) +
                                  (with_shared ? " shared" : "");
        EXPECT_TRUE(same_bits(out_fused, out_seq)) << where;
        EXPECT_TRUE(same_bits(x_fused, x_seq)) << where;
        // Not a test that cannot fail: the adds in the other order round differently.
        if (with_shared) {
          std::vector<float> x_other = x0;
          cpu.add(x_other.data(), shared.data(), n_tokens * dim);
          cpu.add(x_other.data(), out_seq.data(), n_tokens * dim);
          EXPECT_FALSE(same_bits(x_other, x_seq)) << where;
        }
      }
    }
  }
}

}  // namespace
}  // namespace tandem
