// Split models: NAME-0000i-of-0000N.gguf parts opened through the first one.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <filesystem>

#include "gguf/gguf_file.h"
#include "gguf/gguf_writer.h"
#include "gguf_test_util.h"

namespace tandem::gguf {
namespace {

using test::error_of;
using test::expect_contains;
using test::pattern_bytes;
using test::ScratchDir;
using Metadata = std::vector<std::pair<std::string, Value>>;

struct SplitOptions {
  bool with_split_metadata = true;
  uint64_t tensors_count_override = 0;  // 0: the true count
};

// Three parts; part i holds tensors "p{i}.a" [8] F32 and "p{i}.b" [32] Q8_0.
std::vector<std::vector<uint8_t>> write_three_parts(const std::string& prefix,
                                                    SplitOptions options = {}) {
  std::vector<std::vector<uint8_t>> payloads;
  for (uint32_t i = 0; i < 3; ++i) {
    Metadata metadata;
    if (i == 0) metadata.emplace_back("general.architecture", Value::string("deepseek2"));
    if (options.with_split_metadata) {
      metadata.emplace_back("split.no", Value::u16(uint16_t(i)));
      metadata.emplace_back("split.count", Value::u16(3));
      metadata.emplace_back(
          "split.tensors.count",
          Value::i32(int32_t(options.tensors_count_override ? options.tensors_count_override : 6)));
    }
    const auto a = pattern_bytes(32, 10 * i + 1);
    const auto b = pattern_bytes(34, 10 * i + 2);
    payloads.push_back(a);
    payloads.push_back(b);
    write_gguf(split_path(prefix, i + 1, 3), metadata,
               std::vector<TensorToWrite>{{fmt::format("p{}.a", i), DType::F32, {8}, a},
                                          {fmt::format("p{}.b", i), DType::Q8_0, {32}, b}});
  }
  return payloads;
}

TEST(GgufSplit, split_names_are_recognised_exactly) {
  const auto name = parse_split_name("/m/DeepSeek-V3-Q4_K_M-00002-of-00009.gguf");
  ASSERT_TRUE(name.has_value());
  EXPECT_EQ(name->prefix, "/m/DeepSeek-V3-Q4_K_M");
  EXPECT_EQ(name->index, 2u);
  EXPECT_EQ(name->count, 9u);
  EXPECT_EQ(split_path(name->prefix, 3, 9), "/m/DeepSeek-V3-Q4_K_M-00003-of-00009.gguf");
  EXPECT_FALSE(parse_split_name("model.gguf"));
  EXPECT_FALSE(parse_split_name("m-0001-of-00003.gguf"));
  EXPECT_FALSE(parse_split_name("m-00004-of-00003.gguf"));
  EXPECT_FALSE(parse_split_name("m-000a1-of-00003.gguf"));
  EXPECT_FALSE(parse_split_name("-00001-of-00003.gguf"));
}

TEST(GgufSplit, opening_the_first_part_reads_tensors_from_all_parts) {
  ScratchDir dir;
  const std::string prefix = dir.file("model");
  const auto payloads = write_three_parts(prefix);
  const GgufFile file = GgufFile::open(split_path(prefix, 1, 3));
  ASSERT_EQ(file.paths().size(), 3u);
  for (uint32_t i = 0; i < 3; ++i) EXPECT_EQ(file.paths()[i], split_path(prefix, i + 1, 3));
  EXPECT_EQ(file.get_string("general.architecture"), "deepseek2");
  ASSERT_EQ(file.tensors().size(), 6u);
  uint64_t total = 0;
  for (const std::string& p : file.paths()) total += std::filesystem::file_size(p);
  EXPECT_EQ(file.total_file_bytes(), total);
  for (size_t k = 0; k < 6; ++k) {
    const TensorInfo& t = file.tensors()[k];
    EXPECT_EQ(t.file_index, k / 2) << t.name;
    // fmt rather than string +: gcc 12 -O3 warns falsely (-Wrestrict) on the latter.
    EXPECT_EQ(t.name, fmt::format("p{}.{}", k / 2, k % 2 ? "b" : "a"));
    ASSERT_EQ(t.n_bytes, payloads[k].size());
    EXPECT_TRUE(std::equal(t.data, t.data + t.n_bytes, payloads[k].begin())) << t.name;
    // file_offset is absolute within the tensor's own part.
    const auto part = test::read_file_bytes(file.paths()[t.file_index]);
    EXPECT_TRUE(std::equal(t.data, t.data + t.n_bytes, part.begin() + long(t.file_offset)));
  }
  EXPECT_EQ(file.find_tensor("p2.b")->file_index, 2u);
}

TEST(GgufSplit, parts_without_split_metadata_are_found_by_name) {
  ScratchDir dir;
  const std::string prefix = dir.file("plain");
  write_three_parts(prefix, {.with_split_metadata = false});
  const GgufFile file = GgufFile::open(split_path(prefix, 1, 3));
  EXPECT_EQ(file.paths().size(), 3u);
  EXPECT_EQ(file.tensors().size(), 6u);
}

TEST(GgufSplit, missing_part_names_the_expected_path) {
  ScratchDir dir;
  const std::string prefix = dir.file("model");
  write_three_parts(prefix);
  std::filesystem::remove(split_path(prefix, 3, 3));
  expect_contains(error_of([&] { GgufFile::open(split_path(prefix, 1, 3)); }),
                  {"part 3 of 3", "is missing", split_path(prefix, 3, 3)});
}

TEST(GgufSplit, opening_a_later_part_points_to_the_first) {
  ScratchDir dir;
  const std::string prefix = dir.file("model");
  write_three_parts(prefix);
  expect_contains(error_of([&] { GgufFile::open(split_path(prefix, 2, 3)); }),
                  {"part 2 of 3", "open the first part", split_path(prefix, 1, 3)});
}

TEST(GgufSplit, wrong_split_tensors_count_is_refused) {
  ScratchDir dir;
  const std::string prefix = dir.file("model");
  write_three_parts(prefix, {.tensors_count_override = 7});
  expect_contains(error_of([&] { GgufFile::open(split_path(prefix, 1, 3)); }),
                  {"split.tensors.count says 7 tensors but the 3 parts hold 6"});
}

TEST(GgufSplit, part_from_another_split_is_refused) {
  ScratchDir dir;
  const std::string prefix = dir.file("model");
  write_three_parts(prefix);
  // Part 2 replaced by a file that says it is part 1 of a 2-part model.
  write_gguf(split_path(prefix, 2, 3),
             {{"split.no", Value::u16(0)}, {"split.count", Value::u16(2)}}, {});
  expect_contains(error_of([&] { GgufFile::open(split_path(prefix, 1, 3)); }),
                  {split_path(prefix, 2, 3), "split.count is 2 but the first part says 3"});
}

TEST(GgufSplit, same_tensor_in_two_parts_is_refused) {
  ScratchDir dir;
  const std::string prefix = dir.file("model");
  write_three_parts(prefix, {.with_split_metadata = false});
  const auto a = pattern_bytes(32, 1);
  write_gguf(split_path(prefix, 3, 3), {},
             std::vector<TensorToWrite>{{"p0.a", DType::F32, {8}, a}});
  expect_contains(error_of([&] { GgufFile::open(split_path(prefix, 1, 3)); }),
                  {"tensor 'p0.a' appears in both", split_path(prefix, 3, 3)});
}

TEST(GgufSplit, split_metadata_on_an_unsplit_name_is_refused) {
  ScratchDir dir;
  write_gguf(dir.file("renamed.gguf"),
             {{"split.no", Value::u16(0)}, {"split.count", Value::u16(3)}}, {});
  expect_contains(error_of([&] { GgufFile::open(dir.file("renamed.gguf")); }),
                  {"part of a split model", "NAME-00001-of-00003.gguf"});
}

TEST(GgufSplit, unsplit_file_opens_alone) {
  ScratchDir dir;
  write_gguf(dir.file("one.gguf"), {{"k", Value::u8(1)}}, {});
  const GgufFile file = GgufFile::open(dir.file("one.gguf"));
  EXPECT_EQ(file.paths().size(), 1u);
  expect_contains(error_of([&] { GgufFile::open(dir.file("absent.gguf")); }),
                  {"absent.gguf: cannot open"});
}

}  // namespace
}  // namespace tandem::gguf
