// --devices texts: what each form asks for, in order, and the errors a person can act on.
#include "runtime/device_setup.h"

#include <gtest/gtest.h>

#include <string>

#include "core/error.h"

namespace tandem {
namespace {

std::string error_of(std::string_view spec, int gpus_found) {
  try {
    parse_devices(spec, gpus_found);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(DeviceSetup, CpuAndAutoWithoutGpusAskForNothingBesidesTheHost) {
  EXPECT_TRUE(parse_devices("cpu", 0).empty());
  EXPECT_TRUE(parse_devices("", 3).empty());
  EXPECT_TRUE(parse_devices("auto", 0).empty());
}

TEST(DeviceSetup, AutoAndCudaTakeEveryGpuInOrder) {
  for (const char* spec : {"auto", "cuda", "cpu,cuda"}) {
    const std::vector<DeviceRequest> r = parse_devices(spec, 2);
    ASSERT_EQ(r.size(), 2u) << spec;
    EXPECT_TRUE(r[0].cuda && r[1].cuda);
    EXPECT_EQ(r[0].cuda_index, 0);
    EXPECT_EQ(r[1].cuda_index, 1);
  }
}

TEST(DeviceSetup, NamedGpusAndSimulatedDevicesKeepTheirOrder) {
  const std::vector<DeviceRequest> r = parse_devices("cuda:1,sim:2x1MiB,cuda:0", 2);
  ASSERT_EQ(r.size(), 4u);
  EXPECT_TRUE(r[0].cuda);
  EXPECT_EQ(r[0].cuda_index, 1);
  EXPECT_FALSE(r[1].cuda);
  EXPECT_EQ(r[1].sim_bytes, uint64_t(1) << 20);
  EXPECT_FALSE(r[2].cuda);
  EXPECT_TRUE(r[3].cuda);
  EXPECT_EQ(r[3].cuda_index, 0);
  EXPECT_EQ(parse_sim_devices("cuda:0,sim:1GiB,sim:2x1MiB"),
            (std::vector<uint64_t>{uint64_t(1) << 30, uint64_t(1) << 20, uint64_t(1) << 20}));
}

TEST(DeviceSetup, MistakesAreNamedWithTheFix) {
  EXPECT_NE(error_of("cuda", 0).find("no CUDA GPU found"), std::string::npos)
      << error_of("cuda", 0);
  EXPECT_NE(error_of("cuda", 0).find("--devices cpu"), std::string::npos);
  EXPECT_NE(error_of("cuda:1", 1).find("there is no cuda:1: 1 GPU found"), std::string::npos)
      << error_of("cuda:1", 1);
  EXPECT_NE(error_of("cuda:0,cuda:0", 1).find("cuda:0 is named twice"), std::string::npos);
  EXPECT_NE(error_of("cuda:x", 1).find("bad GPU index in 'cuda:x'"), std::string::npos);
  EXPECT_NE(error_of("gpu:0", 1).find("unknown device 'gpu:0'"), std::string::npos);
  EXPECT_NE(error_of("sim:0x1GiB", 0).find("bad device count"), std::string::npos);
}

}  // namespace
}  // namespace tandem
