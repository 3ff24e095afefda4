// The host-and-device block decoders of quant/block_decode.h against the scalar references:
// the fixture blocks of an independent implementation, rows our quantizer writes, and raw random
// blocks, all compared bit for bit with dequantize_row.
#include "quant/block_decode.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "core/blocks.h"
#include "core/dtype.h"
#include "quant/quant.h"
#include "test_support.h"

namespace tandem {
namespace {

constexpr DType kDecodable[] = {DType::F32,  DType::F16,  DType::BF16, DType::Q4_0,
                                DType::Q5_0, DType::Q5_1, DType::Q8_0, DType::Q2_K,
                                DType::Q3_K, DType::Q4_K, DType::Q5_K, DType::Q6_K,
                                DType::IQ4_NL, DType::IQ4_XS, DType::Q4_1, DType::MXFP4,
                                DType::TQ1_0, DType::TQ2_0, DType::IQ1_S, DType::IQ1_M,
                                DType::IQ2_XXS, DType::IQ2_XS, DType::IQ2_S, DType::IQ3_XXS,
                                DType::IQ3_S};

int block_elems(DType type) {
  int elems = 0;
  blocks::visit_decoder(type, [&](auto decoder) { elems = decoder.kElems; });
  return elems;
}

std::vector<uint8_t> bytes_from_hex(const std::string& hex) {
  std::vector<uint8_t> bytes(hex.size() / 2);
  for (size_t i = 0; i < bytes.size(); ++i)
    bytes[i] = uint8_t(std::stoul(hex.substr(2 * i, 2), nullptr, 16));
  return bytes;
}

uint32_t float_bits(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  return bits;
}

// Number of elements whose bits differ, reporting the first few.
int count_mismatches(const std::vector<float>& want, const std::vector<float>& got,
                     const std::string& what) {
  int mismatches = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    if (float_bits(want[i]) == float_bits(got[i])) continue;
    if (++mismatches <= 5)
      ADD_FAILURE() << what << " element " << i << ": reference bits 0x" << std::hex
                    << float_bits(want[i]) << ", decode8 bits 0x" << float_bits(got[i]) << std::dec;
  }
  return mismatches;
}

// decode_row over `bytes` against dequantize_row. The decoder reads a copy placed one byte past
// an aligned address, since kernels meet blocks at any byte offset.
void expect_decode_matches_reference(DType type, const std::vector<uint8_t>& bytes, int64_t n,
                                     const std::string& what) {
  std::vector<float> want(size_t(n), 0.0f), got(size_t(n), 0.0f);
  dequantize_row(type, bytes.data(), want.data(), n);
  std::vector<uint8_t> shifted(bytes.size() + 1);
  std::memcpy(shifted.data() + 1, bytes.data(), bytes.size());
  blocks::decode_row(type, shifted.data() + 1, got.data(), n);
  EXPECT_EQ(count_mismatches(want, got, what), 0) << what;
  EXPECT_EQ(std::memcmp(want.data(), got.data(), want.size() * sizeof(float)), 0) << what;
}

// Byte offsets of the f16 scale fields of a block.
std::vector<size_t> f16_field_offsets(DType type) {
  switch (type) {
    case DType::Q4_0:
      return {offsetof(BlockQ4_0, d)};
    case DType::Q5_0:
      return {offsetof(BlockQ5_0, d)};
    case DType::Q5_1:
      return {offsetof(BlockQ5_1, d), offsetof(BlockQ5_1, m)};
    case DType::Q8_0:
      return {offsetof(BlockQ8_0, d)};
    case DType::Q2_K:
      return {offsetof(BlockQ2_K, d), offsetof(BlockQ2_K, dmin)};
    case DType::Q3_K:
      return {offsetof(BlockQ3_K, d)};
    case DType::Q4_K:
      return {offsetof(BlockQ4_K, d), offsetof(BlockQ4_K, dmin)};
    case DType::Q5_K:
      return {offsetof(BlockQ5_K, d), offsetof(BlockQ5_K, dmin)};
    case DType::Q6_K:
      return {offsetof(BlockQ6_K, d)};
    case DType::IQ4_NL:
      return {offsetof(BlockIQ4_NL, d)};
    case DType::IQ4_XS:
      return {offsetof(BlockIQ4_XS, d)};
    case DType::Q4_1:
      return {offsetof(BlockQ4_1, d), offsetof(BlockQ4_1, m)};
    case DType::TQ1_0:
      return {offsetof(BlockTQ1_0, d)};
    case DType::TQ2_0:
      return {offsetof(BlockTQ2_0, d)};
    case DType::IQ1_S:
    case DType::IQ2_XXS:
    case DType::IQ2_XS:
    case DType::IQ2_S:
    case DType::IQ3_XXS:
    case DType::IQ3_S:
      return {0};  // d first (IQ1_M's is spread over its scale words)
    default:
      return {};
  }
}

TEST(BlockDecode, decode8_matches_fixture_values_bit_for_bit) {
  std::map<DType, int> cases_per_type;
  for (const char* file : {"dequant-cases.json", "dequant-cases-iq.json"}) {
    const auto doc = nlohmann::json::parse(test::read_text_file(test::fixture(file)));
    ASSERT_EQ(doc.at("format"), "dequant_cases/1") << file;
    for (const auto& entry : doc.at("cases")) {
      const std::string type_name = entry.at("type");
      const auto type = dtype_from_name(type_name);
      ASSERT_TRUE(type.has_value()) << type_name;
      if (!blocks::has_block_decoder(*type)) continue;
      const std::vector<uint8_t> raw = bytes_from_hex(entry.at("raw_hex"));
      const std::vector<uint8_t> expected = bytes_from_hex(entry.at("values_f32_hex"));
      const int64_t n = entry.at("n_values");
      ASSERT_EQ(int64_t(expected.size()), 4 * n) << type_name;
      ASSERT_EQ(n % block_elems(*type), 0) << type_name;

      std::vector<float> want(static_cast<size_t>(n)), got(static_cast<size_t>(n));
      std::memcpy(want.data(), expected.data(), expected.size());  // little-endian host
      blocks::decode_row(*type, raw.data(), got.data(), n);
      const std::string what = type_name + " case " + std::to_string(cases_per_type[*type]++) +
                               " (" + entry.value("source", "") + ")";
      EXPECT_EQ(count_mismatches(want, got, what), 0) << what;
    }
  }
  // Every decoder but F32's (which the fixtures have no cases for) must have been exercised.
  for (const DType type : kDecodable) {
    if (type == DType::F32) continue;
    EXPECT_GT(cases_per_type[type], 0) << dtype_name(type);
  }
}

TEST(BlockDecode, decode8_matches_reference_on_quantized_random_rows) {
  constexpr int64_t kRowElems = 4 * 256;
  // Tiny scales make f16 subnormal super-scales; large ones saturate the f16 scale fields.
  const float sigmas[] = {1e-6f, 3e-3f, 1.0f, 40.0f, 3e4f};
  for (const DType type : kDecodable) {
    if (!can_quantize(type)) continue;
    for (uint32_t seed = 1; seed <= 3; ++seed) {
      std::mt19937 rng(seed);
      std::normal_distribution<float> normal(0.0f, 1.0f);
      std::uniform_real_distribution<float> exponent(-9.0f, 5.0f);
      for (size_t s = 0; s <= std::size(sigmas); ++s) {
        // The last row mixes magnitudes from 1e-9 to 1e5 within each block.
        std::vector<float> x(kRowElems);
        for (float& v : x)
          v = normal(rng) * (s < std::size(sigmas) ? sigmas[s] : std::pow(10.0f, exponent(rng)));
        std::vector<uint8_t> bytes(row_bytes(type, kRowElems));
        quantize_row(type, x.data(), bytes.data(), kRowElems);
        expect_decode_matches_reference(type, bytes, kRowElems,
                                        std::string(dtype_name(type)) + " seed " +
                                            std::to_string(seed) + " row " + std::to_string(s));
      }
    }
  }
}

TEST(BlockDecode, decode8_matches_reference_on_random_block_bytes) {
  // Covers the formats quantize_row cannot write (Q5_1, Q2_K, Q3_K) and, for every format, bit
  // patterns a quantizer never produces (negative scales, all 6-bit scale values, NaN in F32).
  constexpr int kBlocks = 64;
  for (const DType type : kDecodable) {
    const int64_t n = int64_t(kBlocks) * block_elems(type);
    const size_t block_bytes = row_bytes(type, uint64_t(block_elems(type)));
    for (uint32_t seed = 1; seed <= 8; ++seed) {
      std::mt19937 rng(seed * 7919u + uint32_t(type));
      std::vector<uint8_t> bytes(row_bytes(type, uint64_t(n)));
      for (uint8_t& b : bytes) b = uint8_t(rng());
      // Finite f16 scales: an infinite one would make 0 * inf, whose NaN the device need not
      // reproduce bit for bit. Clearing the top exponent bit keeps the rest random.
      for (size_t block = 0; block < size_t(kBlocks); ++block)
        for (const size_t offset : f16_field_offsets(type)) {
          uint8_t& high_byte = bytes[block * block_bytes + offset + 1];
          if ((high_byte & 0x7c) == 0x7c) high_byte &= uint8_t(~0x40);
        }
      expect_decode_matches_reference(
          type, bytes, n, std::string(dtype_name(type)) + " seed " + std::to_string(seed));
    }
  }
}

TEST(BlockDecode, block_geometry_agrees_with_dtype_info) {
  for (const DType type : kDecodable) {
    const DTypeInfo& info = dtype_info(type);
    ASSERT_TRUE(blocks::visit_decoder(type, [&](auto decoder) {
      using D = decltype(decoder);
      EXPECT_EQ(D::kType, type);
      EXPECT_EQ(D::kElems % 8, 0) << dtype_name(type);
      EXPECT_EQ(D::kElems % int(info.block_elems), 0) << dtype_name(type);
      EXPECT_EQ(uint64_t(D::kBytes), row_bytes(type, uint64_t(D::kElems))) << dtype_name(type);
    })) << dtype_name(type);
    EXPECT_TRUE(can_dequantize(type)) << dtype_name(type);
  }
}

TEST(BlockDecode, visit_decoder_refuses_activation_integer_and_interleaved_formats) {
  for (const DType type : {DType::Q8_K, DType::Q4_K_R16, DType::Q8_0_R16, DType::Q5_0_R16,
                           DType::Q8_1, DType::I8, DType::I32, DType::F64}) {
    bool called = false;
    EXPECT_FALSE(blocks::visit_decoder(type, [&](auto) { called = true; })) << dtype_name(type);
    EXPECT_FALSE(called) << dtype_name(type);
    EXPECT_FALSE(blocks::has_block_decoder(type)) << dtype_name(type);
  }
  EXPECT_FALSE(blocks::has_block_decoder(DType(12345)));
  for (const DType type : kDecodable) EXPECT_TRUE(blocks::has_block_decoder(type));
}

TEST(BlockDecode, decode_row_stops_on_a_partial_block_or_a_format_without_decoder) {
  std::vector<uint8_t> bytes(2 * sizeof(BlockQ4_K), 0);
  std::vector<float> out(2 * 256);
  EXPECT_DEATH(blocks::decode_row(DType::Q4_K, bytes.data(), out.data(), 300), "internal error");
  EXPECT_DEATH(blocks::decode_row(DType::F16, bytes.data(), out.data(), 12), "internal error");
  EXPECT_DEATH(blocks::decode_row(DType::Q8_K, bytes.data(), out.data(), 256), "internal error");
}

}  // namespace
}  // namespace tandem
