// The CUDA backend's matmul and small ops against the CPU backend, on random inputs: one test per
// op that loops over formats and shapes (llama.cpp's test-backend-ops style). Each test makes host
// data, copies it to the GPU, poisons the outputs, runs the op on both backends (the CPU on host
// memory), copies back and compares. The attention and MoE ops are in
// cuda_attention_moe_test.cpp, graphs and host tasks in cuda_graph_test.cpp, whole models in
// cuda_model_test.cpp.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "cuda_test_support.h"

namespace tandem::test {
namespace {

// Floats past the end of an output that an op must not write.
constexpr size_t kGuard = 67;

// ---- matmul ----

// y = W·x in double from the exact weights, with Σ_k |w_k x_k| per element for the error measure.
struct MatmulReference {
  std::vector<double> y, abs_sum;  // [n_tokens, rows]
};

MatmulReference exact_matmul(const std::vector<float>& w, int64_t rows, int64_t cols,
                             const std::vector<float>& x, int64_t n_tokens) {
  MatmulReference ref{std::vector<double>(size_t(n_tokens * rows)),
                      std::vector<double>(size_t(n_tokens * rows))};
  for (int64_t t = 0; t < n_tokens; ++t)
    for (int64_t r = 0; r < rows; ++r) {
      double sum = 0, abs_sum = 0;
      for (int64_t k = 0; k < cols; ++k) {
        const double p = double(w[size_t(r * cols + k)]) * double(x[size_t(t * cols + k)]);
        sum += p;
        abs_sum += std::fabs(p);
      }
      ref.y[size_t(t * rows + r)] = sum;
      ref.abs_sum[size_t(t * rows + r)] = abs_sum;
    }
  return ref;
}

// Bounds on the normalized error (cuda_test_support.h) and why. Any layout bug (a wrong nibble,
// scale, min, bit plane, row or token) costs 0.1 or more; the bounds are there to catch the
// smaller mistakes too.
//
// GPU against the exact reference, every format: the GPU decodes weights exactly (bit for bit
// dequantize_row, tests/quant/block_decode_test.cpp) and multiplies in F32: the rows kernel by FMA
// in a fixed order, errors of random sign ~sqrt(cols) * 2^-24 (~1e-7 here); the tiled kernel in
// TF32 split three ways (hi·hi + hi·lo + lo·hi; the dropped lo·lo is ~2^-22 of a product), whose
// tensor-core accumulation rounds toward zero: one rounding of at most 2^-23 |partial sum| per
// 8 columns per product, 192 at 512 columns, and partial sums are a fraction of Σ|w x|: a few
// 1e-6 at worst. Bound 2e-5. Forgetting the split (plain TF32, 11 significant bits per operand)
// fails it: emulated by rounding F32 weights and inputs to TF32, it cost 4e-4.
constexpr double kMatmulGpuVsExact = 2e-5;
// GPU against the CPU: the CPU's own error plus the GPU's. Floats: the CPU multiplies in f32
// (~1e-7 against the exact reference here), so the GPU's bound holds. Quantized formats: the CPU
// quantizes the activations to int16 per 32 elements; against the exact reference it reaches
// 4.3e-5 on these shapes (Q4_0, rows of 32 columns, where one activation scale covers the whole
// row), 3e-5 for the other 32-element formats and 1.2e-5 for the k-quants, plus the GPU's few
// 1e-6: bound 1.5e-4.
double matmul_bound_vs_cpu(DType type) {
  return is_float_format(type) ? 2e-5 : 1.5e-4;
}

// Row lengths: the formats' blocks once and several times; the float formats (groups of 8 on the
// GPU) also 40, which leaves the tiled kernel a partial step of 32 columns.
std::vector<int64_t> matmul_cols(DType type) {
  const uint32_t block = dtype_info(type).block_elems;
  if (block == 256) return {256, 512};
  if (block == 32) return {32, 96, 256, 512};
  return {32, 40, 96, 256, 512};
}

TEST_F(CudaBackendTest, MatmulEveryFormatShapeAndKernelChoiceMatchesCpu) {
  uint32_t seed = 1;
  for (DType type : kGpuFormats) {
    ASSERT_TRUE(gpu().can_multiply(type)) << dtype_name(type);
    const double exact_bound = is_standin(gpu()) ? matmul_bound_vs_cpu(type) : kMatmulGpuVsExact;
    Worst format_vs_cpu, format_vs_exact, format_cpu_vs_exact;
    // Rows that are no multiple of the rows kernel's 4 per block nor the tiled kernel's 64;
    // tokens over one and several launches of 8 (rows kernel) and one and two tiles of 64.
    for (int64_t cols : matmul_cols(type)) {
      for (int64_t rows : {1, 67, 130}) {
        const std::vector<uint8_t> weights = make_weights(type, rows, cols, ++seed);
        const std::vector<float> w = dequantized(type, weights, rows, cols);
        const auto w_dev = to_device(gpu(), weights);
        for (int64_t n_tokens : {1, 3, 8, 9, 17, 70}) {
          const std::vector<float> x = gaussian(size_t(n_tokens * cols), ++seed);
          const auto x_dev = to_device(gpu(), x);
          const MatmulReference ref = exact_matmul(w, rows, cols, x, n_tokens);
          const size_t n_out = size_t(n_tokens * rows);
          const auto y_dev = poisoned(gpu(), n_out + kGuard);
          for (KernelChoice choice : kChoices) {
            const std::string context =
                fmt::format("{} rows={} cols={} n_tokens={} {}", dtype_name(type), rows, cols,
                            n_tokens, choice_name(choice));
            poison(gpu(), y_dev);
            gpu().matmul({.weight = weight_view(type, w_dev.data(), rows, cols),
                          .input = x_dev.data(),
                          .output = y_dev.data(),
                          .n_tokens = n_tokens,
                          .kernels = choice});
            std::vector<float> y_cpu(n_out, poison_value());
            cpu_.matmul({.weight = weight_view(type, weights.data(), rows, cols),
                         .input = x.data(),
                         .output = y_cpu.data(),
                         .n_tokens = n_tokens,
                         .kernels = choice});
            const std::vector<float> y = to_host(gpu(), y_dev);
            Worst vs_cpu, vs_exact, cpu_vs_exact;
            for (size_t i = 0; i < n_out; ++i) {
              auto where = [&] {
                return fmt::format("{} token {} row {}", context, i / size_t(rows),
                                   i % size_t(rows));
              };
              vs_cpu.add(normalized_error(y[i], y_cpu[i], ref.abs_sum[i]), where);
              vs_exact.add(normalized_error(y[i], ref.y[i], ref.abs_sum[i]), where);
              cpu_vs_exact.add(normalized_error(y_cpu[i], ref.y[i], ref.abs_sum[i]), where);
            }
            EXPECT_LE(vs_cpu.error, matmul_bound_vs_cpu(type)) << "GPU vs CPU at " << vs_cpu.where;
            EXPECT_LE(vs_exact.error, exact_bound) << "GPU vs exact at " << vs_exact.where;
            size_t guard_written = 0;
            for (size_t i = n_out; i < y.size(); ++i) guard_written += !is_poison(y[i]);
            EXPECT_EQ(guard_written, 0u) << context << ": floats written past the output";
            format_vs_cpu.add(vs_cpu);
            format_vs_exact.add(vs_exact);
            format_cpu_vs_exact.add(cpu_vs_exact);
          }
        }
      }
    }
    std::printf(
        "  %-5s GPU vs CPU %.3g (bound %.3g), GPU vs exact %.3g (bound %.3g), CPU vs exact %.3g\n",
        std::string(dtype_name(type)).c_str(), format_vs_cpu.error, matmul_bound_vs_cpu(type),
        format_vs_exact.error, exact_bound, format_cpu_vs_exact.error);
  }
}

// Batch invariance (core/backend.h, KernelChoice): under PerToken a token's output has the same
// bits alone and among 9 tokens (the rows kernel takes 8 at a time, then 1); under Tiled the same
// alone and among 70 (two tiles of 64, the token at several places in its tile).
TEST_F(CudaBackendTest, MatmulTokenResultsDoNotDependOnBatchCompanions) {
  const int64_t rows = 67, cols = 256;
  struct Case {
    KernelChoice choice;
    int64_t n_tokens;
    std::vector<int64_t> probed;  // tokens run alone too
  };
  const Case cases[] = {{KernelChoice::PerToken, 9, {0, 1, 2, 3, 4, 5, 6, 7, 8}},
                        {KernelChoice::Tiled, 70, {0, 1, 31, 63, 64, 69}}};
  uint32_t seed = 500;
  for (DType type : kGpuFormats) {
    const auto w_dev = to_device(gpu(), make_weights(type, rows, cols, ++seed));
    const WeightView w = weight_view(type, w_dev.data(), rows, cols);
    for (const Case& c : cases) {
      const auto x_dev = to_device(gpu(), gaussian(size_t(c.n_tokens * cols), ++seed));
      const auto all_dev = poisoned(gpu(), size_t(c.n_tokens * rows));
      gpu().matmul({.weight = w,
                    .input = x_dev.data(),
                    .output = all_dev.data(),
                    .n_tokens = c.n_tokens,
                    .kernels = c.choice});
      const std::vector<float> all = to_host(gpu(), all_dev);
      for (int64_t t : c.probed) {
        const auto one_dev = poisoned(gpu(), size_t(rows));
        gpu().matmul({.weight = w,
                      .input = x_dev.data() + t * cols,
                      .output = one_dev.data(),
                      .n_tokens = 1,
                      .kernels = c.choice});
        const std::vector<float> one = to_host(gpu(), one_dev);
        const std::span<const float> among(all.data() + t * rows, size_t(rows));
        size_t finite = 0;
        for (float v : one) finite += std::isfinite(v);
        EXPECT_EQ(finite, size_t(rows)) << dtype_name(type) << " token " << t << " alone";
        EXPECT_TRUE(same_bits(one, among))
            << dtype_name(type) << " " << choice_name(c.choice) << ": token " << t
            << " alone differs from the same token among " << c.n_tokens;
      }
    }
  }
}

// ---- rms_norm, add, zero, copy_rows, get_rows ----

// Both backends sum the squares in double (in different orders: ~1e-16 apart), round the scale
// 1/sqrt(mean + eps) to float, and multiply (x * scale) * w with the same two roundings. The
// results are the same bits unless the two double sums straddle a float rounding point of the
// scale (one ulp, 2^-23 relative), so each element is within 2^-23 + 2 * 2^-24 ~ 2.4e-7 of the
// CPU's, relative: bound 4e-7. Elements between strided rows must keep their bits.
TEST_F(CudaBackendTest, RmsNormMatchesCpuWithStridesAndInPlace) {
  struct Case {
    int64_t n_rows, dim, input_stride, output_stride;
    bool in_place;
  };
  const Case cases[] = {{1, 128, 128, 128, false},
                        {5, 512, 576, 576, true},  // the latent part of KV rows, in place
                        {33, 2048, 2064, 2048, false},
                        {3, 100, 100, 128, false},
                        {4, 7168, 7168, 7168, true}};
  uint32_t seed = 900;
  for (const Case& c : cases) {
    const std::string context =
        fmt::format("rows={} dim={} strides {}/{}{}", c.n_rows, c.dim, c.input_stride,
                    c.output_stride, c.in_place ? " in place" : "");
    const std::vector<float> x = gaussian(size_t(c.n_rows * c.input_stride), ++seed, 3.0f);
    std::vector<float> weight = gaussian(size_t(c.dim), ++seed, 0.5f);
    for (float& v : weight) v += 1.0f;
    const auto x_dev = to_device(gpu(), x);
    const auto weight_dev = to_device(gpu(), weight);
    const auto out_dev = c.in_place ? x_dev : poisoned(gpu(), size_t(c.n_rows * c.output_stride));
    std::vector<float> x_cpu = x;
    std::vector<float> out_cpu =
        c.in_place ? x : std::vector<float>(size_t(c.n_rows * c.output_stride), poison_value());
    const std::vector<float> before = out_cpu;
    gpu().rms_norm({.input = x_dev.data(),
                    .weight = weight_dev.data(),
                    .output = out_dev.data(),
                    .n_rows = c.n_rows,
                    .dim = c.dim,
                    .input_stride = c.input_stride,
                    .output_stride = c.output_stride,
                    .eps = 1e-6f});
    cpu_.rms_norm({.input = c.in_place ? out_cpu.data() : x_cpu.data(),
                   .weight = weight.data(),
                   .output = out_cpu.data(),
                   .n_rows = c.n_rows,
                   .dim = c.dim,
                   .input_stride = c.input_stride,
                   .output_stride = c.output_stride,
                   .eps = 1e-6f});
    const std::vector<float> out = to_host(gpu(), out_dev);
    Worst worst;
    size_t changed_outside = 0;
    for (int64_t r = 0; r < c.n_rows; ++r)
      for (int64_t i = 0; i < c.output_stride; ++i) {
        const size_t at = size_t(r * c.output_stride + i);
        if (i < c.dim)
          worst.add(normalized_error(out[at], out_cpu[at], std::fabs(out_cpu[at])),
                    [&] { return fmt::format("{} row {} element {}", context, r, i); });
        else
          changed_outside += !same_bits({&out[at], 1}, {&before[at], 1});
      }
    EXPECT_LE(worst.error, 4e-7) << worst.where;
    EXPECT_EQ(changed_outside, 0u) << context << ": elements between rows were written";
  }
}

// The fused residual add in front of the norm (RmsNormOp::residual): the sum is one IEEE add an
// element, the CPU's bits; the norm of it within the bound above.
TEST_F(CudaBackendTest, RmsNormFusedResidualAddMatchesCpu) {
  uint32_t seed = 950;
  for (int64_t n_rows : {1, 9}) {
    const int64_t dim = 2048;
    const size_t n = size_t(n_rows * dim);
    const std::vector<float> x = gaussian(n, ++seed, 3.0f), out = gaussian(n, ++seed, 30.0f);
    std::vector<float> weight = gaussian(size_t(dim), ++seed, 0.5f);
    for (float& v : weight) v += 1.0f;
    const auto x_dev = to_device(gpu(), x), out_dev = to_device(gpu(), out);
    const auto weight_dev = to_device(gpu(), weight);
    const auto h_dev = poisoned(gpu(), n);
    std::vector<float> x_cpu = x, h_cpu(n);
    const RmsNormOp op{.input = nullptr,
                       .weight = nullptr,
                       .output = nullptr,
                       .n_rows = n_rows,
                       .dim = dim,
                       .input_stride = dim,
                       .output_stride = dim,
                       .eps = 1e-6f};
    RmsNormOp on_gpu = op, on_cpu = op;
    on_gpu.input = on_gpu.residual = x_dev.data();
    on_gpu.weight = weight_dev.data(), on_gpu.output = h_dev.data(), on_gpu.add = out_dev.data();
    on_cpu.input = on_cpu.residual = x_cpu.data();
    on_cpu.weight = weight.data(), on_cpu.output = h_cpu.data(), on_cpu.add = out.data();
    gpu().rms_norm(on_gpu);
    cpu_.rms_norm(on_cpu);
    EXPECT_TRUE(same_bits(to_host(gpu(), x_dev), x_cpu)) << n_rows << " rows: the residual";
    const std::vector<float> h = to_host(gpu(), h_dev);
    Worst worst;
    for (size_t i = 0; i < n; ++i)
      worst.add(normalized_error(h[i], h_cpu[i], std::fabs(h_cpu[i])),
                [&] { return fmt::format("{} rows, element {}", n_rows, i); });
    EXPECT_LE(worst.error, 4e-7) << worst.where;
  }
}

// One IEEE operation per element (an add, a store, a copy) gives the same bits everywhere.
TEST_F(CudaBackendTest, AddZeroAndCopyRowsAreExact) {
  uint32_t seed = 1300;
  // Past 4096 blocks of 256 the kernels loop over the grid.
  for (int64_t n : {int64_t(1), int64_t(1000), (int64_t(1) << 21) + 3}) {
    const std::vector<float> x = gaussian(size_t(n), ++seed);
    std::vector<float> y_cpu = gaussian(size_t(n) + kGuard, ++seed);
    const auto x_dev = to_device(gpu(), x);
    const auto y_dev = to_device(gpu(), y_cpu);
    gpu().add(y_dev.data(), x_dev.data(), n);
    cpu_.add(y_cpu.data(), x.data(), n);
    EXPECT_TRUE(same_bits(to_host(gpu(), y_dev), y_cpu)) << "add n=" << n;

    // add_parts: past eight parts the kernel launches again; the bits are the CPU's.
    for (size_t n_parts : {size_t(1), size_t(3), size_t(11)}) {
      std::vector<std::vector<float>> parts;
      std::vector<DeviceArray<float>> parts_dev;
      std::vector<const float*> on_cpu, on_gpu;
      for (size_t p = 0; p < n_parts; ++p) {
        parts.push_back(gaussian(size_t(n), ++seed));
        parts_dev.push_back(to_device(gpu(), parts.back()));
        on_cpu.push_back(parts.back().data());
        on_gpu.push_back(parts_dev.back().data());
      }
      std::vector<float> sum_cpu = gaussian(size_t(n) + kGuard, ++seed);
      const auto sum_dev = to_device(gpu(), sum_cpu);
      gpu().add_parts(sum_dev.data(), on_gpu, n);
      cpu_.add_parts(sum_cpu.data(), on_cpu, n);
      EXPECT_TRUE(same_bits(to_host(gpu(), sum_dev), sum_cpu)) << "add_parts " << n_parts << " n=" << n;
    }

    const auto z_dev = poisoned(gpu(), size_t(n) + kGuard);
    std::vector<float> z_cpu(size_t(n) + kGuard, poison_value());
    gpu().zero(z_dev.data(), n);
    cpu_.zero(z_cpu.data(), n);
    EXPECT_TRUE(same_bits(to_host(gpu(), z_dev), z_cpu)) << "zero n=" << n;
  }
  struct Copy {
    int64_t n_rows, row_len, src_stride, dst_stride;
  };
  for (const Copy& c : {Copy{1, 5, 5, 5}, Copy{7, 100, 130, 120}, Copy{3000, 64, 576, 64},
                        Copy{40, 576, 576, 1000}}) {
    const std::vector<float> src = gaussian(size_t(c.n_rows * c.src_stride), ++seed);
    const size_t dst_size = size_t(c.n_rows * c.dst_stride) + kGuard;
    const auto src_dev = to_device(gpu(), src);
    const auto dst_dev = poisoned(gpu(), dst_size);
    std::vector<float> dst_cpu(dst_size, poison_value());
    gpu().copy_rows(dst_dev.data(), c.dst_stride, src_dev.data(), c.src_stride, c.n_rows,
                    c.row_len);
    cpu_.copy_rows(dst_cpu.data(), c.dst_stride, src.data(), c.src_stride, c.n_rows, c.row_len);
    EXPECT_TRUE(same_bits(to_host(gpu(), dst_dev), dst_cpu))
        << "copy_rows " << c.n_rows << " rows of " << c.row_len << ", strides " << c.src_stride
        << " -> " << c.dst_stride;
  }
}

// The GPU's block decoders are dequantize_row bit for bit (quant/block_decode.h, checked on the
// host by tests/quant/block_decode_test.cpp), and the CPU's get_rows is dequantize_row: the rows
// must be the same bits, and nothing past them written.
TEST_F(CudaBackendTest, GetRowsDecodesEveryFormatExactly) {
  const int64_t table_rows = 50;
  const std::vector<int32_t> ids = {0, 49, 7, 7, 23, 1};  // repeats, first and last rows
  const int64_t n = int64_t(ids.size());
  const auto ids_dev = to_device(gpu(), ids);
  uint32_t seed = 1700;
  for (DType type : kGpuFormats) {
    std::vector<int64_t> cols_list = {256, 512};
    if (dtype_info(type).block_elems == 32) cols_list = {32, 256};
    if (is_float_format(type)) cols_list = {40, 256};
    for (int64_t cols : cols_list) {
      const std::vector<uint8_t> table = make_weights(type, table_rows, cols, ++seed);
      const auto table_dev = to_device(gpu(), table);
      const size_t out_size = size_t(n * cols) + kGuard;
      const auto out_dev = poisoned(gpu(), out_size);
      std::vector<float> out_cpu(out_size, poison_value());
      gpu().get_rows(weight_view(type, table_dev.data(), table_rows, cols), ids_dev.data(), n,
                     out_dev.data());
      cpu_.get_rows(weight_view(type, table.data(), table_rows, cols), ids.data(), n,
                    out_cpu.data());
      EXPECT_TRUE(same_bits(to_host(gpu(), out_dev), out_cpu))
          << dtype_name(type) << " cols=" << cols;
    }
  }
}

// ---- rope ----

// Both backends compute the angles with the same code (backends/rope_angles.h) and rotate with
// the same roundings, but the math library differs: CUDA's powf is within 4 ulp, cosf/sinf within
// 2, glibc's within 1. The angle θ = pos · base^(-2i/d) (then scaled and blended by YaRN, θ <= pos)
// is then within ~6e-7 θ of the CPU's, cos and sin within that plus ~2e-7, and the rotated pair
// within (|x0| + |x1|) (6e-7 θ + 2e-7) plus a rounding. The normalized error of a rotated element
// is |y - y_cpu| / ((|x0| + |x1|) (1 + pos)) <= ~8e-7: bound 2e-6. A wrong frequency, ramp or
// pair costs 1e-4 or more (the slowest pair turns by 1e-4 rad per position). Every element
// outside the rotated dims must keep its bits.
TEST_F(CudaBackendTest, RopePlainAndYarnMatchCpu) {
  const RopeParams plain{.rope_dims = 64, .freq_base = 10000.0f};
  const RopeParams yarn{.rope_dims = 64,
                        .freq_base = 10000.0f,
                        .freq_scale = 1.0f / 40.0f,
                        .ext_factor = 1.0f,
                        .original_ctx = 4096,
                        .beta_fast = 32.0f,
                        .beta_slow = 1.0f};
  RopeParams yarn16 = yarn, plain16 = plain;
  yarn16.rope_dims = plain16.rope_dims = 16;
  struct Case {
    const char* name;
    RopeParams params;
    int64_t n_heads, head_stride, token_stride, offset;
  };
  const Case cases[] = {// The query: rope part after 128 nope dims of each of 16 heads.
                        {"plain q", plain, 16, 192, 16 * 192, 128},
                        {"yarn q", yarn, 16, 192, 16 * 192, 128},
                        // The shared key: rope dims after the 512 latent values of a KV row.
                        {"yarn k", yarn, 1, 576, 576, 512},
                        // Small heads, rope first in the head, padding between tokens.
                        {"plain small", plain16, 4, 48, 4 * 48 + 8, 0},
                        {"yarn small", yarn16, 4, 48, 4 * 48 + 8, 32}};
  const std::vector<int32_t> positions = {0, 1, 5, 63, 100, 1000, 3000, 4095};
  const int64_t n_tokens = int64_t(positions.size());
  const auto positions_dev = to_device(gpu(), positions);
  uint32_t seed = 2100;
  for (const Case& c : cases) {
    const std::vector<float> x = gaussian(size_t(n_tokens * c.token_stride), ++seed);
    const auto data_dev = to_device(gpu(), x);
    std::vector<float> data_cpu = x;
    const RopeOp op{.n_tokens = n_tokens,
                    .n_heads = c.n_heads,
                    .head_stride = c.head_stride,
                    .token_stride = c.token_stride,
                    .offset = c.offset,
                    .params = c.params};
    RopeOp on_gpu = op, on_cpu = op;
    on_gpu.data = data_dev.data(), on_gpu.positions = positions_dev.data();
    on_cpu.data = data_cpu.data(), on_cpu.positions = positions.data();
    gpu().rope(on_gpu);
    cpu_.rope(on_cpu);
    const std::vector<float> y = to_host(gpu(), data_dev);
    std::vector<bool> rotated(x.size(), false);
    Worst worst;
    for (int64_t t = 0; t < n_tokens; ++t)
      for (int64_t h = 0; h < c.n_heads; ++h)
        for (int64_t d = 0; d < c.params.rope_dims; ++d) {
          const size_t at = size_t(t * c.token_stride + h * c.head_stride + c.offset + d);
          const size_t pair = at - size_t(d % 2);
          rotated[at] = true;
          const double scale = (std::fabs(x[pair]) + std::fabs(x[pair + 1])) * (1.0 + positions[t]);
          worst.add(normalized_error(y[at], data_cpu[at], scale), [&] {
            return fmt::format("{}: position {} head {} dim {}", c.name, positions[t], h, d);
          });
        }
    EXPECT_LE(worst.error, 2e-6) << worst.where;
    size_t changed = 0;
    for (size_t i = 0; i < x.size(); ++i)
      if (!rotated[i]) changed += !same_bits({&y[i], 1}, {&x[i], 1});
    EXPECT_EQ(changed, 0u) << c.name << ": elements outside the rotated dims changed";
  }
}

}  // namespace
}  // namespace tandem::test
