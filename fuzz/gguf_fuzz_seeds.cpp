// Writes small valid GGUF images into a folder, as the fuzzer's starting corpus: each one
// exercises a different part of the format (every value type, nested arrays, several tensor
// formats, a non-default alignment, tokenizer-shaped metadata, split keys).
//
//   gguf_fuzz_seeds OUT_DIR
#include <cstdio>
#include <string>
#include <vector>

#include "core/error.h"
#include "gguf/gguf_writer.h"

namespace {

using tandem::DType;
using tandem::gguf::TensorToWrite;
using tandem::gguf::Value;
using tandem::gguf::ValueType;
using Metadata = std::vector<std::pair<std::string, Value>>;

std::vector<uint8_t> filler(size_t n) {
  std::vector<uint8_t> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = uint8_t(i * 37 + 11);
  return out;
}

Metadata every_value_type() {
  return {
      {"general.architecture", Value::string("deepseek2")},
      {"t.u8", Value::u8(1)},
      {"t.i8", Value::i8(-2)},
      {"t.u16", Value::u16(3)},
      {"t.i16", Value::i16(-4)},
      {"t.u32", Value::u32(5)},
      {"t.i32", Value::i32(-6)},
      {"t.f32", Value::f32(0.5f)},
      {"t.bool", Value::boolean(true)},
      {"t.u64", Value::u64(7)},
      {"t.i64", Value::i64(-8)},
      {"t.f64", Value::f64(0.25)},
      {"t.nested",
       Value::array(ValueType::Array,
                    {Value::i32_array(std::vector<int32_t>{1, 2}),
                     Value::array(ValueType::Array, {Value::array(ValueType::U8, {})})})},
  };
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUT_DIR\n", argv[0]);
    return 2;
  }
  const std::string dir = argv[1];
  try {
    using tandem::gguf::write_gguf;
    write_gguf(dir + "/empty.gguf", {}, {});
    write_gguf(dir + "/values.gguf", every_value_type(), {});

    const auto bytes = filler(4096);
    const std::span<const uint8_t> b(bytes);
    const std::vector<TensorToWrite> tensors = {
        {"token_embd.weight", DType::F32, {4, 3}, b.first(48)},
        {"blk.0.attn_norm.weight", DType::F16, {8}, b.first(16)},
        {"blk.0.attn_q.weight", DType::Q8_0, {32, 2}, b.first(68)},
        {"blk.0.ffn_up_exps.weight", DType::Q4_K, {256, 1, 2}, b.first(288)},
        {"blk.0.ffn_down_exps.weight", DType::Q6_K, {256, 1}, b.first(210)},
        {"blk.0.attn_k_b.weight", DType::Q5_0, {32}, b.first(22)},
        {"output_norm.weight", DType::BF16, {2, 1, 1, 1}, b.first(4)},
    };
    write_gguf(dir + "/tensors.gguf", {{"general.architecture", Value::string("deepseek2")}},
               tensors);
    write_gguf(dir + "/aligned64.gguf", {}, std::span(tensors).first(3), 64);

    const std::vector<std::string> tokens = {"<s>", "</s>", "a", "b", "ab", "Ġthe"};
    const std::vector<std::string> merges = {"a b", "Ġ t", "Ġt he"};
    write_gguf(
        dir + "/tokenizer.gguf",
        {{"tokenizer.ggml.model", Value::string("gpt2")},
         {"tokenizer.ggml.tokens", Value::string_array(tokens)},
         {"tokenizer.ggml.token_type", Value::i32_array(std::vector<int32_t>{3, 3, 1, 1, 1, 1})},
         {"tokenizer.ggml.merges", Value::string_array(merges)},
         {"tokenizer.ggml.bos_token_id", Value::u32(0)},
         {"tokenizer.ggml.add_bos_token", Value::boolean(true)}},
        {});
    write_gguf(dir + "/split-part.gguf",
               {{"split.no", Value::u16(0)},
                {"split.count", Value::u16(1)},
                {"split.tensors.count", Value::i32(1)}},
               std::span(tensors).first(1));
  } catch (const tandem::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  return 0;
}
