// Writer -> reader round trips: every metadata value type, nested arrays, tensor layout and
// alignment, streaming in pieces, and the writer's own errors.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <limits>

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

Metadata every_value_type() {
  const std::vector<std::string> words = {"alpha", "", "γάμμα", std::string("nul\0inside", 10)};
  return {
      {"t.u8", Value::u8(250)},
      {"t.i8", Value::i8(-120)},
      {"t.u16", Value::u16(65000)},
      {"t.i16", Value::i16(-32000)},
      {"t.u32", Value::u32(4000000000u)},
      {"t.i32", Value::i32(-2000000000)},
      {"t.f32", Value::f32(1.5e-6f)},
      {"t.bool_true", Value::boolean(true)},
      {"t.bool_false", Value::boolean(false)},
      {"t.string", Value::string("deepseek2")},
      {"t.empty_string", Value::string("")},
      {"t.u64", Value::u64(std::numeric_limits<uint64_t>::max())},
      {"t.i64", Value::i64(std::numeric_limits<int64_t>::min())},
      {"t.f64", Value::f64(3.141592653589793)},
      {"t.strings", Value::string_array(words)},
      {"t.i32s", Value::i32_array(std::vector<int32_t>{1, -2, 3})},
      {"t.f32s", Value::f32_array(std::vector<float>{0.5f, -0.25f})},
      {"t.empty_array", Value::array(ValueType::U64, {})},
      {"t.bools", Value::array(ValueType::Bool, {Value::boolean(true), Value::boolean(false)})},
      {"t.nested",
       Value::array(ValueType::Array,
                    {Value::i32_array(std::vector<int32_t>{7, 8}), Value::string_array(words),
                     Value::array(ValueType::Array, {Value::array(ValueType::F64, {})})})},
  };
}

TEST(GgufRoundTrip, every_value_type_reads_back_equal_and_in_order) {
  const Metadata metadata = every_value_type();
  const std::vector<uint8_t> bytes = write_gguf_to_memory(metadata, {});
  const GgufFile file = GgufFile::parse_memory(bytes, "mem.gguf");
  EXPECT_EQ(file.version(), 3u);
  EXPECT_EQ(file.alignment(), 32u);
  ASSERT_EQ(file.metadata().size(), metadata.size());
  for (size_t i = 0; i < metadata.size(); ++i) {
    EXPECT_EQ(file.metadata()[i].first, metadata[i].first);
    EXPECT_TRUE(file.metadata()[i].second == metadata[i].second)
        << metadata[i].first << ": " << file.metadata()[i].second.to_display();
    EXPECT_EQ(file.metadata()[i].second.type(), metadata[i].second.type());
  }
  EXPECT_TRUE(file.tensors().empty());
}

TEST(GgufRoundTrip, typed_getters_convert_between_integer_widths) {
  const std::vector<uint8_t> bytes = write_gguf_to_memory(every_value_type(), {});
  const GgufFile file = GgufFile::parse_memory(bytes, "mem.gguf");
  EXPECT_EQ(file.get_int("t.u8"), 250);
  EXPECT_EQ(file.get_int("t.i8"), -120);
  EXPECT_EQ(file.get_int("t.u32"), 4000000000);
  EXPECT_EQ(file.get_int("t.i64"), std::numeric_limits<int64_t>::min());
  EXPECT_DOUBLE_EQ(file.get_number("t.f64"), 3.141592653589793);
  EXPECT_DOUBLE_EQ(file.get_number("t.i16"), -32000.0);
  EXPECT_FLOAT_EQ(float(file.get_number("t.f32")), 1.5e-6f);
  EXPECT_TRUE(file.get_bool("t.bool_true"));
  EXPECT_FALSE(file.get_bool("t.bool_false"));
  EXPECT_EQ(file.get_string("t.string"), "deepseek2");
  EXPECT_EQ(file.get_array("t.strings", ValueType::String).items.size(), 4u);
  EXPECT_EQ(*file.get_array("t.strings").items[3].as_string(), std::string("nul\0inside", 10));
  EXPECT_EQ(file.get_int_or("absent", 42), 42);
  EXPECT_EQ(file.get_string_or("absent", "x"), "x");

  // u64 beyond int64 is not silently wrapped.
  EXPECT_FALSE(file.find("t.u64")->as_int().has_value());
  EXPECT_EQ(file.find("t.u64")->as_uint(), std::numeric_limits<uint64_t>::max());
  expect_contains(error_of([&] { file.get_int("t.u64"); }), {"'t.u64'", "too large"});
  EXPECT_FALSE(file.find("t.bool_true")->as_int().has_value());
  EXPECT_FALSE(file.find("t.i8")->as_uint().has_value());
}

TEST(GgufRoundTrip, typed_getters_name_the_file_key_and_types_on_error) {
  const std::vector<uint8_t> bytes = write_gguf_to_memory(every_value_type(), {});
  const GgufFile file = GgufFile::parse_memory(bytes, "mem.gguf");
  expect_contains(error_of([&] { file.get_string("general.name"); }),
                  {"mem.gguf: metadata key 'general.name' is missing"});
  expect_contains(error_of([&] { file.get_int("t.string"); }),
                  {"mem.gguf: metadata key 't.string' has type string, expected an integer"});
  expect_contains(error_of([&] { file.get_bool("t.u8"); }), {"has type u8, expected bool"});
  expect_contains(error_of([&] { file.get_string("t.f32"); }), {"has type f32, expected string"});
  expect_contains(error_of([&] { file.get_array("t.i32s", ValueType::String); }),
                  {"'t.i32s' is an array of i32, expected an array of string"});
  expect_contains(error_of([&] { file.get_int_or("t.string", 1); }), {"has type string"});
}

TEST(GgufRoundTrip, tensors_keep_type_shape_bytes_and_aligned_offsets) {
  const auto f32 = pattern_bytes(4 * 3 * 5, 1);
  const auto f16 = pattern_bytes(2 * 7, 2);
  const auto q8 = pattern_bytes(34 * 2 * 3, 3);    // 2 blocks per row, 3 rows
  const auto q4k = pattern_bytes(144 * 1 * 2, 4);  // [256, 2]
  const std::vector<TensorToWrite> tensors = {
      {"a.weight", DType::F32, {3, 5}, f32},
      {"b.bias", DType::F16, {7}, f16},
      {"c.weight", DType::Q8_0, {64, 3}, q8},
      {"d.weight", DType::Q4_K, {256, 2, 1, 1}, q4k},
  };
  const std::vector<uint8_t> bytes =
      write_gguf_to_memory({{"general.architecture", Value::string("test")}}, tensors);
  EXPECT_EQ(bytes.size() % 32, 0u);
  const GgufFile file = GgufFile::parse_memory(bytes, "mem.gguf");
  ASSERT_EQ(file.tensors().size(), tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TensorInfo& t = file.tensors()[i];
    EXPECT_EQ(t.name, tensors[i].name);
    EXPECT_EQ(t.type, tensors[i].type);
    EXPECT_EQ(t.shape, tensors[i].shape);
    EXPECT_EQ(t.n_bytes, tensors[i].data.size());
    EXPECT_EQ(t.file_offset % 32, 0u);
    EXPECT_EQ(t.data, bytes.data() + t.file_offset);
    EXPECT_TRUE(std::equal(t.data, t.data + t.n_bytes, tensors[i].data.begin()));
    EXPECT_EQ(file.find_tensor(t.name), &t);
  }
  EXPECT_EQ(file.tensors()[2].n_elements, 192u);
  EXPECT_EQ(file.find_tensor("missing"), nullptr);
}

TEST(GgufRoundTrip, custom_alignment_is_recorded_and_honoured) {
  const auto data = pattern_bytes(12, 5);
  const std::vector<TensorToWrite> tensors = {{"x", DType::F32, {3}, data},
                                              {"y", DType::F32, {3}, data}};
  const std::vector<uint8_t> bytes = write_gguf_to_memory({}, tensors, 256);
  const GgufFile file = GgufFile::parse_memory(bytes, "mem.gguf");
  EXPECT_EQ(file.alignment(), 256u);
  EXPECT_EQ(file.get_int("general.alignment"), 256);
  for (const TensorInfo& t : file.tensors()) EXPECT_EQ(t.file_offset % 256, 0u);
}

TEST(GgufRoundTrip, streamed_pieces_make_the_same_file_as_one_write) {
  ScratchDir dir;
  const auto big = pattern_bytes(4 * 1000 * 37, 6);
  const auto small = pattern_bytes(34 * 4, 7);
  const std::vector<TensorToWrite> tensors = {{"big", DType::F32, {1000, 37}, big},
                                              {"empty", DType::F32, {0}, {}},
                                              {"q", DType::Q8_0, {128}, small}};
  write_gguf(dir.file("whole.gguf"), {{"k", Value::u32(1)}}, tensors);

  GgufWriter writer(dir.file("pieces.gguf"));
  writer.add_metadata("k", Value::u32(1));
  for (const TensorToWrite& t : tensors) writer.add_tensor(t.name, t.type, t.shape);
  for (size_t at = 0; at < big.size(); at += 999)
    writer.write_tensor_data("big",
                             std::span(big).subspan(at, std::min<size_t>(999, big.size() - at)));
  writer.write_tensor_data("q", std::span(small).first(5));
  writer.write_tensor_data("q", std::span(small).subspan(5));
  writer.finish();

  const GgufFile whole = GgufFile::open(dir.file("whole.gguf"));
  const GgufFile pieces = GgufFile::open(dir.file("pieces.gguf"));
  EXPECT_EQ(test::read_file_bytes(dir.file("whole.gguf")),
            test::read_file_bytes(dir.file("pieces.gguf")));
  ASSERT_EQ(pieces.tensors().size(), 3u);
  const TensorInfo& b = pieces.tensors()[0];
  EXPECT_TRUE(std::equal(b.data, b.data + b.n_bytes, big.begin()));
  EXPECT_EQ(pieces.tensors()[1].n_bytes, 0u);
  EXPECT_EQ(pieces.paths(), std::vector<std::string>{dir.file("pieces.gguf")});
  EXPECT_EQ(pieces.total_file_bytes(), std::filesystem::file_size(dir.file("pieces.gguf")));
}

TEST(GgufWriterErrors, data_out_of_declaration_order_is_refused) {
  std::vector<uint8_t> out;
  GgufWriter writer(&out);
  writer.add_tensor("first", DType::F32, {4});
  writer.add_tensor("second", DType::F32, {4});
  const auto data = pattern_bytes(16, 1);
  expect_contains(error_of([&] { writer.write_tensor_data("second", data); }),
                  {"tensor 'second'", "'first' still needs 16 of its 16 bytes"});
  writer.write_tensor_data("first", data);
  expect_contains(error_of([&] { writer.write_tensor_data("first", data); }),
                  {"'first' is 16 bytes", "runs past its end"});
  expect_contains(error_of([&] { writer.write_tensor_data("third", data); }),
                  {"no tensor 'third' was declared"});
  expect_contains(error_of([&] { writer.finish(); }), {"'second' got 0 of its 16 bytes"});
  expect_contains(error_of([&] { writer.add_tensor("late", DType::F32, {4}); }),
                  {"after the header was written"});
}

TEST(GgufWriterErrors, bad_declarations_are_refused) {
  std::vector<uint8_t> out;
  GgufWriter writer(&out);
  writer.add_tensor("w", DType::F32, {4});
  expect_contains(error_of([&] { writer.add_tensor("w", DType::F32, {4}); }),
                  {"'w' declared twice"});
  expect_contains(error_of([&] { writer.add_tensor("q", DType::Q4_K, {100}); }),
                  {"row length 100 is not a multiple of Q4_K's block size 256"});
  expect_contains(error_of([&] {
                    writer.add_tensor("5d", DType::F32, {1, 1, 1, 1, 1});
                  }),
                  {"'5d' has 5 dimensions"});
  writer.add_metadata("k", Value::u8(1));
  expect_contains(error_of([&] { writer.add_metadata("k", Value::u8(2)); }), {"'k' added twice"});
  expect_contains(error_of([&] { writer.add_metadata("general.alignment", Value::u32(64)); }),
                  {"before declaring tensors"});
  expect_contains(error_of([] {
                    Value::array(ValueType::U8, {Value::u8(1), Value::i8(1)});
                  }),
                  {"item 1 has type i8, but the array holds u8"});
  expect_contains(error_of([&] { GgufWriter w(&out, 48); }),
                  {"alignment 48 is not a power of two"});
  // No larger than the reader accepts.
  expect_contains(error_of([&] { GgufWriter w(&out, uint64_t(1) << 21); }),
                  {"alignment 2097152 is not a power of two up to 2^20"});
}

TEST(GgufWriterErrors, file_that_cannot_be_created_names_the_path) {
  expect_contains(error_of([] { GgufWriter w("/nonexistent-dir/out.gguf"); }),
                  {"/nonexistent-dir/out.gguf: cannot create"});
}

TEST(GgufWriterErrors, full_disk_names_the_path_and_says_why) {
  if (!std::filesystem::exists("/dev/full")) GTEST_SKIP() << "no /dev/full here";
  const auto data = pattern_bytes(4 << 20, 1);
  const std::string message = error_of([&] {
    GgufWriter writer("/dev/full");
    writer.add_tensor("t", DType::F32, {1 << 20});
    writer.write_tensor_data("t", data);
    writer.finish();
  });
  expect_contains(message, {"/dev/full: cannot write", "No space left on device"});
  EXPECT_TRUE(std::filesystem::exists("/dev/full"));
}

TEST(GgufWriterErrors, unfinished_file_is_removed) {
  ScratchDir dir;
  {
    GgufWriter writer(dir.file("partial.gguf"));
    writer.add_tensor("t", DType::F32, {4});
    writer.write_tensor_data("t", pattern_bytes(8, 1));
  }  // abandoned, as by an exception in a converter
  EXPECT_FALSE(std::filesystem::exists(dir.file("partial.gguf")));
}

}  // namespace
}  // namespace tandem::gguf
