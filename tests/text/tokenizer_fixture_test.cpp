// The tokenizer against ../shared/fixtures: 240 strings tokenized by an independent
// implementation with the full DeepSeek-V3 vocabulary and with the reduced vocabulary of the
// micro/small models, in all four modes, plus the prompts of the model references.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "gguf/gguf_file.h"
#include "test_support.h"
#include "text/byte_unicode.h"
#include "text/tokenizer.h"
#include "text/utf8_scan.h"

namespace tandem {
namespace {

using Clock = std::chrono::steady_clock;
using Ids = std::vector<int32_t>;

double ms_since(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

struct Case {
  int id = 0;
  std::string text;
  Ids bos_special, bos_nospecial, nobos_special, nobos_nospecial;
};

std::vector<Case> read_cases(const std::string& name) {
  const nlohmann::json doc = nlohmann::json::parse(test::read_text_file(test::fixture(name)));
  std::vector<Case> cases;
  for (const auto& item : doc.at("items"))
    cases.push_back({item.at("id").get<int>(), item.at("text").get<std::string>(),
                     item.at("bos_special").get<Ids>(), item.at("bos_nospecial").get<Ids>(),
                     item.at("nobos_special").get<Ids>(), item.at("nobos_nospecial").get<Ids>()});
  return cases;
}

// The vocabularies are loaded once for all tests (the full one has 129280 tokens).
class TokenizerFixtures : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const auto start = Clock::now();
    full_ = std::make_unique<Tokenizer>(Tokenizer::from_gguf(
        gguf::GgufFile::open(test::fixture("tokenizer-deepseek-v3.gguf").string())));
    std::printf("[ timing   ] loading the %d-token DeepSeek-V3 vocabulary (%zu merges): %.1f ms\n",
                full_->n_vocab(), full_->n_merges(), ms_since(start));
    small_ = std::make_unique<Tokenizer>(
        Tokenizer::from_gguf(gguf::GgufFile::open(test::fixture("micro-v2-F32.gguf").string())));
  }
  static void TearDownTestSuite() {
    full_.reset();
    small_.reset();
  }

  // Every case in every mode; reports each difference and returns how many there were.
  static int count_mismatches(const Tokenizer& tok, const std::vector<Case>& cases) {
    int mismatches = 0;
    for (const Case& c : cases) {
      const struct {
        const char* mode;
        EncodeOptions options;
        const Ids& expected;
      } modes[] = {
          {"bos_special", {.add_bos = true, .parse_special = true}, c.bos_special},
          {"bos_nospecial", {.add_bos = true, .parse_special = false}, c.bos_nospecial},
          {"nobos_special", {.add_bos = false, .parse_special = true}, c.nobos_special},
          {"nobos_nospecial", {.add_bos = false, .parse_special = false}, c.nobos_nospecial},
      };
      for (const auto& m : modes) {
        const Ids got = tok.encode(c.text, m.options);
        if (got == m.expected) continue;
        ++mismatches;
        ADD_FAILURE() << "case " << c.id << " (" << m.mode << ") text '" << c.text << "'\n"
                      << "  expected " << ::testing::PrintToString(m.expected) << "\n"
                      << "  got      " << ::testing::PrintToString(got);
      }
    }
    return mismatches;
  }

  static std::unique_ptr<Tokenizer> full_, small_;
};

std::unique_ptr<Tokenizer> TokenizerFixtures::full_, TokenizerFixtures::small_;

TEST_F(TokenizerFixtures, VocabulariesAreReadAsDescribed) {
  EXPECT_EQ(full_->n_vocab(), 129280);
  EXPECT_EQ(full_->n_merges(), 127741u);
  EXPECT_EQ(full_->bos_id(), 0);
  EXPECT_EQ(full_->eos_id(), 1);
  EXPECT_TRUE(full_->add_bos_by_default());
  EXPECT_EQ(full_->pre_tokenizer().name(), "deepseek-v3");
  EXPECT_EQ(full_->token_text(0), "<｜begin▁of▁sentence｜>");
  EXPECT_EQ(full_->token_type(0), TokenType::Control);
  EXPECT_EQ(full_->token_type(128800), TokenType::Control);
  EXPECT_EQ(small_->n_vocab(), 4111);
  EXPECT_EQ(small_->find_token("<｜User｜>"), 4099);
  // Ids 0..4095 are the same tokens in both.
  for (int32_t id = 0; id < 4096; ++id) ASSERT_EQ(small_->token_text(id), full_->token_text(id));
}

TEST_F(TokenizerFixtures, FullVocabularyMatchesAllCasesInAllModes) {
  const std::vector<Case> cases = read_cases("tokenizer-cases.json");
  ASSERT_EQ(cases.size(), 240u);
  EXPECT_EQ(count_mismatches(*full_, cases), 0);

  // Timing, printed for the report (never asserted).
  auto start = Clock::now();
  size_t n_tokens = 0, n_bytes = 0;
  for (const Case& c : cases) {
    n_tokens += full_->encode(c.text, {.parse_special = true}).size();
    n_bytes += c.text.size();
  }
  std::printf(
      "[ timing   ] encoding the 240 cases (%zu bytes -> %zu tokens), full vocabulary: "
      "%.2f ms\n",
      n_bytes, n_tokens, ms_since(start));
  std::string long_text;
  while (long_text.size() < 1'000'000)
    for (const Case& c : cases) long_text += c.text + "\n";
  start = Clock::now();
  n_tokens = full_->encode(long_text).size();
  const double long_ms = ms_since(start);
  std::printf(
      "[ timing   ] encoding a %.2f MB prompt (the cases repeated): %zu tokens in %.1f ms "
      "(%.1f MB/s)\n",
      long_text.size() / 1e6, n_tokens, long_ms, long_text.size() / 1e3 / long_ms);
}

TEST_F(TokenizerFixtures, SmallVocabularyMatchesAllCasesInAllModes) {
  const std::vector<Case> cases = read_cases("tokenizer-cases-small-vocab.json");
  ASSERT_EQ(cases.size(), 240u);
  EXPECT_EQ(count_mismatches(*small_, cases), 0);
}

TEST_F(TokenizerFixtures, DecodeOfEncodeGivesTheTextBack) {
  for (const Tokenizer* tok : {full_.get(), small_.get()}) {
    for (const Case& c : read_cases("tokenizer-cases.json")) {
      EXPECT_EQ(tok->decode(tok->encode(c.text)), c.text) << "case " << c.id;
      // With specials parsed and rendered, the text comes back too.
      EXPECT_EQ(tok->decode(tok->encode(c.text, {.parse_special = true}), true), c.text)
          << "case " << c.id;
    }
  }
}

TEST_F(TokenizerFixtures, InvalidUtf8InTheTextStillRoundTrips) {
  const std::string text = "ab\xff\xfe 中\xe4\xb8 x\x80";
  EXPECT_EQ(full_->decode(full_->encode(text)), text);
  // Shown through the streaming decoder, each invalid sequence becomes one U+FFFD.
  StreamingDecoder decoder(*full_);
  std::string shown;
  for (const int32_t id : full_->encode(text)) shown += decoder.push(id);
  shown += decoder.finish();
  EXPECT_EQ(shown, "ab\uFFFD\uFFFD 中\uFFFD x\uFFFD");
}

TEST_F(TokenizerFixtures, StreamingDecoderGivesWholeCharactersOnly) {
  for (const Case& c : read_cases("tokenizer-cases.json")) {
    StreamingDecoder decoder(*full_);
    std::string text;
    for (const int32_t id : c.nobos_nospecial) {
      const std::string out = decoder.push(id);
      EXPECT_TRUE(is_valid_utf8(out)) << "case " << c.id;
      text += out;
    }
    text += decoder.finish();
    EXPECT_EQ(text, c.text) << "case " << c.id;
  }
}

TEST_F(TokenizerFixtures, StreamingDecoderHidesControlTokensUnlessAsked) {
  const Ids ids =
      full_->encode("<｜User｜>Hi<｜Assistant｜>", {.add_bos = true, .parse_special = true});
  StreamingDecoder plain(*full_), rendered(*full_, /*render_special=*/true);
  std::string plain_text, rendered_text;
  for (const int32_t id : ids) {
    plain_text += plain.push(id);
    rendered_text += rendered.push(id);
  }
  EXPECT_EQ(plain_text + plain.finish(), "Hi");
  EXPECT_EQ(rendered_text + rendered.finish(),
            "<｜begin▁of▁sentence｜><｜User｜>Hi<｜Assistant｜>");
}

TEST_F(TokenizerFixtures, ReadmePromptsReproduce) {
  EXPECT_EQ(small_->encode("The quick brown fox jumps over the lazy dog.", {.add_bos = true}),
            (Ids{0, 671, 645, 1193, 291, 1072, 80, 285, 1876, 597, 395, 1149, 1060, 270, 847, 3616,
                 283, 520, 16}));
  EXPECT_EQ(small_->encode("<｜begin▁of▁sentence｜><｜User｜>Write a short poem about the sea, in "
                           "English and 中文.<｜Assistant｜>",
                           {.parse_special = true}),
            (Ids{0,  4099, 57,  3135, 260, 3107, 1159, 381, 943, 270, 488,
                 67, 14,   295, 3947, 305, 223,  525,  978, 16,  4100}));
}

TEST_F(TokenizerFixtures, ModelReferencePromptsReproduce) {
  // Each reference carries its prompt, how it was tokenized, and the ids.
  for (const std::string name : {"micro-v2-F32.p1.json", "micro-v2-F32.p2.json",
                                 "micro-v2-F32.chat.json", "micro-v3-F32.p2.json"}) {
    const nlohmann::json ref = nlohmann::json::parse(test::read_text_file(test::fixture(name)));
    EncodeOptions options{.add_bos = true, .parse_special = false};
    if (ref.contains("tokenize")) {
      options.add_bos = ref["tokenize"].at("add_bos").get<bool>();
      options.parse_special = ref["tokenize"].at("parse_special").get<bool>();
    }
    EXPECT_EQ(small_->encode(ref.at("prompt").get<std::string>(), options),
              ref.at("prompt_tokens").get<Ids>())
        << name;
  }
}

}  // namespace
}  // namespace tandem
