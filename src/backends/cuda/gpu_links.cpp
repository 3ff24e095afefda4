// NVLink or the PCIe generation of cuda:0, from NVML. NVML comes with the driver
// (libnvidia-ml.so.1), not with the toolkit's headers here, so it is opened at run time and the
// few functions used are declared below from NVML's documented C interface: every call returns
// 0 (NVML_SUCCESS) or an error code, devices are opaque handles.
#include <dlfcn.h>

#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include "backends/cuda/cuda_devices.h"

namespace tandem::cuda {
namespace {

using NvmlDevice = struct NvmlDeviceOpaque*;
constexpr int kNvmlSuccess = 0;
constexpr int kNvmlFeatureEnabled = 1;
constexpr unsigned kNvmlMaxLinks = 18;  // NVML_NVLINK_MAX_LINKS (H100/H200: 18)

struct Nvml {
  void* library = nullptr;
  int (*init)() = nullptr;
  int (*shutdown)() = nullptr;
  int (*device_by_bus_id)(const char*, NvmlDevice*) = nullptr;
  int (*nvlink_state)(NvmlDevice, unsigned, int*) = nullptr;
  int (*max_pcie_generation)(NvmlDevice, unsigned*) = nullptr;

  bool open() {
    library = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!library) return false;
    init = reinterpret_cast<int (*)()>(dlsym(library, "nvmlInit_v2"));
    shutdown = reinterpret_cast<int (*)()>(dlsym(library, "nvmlShutdown"));
    device_by_bus_id = reinterpret_cast<int (*)(const char*, NvmlDevice*)>(
        dlsym(library, "nvmlDeviceGetHandleByPciBusId_v2"));
    nvlink_state = reinterpret_cast<int (*)(NvmlDevice, unsigned, int*)>(
        dlsym(library, "nvmlDeviceGetNvLinkState"));
    max_pcie_generation = reinterpret_cast<int (*)(NvmlDevice, unsigned*)>(
        dlsym(library, "nvmlDeviceGetMaxPcieLinkGeneration"));
    return init && shutdown && device_by_bus_id && nvlink_state && max_pcie_generation;
  }
  ~Nvml() {
    if (library) dlclose(library);
  }
};

}  // namespace

GpuLinks detect_gpu_links() {
  if (count_gpus() == 0) return {.how = "no GPU"};
  char bus_id[32] = {};
  if (cudaDeviceGetPCIBusId(bus_id, int(sizeof bus_id), 0) != cudaSuccess) {
    (void)cudaGetLastError();
    return {.how = "the driver gave no PCI bus id for cuda:0"};
  }
  Nvml nvml;
  if (!nvml.open()) return {.how = "NVML (libnvidia-ml.so.1) not found"};
  if (nvml.init() != kNvmlSuccess) return {.how = "NVML did not start"};
  GpuLinks links{.known = true};
  NvmlDevice device = nullptr;
  if (nvml.device_by_bus_id(bus_id, &device) != kNvmlSuccess) {
    nvml.shutdown();
    return {.how = fmt::format("NVML does not know cuda:0 ({})", bus_id)};
  }
  int active_links = 0;
  for (unsigned link = 0; link < kNvmlMaxLinks; ++link) {
    int state = 0;  // links a GPU does not have answer with an error
    if (nvml.nvlink_state(device, link, &state) == kNvmlSuccess && state == kNvmlFeatureEnabled)
      ++active_links;
  }
  unsigned generation = 0;
  if (nvml.max_pcie_generation(device, &generation) == kNvmlSuccess)
    links.pcie_generation = int(generation);
  nvml.shutdown();
  links.nvlink = active_links > 0;
  links.how = fmt::format("NVML: cuda:0 has {} active NVLink{}, PCIe gen {}", active_links,
                          active_links == 1 ? "" : "s",
                          links.pcie_generation ? std::to_string(links.pcie_generation) : "unknown");
  return links;
}

}  // namespace tandem::cuda
