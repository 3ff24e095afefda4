#pragma once
// The GPUs of this machine as the rest of tandem sees them, without any CUDA header: the list
// of devices, a backend for one, and rates measured on it for the cost model. A build without a
// CUDA toolkit links cuda_absent.cpp instead, which finds no GPU and says how to get one.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/backend.h"

namespace tandem::cuda {

struct GpuInfo {
  int index = 0;
  std::string name;  // "NVIDIA H200"
  uint64_t total_bytes = 0;
  uint64_t free_bytes = 0;  // now, before tandem allocates
  int compute_major = 0, compute_minor = 0;
  int multiprocessors = 0;
  double peak_bandwidth_bytes_per_s = 0;  // from the memory clock and bus width the driver reports
  std::string pci_slot;  // "0000:65:00": domain, bus, device (the host link is the slot's)
};

// Whether this build has the CUDA backend.
bool built_with_cuda();
// How many GPUs the driver shows, without starting anything on them (0 without a driver, a
// device, or a CUDA build; never throws).
int count_gpus();
// The GPUs with their free memory: this starts a CUDA context on each (the free memory it reports
// is what is left beside that context). Empty where count_gpus() is 0.
std::vector<GpuInfo> list_gpus();
// A backend for GPU `index`; throws tandem::Error naming the problem without one.
std::unique_ptr<Backend> make_cuda_backend(int index);

// Measured on GPU `index` in about a second: a device-to-device copy (bytes read plus bytes
// written per second) and our one-token decode kernel streaming Q4_K expert-sized matrices that
// do not fit in L2 (weight bytes per second), as the CPU's rates are measured (plan/kernel_rate.h);
// and what a hybrid step pays besides compute: a 64 MiB copy from page-locked host memory (the
// host link, what streaming experts takes), and a MoE layer's hand-off to the host and back (a
// few KiB copied out, an empty host task, a few KiB copied in, in stream order, as
// model/ffn_blocks.cpp does it), the mean of 200.
struct GpuRates {
  double copy_bytes_per_s = 0;
  double decode_kernel_bytes_per_s = 0;
  double host_link_bytes_per_s = 0;
  double host_handoff_s = 0;
};
GpuRates measure_gpu_rates(int index);

// How this machine's GPUs reach each other and the host, as the driver reports it for cuda:0
// (NVML, loaded at run time where the driver has it: no link-time dependency). `known` false,
// with `how` saying why, when there is no GPU, no NVML or no answer.
struct GpuLinks {
  bool known = false;
  bool nvlink = false;      // an NVLink of cuda:0 is active
  int pcie_generation = 0;  // the highest PCIe generation of cuda:0's slot and the GPU
  std::string how;          // what was read, for the plan's explanation
};
GpuLinks detect_gpu_links();

// How GPU buffers cross ranks: over NCCL (libnccl.so.2, loaded at run time the first time this is
// asked), described as "NCCL 2.28.9", or through host memory, described with why.
bool nccl_loaded();
std::string describe_nccl();

}  // namespace tandem::cuda
