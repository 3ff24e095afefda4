// Every block of ../shared/fixtures/dequant-cases.json, produced by an independent
// implementation, must decode to exactly the float32 bit patterns recorded there.
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "quant/quant.h"
#include "test_support.h"

namespace tandem {
namespace {

std::vector<uint8_t> bytes_from_hex(const std::string& hex) {
  std::vector<uint8_t> bytes(hex.size() / 2);
  for (size_t i = 0; i < bytes.size(); ++i)
    bytes[i] = uint8_t(std::stoul(hex.substr(2 * i, 2), nullptr, 16));
  return bytes;
}

uint32_t load_u32_le(const uint8_t* p) {
  return uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24;
}

// Decodes one case and compares every float's bits; says which elements differ (the first 5).
void expect_case_decodes_bit_for_bit(DType type, const nlohmann::json& entry, size_t c) {
  const std::string type_name(dtype_name(type));
  const std::vector<uint8_t> raw = bytes_from_hex(entry.at("raw_hex"));
  const std::vector<uint8_t> expected = bytes_from_hex(entry.at("values_f32_hex"));
  const int64_t n = entry.at("n_values");
  ASSERT_EQ(int64_t(expected.size()), 4 * n) << type_name << " case " << c;
  ASSERT_EQ(row_bytes(type, uint64_t(n)), raw.size()) << type_name << " case " << c;
  std::vector<float> got(static_cast<size_t>(n));
  dequantize_row(type, raw.data(), got.data(), n);
  int mismatches = 0;
  for (int64_t i = 0; i < n; ++i) {
    uint32_t got_bits;
    std::memcpy(&got_bits, &got[size_t(i)], 4);
    const uint32_t want_bits = load_u32_le(&expected[size_t(4 * i)]);
    if (got_bits != want_bits && ++mismatches <= 5)
      ADD_FAILURE() << type_name << " case " << c << " (" << entry.value("source", "")
                    << ") element " << i << ": expected bits 0x" << std::hex << want_bits
                    << " got 0x" << got_bits << std::dec;
  }
  EXPECT_EQ(mismatches, 0) << type_name << " case " << c;
}

TEST(DequantFixture, EveryCaseDecodesBitForBit) {
  const auto doc = nlohmann::json::parse(test::read_text_file(test::fixture("dequant-cases.json")));
  ASSERT_EQ(doc.at("format"), "dequant_cases/1");
  const auto& cases = doc.at("cases");
  ASSERT_FALSE(cases.empty());
  std::map<std::string, int> cases_per_type;
  for (size_t c = 0; c < cases.size(); ++c) {
    const auto& entry = cases[c];
    const std::string type_name = entry.at("type");
    const auto type = dtype_from_name(type_name);
    ASSERT_TRUE(type.has_value()) << "case " << c << ": unknown type " << type_name;
    ASSERT_TRUE(can_dequantize(*type)) << type_name;
    ASSERT_EQ(entry.at("block_bytes"), dtype_info(*type).block_bytes) << type_name;
    ASSERT_EQ(entry.at("block_elems"), dtype_info(*type).block_elems) << type_name;
    expect_case_decodes_bit_for_bit(*type, entry, c);
    ++cases_per_type[type_name];
  }
  // The fixture README promises these; a shrunken fixture should not pass silently.
  for (const char* name :
       {"F16", "BF16", "Q4_0", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"})
    EXPECT_GT(cases_per_type[name], 0) << "no fixture case for " << name;
}

// The i-quant and other low-bit additions (fixtures README section 9): every case of a format
// tandem decodes is bit-exact; a format it does not decode yet must say so (can_dequantize), so
// that adding one without passing its cases fails here.
TEST(DequantFixture, IquantCasesOfTheReadableFormatsDecodeBitForBit) {
  const auto doc = nlohmann::json::parse(test::read_text_file(test::fixture("dequant-cases-iq.json")));
  ASSERT_EQ(doc.at("format"), "dequant_cases/1");
  std::map<std::string, int> checked, not_read;
  const auto& cases = doc.at("cases");
  for (size_t c = 0; c < cases.size(); ++c) {
    const auto& entry = cases[c];
    const std::string type_name = entry.at("type");
    const auto type = dtype_from_name(type_name);
    ASSERT_TRUE(type.has_value()) << "unknown type " << type_name;  // every one is at least named
    ASSERT_EQ(entry.at("block_bytes"), dtype_info(*type).block_bytes) << type_name;
    ASSERT_EQ(entry.at("block_elems"), dtype_info(*type).block_elems) << type_name;
    if (!can_dequantize(*type)) {
      ++not_read[type_name];
      continue;
    }
    expect_case_decodes_bit_for_bit(*type, entry, c);
    ++checked[type_name];
  }
  for (const char* name : {"Q4_1", "IQ4_NL", "IQ4_XS", "TQ1_0", "TQ2_0", "MXFP4", "IQ1_S", "IQ1_M",
                           "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S"})
    EXPECT_GT(checked[name], 0) << "no fixture case checked for " << name;
  // Every format of the file is decoded.
  std::string missing;
  for (const auto& [name, count] : not_read) missing += name + " ";
  EXPECT_EQ(missing, "");
}

}  // namespace
}  // namespace tandem
