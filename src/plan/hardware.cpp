#include "plan/hardware.h"


#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include <unistd.h>

#include "backends/cuda/cuda_devices.h"
#include "core/aligned_buffer.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "plan/kernel_rate.h"

namespace tandem::plan {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

// What the CUDA context, cuBLAS workspaces and the allocator's slack take on a real GPU before
// tandem allocates anything (~0.5 GiB of context on current drivers, plus headroom), so a plan
// that fills `memory_bytes` still loads. Simulated devices get their budget exactly.
constexpr uint64_t kGpuRuntimeReserveBytes = uint64_t(0.75 * kGiB);
// A detected GPU's free memory already excludes the context; what tandem's kernels take beyond
// the planner's buffers (scratch, allocator rounding) is kept free (cuda_backend.cpp).
constexpr uint64_t kGpuScratchReserveBytes = uint64_t(0.5 * kGiB);

// Bandwidth assumed for a GPU described only by its memory size: between a 4090 and an A6000,
// what most 24-48 GiB cards people pair with a CPU reach.
constexpr double kDefaultGpuBandwidth = 900e9;
// Likewise for compute: FP16 tensor throughput of a mid-range 24-48 GiB card, dense.
constexpr double kDefaultGpuFlops = 150e12;

// ---- known GPUs ------------------------------------------------------------------------------
// Memory as the card is sold (GiB), peak memory bandwidth, and dense tensor-core throughput
// without structured sparsity: FP16 with FP32 accumulation (what accurate GEMMs use; GeForce cards
// run it at half their FP16-accumulate rate) and INT8. Sources: NVIDIA's architecture whitepapers
// (GA102 for the 3090, AD102 for the 4090, GB202 / RTX Blackwell for the 5090: 3352 "AI TOPS" is
// FP4 with sparsity, so INT8 dense = 838 and FP16/FP32-acc dense = 209.5) and product datasheets
// (RTX A6000, A100 40 GB / 80 GB SXM, H100 SXM, H200 SXM, L40S), each halved where the sheet
// quotes sparse numbers.
struct KnownGpu {
  std::vector<std::string_view> names;  // accepted spellings, lower case
  std::string_view model;
  double memory_gib;
  double bandwidth_gb_per_s;
  double fp16_tflops;
  double int8_tops;
};

const std::vector<KnownGpu>& known_gpus() {
  static const std::vector<KnownGpu> gpus = {
      {{"3090", "rtx3090"}, "RTX 3090", 24, 936, 71, 284},
      {{"4090", "rtx4090"}, "RTX 4090", 24, 1008, 165.2, 660.6},
      {{"5090", "rtx5090"}, "RTX 5090", 32, 1792, 209.5, 838},
      {{"a6000", "rtxa6000"}, "RTX A6000", 48, 768, 154.8, 309.7},
      {{"a100", "a100-40g", "a100-40gb"}, "A100 40GB", 40, 1555, 312, 624},
      {{"a100-80g", "a100-80gb"}, "A100 80GB", 80, 2039, 312, 624},
      {{"h100", "h100-80g", "h100-sxm"}, "H100 SXM", 80, 3350, 989.4, 1978.9},
      {{"h200", "h200-sxm"}, "H200 SXM", 141, 4800, 989.4, 1978.9},
      {{"l40s"}, "L40S", 48, 864, 362, 733},
  };
  return gpus;
}

std::string lower(std::string_view text) {
  std::string out(text);
  for (char& c : out) c = char(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

// A non-negative decimal number followed by a unit; nullopt when the text is not of that form
// or the unit is not in `units`.
std::optional<double> parse_with_unit(
    std::string_view text, const std::vector<std::pair<std::string_view, double>>& units) {
  const std::string s = lower(trim(text));
  double value = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
  if (ec != std::errc() || end == s.data() || !std::isfinite(value) || value < 0)
    return std::nullopt;
  const std::string_view unit = trim(std::string_view(end, size_t(s.data() + s.size() - end)));
  for (const auto& [name, scale] : units)
    if (unit == name) return value * scale;
  return std::nullopt;
}

std::optional<uint64_t> try_parse_bytes(std::string_view text) {
  static const std::vector<std::pair<std::string_view, double>> units = {
      {"b", 1},    {"kb", 1e3},   {"kib", 1024.0}, {"mb", 1e6},         {"mib", 1024.0 * 1024},
      {"gb", 1e9}, {"gib", kGiB}, {"tb", 1e12},    {"tib", kGiB * 1024}};
  const auto bytes = parse_with_unit(text, units);
  if (!bytes || *bytes >= 18e18) return std::nullopt;  // beyond uint64_t
  return uint64_t(std::llround(*bytes));
}

std::optional<double> try_parse_bandwidth(std::string_view text) {
  static const std::vector<std::pair<std::string_view, double>> units = {
      {"gbps", 1e9}, {"gb/s", 1e9}, {"tbps", 1e12}, {"tb/s", 1e12}, {"mbps", 1e6}, {"mb/s", 1e6}};
  const auto bandwidth = parse_with_unit(text, units);
  if (!bandwidth || *bandwidth <= 0) return std::nullopt;
  return bandwidth;
}

const KnownGpu* find_gpu(std::string_view text) {
  std::string name = lower(trim(text));
  std::erase(name, ' ');
  for (std::string_view prefix : {"nvidia", "geforce"})
    if (name.starts_with(prefix)) name.erase(0, prefix.size());
  for (const KnownGpu& gpu : known_gpus())
    for (std::string_view alias : gpu.names)
      if (name == alias) return &gpu;
  return nullptr;
}

[[noreturn]] void bad_gpu(std::string_view text, std::string_view why) {
  std::string names;
  for (const KnownGpu& gpu : known_gpus())
    names += fmt::format("{}{}", names.empty() ? "" : ", ", gpu.names[0]);
  fail(
      "--gpu '{}': {}; give a memory size (\"48GiB\"), optionally with a bandwidth "
      "(\"24GiB:1000GBps\"), "
      "or a card name ({}) optionally followed by \":NNGiB\" or \":NNNGBps\"",
      text, why, names);
}

// ---- this machine ----------------------------------------------------------------------------

std::string cpu_model_name() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);) {
    if (!line.starts_with("model name")) continue;
    const size_t colon = line.find(':');
    if (colon != std::string::npos)
      return std::string(trim(std::string_view(line).substr(colon + 1)));
  }
  return "unknown CPU";
}

int numa_node_count() {
  int nodes = 0;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/sys/devices/system/node", ec)) {
    const std::string name = entry.path().filename().string();
    if (name.size() > 4 && name.starts_with("node") &&
        std::all_of(name.begin() + 4, name.end(),
                    [](char c) { return std::isdigit(static_cast<unsigned char>(c)); }))
      ++nodes;
  }
  return std::max(nodes, 1);
}

// Matmul throughput per core with int8 activations, an estimate from the instruction set: one
// 512-bit VPDPBUSD does 128 int8 ops, so a core at ~3 GHz peaks near 400-700 GOPS with AVX-512
// VNNI; quantized kernels spend much of their time unpacking blocks and reach about a third.
// AVX-VNNI is the same on 256 bits, plain AVX2 needs two instructions per multiply-add.
double cpu_ops_per_core() {
  if (__builtin_cpu_supports("avx512vnni")) return 200e9;
  if (__builtin_cpu_supports("avxvnni")) return 120e9;
  if (__builtin_cpu_supports("avx2")) return 80e9;
  return 20e9;
}

std::string today() {
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  gmtime_r(&now, &utc);
  char text[16];
  std::strftime(text, sizeof text, "%Y-%m-%d", &utc);
  return text;
}

// STREAM's triad a[i] = b[i] + s * c[i] over three arrays far past any cache: 256 MiB in all, or
// 16 MiB per thread where that is more (a many-core server can have 384 MiB of L3), but never
// more than a quarter of the free RAM. Each thread works on its own slice, which it also
// first-touched so pages sit on its NUMA node. Bytes counted as STREAM counts them (24 per
// element; the write-allocate read is not counted, so this is what reads and writes of weights
// and activations see). The best of the repetitions in about a second.
double measure_triad_bandwidth(int threads, uint64_t available_ram_bytes) {
  uint64_t total_bytes = std::max<uint64_t>(uint64_t(256) << 20, uint64_t(threads) * (16 << 20));
  if (available_ram_bytes > 0) total_bytes = std::min(total_bytes, available_ram_bytes / 4);
  total_bytes = std::max<uint64_t>(total_bytes, uint64_t(32) << 20);
  const size_t n_elements = size_t(total_bytes / (3 * sizeof(double)));
  constexpr double kBudgetSeconds = 1.0;
  // On huge pages, as the weights are (core/aligned_buffer.h).
  AlignedBuffer a_bytes(n_elements * sizeof(double)), b_bytes(n_elements * sizeof(double)),
      c_bytes(n_elements * sizeof(double));
  double* a = a_bytes.as<double>();
  double* b = b_bytes.as<double>();
  double* c = c_bytes.as<double>();
  ThreadPool pool(threads);
  const int64_t n_slices = pool.size();
  auto slice = [&](int64_t s) {
    return std::pair<size_t, size_t>(n_elements * size_t(s) / size_t(n_slices),
                                     n_elements * size_t(s + 1) / size_t(n_slices));
  };
  pool.parallel_for(n_slices, [&](int64_t s, int) {
    const auto [first, last] = slice(s);
    for (size_t i = first; i < last; ++i) a[i] = 0.0, b[i] = 1.0, c[i] = 2.0;
  });

  const double scalar = 3.0;
  double best_seconds = 1e30, spent = 0;
  for (int rep = 0; rep < 20 && (rep < 3 || spent < kBudgetSeconds); ++rep) {
    const auto start = std::chrono::steady_clock::now();
    pool.parallel_for(n_slices, [&](int64_t s, int) {
      const auto [first, last] = slice(s);
      double* __restrict out = a;
      const double* __restrict x = b;
      const double* __restrict y = c;
      for (size_t i = first; i < last; ++i) out[i] = x[i] + scalar * y[i];
    });
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    best_seconds = std::min(best_seconds, seconds);
    spent += seconds;
  }
  // Every a[i] is 7; reading one back keeps the loop from being optimized away.
  TANDEM_CHECK(a[n_elements / 2] == 7.0);
  return 3.0 * sizeof(double) * double(n_elements) / best_seconds;
}

std::optional<std::filesystem::path> bandwidth_cache_path() {
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  if (xdg && *xdg) return std::filesystem::path(xdg) / "tandem" / "bandwidth.json";
  const char* home = std::getenv("HOME");
  if (home && *home) return std::filesystem::path(home) / ".cache" / "tandem" / "bandwidth.json";
  return std::nullopt;
}

nlohmann::json read_cache(const std::filesystem::path& path) {
  std::ifstream in(path);
  if (!in) return nlohmann::json::object();
  // A damaged cache is measured over, never an error.
  nlohmann::json cache = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (!cache.is_object() || !cache.contains("entries") || !cache["entries"].is_array())
    return nlohmann::json::object();
  return cache;
}

// Written beside and renamed, so a concurrent reader sees the old file or the new one. A cache
// that cannot be written costs the measurement next time, nothing more.
void write_cache(const std::filesystem::path& path, const nlohmann::json& cache) {
  std::error_code ec;
  std::filesystem::create_directories(path.parent_path(), ec);
  const std::filesystem::path temp = path.string() + fmt::format(".{}.tmp", ::getpid());
  std::ofstream out(temp);
  if (out << cache.dump(2) << '\n') {
    out.close();
    std::filesystem::rename(temp, path, ec);
  }
  if (ec || !out) std::filesystem::remove(temp, ec);
}

struct HostRates {
  double bandwidth_bytes_per_s;
  double decode_kernel_bytes_per_s;
  double interleaved_kernel_bytes_per_s;
  std::string source;
};

// The host's bandwidth and decode kernel rate for `threads` threads: from the cache when this CPU
// model and thread count were measured before, otherwise measured now (~2 s) and written back (a
// cache that cannot be written costs the measurement next time, nothing more).
// Cached rates measured another way are measured again: 2 = buffers on huge pages, as the
// weights have been since their mapping asks for them; 3 = with the interleaved kernel's rate;
// 4 = the kernels at 8-bit activations, the FFNs' default (the interleaved formats' 8-bit ones);
// 5 = measurements that looked disturbed no longer cached (method 4's may hold one).
constexpr int kRatesMethod = 5;

HostRates measure_host_rates(int threads) {
  return {measure_triad_bandwidth(threads, available_ram_bytes()),
          measure_decode_kernel_bytes_per_s(threads, available_ram_bytes()),
          measure_decode_kernel_bytes_per_s(threads, available_ram_bytes(), /*interleaved=*/true),
          ""};
}

bool disturbed(const HostRates& r) {
  return host_rates_look_disturbed(r.bandwidth_bytes_per_s, r.decode_kernel_bytes_per_s);
}

HostRates host_rates(const std::string& cpu_model, int threads) {
  const auto path = bandwidth_cache_path();
  nlohmann::json cache = path ? read_cache(*path) : nlohmann::json::object();
  if (cache.contains("entries")) {
    for (const nlohmann::json& entry : cache["entries"]) {
      if (entry.value("cpu", "") != cpu_model || entry.value("threads", -1) != threads ||
          entry.value("method", 1) != kRatesMethod)
        continue;
      const double bytes_per_s = entry.value("bytes_per_s", 0.0);
      const double kernel_bytes_per_s = entry.value("decode_kernel_bytes_per_s", 0.0);
      const double interleaved_bytes_per_s = entry.value("interleaved_kernel_bytes_per_s", 0.0);
      if (bytes_per_s > 0 && kernel_bytes_per_s > 0 && interleaved_bytes_per_s > 0)
        return {bytes_per_s, kernel_bytes_per_s, interleaved_bytes_per_s,
                fmt::format("measured {} (STREAM triad and decode kernel, {} threads; cached in {})",
                            entry.value("date", "?"), threads, path->string())};
    }
  }
  HostRates rates = measure_host_rates(threads);
  const std::string date = today();
  if (disturbed(rates)) {
    // Once more: two kernel rates within a quarter of each other are this machine's own (a
    // portable build's kernels, very wide memory), two far apart were the other work's.
    const HostRates again = measure_host_rates(threads);
    const double low = std::min(rates.decode_kernel_bytes_per_s, again.decode_kernel_bytes_per_s);
    const double high = std::max(rates.decode_kernel_bytes_per_s, again.decode_kernel_bytes_per_s);
    const bool steady = high <= 1.25 * low;
    rates = again.decode_kernel_bytes_per_s >= rates.decode_kernel_bytes_per_s ? again : rates;
    if (!steady && disturbed(rates)) {
      // The kernel rates are not used (the cost model would prefer them to the bandwidth).
      rates.source = fmt::format(
          "measured {} (STREAM triad, {} threads; the cores looked busy: our decode kernel at "
          "{:.1f} GB/s against {:.1f} GB/s of memory bandwidth, so its rate is left out; not "
          "cached, measured again next time)",
          date, threads, rates.decode_kernel_bytes_per_s / 1e9, rates.bandwidth_bytes_per_s / 1e9);
      rates.decode_kernel_bytes_per_s = rates.interleaved_kernel_bytes_per_s = 0;
      return rates;
    }
  }
  if (path) {
    if (!cache.contains("entries")) cache["entries"] = nlohmann::json::array();
    // An older entry for this CPU and thread count is replaced.
    auto& entries = cache["entries"];
    for (auto it = entries.begin(); it != entries.end();)
      it = it->value("cpu", "") == cpu_model && it->value("threads", -1) == threads
               ? entries.erase(it)
               : it + 1;
    entries.push_back({{"cpu", cpu_model},
                       {"threads", threads},
                       {"bytes_per_s", rates.bandwidth_bytes_per_s},
                       {"decode_kernel_bytes_per_s", rates.decode_kernel_bytes_per_s},
                       {"interleaved_kernel_bytes_per_s", rates.interleaved_kernel_bytes_per_s},
                       {"method", kRatesMethod},
                       {"date", date}});
    write_cache(*path, cache);
  }
  rates.source =
      fmt::format("measured {} (STREAM triad and decode kernel, {} threads)", date, threads);
  return rates;
}

// A GPU's copy bandwidth and decode kernel rate: from the cache when this GPU model was measured
// before in this slot, otherwise measured now on device `index` (~1 s) and written back. The slot
// is part of the key because the host link and the hand-off are the slot's: two cards of one
// model behind different links (PCIe 4 and 5, x8 and x16) are measured each.
struct GpuRates {
  double copy_bytes_per_s;
  double decode_kernel_bytes_per_s;
  double host_link_bytes_per_s;
  double host_handoff_s;
  std::string source;
};
constexpr int kGpuRatesMethod = 2;  // 2: with the host link and the hybrid hand-off

GpuRates gpu_rates(const std::string& gpu_model, const std::string& slot, int index) {
  const auto path = bandwidth_cache_path();
  nlohmann::json cache = path ? read_cache(*path) : nlohmann::json::object();
  if (cache.contains("entries"))
    for (const nlohmann::json& entry : cache["entries"]) {
      if (entry.value("gpu", "") != gpu_model || entry.value("slot", "") != slot ||
          entry.value("method", 0) != kGpuRatesMethod)
        continue;
      const double copy = entry.value("copy_bytes_per_s", 0.0), kernel = entry.value("decode_kernel_bytes_per_s", 0.0);
      if (copy > 0 && kernel > 0)
        return {
            copy, kernel, entry.value("host_link_bytes_per_s", 0.0),
            entry.value("host_handoff_s", 0.0),
            fmt::format(
                "measured {} (device copy, decode kernel, host link and hand-off; cached in {})",
                entry.value("date", "?"), path->string())};
    }
  const cuda::GpuRates measured = cuda::measure_gpu_rates(index);
  const std::string date = today();
  if (path) {
    if (!cache.contains("entries")) cache["entries"] = nlohmann::json::array();
    auto& entries = cache["entries"];
    // This slot's entry, and the model's from before slots were kept (method 2 without one).
    for (auto it = entries.begin(); it != entries.end();)
      it = it->value("gpu", "") == gpu_model && it->value("slot", slot) == slot ? entries.erase(it)
                                                                                : it + 1;
    entries.push_back({{"gpu", gpu_model},
                       {"slot", slot},
                       {"copy_bytes_per_s", measured.copy_bytes_per_s},
                       {"decode_kernel_bytes_per_s", measured.decode_kernel_bytes_per_s},
                       {"host_link_bytes_per_s", measured.host_link_bytes_per_s},
                       {"host_handoff_s", measured.host_handoff_s},
                       {"method", kGpuRatesMethod},
                       {"date", date}});
    write_cache(*path, cache);
  }
  return {measured.copy_bytes_per_s, measured.decode_kernel_bytes_per_s,
          measured.host_link_bytes_per_s, measured.host_handoff_s,
          fmt::format("measured {} (device copy, decode kernel, host link and hand-off)", date)};
}

// RAM as seen (described, or available now) with the default share kept free.
void set_ram(Hardware& hw, uint64_t ram_bytes) {
  hw.ram_bytes = ram_bytes;
  set_ram_reserve(hw, default_ram_reserve(ram_bytes),
                  "default: 10% of RAM, at least 4 GiB, at most half; --ram-reserve to change");
}

Hardware detect_host(int32_t threads, bool measure_bandwidth) {
  Hardware hw;
  hw.cpu_cores = physical_core_count();
  hw.numa_nodes = numa_node_count();
  if (threads <= 0) threads = hw.cpu_cores;
  const std::string cpu = cpu_model_name();
  hw.host.name = "cpu";
  hw.host.kind = DeviceKind::Cpu;
  hw.host.model = fmt::format("{} ({} cores)", cpu, hw.cpu_cores);
  set_ram(hw, available_ram_bytes());
  // Threads past the physical cores share their units, so they add no matmul throughput.
  hw.host.flops_per_s = cpu_ops_per_core() * std::min(threads, hw.cpu_cores);
  if (measure_bandwidth) {
    const HostRates rates = host_rates(cpu, threads);
    hw.host.bandwidth_bytes_per_s = rates.bandwidth_bytes_per_s;
    hw.host.decode_kernel_bytes_per_s = rates.decode_kernel_bytes_per_s;
    hw.host.interleaved_kernel_bytes_per_s = rates.interleaved_kernel_bytes_per_s;
    hw.host.bandwidth_source = rates.source;
  }
  return hw;
}

}  // namespace

bool host_rates_look_disturbed(double triad_bytes_per_s, double kernel_bytes_per_s) {
  return kernel_bytes_per_s < triad_bytes_per_s / 5;
}

uint64_t available_ram_bytes() {
  // MemAvailable: free memory plus what the kernel can reclaim (page cache), which is what a
  // process can take without swapping. Weights mapped from the file live in that page cache.
  std::ifstream in("/proc/meminfo");
  for (std::string line; std::getline(in, line);) {
    if (!line.starts_with("MemAvailable:")) continue;
    std::istringstream fields(line.substr(13));
    uint64_t kib = 0;
    if (fields >> kib) return kib * 1024;
  }
  return 0;
}

double measure_memory_bandwidth(int32_t threads) {
  return measure_triad_bandwidth(threads, available_ram_bytes());
}

uint64_t parse_bytes(std::string_view text) {
  if (const auto bytes = try_parse_bytes(text)) return *bytes;
  fail(
      "'{}' is not an amount of memory; write a number and a unit: 192GiB, 512GB, 1.5TiB, 800MiB "
      "(GiB/MiB/TiB are powers of 1024, GB/MB/TB of 1000)",
      text);
}

DeviceSpec parse_gpu(std::string_view text, int32_t index, DeviceKind kind) {
  TANDEM_CHECK(kind != DeviceKind::Cpu);
  DeviceSpec spec;
  spec.kind = kind;
  spec.name = fmt::format("{}:{}", kind == DeviceKind::Sim ? "sim" : "cuda", index);

  std::vector<std::string_view> parts;
  for (size_t start = 0;;) {
    const size_t colon = text.find(':', start);
    parts.push_back(
        trim(text.substr(start, colon == std::string_view::npos ? colon : colon - start)));
    if (colon == std::string_view::npos) break;
    start = colon + 1;
  }

  std::optional<uint64_t> memory;
  std::optional<double> bandwidth;
  if (const KnownGpu* gpu = find_gpu(parts[0])) {
    spec.model = std::string(gpu->model);
    memory = uint64_t(gpu->memory_gib * kGiB);
    bandwidth = gpu->bandwidth_gb_per_s * 1e9;
    spec.flops_per_s = gpu->fp16_tflops * 1e12;
    spec.int8_ops_per_s = gpu->int8_tops * 1e12;
    spec.bandwidth_source = fmt::format("default for {}", gpu->model);
  } else if (const auto bytes = try_parse_bytes(parts[0])) {
    memory = *bytes;
    spec.model = fmt::format("{:.4g} GiB GPU", double(*bytes) / kGiB);
    spec.flops_per_s = kDefaultGpuFlops;
    spec.int8_ops_per_s = 2 * kDefaultGpuFlops;
  } else {
    bad_gpu(text, fmt::format("'{}' is neither a known card nor a memory size", parts[0]));
  }

  // Overrides after the first part: each a memory size or a bandwidth, at most one of each.
  bool memory_given = false, bandwidth_given = false;
  for (size_t i = 1; i < parts.size(); ++i) {
    if (const auto bytes = try_parse_bytes(parts[i]);
        bytes && !memory_given && find_gpu(parts[0])) {
      memory = *bytes, memory_given = true;
    } else if (const auto bw = try_parse_bandwidth(parts[i]); bw && !bandwidth_given) {
      bandwidth = *bw, bandwidth_given = true;
    } else {
      bad_gpu(text, fmt::format("cannot use '{}' here", parts[i]));
    }
  }
  if (*memory == 0) bad_gpu(text, "the memory size is zero");
  if (bandwidth_given) {
    spec.bandwidth_bytes_per_s = *bandwidth;
    spec.bandwidth_source = "given";
  } else if (bandwidth) {
    spec.bandwidth_bytes_per_s = *bandwidth;
  } else {
    spec.bandwidth_bytes_per_s = kDefaultGpuBandwidth;
    spec.bandwidth_source =
        fmt::format("default for an unnamed GPU ({:.0f} GB/s); give it as \"48GiB:NNNGBps\"",
                    kDefaultGpuBandwidth / 1e9);
  }
  const uint64_t reserve = kind == DeviceKind::Cuda ? kGpuRuntimeReserveBytes : 0;
  if (*memory <= reserve)
    bad_gpu(text,
            fmt::format("{:.2f} GiB leaves nothing after the {:.2f} GiB the CUDA runtime needs",
                        double(*memory) / kGiB, double(reserve) / kGiB));
  spec.memory_bytes = *memory - reserve;
  return spec;
}

uint64_t default_ram_reserve(uint64_t ram_bytes) {
  constexpr uint64_t kAtLeast = uint64_t(4) << 30;
  return std::min(std::max(ram_bytes / 10, kAtLeast), ram_bytes / 2);
}

void set_ram_reserve(Hardware& hw, uint64_t reserve_bytes, std::string source) {
  hw.ram_reserve_bytes = std::min(reserve_bytes, hw.ram_bytes);
  hw.ram_reserve_source = std::move(source);
  hw.host.memory_bytes = hw.ram_bytes - hw.ram_reserve_bytes;
}

uint64_t parse_ram_reserve(std::string_view text, uint64_t ram_bytes) {
  const std::string_view t = trim(text);
  if (t.ends_with('%')) {
    double percent = -1;
    const std::string number(trim(t.substr(0, t.size() - 1)));
    const auto [end, ec] = std::from_chars(number.data(), number.data() + number.size(), percent);
    if (ec == std::errc() && end == number.data() + number.size() && percent >= 0 && percent <= 100)
      return uint64_t(double(ram_bytes) * percent / 100.0);
  } else if (const auto bytes = try_parse_bytes(t)) {
    return *bytes;
  }
  fail(
      "--ram-reserve '{}': give an amount of RAM to keep free (\"8GiB\") or a share of it "
      "(\"10%\", 0-100)",
      text);
}

LinkKind parse_link(std::string_view text) {
  const std::string name = lower(trim(text));
  for (LinkKind kind : {LinkKind::Nvlink, LinkKind::Pcie4, LinkKind::Pcie5})
    if (name == link_name(kind)) return kind;
  fail("--link '{}': expected nvlink, pcie4 or pcie5 (how the GPUs reach each other)", text);
}

const char* link_name(LinkKind kind) {
  switch (kind) {
    case LinkKind::Nvlink:
      return "nvlink";
    case LinkKind::Pcie5:
      return "pcie5";
    case LinkKind::Pcie4:
      return "pcie4";
  }
  return "pcie4";
}

double kernel_equivalent_bytes(const DeviceSpec& device, double bytes, double interleaved,
                               double extra) {
  if (device.decode_kernel_bytes_per_s <= 0) return bytes;
  if (interleaved <= 0 || device.interleaved_kernel_bytes_per_s <= 0) return bytes + extra;
  return bytes + extra - interleaved +
         interleaved * device.decode_kernel_bytes_per_s / device.interleaved_kernel_bytes_per_s;
}

Hardware detect_hardware(int32_t threads, bool with_gpus) {
  Hardware hw = detect_host(threads, /*measure_bandwidth=*/true);
  if (with_gpus) hw.gpus = detect_gpus();
  if (!hw.gpus.empty()) {
    const cuda::GpuLinks links = cuda::detect_gpu_links();
    apply_gpu_links(hw, links.known, links.nvlink, links.pcie_generation, links.how);
  }
  return hw;
}

void apply_gpu_links(Hardware& hw, bool known, bool nvlink, int pcie_generation,
                     const std::string& how) {
  if (!known) {
    hw.link_source = fmt::format("{} (not detected: {})", hw.link_source, how);
    return;
  }
  hw.gpu_link = nvlink ? LinkKind::Nvlink : pcie_generation >= 5 ? LinkKind::Pcie5 : LinkKind::Pcie4;
  hw.link_source = fmt::format("detected, {}{}", how,
                               !nvlink && pcie_generation > 0 && pcie_generation < 4
                                   ? "; planned as PCIe 4, the slowest link the cost model knows"
                                   : "");
}

std::vector<DeviceSpec> detect_gpus(bool measure) {
  std::vector<DeviceSpec> specs;
  for (const cuda::GpuInfo& gpu : cuda::list_gpus()) {
    DeviceSpec spec{.name = fmt::format("cuda:{}", gpu.index), .kind = DeviceKind::Cuda, .model = gpu.name};
    // The free memory already excludes the context this process and others hold; what tandem's
    // kernels add on top (scratch, allocator rounding) stays free.
    spec.memory_bytes = gpu.free_bytes > kGpuScratchReserveBytes ? gpu.free_bytes - kGpuScratchReserveBytes : 0;
    const KnownGpu* known = find_gpu(gpu.name);
    spec.flops_per_s = known ? known->fp16_tflops * 1e12 : kDefaultGpuFlops;
    spec.int8_ops_per_s = known ? known->int8_tops * 1e12 : 2 * kDefaultGpuFlops;
    if (gpu.peak_bandwidth_bytes_per_s > 0) {
      spec.bandwidth_bytes_per_s = gpu.peak_bandwidth_bytes_per_s;
      spec.bandwidth_source = "peak from the memory clock and bus width the driver reports";
    } else if (known) {
      spec.bandwidth_bytes_per_s = known->bandwidth_gb_per_s * 1e9;
      spec.bandwidth_source = fmt::format("default for {}", known->model);
    } else {
      spec.bandwidth_bytes_per_s = kDefaultGpuBandwidth;
      spec.bandwidth_source = "default for an unnamed GPU";
    }
    if (measure) {
      const GpuRates rates = gpu_rates(gpu.name, gpu.pci_slot, gpu.index);
      spec.bandwidth_bytes_per_s = rates.copy_bytes_per_s;
      spec.decode_kernel_bytes_per_s = rates.decode_kernel_bytes_per_s;
      spec.host_link_bytes_per_s = rates.host_link_bytes_per_s;
      spec.host_handoff_s = rates.host_handoff_s;
      spec.bandwidth_source = rates.source;
    }
    specs.push_back(std::move(spec));
  }
  return specs;
}

Hardware describe_hardware(const std::vector<std::string>& gpus, std::string_view ram,
                           double host_bandwidth_bytes_per_s, int32_t threads) {
  Hardware hw = detect_host(threads, /*measure_bandwidth=*/host_bandwidth_bytes_per_s <= 0);
  if (host_bandwidth_bytes_per_s > 0) {
    hw.host.bandwidth_bytes_per_s = host_bandwidth_bytes_per_s;
    hw.host.bandwidth_source = "given";
  }
  // Described RAM is taken as what tandem may use; a person who runs other things gives less.
  if (!trim(ram).empty()) {
    set_ram(hw, parse_bytes(ram));
    hw.host.memory_given = true;
  }
  for (size_t i = 0; i < gpus.size(); ++i)
    hw.gpus.push_back(parse_gpu(gpus[i], int32_t(i), DeviceKind::Cuda));
  return hw;
}

void set_cpu_cores(Hardware& hw, int32_t cores) {
  hw.host.flops_per_s *= double(cores) / double(std::max(hw.cpu_cores, 1));
  hw.cpu_cores = cores;
  hw.host.model = fmt::format("CPU ({} cores, given)", cores);
}

void set_node_link(Hardware& hw, std::string_view text) {
  // Per direction, as MPI's and NCCL's point-to-point tests reach them: InfiniBand about 90% of
  // the line rate with 1-3 us for a small message (OSU latency and bandwidth benchmarks on HDR and
  // NDR fabrics); Ethernet with TCP about 90% of the line rate and 20-50 us (RoCE is closer to
  // InfiniBand: give it as numbers).
  struct Named {
    std::string_view name;
    double bytes_per_s, latency_s;
  };
  static constexpr Named kLinks[] = {{"ib-ndr", 45e9, 2e-6},
                                     {"ib-hdr", 22.5e9, 2e-6},
                                     {"eth100", 11e9, 25e-6},
                                     {"eth25", 2.8e9, 30e-6},
                                     {"eth10", 1.1e9, 40e-6}};
  for (const Named& link : kLinks)
    if (text == link.name) {
      hw.node_link_bytes_per_s = link.bytes_per_s;
      hw.node_link_latency_s = link.latency_s;
      hw.node_link_source = fmt::format("given: {}", text);
      return;
    }
  // "50GBps:3us": each number followed by exactly its unit.
  auto number_with_unit = [](std::string_view part, std::string_view unit, double& value) {
    if (!part.ends_with(unit)) return false;
    part.remove_suffix(unit.size());
    const auto [end, error] = std::from_chars(part.data(), part.data() + part.size(), value);
    return error == std::errc() && end == part.data() + part.size();
  };
  const size_t colon = text.find(':');
  double gbps = 0, us = 0;
  if (colon != std::string_view::npos && number_with_unit(text.substr(0, colon), "GBps", gbps) &&
      number_with_unit(text.substr(colon + 1), "us", us) && gbps > 0 && us >= 0) {
    hw.node_link_bytes_per_s = gbps * 1e9;
    hw.node_link_latency_s = us * 1e-6;
    hw.node_link_source = fmt::format("given: {}", text);
    return;
  }
  fail(
      "--node-link {}: not a network; use ib-ndr, ib-hdr, eth100, eth25, eth10, or "
      "BANDWIDTH:LATENCY such as 50GBps:3us",
      text);
}

void repeat_nodes(Hardware& hw, int32_t n_nodes) {
  if (n_nodes < 1 || n_nodes > 64) fail("--nodes {}: give 1 to 64 machines", n_nodes);
  if (hw.node_link_bytes_per_s <= 0) {
    set_node_link(hw, "ib-hdr");
    hw.node_link_source = "assumed InfiniBand HDR (200 Gb/s): give --node-link";
  }
  const std::vector<DeviceSpec> one = hw.gpus;
  for (int32_t node = 1; node < n_nodes; ++node) {
    for (DeviceSpec gpu : one) {
      gpu.name = fmt::format("node{}:{}", node, gpu.name);
      gpu.node = node;
      hw.gpus.push_back(std::move(gpu));
    }
    hw.other_hosts.push_back(host_on_node(hw.host, node));
  }
  hw.n_nodes = n_nodes;
}

DeviceSpec host_on_node(const DeviceSpec& first_host, int32_t node) {
  DeviceSpec host = first_host;
  host.name = fmt::format("node{}:cpu", node);
  host.node = node;
  return host;
}

}  // namespace tandem::plan
