// MappedFile's page-cache reads (and the BackgroundReader that does them ahead): 2 MiB pieces
// clamped to the file, so a range at the end of a file whose size is not a multiple of 2 MiB
// reads what is there and nothing past it.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>

#include "core/background_reader.h"
#include "core/mapped_file.h"

namespace tandem {
namespace {

struct TempFile {
  std::filesystem::path path;
  explicit TempFile(size_t bytes) {
    path = std::filesystem::temp_directory_path() / ("tandem-mapped-" + std::to_string(::getpid()));
    std::ofstream out(path, std::ios::binary);
    for (size_t i = 0; i < bytes; ++i) out.put(char(i * 7));
  }
  ~TempFile() { std::filesystem::remove(path); }
};

TEST(MappedFile, ReadsPiecesUpToTheEndOfAFileOfOddSize) {
  const size_t size = 3 * MappedFile::kReadGranule + 12345;
  TempFile file(size);
  MappedFile map(file.path.string());
  ASSERT_EQ(map.size(), size);
  map.read_into_memory(size - 100, 100);
  EXPECT_TRUE(map.fully_cached(size - 100, 100));
  map.read_into_memory(0, size);
  EXPECT_TRUE(map.fully_cached(0, size));
  EXPECT_EQ(map.cached_bytes(0, size), (size + 4095) / 4096 * 4096);
  EXPECT_EQ(map.data()[size - 1], uint8_t((size - 1) * 7));
}

// The reader's threads share the queues: many reads, urgent and not, all finish, and
// wait_until_done returns (immediately when nothing was asked); a reader destroyed with reads
// still queued stops without doing them.
TEST(BackgroundReader, WaitsUntilEveryReadIsDone) {
  const size_t size = 9 * MappedFile::kReadGranule + 777;
  TempFile file(size);
  MappedFile map(file.path.string());
  {
    BackgroundReader reader;
    reader.wait_until_done();
    for (size_t offset = 0; offset < size; offset += 100000)
      reader.start_reading(map, offset, std::min<size_t>(size - offset, 150000), /*urgent=*/offset % 3 == 0);
    reader.wait_until_done();
    EXPECT_TRUE(map.fully_cached(0, size));
    reader.start_reading(map, 0, size, /*urgent=*/false);
    reader.wait_until_done();
  }
  BackgroundReader dropped;
  for (int i = 0; i < 1000; ++i) dropped.start_reading(map, 0, size, /*urgent=*/false);
}

TEST(MappedFile, RangesPastTheEndAreAProgrammingError) {
  TempFile file(5000);
  MappedFile map(file.path.string());
  EXPECT_DEATH(map.read_into_memory(4000, 2000), "internal error");
  EXPECT_DEATH(map.cached_bytes(6000, 1), "internal error");
}

}  // namespace
}  // namespace tandem
