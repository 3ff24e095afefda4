// Hand-made corrupt and hostile images: each must fail with a tandem::Error whose message
// names the file, the field and what is wrong, and none may crash or allocate wildly.
#include <gtest/gtest.h>

#include "gguf/gguf_file.h"
#include "gguf/gguf_writer.h"
#include "gguf_test_util.h"

namespace tandem::gguf {
namespace {

using test::Bytes;
using test::expect_contains;
using test::parse_error;

constexpr uint32_t kF32 = 0, kQ8_0 = 8;

// One valid F32 tensor [4] at offset 0, after the given metadata.
Bytes one_tensor_file(uint64_t n_metadata = 0) {
  return Bytes().header(1, n_metadata);
}

TEST(GgufCorrupt, a_valid_hand_made_file_parses) {
  Bytes b = Bytes().header(1, 1).kv_str("general.architecture", "deepseek2");
  b.tensor("w", {4}, kF32, 0).pad().zeros(16);
  EXPECT_EQ(parse_error(b.b), "");
  const GgufFile file = GgufFile::parse_memory(b.b, "ok.gguf");
  EXPECT_EQ(file.get_string("general.architecture"), "deepseek2");
  EXPECT_EQ(file.tensors()[0].n_bytes, 16u);
}

TEST(GgufCorrupt, bad_magic_says_not_a_gguf_file) {
  Bytes b;
  b.raw("GGML", 4).u32(3).u64(0).u64(0);
  expect_contains(parse_error(b.b), {"bad.gguf: not a GGUF file", "47 47 4d 4c"});
}

TEST(GgufCorrupt, version_1_is_refused_with_advice) {
  expect_contains(parse_error(Bytes().header(0, 0, 1).b),
                  {"bad.gguf", "version 1 is not supported", "convert the model again"});
}

TEST(GgufCorrupt, unknown_future_version_is_refused) {
  expect_contains(parse_error(Bytes().header(0, 0, 4).b), {"GGUF version 4 is not supported"});
}

TEST(GgufCorrupt, big_endian_file_is_recognised) {
  Bytes b;
  b.raw("GGUF", 4).u32(0x03000000).u64(0).u64(0);
  expect_contains(parse_error(b.b), {"big-endian", "little-endian GGUF only"});
}

TEST(GgufCorrupt, file_shorter_than_a_header_is_truncated) {
  expect_contains(parse_error(std::vector<uint8_t>{'G', 'G', 'U', 'F', 3, 0}),
                  {"only 6 bytes", "truncated", "re-download"});
  expect_contains(parse_error({}), {"only 0 bytes"});
}

TEST(GgufCorrupt, header_cut_inside_the_metadata_is_truncated) {
  Bytes b = Bytes().header(0, 2).kv_u32("a", 1);
  b.u64(50).raw("ab", 2).zeros(8);  // the second key claims 50 bytes; 10 are left
  expect_contains(parse_error(b.b),
                  {"metadata entry 1 key: length 50", "runs past the end", "truncated"});
}

TEST(GgufCorrupt, truncated_string_value_names_the_key) {
  Bytes b = Bytes().header(0, 1).key("tokenizer.chat_template", ValueType::String);
  b.u64(40).raw("{% for message in messages %}", 29);
  expect_contains(parse_error(b.b), {"metadata key 'tokenizer.chat_template' string", "length 40",
                                     "runs past the end", "re-download"});
}

TEST(GgufCorrupt, string_length_beyond_the_whole_file_is_refused) {
  Bytes b = Bytes().header(0, 1).key("general.name", ValueType::String);
  b.u64(uint64_t(1) << 40).zeros(16);
  expect_contains(parse_error(b.b), {"'general.name' string", "larger than the whole file"});
}

TEST(GgufCorrupt, array_claiming_2_pow_62_items_errors_before_allocating) {
  Bytes b = Bytes().header(0, 1).key("tokenizer.ggml.tokens", ValueType::Array);
  b.u32(uint32_t(ValueType::String)).u64(uint64_t(1) << 62).zeros(64);
  expect_contains(parse_error(b.b), {"metadata key 'tokenizer.ggml.tokens' array length",
                                     "4611686018427387904 items of type string"});
}

TEST(GgufCorrupt, array_of_arrays_too_many_items_for_the_bytes_left) {
  Bytes b = Bytes().header(0, 1).key("a", ValueType::Array);
  b.u32(uint32_t(ValueType::Array)).u64(100).zeros(12 * 99);
  expect_contains(parse_error(b.b), {"'a' array length", "100 items of type array"});
}

TEST(GgufCorrupt, arrays_nested_too_deep_are_refused) {
  Bytes b = Bytes().header(0, 1).key("deep", ValueType::Array);
  for (int level = 0; level < 20; ++level) b.u32(uint32_t(ValueType::Array)).u64(1);
  b.zeros(64);
  expect_contains(parse_error(b.b), {"metadata key 'deep'[0][0]", "nested deeper than 8"});
}

TEST(GgufCorrupt, nesting_at_the_limit_is_accepted) {
  Value v = Value::array(ValueType::U8, {Value::u8(7)});
  for (uint32_t level = 1; level < kMaxArrayNesting; ++level)
    v = Value::array(ValueType::Array, {v});
  const auto bytes = write_gguf_to_memory({{"deep", v}}, {});
  EXPECT_EQ(parse_error(bytes), "");
  std::vector<uint8_t> out;
  GgufWriter writer(&out);
  writer.add_metadata("deeper", Value::array(ValueType::Array, {v}));
  expect_contains(test::error_of([&] { writer.finish(); }), {"'deeper' nests arrays deeper"});
}

TEST(GgufCorrupt, unknown_value_type_is_refused) {
  Bytes b = Bytes().header(0, 1).str("general.weird").u32(13).zeros(16);
  expect_contains(parse_error(b.b), {"metadata key 'general.weird' value type",
                                     "unknown value type 13", "known types are 0 to 12"});
}

TEST(GgufCorrupt, unknown_array_item_type_is_refused) {
  Bytes b = Bytes().header(0, 1).key("arr", ValueType::Array).u32(77).u64(1).zeros(16);
  expect_contains(parse_error(b.b), {"'arr' array item type", "unknown value type 77"});
}

TEST(GgufCorrupt, bool_other_than_0_or_1_is_refused) {
  Bytes b = Bytes().header(0, 1).key("flag", ValueType::Bool).u8(2).zeros(16);
  expect_contains(parse_error(b.b), {"'flag' value", "bool value 2 is neither 0 nor 1"});
}

TEST(GgufCorrupt, duplicate_metadata_key_is_refused) {
  Bytes b = Bytes().header(0, 2).kv_u32("deepseek2.block_count", 3);
  b.kv_u32("deepseek2.block_count", 4);
  expect_contains(parse_error(b.b), {"'deepseek2.block_count' appears twice"});
}

TEST(GgufCorrupt, empty_metadata_key_is_refused) {
  Bytes b = Bytes().header(0, 1).kv_u32("", 3);
  expect_contains(parse_error(b.b), {"metadata entry 0 key", "is empty"});
}

TEST(GgufCorrupt, alignment_not_a_power_of_two_is_refused) {
  Bytes b = Bytes().header(0, 1).kv_u32("general.alignment", 48);
  expect_contains(parse_error(b.b), {"'general.alignment' is 48", "power of two"});
  Bytes zero = Bytes().header(0, 1).kv_u32("general.alignment", 0);
  expect_contains(parse_error(zero.b), {"'general.alignment' is 0", "power of two"});
  Bytes huge = Bytes().header(0, 1).kv_u32("general.alignment", uint32_t(1) << 30);
  expect_contains(parse_error(huge.b), {"'general.alignment' is 1073741824", "between 1 and 2^20"});
  Bytes text = Bytes().header(0, 1).kv_str("general.alignment", "32");
  expect_contains(parse_error(text.b), {"'general.alignment'", "of type string"});
}

TEST(GgufCorrupt, metadata_count_beyond_the_file_is_refused) {
  expect_contains(parse_error(Bytes().header(0, uint64_t(1) << 60).zeros(100).b),
                  {"claims 1152921504606846976 metadata entries", "100 bytes follow"});
}

TEST(GgufCorrupt, tensor_count_beyond_the_file_is_refused) {
  expect_contains(parse_error(Bytes().header(~uint64_t(0), 0).zeros(100).b),
                  {"claims 18446744073709551615 tensors"});
}

TEST(GgufCorrupt, unknown_tensor_type_names_the_tensor_and_the_number) {
  Bytes b = one_tensor_file();
  b.tensor("blk.0.attn_q.weight", {32}, 99, 0).pad().zeros(128);
  expect_contains(parse_error(b.b),
                  {"tensor 0 'blk.0.attn_q.weight' type", "unknown tensor type 99", "Q4_K"});
}

TEST(GgufCorrupt, five_dimensions_are_refused) {
  Bytes b = one_tensor_file();
  b.tensor("t5", {1, 1, 1, 1, 1}, kF32, 0).pad().zeros(32);
  expect_contains(parse_error(b.b), {"tensor 0 't5' n_dims", "is 5; expected 1 to 4"});
}

TEST(GgufCorrupt, zero_dimensions_are_refused) {
  Bytes b = one_tensor_file();
  b.tensor("t0", {}, kF32, 0).pad().zeros(32);
  expect_contains(parse_error(b.b), {"tensor 0 't0' n_dims", "is 0"});
}

TEST(GgufCorrupt, shape_whose_product_overflows_is_refused) {
  Bytes b = Bytes().header(2, 0);
  b.tensor("ok", {4}, kF32, 0);
  b.tensor("blk.3.attn_q.weight", {uint64_t(1) << 32, uint64_t(1) << 32, 2}, kF32, 32);
  b.pad().zeros(64);
  expect_contains(parse_error(b.b), {"tensor 1 'blk.3.attn_q.weight' shape",
                                     "4294967296 x 4294967296 x 2", "overflow"});
}

TEST(GgufCorrupt, byte_size_overflow_is_refused) {
  Bytes b = one_tensor_file();
  b.tensor("f64", {uint64_t(1) << 62}, 28 /* F64 */, 0).pad().zeros(32);
  expect_contains(parse_error(b.b), {"tensor 0 'f64' shape", "2^64 bytes"});
}

TEST(GgufCorrupt, row_length_not_a_multiple_of_the_block_is_refused) {
  Bytes b = one_tensor_file();
  b.tensor("blk.0.ffn_down.weight", {33, 2}, kQ8_0, 0).pad().zeros(128);
  expect_contains(parse_error(b.b), {"tensor 0 'blk.0.ffn_down.weight' shape",
                                     "row length 33 is not a multiple of Q8_0's block size 32"});
}

TEST(GgufCorrupt, misaligned_tensor_offset_is_refused) {
  Bytes b = Bytes().header(2, 0);
  b.tensor("a", {1}, kF32, 0).tensor("b", {1}, kF32, 4).pad().zeros(64);
  expect_contains(parse_error(b.b),
                  {"tensor 1 'b' offset", "4 is not a multiple of the alignment 32"});
}

TEST(GgufCorrupt, tensor_data_beyond_the_end_of_file_is_refused) {
  Bytes b = one_tensor_file();
  b.tensor("output.weight", {16, 16}, kF32, 0).pad().zeros(1000);  // needs 1024
  expect_contains(parse_error(b.b), {"tensor 0 'output.weight' data", "1024 bytes",
                                     "beyond the end of the file", "re-download"});
  Bytes far = one_tensor_file();
  far.tensor("x", {1}, kF32, ~uint64_t(31)).pad().zeros(64);  // offset + start overflows
  expect_contains(parse_error(far.b), {"tensor 0 'x' data", "beyond the end"});
}

TEST(GgufCorrupt, duplicate_tensor_name_is_refused) {
  Bytes b = Bytes().header(2, 0);
  b.tensor("w", {4}, kF32, 0).tensor("w", {4}, kF32, 32).pad().zeros(64);
  expect_contains(parse_error(b.b), {"tensor 1 'w' name", "appears twice (also tensor 0)"});
}

TEST(GgufCorrupt, empty_tensor_name_is_refused) {
  Bytes b = one_tensor_file();
  b.tensor("", {4}, kF32, 0).pad().zeros(32);
  expect_contains(parse_error(b.b), {"tensor 0 name", "is empty"});
}

TEST(GgufCorrupt, truncated_tensor_info_names_the_tensor) {
  Bytes b = Bytes().header(1, 0);
  b.str("token_embd.weight").u32(2).u64(128);  // second dim, type and offset missing
  expect_contains(parse_error(b.b), {"tensor 0 'token_embd.weight' shape", "truncated"});
}

// Every prefix and every single-byte corruption of a real small file: only tandem::Error or
// success, never a crash (ASan/UBSan builds make this a memory-safety check too).
TEST(GgufCorrupt, every_truncation_and_byte_flip_fails_cleanly) {
  const auto data = test::pattern_bytes(34 * 2, 9);
  const std::vector<TensorToWrite> tensors = {{"q", DType::Q8_0, {64}, data},
                                              {"f", DType::F32, {2}, std::span(data).first(8)}};
  const std::vector<uint8_t> good = write_gguf_to_memory(
      {{"s", Value::string("text")},
       {"n", Value::array(ValueType::Array, {Value::i32_array(std::vector<int32_t>{1, 2})})},
       {"general.alignment", Value::u32(64)}},
      tensors);
  ASSERT_EQ(parse_error(good), "");
  size_t rejected = 0;
  for (size_t n = 0; n < good.size(); ++n) {
    const std::vector<uint8_t> cut(good.begin(), good.begin() + n);
    if (!parse_error(cut).empty()) ++rejected;
  }
  // Only cuts inside the final padding can still parse.
  EXPECT_GE(rejected, good.size() - 64);
  for (size_t i = 0; i < good.size(); ++i) {
    for (uint8_t flip : {0x01, 0x80, 0xff}) {
      std::vector<uint8_t> bad = good;
      bad[i] ^= flip;
      (void)parse_error(bad);
    }
  }
}

}  // namespace
}  // namespace tandem::gguf
