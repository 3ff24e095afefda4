#include "backends/cuda/cuda_devices.h"

#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <random>
#include <vector>

#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/kernels.h"
#include "core/error.h"
#include "quant/quant.h"

namespace tandem::cuda {

bool built_with_cuda() {
  return true;
}

int count_gpus() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();  // no driver or no device: a CPU machine, not an error
    return 0;
  }
  return count;
}

std::vector<GpuInfo> list_gpus() {
  std::vector<GpuInfo> gpus;
  const int count = count_gpus();
  int current = 0;
  if (count > 0 && cudaGetDevice(&current) != cudaSuccess) current = 0;
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, i) != cudaSuccess || cudaSetDevice(i) != cudaSuccess) {
      (void)cudaGetLastError();
      continue;
    }
    GpuInfo info{.index = i,
                 .name = prop.name,
                 .total_bytes = prop.totalGlobalMem,
                 .compute_major = prop.major,
                 .compute_minor = prop.minor,
                 .multiprocessors = prop.multiProcessorCount,
                 .pci_slot = fmt::format("{:04x}:{:02x}:{:02x}", prop.pciDomainID, prop.pciBusID,
                                         prop.pciDeviceID)};
    size_t free = 0, total = 0;
    if (cudaMemGetInfo(&free, &total) == cudaSuccess) info.free_bytes = free;
    int clock_khz = 0, bus_bits = 0;
    if (cudaDeviceGetAttribute(&clock_khz, cudaDevAttrMemoryClockRate, i) == cudaSuccess &&
        cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, i) == cudaSuccess)
      info.peak_bandwidth_bytes_per_s = 2.0 * clock_khz * 1e3 * bus_bits / 8;  // double data rate
    (void)cudaGetLastError();
    gpus.push_back(std::move(info));
  }
  if (count > 0) cudaSetDevice(current);  // as the caller had it
  return gpus;
}

std::unique_ptr<Backend> make_cuda_backend(int index) {
  return std::make_unique<CudaBackend>(index);
}

namespace {

// Milliseconds of `work`, best of `repeats` runs after one warm-up, timed with events.
template <class Fn>
double best_ms(cudaStream_t stream, int repeats, Fn&& work) {
  cudaEvent_t start, stop;
  TANDEM_CUDA_CHECK(cudaEventCreate(&start));
  TANDEM_CUDA_CHECK(cudaEventCreate(&stop));
  work();
  double best = 1e30;
  for (int r = 0; r < repeats; ++r) {
    TANDEM_CUDA_CHECK(cudaEventRecord(start, stream));
    work();
    TANDEM_CUDA_CHECK(cudaEventRecord(stop, stream));
    TANDEM_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    TANDEM_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    best = std::min(best, double(ms));
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return best;
}

}  // namespace

GpuRates measure_gpu_rates(int index) {
  CudaBackend gpu(index);  // checks the index and makes the device current
  cudaStream_t stream = nullptr;
  TANDEM_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  GpuRates rates;
  // Far past any L2 (50-60 MB on current parts), small beside any GPU tandem would use.
  const size_t bytes = std::min<size_t>(size_t(1) << 30, gpu.free_bytes() / 4);

  {
    auto a = gpu.allocate(bytes, "bandwidth measurement"),
         b = gpu.allocate(bytes, "bandwidth measurement");
    TANDEM_CUDA_CHECK(cudaMemsetAsync(a->data(), 1, bytes, stream));
    const double ms = best_ms(stream, 5, [&] {
      TANDEM_CUDA_CHECK(
          cudaMemcpyAsync(b->data(), a->data(), bytes, cudaMemcpyDeviceToDevice, stream));
    });
    rates.copy_bytes_per_s = 2.0 * double(bytes) / (ms * 1e-3);
  }

  {
    // A DeepSeek-V2-Lite expert's gate (1408 x 2048 Q4_K), one random matrix copied into every
    // slot: the kernel's speed does not depend on the values.
    constexpr int64_t kRows = 1408, kCols = 2048;
    const uint64_t row = row_bytes(DType::Q4_K, kCols), matrix = row * kRows;
    const int64_t n_matrices = std::clamp<int64_t>(int64_t(bytes / matrix), 8, 65535);
    std::vector<uint8_t> host(matrix);
    std::mt19937 rng(7);
    std::normal_distribution<float> normal;
    std::vector<float> values(kCols), x(kCols);
    for (int64_t r = 0; r < kRows; ++r) {
      for (float& v : values) v = normal(rng);
      quantize_row(DType::Q4_K, values.data(), host.data() + r * row, kCols);
    }
    for (float& v : x) v = normal(rng);
    auto weights = gpu.allocate(matrix * n_matrices, "decode kernel measurement");
    auto input = gpu.allocate(kCols * sizeof(float), "decode kernel measurement");
    auto output =
        gpu.allocate(size_t(kRows * n_matrices) * sizeof(float), "decode kernel measurement");
    for (int64_t m = 0; m < n_matrices; ++m)
      gpu.copy_from_host(static_cast<uint8_t*>(weights->data()) + m * matrix, host.data(), matrix);
    gpu.copy_from_host(input->data(), x.data(), x.size() * sizeof(float));
    // One launch over all the matrices (the same token for each): the kernel's streaming rate,
    // without the launch gaps that graphs remove from a real decode step.
    const double ms = best_ms(stream, 5, [&] {
      matmul_rows({.type = DType::Q4_K,
                   .weights = weights->data(),
                   .rows = kRows,
                   .cols = kCols,
                   .row_bytes = row,
                   .mat_bytes = matrix,
                   .input = input->floats(),
                   .input_stride = kCols,
                   .input_mat_stride = 0,
                   .output = output->floats(),
                   .output_stride = kRows,
                   .output_mat_stride = kRows,
                   .n_tokens = 1,
                   .n_mats = n_matrices},
                  stream);
    });
    rates.decode_kernel_bytes_per_s = double(matrix * n_matrices) / (ms * 1e-3);
  }

  {
    constexpr size_t kLinkBytes = size_t(64) << 20;
    auto host = gpu.allocate_host(kLinkBytes, "host link measurement");
    auto device = gpu.allocate(kLinkBytes, "host link measurement");
    std::memset(host->data(), 1, kLinkBytes);
    const double ms = best_ms(stream, 5, [&] {
      TANDEM_CUDA_CHECK(cudaMemcpyAsync(device->data(), host->data(), kLinkBytes,
                                        cudaMemcpyHostToDevice, stream));
    });
    rates.host_link_bytes_per_s = double(kLinkBytes) / (ms * 1e-3);

    // A lite MoE layer's decode hand-off: 8 KiB out (the input and routing), the host's task, 8
    // KiB of its slots back in; the next one waits for the last (as the next layer would).
    constexpr size_t kHandoffBytes = size_t(8) << 10;
    constexpr int kHandoffs = 200;
    uint8_t* out = static_cast<uint8_t*>(host->data());
    uint8_t* in = out + kHandoffBytes;
    double best_s = 1e30;
    for (int run = 0; run < 3; ++run) {
      const auto start = std::chrono::steady_clock::now();
      for (int i = 0; i < kHandoffs; ++i) {
        gpu.copy_to_host_async(out, device->data(), kHandoffBytes);
        gpu.wait_for(gpu.host_task([] {}));
        gpu.copy_from_host_async(device->data(), in, kHandoffBytes);
      }
      gpu.synchronize();
      best_s = std::min(
          best_s, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() /
                      kHandoffs);
    }
    rates.host_handoff_s = best_s;
  }
  cudaStreamDestroy(stream);
  return rates;
}

}  // namespace tandem::cuda
