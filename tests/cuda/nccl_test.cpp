// NCCL as tandem opens it (backends/cuda/nccl_comm.h): loaded at run time or explained, ids made
// without a GPU, every wait bounded by its deadline, and on a GPU a buffer through a communicator.
// Without a GPU only the first three say anything; the last has not yet run on a GPU.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <regex>
#include <vector>

#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/nccl_comm.h"
#include "core/error.h"
#include "cuda_test_support.h"

namespace tandem::cuda {
namespace {

bool library_opens() {
  void* handle = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
  if (handle) dlclose(handle);
  return handle != nullptr;
}

TEST(Nccl, LoadsWhereTheLibraryIsOrSaysWhyGpuBuffersGoThroughTheHost) {
  const NcclStatus& status = nccl_status();
  if (library_opens()) {
    EXPECT_TRUE(status.loaded) << status.describe;
    std::smatch version;
    ASSERT_TRUE(
        std::regex_match(status.describe, version, std::regex(R"(NCCL (\d+)\.(\d+)\.(\d+))")))
        << status.describe;
    EXPECT_GE(std::stoi(version[1]), 2);  // NCCL_VERSION_CODE decoded, not printed raw
    EXPECT_LT(std::stoi(version[2]), 100);
    EXPECT_GE(status.version, 21400);  // ncclCommInitRankConfig and ncclCommFinalize: 2.14
  } else {
    EXPECT_FALSE(status.loaded);
    EXPECT_NE(status.describe.find("host memory"), std::string::npos) << status.describe;
  }
  EXPECT_EQ(describe_nccl(), status.describe);
}

TEST(Nccl, MakesADifferentCommunicatorIdEachTime) {
  if (!nccl_status().loaded) {
    EXPECT_THROW(new_nccl_id(), Error);
    return;
  }
  const NcclId first = new_nccl_id(), second = new_nccl_id();
  EXPECT_NE(first, second);
  EXPECT_NE(first, NcclId{});
}

// A communicator of two whose second member never comes: without a GPU NCCL refuses at once,
// with one it waits; either way the error names what was being done, well within the deadline
// plus a margin, and nothing hangs.
TEST(Nccl, OpeningWithoutThePeerEndsWithinTheDeadlineNamingWhatWasDone) {
  if (!nccl_status().loaded) {
    EXPECT_THROW(NcclComm(0, NcclId{}, 2, 0, 0.5, "opening"), Error);
    return;
  }
  const auto start = std::chrono::steady_clock::now();
  try {
    NcclComm lonely(0, new_nccl_id(), 2, 0, 0.5, "rank 0 opening a channel for a test");
    FAIL() << "a communicator of two opened with one member";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rank 0 opening a channel for a test: "),
              std::string::npos)
        << e.what();
  }
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 10.0);
}

// One member that is its own peer: the bytes go through NCCL's send and receive on the device's
// stream and come back unchanged. Where NCCL is absent the GPU keeps to host memory instead.
TEST(Nccl, ALoneMemberGetsItsOwnBufferBackOnTheGpu) {
  if (cuda::count_gpus() == 0) GTEST_SKIP() << "no CUDA GPU on this machine";
  auto device = make_cuda_backend(0);
  auto& gpu = dynamic_cast<CudaBackend&>(*device);
  if (!nccl_status().loaded) {
    EXPECT_EQ(gpu.rank_channel_end().kind, RankChannelKind::ThroughHost) << nccl_status().describe;
    return;
  }
  EXPECT_EQ(gpu.rank_channel_end().kind, RankChannelKind::Nccl);
  EXPECT_EQ(gpu.rank_channel_end().version, uint32_t(nccl_status().version));
  constexpr size_t kBytes = 1 << 20;
  std::vector<std::byte> sent(kBytes), received(kBytes);
  for (size_t i = 0; i < kBytes; ++i) sent[i] = std::byte(i * 7 + 3);
  auto src = gpu.allocate(kBytes, "nccl test source");
  auto dst = gpu.allocate(kBytes, "nccl test destination");
  gpu.copy_from_host(src->data(), sent.data(), kBytes);
  NcclComm alone(gpu.device(), new_nccl_id(), 1, 0, 30, "a lone member");
  alone.exchange(src->data(), dst->data(), kBytes, 0, gpu.stream(), 30,
                 "a test buffer with itself");
  gpu.copy_to_host(received.data(), dst->data(), kBytes);
  EXPECT_EQ(sent, received);
}

}  // namespace
}  // namespace tandem::cuda
