// Hardware descriptions (--gpu, --ram) and detection of this machine, with its bandwidth cache.
#include "plan/hardware.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "core/error.h"
#include "test_support.h"

namespace tandem::plan {
namespace {

constexpr uint64_t kGiB = uint64_t(1) << 30;
constexpr uint64_t kReserve = 3 * kGiB / 4;  // the CUDA runtime's share, as hardware.cpp keeps it

std::string error_of(auto&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(ParseBytes, accepts_binary_and_decimal_units_with_decimals) {
  EXPECT_EQ(parse_bytes("192GiB"), 192 * kGiB);
  EXPECT_EQ(parse_bytes("512GB"), uint64_t(512e9));
  EXPECT_EQ(parse_bytes("1TiB"), 1024 * kGiB);
  EXPECT_EQ(parse_bytes("1.5TB"), uint64_t(1.5e12));
  EXPECT_EQ(parse_bytes("800MiB"), uint64_t(800) << 20);
  EXPECT_EQ(parse_bytes("0.5gib"), kGiB / 2);
  EXPECT_EQ(parse_bytes(" 64 GiB "), 64 * kGiB);
}

TEST(ParseBytes, rejects_text_without_a_known_unit) {
  for (const char* bad : {"", "192", "GiB", "12 parsecs", "-4GiB", "1e30GB", "4GiB extra"}) {
    const std::string message = error_of([&] { parse_bytes(bad); });
    EXPECT_NE(message.find("192GiB"), std::string::npos) << bad << ": " << message;
  }
}

TEST(RamReserve, ten_percent_at_least_4_gib_at_most_half) {
  EXPECT_EQ(default_ram_reserve(64 * kGiB), 64 * kGiB / 10);
  EXPECT_EQ(default_ram_reserve(1024 * kGiB), 1024 * kGiB / 10);
  EXPECT_EQ(default_ram_reserve(16 * kGiB), 4 * kGiB);
  EXPECT_EQ(default_ram_reserve(2 * kGiB), kGiB);
  EXPECT_EQ(parse_ram_reserve("8GiB", 64 * kGiB), 8 * kGiB);
  EXPECT_EQ(parse_ram_reserve("25%", 64 * kGiB), 16 * kGiB);
  EXPECT_EQ(parse_ram_reserve("0%", 64 * kGiB), 0u);
  for (const char* bad : {"", "lots", "120%", "-5%", "8"})
    EXPECT_NE(error_of([&] { parse_ram_reserve(bad, 64 * kGiB); }).find("--ram-reserve"),
              std::string::npos)
        << bad;
  Hardware hw;
  hw.ram_bytes = 64 * kGiB;
  set_ram_reserve(hw, 8 * kGiB, "given");
  EXPECT_EQ(hw.host.memory_bytes, 56 * kGiB);
  EXPECT_EQ(hw.ram_reserve_source, "given");
  set_ram_reserve(hw, 100 * kGiB, "given");  // never more than there is
  EXPECT_EQ(hw.host.memory_bytes, 0u);
}

TEST(ParseLink, names_round_trip_and_errors_list_the_choices) {
  for (LinkKind kind : {LinkKind::Nvlink, LinkKind::Pcie4, LinkKind::Pcie5})
    EXPECT_EQ(parse_link(link_name(kind)), kind);
  EXPECT_EQ(parse_link(" NVLink "), LinkKind::Nvlink);
  EXPECT_NE(error_of([] { parse_link("pcie3"); }).find("nvlink, pcie4 or pcie5"),
            std::string::npos);
}

// What the driver says about cuda:0's links becomes the plan's link kind, with where it came
// from; no answer keeps the assumption and says why.
TEST(GpuLinks, nvlink_then_the_pcie_generation_decide_and_unknown_keeps_the_assumption) {
  Hardware hw;
  apply_gpu_links(hw, true, true, 4, "NVML: cuda:0 has 12 active NVLinks, PCIe gen 4");
  EXPECT_EQ(hw.gpu_link, LinkKind::Nvlink);
  EXPECT_EQ(hw.link_source, "detected, NVML: cuda:0 has 12 active NVLinks, PCIe gen 4");
  hw = Hardware{};
  apply_gpu_links(hw, true, false, 5, "x");
  EXPECT_EQ(hw.gpu_link, LinkKind::Pcie5);
  hw = Hardware{};
  apply_gpu_links(hw, true, false, 3, "x");
  EXPECT_EQ(hw.gpu_link, LinkKind::Pcie4);
  EXPECT_NE(hw.link_source.find("planned as PCIe 4"), std::string::npos) << hw.link_source;
  hw = Hardware{};
  apply_gpu_links(hw, false, false, 0, "NVML (libnvidia-ml.so.1) not found");
  EXPECT_EQ(hw.gpu_link, LinkKind::Pcie4);
  EXPECT_TRUE(hw.link_source.starts_with("assumed PCIe 4")) << hw.link_source;
  EXPECT_NE(hw.link_source.find("not detected: NVML (libnvidia-ml.so.1) not found"),
            std::string::npos)
      << hw.link_source;
}

TEST(ParseGpu, known_cards_get_their_memory_bandwidth_and_throughput) {
  const DeviceSpec g = parse_gpu("4090", 1);
  EXPECT_EQ(g.name, "cuda:1");
  EXPECT_EQ(g.kind, DeviceKind::Cuda);
  EXPECT_EQ(g.model, "RTX 4090");
  EXPECT_EQ(g.memory_bytes, 24 * kGiB - kReserve);
  EXPECT_DOUBLE_EQ(g.bandwidth_bytes_per_s, 1008e9);
  EXPECT_GT(g.flops_per_s, 100e12);
  EXPECT_GT(g.int8_ops_per_s, g.flops_per_s);
  EXPECT_EQ(g.bandwidth_source, "default for RTX 4090");

  struct Card {
    const char* text;
    uint64_t gib;
    double gb_per_s;
  };
  for (const Card& c :
       {Card{"3090", 24, 936}, Card{"RTX 5090", 32, 1792}, Card{"a6000", 48, 768},
        Card{"A100", 40, 1555}, Card{"a100-80g", 80, 2039}, Card{"H100", 80, 3350},
        Card{"h200", 141, 4800}, Card{"L40S", 48, 864}, Card{"NVIDIA GeForce RTX 3090", 24, 936}}) {
    const DeviceSpec spec = parse_gpu(c.text, 0);
    EXPECT_EQ(spec.memory_bytes, c.gib * kGiB - kReserve) << c.text;
    EXPECT_DOUBLE_EQ(spec.bandwidth_bytes_per_s, c.gb_per_s * 1e9) << c.text;
  }
}

TEST(ParseGpu, sizes_and_overrides) {
  const DeviceSpec plain = parse_gpu("48GiB", 0);
  EXPECT_EQ(plain.memory_bytes, 48 * kGiB - kReserve);
  EXPECT_DOUBLE_EQ(plain.bandwidth_bytes_per_s, 900e9);
  EXPECT_NE(plain.bandwidth_source.find("default"), std::string::npos);

  const DeviceSpec with_bw = parse_gpu("24GiB:1000GBps", 2);
  EXPECT_EQ(with_bw.name, "cuda:2");
  EXPECT_DOUBLE_EQ(with_bw.bandwidth_bytes_per_s, 1000e9);
  EXPECT_EQ(with_bw.bandwidth_source, "given");

  const DeviceSpec card = parse_gpu("4090:20GiB:1.2TB/s", 0);
  EXPECT_EQ(card.model, "RTX 4090");
  EXPECT_EQ(card.memory_bytes, 20 * kGiB - kReserve);
  EXPECT_DOUBLE_EQ(card.bandwidth_bytes_per_s, 1.2e12);

  // A simulated device gets its budget exactly: no CUDA runtime to reserve for.
  const DeviceSpec sim = parse_gpu("2GiB", 1, DeviceKind::Sim);
  EXPECT_EQ(sim.name, "sim:1");
  EXPECT_EQ(sim.memory_bytes, 2 * kGiB);
}

TEST(ParseGpu, errors_name_the_text_and_the_accepted_forms) {
  for (const char* bad :
       {"4080", "", "48GiB:24GiB", "4090:fast", "4090:1000GBps:900GBps", "0.5GiB", "0GiB"}) {
    const std::string message = error_of([&] { parse_gpu(bad, 0); });
    EXPECT_NE(message.find(std::string("'") + bad + "'"), std::string::npos) << message;
    EXPECT_NE(message.find("48GiB"), std::string::npos) << message;
    EXPECT_NE(message.find("4090"), std::string::npos) << message;
  }
}

// The measurements this machine cached on 2026-12-07: one taken while its other core compiled
// (the kernel at 1.8 GB/s against 25 GB/s of bandwidth, then every plan's rate), and sound ones.
TEST(HostRates, a_decode_kernel_below_a_fifth_of_the_bandwidth_looks_disturbed) {
  EXPECT_TRUE(host_rates_look_disturbed(25.0e9, 1.8e9));
  EXPECT_FALSE(host_rates_look_disturbed(28.1e9, 21.9e9));  // one thread
  EXPECT_FALSE(host_rates_look_disturbed(200e9, 60e9));     // a server's STREAM, AVX2 kernels
  EXPECT_FALSE(host_rates_look_disturbed(50e9, 45e9));
}

// Points XDG_CACHE_HOME at a fresh folder for the test's duration.
class DetectHardwareTest : public ::testing::Test {
 protected:
  test::ScopedCacheDir cache_{"hw"};
  const std::filesystem::path& dir_ = cache_.dir();
};

TEST_F(DetectHardwareTest, measures_once_then_reuses_the_cache) {
  const Hardware first = detect_hardware(2);
  EXPECT_GE(first.cpu_cores, 1);
  EXPECT_GE(first.numa_nodes, 1);
  EXPECT_EQ(first.host.name, "cpu");
  EXPECT_EQ(first.host.kind, DeviceKind::Cpu);
  EXPECT_GT(first.host.memory_bytes, uint64_t(64) << 20);
  EXPECT_GT(first.host.bandwidth_bytes_per_s, 1e9);
  EXPECT_LT(first.host.bandwidth_bytes_per_s, 5e12);
  EXPECT_GT(first.host.flops_per_s, 1e9);
  EXPECT_TRUE(first.gpus.empty());
  EXPECT_NE(first.host.bandwidth_source.find("measured"), std::string::npos);
  std::printf("host: %s, %.1f GB/s (%s), %.1f GiB available, %d NUMA node(s)\n",
              first.host.model.c_str(), first.host.bandwidth_bytes_per_s / 1e9,
              first.host.bandwidth_source.c_str(), double(first.host.memory_bytes) / double(kGiB),
              first.numa_nodes);

  // A measurement the other tests' work disturbed twice (ctest -j2 on two cores) is not cached,
  // and says so (HostRates, above); the cache is then what this test cannot see this time.
  const std::filesystem::path cache = dir_ / "tandem" / "bandwidth.json";
  if (first.host.bandwidth_source.find("not cached") != std::string::npos) {
    EXPECT_FALSE(std::filesystem::exists(cache)) << first.host.bandwidth_source;
    return;
  }
  // The cache now holds the measurement; change it to a value no machine measures and see the
  // second call return it instead of measuring again.
  ASSERT_TRUE(std::filesystem::exists(cache));
  nlohmann::json json = nlohmann::json::parse(std::ifstream(cache));
  ASSERT_EQ(json["entries"].size(), 1u);
  EXPECT_EQ(json["entries"][0]["threads"], 2);
  json["entries"][0]["bytes_per_s"] = 123.5e9;
  std::ofstream(cache) << json.dump();

  const Hardware second = detect_hardware(2);
  EXPECT_DOUBLE_EQ(second.host.bandwidth_bytes_per_s, 123.5e9);
  EXPECT_NE(second.host.bandwidth_source.find("cached"), std::string::npos);
}

TEST_F(DetectHardwareTest, unwritable_or_damaged_cache_is_not_an_error) {
  // XDG_CACHE_HOME under a regular file: the folder cannot be created.
  const std::filesystem::path blocker = dir_ / "file";
  std::ofstream(blocker) << "x";
  ::setenv("XDG_CACHE_HOME", (blocker / "sub").c_str(), 1);
  EXPECT_GT(detect_hardware(1).host.bandwidth_bytes_per_s, 1e9);

  ::setenv("XDG_CACHE_HOME", dir_.c_str(), 1);
  std::filesystem::create_directories(dir_ / "tandem");
  std::ofstream(dir_ / "tandem" / "bandwidth.json") << "{ not json";
  EXPECT_GT(detect_hardware(1).host.bandwidth_bytes_per_s, 1e9);
}

TEST_F(DetectHardwareTest, describe_replaces_ram_and_gpus_and_keeps_a_given_bandwidth) {
  const Hardware hw = describe_hardware({"4090", "24GiB:1000GBps"}, "192GiB", 80e9, 2);
  // Described RAM keeps the default reserve free: 10% of 192 GiB.
  EXPECT_EQ(hw.ram_bytes, 192 * kGiB);
  EXPECT_EQ(hw.ram_reserve_bytes, 192 * kGiB / 10);
  EXPECT_EQ(hw.host.memory_bytes, 192 * kGiB - 192 * kGiB / 10);
  EXPECT_EQ(hw.gpu_link, LinkKind::Pcie4);
  EXPECT_TRUE(hw.link_source.starts_with("assumed")) << hw.link_source;
  EXPECT_DOUBLE_EQ(hw.host.bandwidth_bytes_per_s, 80e9);
  EXPECT_EQ(hw.host.bandwidth_source, "given");
  ASSERT_EQ(hw.gpus.size(), 2u);
  EXPECT_EQ(hw.gpus[0].name, "cuda:0");
  EXPECT_EQ(hw.gpus[1].name, "cuda:1");
  EXPECT_DOUBLE_EQ(hw.gpus[1].bandwidth_bytes_per_s, 1000e9);
  // A given bandwidth needs no measurement, so nothing was cached.
  EXPECT_FALSE(std::filesystem::exists(dir_ / "tandem" / "bandwidth.json"));
  EXPECT_NE(error_of([] { describe_hardware({}, "lots", 80e9, 1); }).find("lots"),
            std::string::npos);
}

}  // namespace
}  // namespace tandem::plan
