#pragma once
// Shared by the CUDA backend tests: the device under test (or a skip that says why), moving test
// data in and out of its memory, poisoned outputs, random weights in every format, and the
// normalized error measure.
//
// The tests compare the GPU against the CPU backend (and, where the CPU's own rounding would hide
// the GPU's, against an exact double-precision reference), so they need a GPU to mean anything.
// Without one they skip. TANDEM_CUDA_TESTS_STANDIN=sim runs them with a simulated device (sim:0,
// the CPU's kernels behind a stream of its own, with graphs and host tasks) in place of the GPU:
// that checks the tests' own data flow and bookkeeping on any machine, and says nothing about CUDA.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "backends/cuda/cuda_devices.h"
#include "backends/cuda/launch_record.h"
#include "backends/cuda/op_launches.h"
#include "backends/sim/sim_backend.h"
#include "core/backend.h"
#include "core/blocks.h"
#include "core/dtype.h"
#include "core/half.h"
#include "quant/quant.h"
#include "test_weights.h"

namespace tandem::test {

// The kernels the CUDA backend launches for what fn asks of an OpLaunches (op_launches.h),
// recorded, nothing run: a fused test checks that its fused path is the one taken.
template <class Fn>
std::vector<cuda::KernelLaunch> kernels_for(Fn&& fn) {
  std::vector<char> scratch;  // recorded launchers never read or write it
  cuda::OpLaunches ops(nullptr, [&](cuda::Scratch, size_t bytes) {
    if (scratch.size() < bytes) scratch.resize(bytes);
    return static_cast<void*>(scratch.data());
  });
  std::vector<cuda::KernelLaunch> launched;
  cuda::RecordLaunches recording(launched);
  fn(ops);
  return launched;
}

inline std::string kernel_list(const std::vector<cuda::KernelLaunch>& launched) {
  std::string names;
  for (const cuda::KernelLaunch& k : launched) names += (names.empty() ? "" : " ") + k.kernel;
  return names;
}

// The GPU the tests run on: cuda:0, or null after marking the current test skipped (call it from
// SetUp, where a skip stops the test body, or return when it gives null).
inline std::unique_ptr<Backend> gpu_or_skip() {
  if (const char* standin = std::getenv("TANDEM_CUDA_TESTS_STANDIN");
      standin && std::string(standin) == "sim") {
    std::printf("  TANDEM_CUDA_TESTS_STANDIN=sim: sim:0 stands in for the GPU (no CUDA tested)\n");
    return std::make_unique<sim::SimBackend>(0, size_t(4) << 30, 2);
  }
  std::string why;
  if (!cuda::built_with_cuda())
    why = "this tandem was built without CUDA (no nvcc found, or -DTANDEM_CUDA=OFF)";
  else if (cuda::list_gpus().empty())
    why = "the CUDA driver shows no device on this machine";
  if (!why.empty()) {
    [&] { GTEST_SKIP() << "no CUDA GPU: " << why; }();
    return nullptr;
  }
  return cuda::make_cuda_backend(0);
}

// Whether `device` is the simulated stand-in: it computes with the CPU's kernels, so bounds that
// hold the GPU to F32 accuracy against an exact reference hold it to the CPU's instead.
inline bool is_standin(const Backend& device) {
  return device.name().rfind("sim", 0) == 0;
}

// Written into every output before an op runs, so that an element the op should have written
// and did not is caught (NaN fails every comparison), and an element it must leave alone can be
// checked bit for bit. A quiet NaN with a payload no arithmetic produces.
constexpr uint32_t kPoisonBits = 0x7fc0a5a5u;

inline float poison_value() {
  float f;
  std::memcpy(&f, &kPoisonBits, sizeof f);
  return f;
}

inline bool is_poison(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  return bits == kPoisonBits;
}

// A typed array in a backend's memory.
template <class T>
struct DeviceArray {
  std::shared_ptr<DeviceBuffer> buffer;
  size_t size = 0;
  T* data() const { return static_cast<T*>(buffer->data()); }
};

template <class T>
DeviceArray<T> to_device(Backend& backend, std::span<const T> host) {
  DeviceArray<T> array{backend.allocate(host.size_bytes(), "test data"), host.size()};
  if (!host.empty()) backend.copy_from_host(array.data(), host.data(), host.size_bytes());
  return array;
}

template <class T>
DeviceArray<T> to_device(Backend& backend, const std::vector<T>& host) {
  return to_device(backend, std::span<const T>(host));
}

// An array of n poisoned floats.
inline DeviceArray<float> poisoned(Backend& backend, size_t n) {
  return to_device(backend, std::vector<float>(n, poison_value()));
}

inline void poison(Backend& backend, const DeviceArray<float>& array) {
  const std::vector<float> values(array.size, poison_value());
  backend.copy_from_host(array.data(), values.data(), values.size() * sizeof(float));
}

// Waits for everything submitted, then copies the array back.
template <class T>
std::vector<T> to_host(Backend& backend, const DeviceArray<T>& array) {
  backend.synchronize();
  std::vector<T> host(array.size);
  if (!host.empty()) backend.copy_to_host(host.data(), array.data(), array.size * sizeof(T));
  return host;
}

// Bit-for-bit equality (NaN payloads included).
inline bool same_bits(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size_bytes()) == 0);
}

// The formats with a GPU block decoder (quant/block_decode.h), as tests/quant lists them.
constexpr DType kGpuFormats[] = {DType::F32,  DType::F16,  DType::BF16,   DType::Q4_0,
                                 DType::Q5_0, DType::Q5_1, DType::Q8_0,   DType::Q2_K,
                                 DType::Q3_K, DType::Q4_K, DType::Q5_K,   DType::Q6_K,
                                 DType::IQ4_NL, DType::IQ4_XS, DType::Q4_1, DType::MXFP4,
                                 DType::TQ1_0, DType::TQ2_0, DType::IQ1_S, DType::IQ1_M,
                                 DType::IQ2_XXS, DType::IQ2_XS, DType::IQ2_S, DType::IQ3_XXS,
                                 DType::IQ3_S};

constexpr KernelChoice kChoices[] = {KernelChoice::ByTokenCount, KernelChoice::PerToken,
                                     KernelChoice::Tiled};

inline const char* choice_name(KernelChoice choice) {
  switch (choice) {
    case KernelChoice::ByTokenCount:
      return "ByTokenCount";
    case KernelChoice::PerToken:
      return "PerToken";
    case KernelChoice::Tiled:
      return "Tiled";
  }
  return "?";
}

inline bool is_float_format(DType type) {
  return type == DType::F32 || type == DType::F16 || type == DType::BF16;
}

// A matrix (or a stack of n_mats) of `type` at `data`, rows of `cols` elements.
inline WeightView weight_view(DType type, const void* data, int64_t rows, int64_t cols,
                              int64_t n_mats = 1) {
  return {.type = type,
          .data = data,
          .cols = cols,
          .rows = rows,
          .n_mats = n_mats,
          .row_bytes = row_bytes(type, uint64_t(cols))};
}

// The weights as F32, exactly (dequantize_row): what an exact reference multiplies with.
inline std::vector<float> dequantized(DType type, const std::vector<uint8_t>& bytes, int64_t rows,
                                      int64_t cols) {
  std::vector<float> w(size_t(rows * cols));
  const size_t stride = row_bytes(type, uint64_t(cols));
  for (int64_t r = 0; r < rows; ++r)
    dequantize_row(type, bytes.data() + size_t(r) * stride, w.data() + r * cols, cols);
  return w;
}

// The normalized error of the tests: |y - y_ref| / scale, where scale is Σ_k |w_k x_k| over the
// products that made the element (for a chain of products, the first-order sum that each test
// writes out). Dividing by the absolute sum rather than |y_ref| keeps the measure meaningful when
// a sum cancels to near zero, and makes it a relative error per product: an error of e in every
// product gives at most e. A NaN or an infinity (an element never written) counts as infinite.
inline double normalized_error(double y, double y_ref, double scale) {
  const double e = std::fabs(y - y_ref) / std::max(scale, 1e-30);
  return std::isfinite(e) ? e : INFINITY;
}

// The largest of a set of errors, and where it was; `describe` (a callable giving a string) is
// called only for a new largest.
struct Worst {
  double error = 0.0;
  std::string where;
  template <class Describe>
  void add(double e, Describe&& describe) {
    if (where.empty() || e > error) error = e, where = describe();
  }
  void add(const Worst& other) {
    if (!other.where.empty()) add(other.error, [&] { return other.where; });
  }
};

// The op tests: the GPU (or a skip, decided before the body runs) and the CPU it is compared with.
class CudaBackendTest : public ::testing::Test {
 protected:
  void SetUp() override { gpu_ = gpu_or_skip(); }
  Backend& gpu() { return *gpu_; }

  std::unique_ptr<Backend> gpu_;
  cpu::CpuBackend cpu_{4};
};

}  // namespace tandem::test
