#pragma once
// The machine a plan is for: the host (RAM, cores, NUMA nodes, measured memory bandwidth) and
// its accelerators, either detected or described on the command line so that a person can ask
// "what if I had two 24 GB cards?" before buying them.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace tandem::plan {

enum class DeviceKind { Cpu, Cuda, Sim };

struct DeviceSpec {
  std::string name;                 // "cpu", "cuda:0", "sim:1"
  DeviceKind kind = DeviceKind::Cpu;
  std::string model;                // "RTX 4090", "AMD EPYC (2 cores)", "simulated"
  uint64_t memory_bytes = 0;        // what tandem may use (after a reserve for the runtime)
  double bandwidth_bytes_per_s = 0; // memory bandwidth
  double flops_per_s = 0;           // dense matmul throughput at the activation precision used
                                    // (GPUs: FP16 tensor cores; host: int8 kernels, estimated)
  double int8_ops_per_s = 0;        // GPUs: dense INT8 tensor-core throughput, 0 where unknown
  double decode_kernel_bytes_per_s = 0;  // host: weights/s our one-token kernel streams from
                                         // DRAM (kernel_rate.h); 0 = unknown
  double interleaved_kernel_bytes_per_s = 0;  // the same for the interleaved formats of
                                              // `tandem repack`; 0 = unknown
  std::string bandwidth_source;     // "measured 2026-12-02", "default for RTX 4090", "given"
  // GPUs, measured on the machine (cuda::GpuRates; 0 = unknown, the cost model's defaults):
  double host_link_bytes_per_s = 0;  // a copy from page-locked host memory
  double host_handoff_s = 0;         // a MoE layer's round trip to a host task and back
  int32_t node = 0;                 // the machine it is in (Hardware::n_nodes); the host: 0
  // A host's RAM as described (--ram, a cluster file's ram:) rather than what this machine has
  // free now: a run over a cluster file plans with it, as `tandem plan --cluster` does.
  bool memory_given = false;
};

// `bytes` as a device's measured decode kernels see them: the `interleaved` part (tandem
// repack's formats) streams at the interleaved kernel's rate, so it counts as fewer bytes at the
// plain kernel's rate (where both rates are known); formats slower per byte than Q4_K add their
// `extra` bytes (InventoryGroup::host_kernel_extra_bytes). Plain bytes where the device's kernel
// rate is unknown (GPUs: their kernels are bound by memory).
double kernel_equivalent_bytes(const DeviceSpec& device, double bytes, double interleaved,
                               double extra = 0);

// Whether a measurement of the host's rates looks like one other work disturbed (the cores it
// ran on were busy): our decode kernel below a fifth of the STREAM triad's bandwidth (it reaches
// 30-90% of it; a 2-core machine compiling measured 1.8 GB/s against 25). Such a measurement is
// taken again once: two kernel rates within a quarter of each other are kept (a machine whose
// kernel is that slow), else the kernel rates are left out of that run and nothing is cached: a
// cached rate is every later plan's on this machine. (The interleaved kernel's rate is not
// judged: without AVX-512 it is slow.)
bool host_rates_look_disturbed(double triad_bytes_per_s, double kernel_bytes_per_s);

// How the GPUs reach each other (one kind for the whole machine) and the host. Their costs are
// in CostParams (cost_model.h), each with its source.
enum class LinkKind { Pcie4, Pcie5, Nvlink };

struct Hardware {
  DeviceSpec host;                  // kind Cpu: RAM and the CPU's bandwidth and compute; its
                                    // memory_bytes is the RAM less ram_reserve_bytes
  std::vector<DeviceSpec> gpus;     // cuda:0.. or sim:0.., in order
  int32_t cpu_cores = 1;
  int32_t numa_nodes = 1;
  // GPU to GPU: NVLink, or peer copies over PCIe. Host to GPU is always PCIe: gen 5 when the
  // machine's GPUs link over PCIe 5, gen 4 otherwise (A100 systems, NVLink or not).
  LinkKind gpu_link = LinkKind::Pcie4;
  std::string link_source = "assumed PCIe 4: give --link nvlink|pcie4|pcie5";
  double disk_bytes_per_s = 2e9;  // for weights streamed from disk
  // Several machines (plan --nodes, --cluster): their GPUs (DeviceSpec::node) join the plan, and
  // so do their hosts: `host` is the first machine's (where rank 0 runs), `other_hosts` the
  // others' in order (node k at [k-1], named "nodek:cpu"; memory_bytes what the plan may use
  // there, after that machine's reserve). A copy between machines goes over their network: its
  // bandwidth per direction and a small message's latency.
  int32_t n_nodes = 1;
  std::vector<DeviceSpec> other_hosts;
  double node_link_bytes_per_s = 0;
  double node_link_latency_s = 0;
  std::string node_link_source;
  // RAM as described or available now, and the share of it kept free for the operating system and
  // the page cache (default_ram_reserve); host.memory_bytes is what is left for the plan.
  uint64_t ram_bytes = 0;
  uint64_t ram_reserve_bytes = 0;
  std::string ram_reserve_source;  // "default: 10% of RAM, at least 4 GiB", "given"
};

// The network between machines: "ib-ndr" (InfiniBand NDR, 400 Gb/s), "ib-hdr" (200 Gb/s),
// "eth100", "eth25", "eth10" (Ethernet, Gb/s), or "50GBps:3us" (bandwidth per direction in GB/s
// and latency); sets hw's node link. Throws tandem::Error with the accepted forms.
void set_node_link(Hardware& hw, std::string_view text);
// `hw` as `n_nodes` identical machines: its GPUs and its host repeated per machine (named
// "node1:cuda:0", "node1:cpu" ... beyond the first).
void repeat_nodes(Hardware& hw, int32_t n_nodes);
// `first_host` standing for machine `node`'s (named "nodeN:cpu"): what repeat_nodes and a
// cluster file's later machines start from.
DeviceSpec host_on_node(const DeviceSpec& first_host, int32_t node);

// What is kept free of `ram_bytes` unless said otherwise: 10% of it, at least 4 GiB, at most half.
// The kernel starts evicting page-cache pages before MemAvailable reaches zero, and the weights
// tandem maps live in that page cache: planned to the last byte, the next allocation anywhere on
// the machine evicts weights that every token then reads again from disk. 4 GiB is an idle
// desktop session plus what tandem holds beyond its planned buffers (tokenizer, server, thread
// stacks, page tables of a mapping of hundreds of GiB); 10% covers the watermarks and other
// programs on bigger machines; half keeps a tiny described machine plannable.
uint64_t default_ram_reserve(uint64_t ram_bytes);
// Keeps `reserve_bytes` of hw.ram_bytes free (host.memory_bytes = the rest), saying `source`.
void set_ram_reserve(Hardware& hw, uint64_t reserve_bytes, std::string source);
// "8GiB" or "10%" of `ram_bytes`; throws tandem::Error with the accepted forms.
uint64_t parse_ram_reserve(std::string_view text, uint64_t ram_bytes);

// A host with `cores` cores (plan --cpu-cores): its matmul throughput scaled from the detected
// host's, which is per core.
void set_cpu_cores(Hardware& hw, int32_t cores);

// "nvlink", "pcie4", "pcie5" (throws tandem::Error naming the choices); and back.
LinkKind parse_link(std::string_view text);
const char* link_name(LinkKind kind);

// A GPU from a description: "48GiB", "24GiB:1000GBps", or a known card name ("4090", "3090",
// "a6000", "a100", "a100-80g", "h100", "h200", "l40s", "5090") optionally with ":NNGiB" or
// ":NNNGBps" overrides. Throws tandem::Error naming the text and the accepted forms.
DeviceSpec parse_gpu(std::string_view text, int32_t index, DeviceKind kind = DeviceKind::Cuda);
// MemAvailable: what a process can take now without swapping (free memory and reclaimable page
// cache, where mapped weights live); 0 when unknown.
uint64_t available_ram_bytes();
// "192GiB", "512GB", "1TiB"; throws with the accepted forms.
uint64_t parse_bytes(std::string_view text);

// Memory bandwidth of this machine now: a STREAM-style triad on `threads` threads, best of a
// few repetitions in about a second (no cache: benchmarks measure it before and after a run).
double measure_memory_bandwidth(int32_t threads);

// This machine: cores, NUMA nodes, free RAM, and the memory bandwidth measured with a short
// STREAM-style triad on `threads` threads (cached in ~/.cache/tandem/bandwidth.json per CPU
// model and thread count, so only the first call takes ~1 s). GPUs when built with CUDA.
Hardware detect_hardware(int32_t threads, bool with_gpus = true);

// The GPUs of this machine (none without a CUDA build or a driver), named cuda:0, cuda:1 ...:
// the free memory now less what the CUDA context and kernels' scratch take, and the copy
// bandwidth and decode kernel rate measured on each (cached per GPU model and PCI slot beside the
// host's, about a second per card the first time). `measure` false: datasheet or default rates.
std::vector<DeviceSpec> detect_gpus(bool measure = true);

// The links a machine's GPUs use, from what the driver reported for cuda:0 (cuda::GpuLinks,
// `nvlink` / `pcie_generation` / `how`): NVLink when one is active, else PCIe 5 from a gen-5 slot,
// else PCIe 4 (gen 3 counted as 4: the cost model has no slower kind, and says so). Without an
// answer (`known` false) the assumption stays, with the reason beside it.
void apply_gpu_links(Hardware& hw, bool known, bool nvlink, int pcie_generation,
                     const std::string& how);

// The same host with RAM and GPUs replaced by a description (what `tandem plan --gpu --ram`
// gives); host bandwidth stays measured unless `host_bandwidth` is given. Both keep the default
// RAM reserve and assume PCIe 4 links (link_source says so).
Hardware describe_hardware(const std::vector<std::string>& gpus, std::string_view ram,
                           double host_bandwidth_bytes_per_s, int32_t threads);

}  // namespace tandem::plan
