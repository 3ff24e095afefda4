// Tokenizer behaviour on tiny hand-made vocabularies (merge order, special tokens, decoding,
// metadata errors). The real vocabularies are checked against fixtures in
// tokenizer_fixture_test.cpp.
#include "text/tokenizer.h"

#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <vector>

#include "core/error.h"
#include "gguf/gguf_file.h"
#include "gguf/gguf_writer.h"
#include "text/byte_unicode.h"
#include "text/utf8_scan.h"

namespace tandem {
namespace {

using gguf::Value;

struct VocabSpec {
  std::string model = "gpt2";
  std::string pre = "deepseek-v3";
  std::vector<std::string> tokens;
  std::vector<int32_t> types;
  std::vector<std::string> merges;
  std::optional<uint32_t> bos = 0, eos = 1;
  bool add_bos = true;

  void add(std::string text, TokenType type = TokenType::Normal) {
    tokens.push_back(std::move(text));
    types.push_back(int32_t(type));
  }
};

// BOS, EOS, the 256 byte tokens, then whatever a test adds.
VocabSpec byte_vocab() {
  VocabSpec spec;
  spec.add("<s>", TokenType::Control);
  spec.add("</s>", TokenType::Control);
  for (uint8_t byte : byte_alphabet_order()) spec.add(utf8_encode(byte_to_codepoint(byte)));
  return spec;
}

Tokenizer load(const VocabSpec& spec) {
  std::vector<uint8_t> bytes;
  {
    gguf::GgufWriter writer(&bytes);
    writer.add_metadata("general.architecture", Value::string("deepseek2"));
    writer.add_metadata("tokenizer.ggml.model", Value::string(spec.model));
    writer.add_metadata("tokenizer.ggml.pre", Value::string(spec.pre));
    writer.add_metadata("tokenizer.ggml.tokens", Value::string_array(spec.tokens));
    writer.add_metadata("tokenizer.ggml.token_type", Value::i32_array(spec.types));
    writer.add_metadata("tokenizer.ggml.merges", Value::string_array(spec.merges));
    if (spec.bos) writer.add_metadata("tokenizer.ggml.bos_token_id", Value::u32(*spec.bos));
    if (spec.eos) writer.add_metadata("tokenizer.ggml.eos_token_id", Value::u32(*spec.eos));
    writer.add_metadata("tokenizer.ggml.add_bos_token", Value::boolean(spec.add_bos));
    writer.finish();
  }
  return Tokenizer::from_gguf(gguf::GgufFile::parse_memory(bytes, "vocab.gguf"));
}

std::string load_error(const VocabSpec& spec) {
  try {
    load(spec);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

int32_t id(const Tokenizer& tok, std::string_view text) {
  const std::optional<int32_t> found = tok.find_token(text);
  EXPECT_TRUE(found.has_value()) << text;
  return found.value_or(-1);
}

// The byte token of `byte`.
int32_t byte_id(const Tokenizer& tok, uint8_t byte) {
  return id(tok, utf8_encode(byte_to_codepoint(byte)));
}

using Ids = std::vector<int32_t>;

// ---- BPE ---------------------------------------------------------------------------------------

TEST(TokenizerBpe, LowerRankMergesFirst) {
  VocabSpec spec = byte_vocab();
  spec.add("bc"), spec.add("ab");
  spec.merges = {"b c", "a b"};  // "bc" outranks "ab"
  const Tokenizer tok = load(spec);
  EXPECT_EQ(tok.encode("abc"), (Ids{id(tok, "a"), id(tok, "bc")}));
  EXPECT_EQ(tok.encode("abd"), (Ids{id(tok, "ab"), id(tok, "d")}));
}

TEST(TokenizerBpe, MergedTokensMergeFurther) {
  VocabSpec spec = byte_vocab();
  spec.add("bc"), spec.add("abc");
  spec.merges = {"b c", "a bc"};
  const Tokenizer tok = load(spec);
  EXPECT_EQ(tok.encode("abcabc"), (Ids{id(tok, "abc"), id(tok, "abc")}));
}

TEST(TokenizerBpe, EqualPairsMergeLeftmostFirst) {
  VocabSpec spec = byte_vocab();
  spec.add("aa");
  spec.merges = {"a a"};
  const Tokenizer tok = load(spec);
  EXPECT_EQ(tok.encode("aaa"), (Ids{id(tok, "aa"), id(tok, "a")}));
  EXPECT_EQ(tok.encode("aaaa"), (Ids{id(tok, "aa"), id(tok, "aa")}));
}

TEST(TokenizerBpe, PiecesNeverMergeAcrossThePreTokenizerSplit) {
  VocabSpec spec = byte_vocab();
  spec.add("a1");
  spec.merges = {"a 1"};
  const Tokenizer tok = load(spec);
  // deepseek-v3 puts digits in their own piece.
  EXPECT_EQ(tok.encode("a1"), (Ids{id(tok, "a"), id(tok, "1")}));
}

TEST(TokenizerBpe, LongPiecesEncodeAndDecodeExactly) {
  VocabSpec spec = byte_vocab();
  spec.add("aa"), spec.add("aaaa"), spec.add("ĠĠ");
  spec.merges = {"a a", "aa aa", "Ġ Ġ"};
  const Tokenizer tok = load(spec);
  const std::string letters(100001, 'a');
  const Ids ids = tok.encode(letters);
  EXPECT_EQ(ids.size(), 25001u);  // 25000 "aaaa" and one "a"
  EXPECT_EQ(tok.decode(ids), letters);
  const std::string spaces = std::string(50000, ' ') + "x";
  EXPECT_EQ(tok.decode(tok.encode(spaces)), spaces);
}

// ---- special tokens ----------------------------------------------------------------------------

VocabSpec special_vocab() {
  VocabSpec spec = byte_vocab();
  spec.add("<c>", TokenType::Control);
  spec.add("<c>!", TokenType::Control);
  spec.add("<u>", TokenType::UserDefined);
  return spec;
}

TEST(TokenizerSpecial, ControlTokensOnlyWhenParsingSpecials) {
  const Tokenizer tok = load(special_vocab());
  const int32_t lt = byte_id(tok, '<'), c = byte_id(tok, 'c'), gt = byte_id(tok, '>');
  EXPECT_EQ(tok.encode("<c>", {.parse_special = true}), (Ids{id(tok, "<c>")}));
  EXPECT_EQ(tok.encode("<c>"), (Ids{lt, c, gt}));
  EXPECT_EQ(tok.encode("<s>", {.parse_special = true}), (Ids{0}));
}

TEST(TokenizerSpecial, LongestTokenAtAPositionWins) {
  const Tokenizer tok = load(special_vocab());
  const EncodeOptions special{.parse_special = true};
  EXPECT_EQ(tok.encode("<c>!", special), (Ids{id(tok, "<c>!")}));
  EXPECT_EQ(tok.encode("x<c>?<c>", special),
            (Ids{byte_id(tok, 'x'), id(tok, "<c>"), byte_id(tok, '?'), id(tok, "<c>")}));
}

TEST(TokenizerSpecial, UserDefinedTokensAreAlwaysRecognised) {
  const Tokenizer tok = load(special_vocab());
  EXPECT_EQ(tok.encode("<u>"), (Ids{id(tok, "<u>")}));
  EXPECT_EQ(tok.encode("<u>", {.parse_special = true}), (Ids{id(tok, "<u>")}));
}

TEST(TokenizerSpecial, BosIsAddedOnRequest) {
  const Tokenizer tok = load(special_vocab());
  EXPECT_TRUE(tok.add_bos_by_default());
  EXPECT_EQ(tok.encode("", {.add_bos = true}), (Ids{0}));
  EXPECT_EQ(tok.encode("a", {.add_bos = true}), (Ids{0, byte_id(tok, 'a')}));
  EXPECT_TRUE(tok.encode("").empty());
}

TEST(TokenizerSpecial, AddingBosWithoutOneIsAnError) {
  VocabSpec spec = byte_vocab();
  spec.bos.reset();
  spec.add_bos = false;
  const Tokenizer tok = load(spec);
  EXPECT_THROW(tok.encode("a", {.add_bos = true}), Error);
}

// ---- decoding ----------------------------------------------------------------------------------

TEST(TokenizerDecode, ControlTokensRenderOnlyWhenAsked) {
  const Tokenizer tok = load(special_vocab());
  EXPECT_EQ(tok.token_to_piece(0), "");
  EXPECT_EQ(tok.token_to_piece(0, /*render_special=*/true), "<s>");
  EXPECT_EQ(tok.token_to_piece(id(tok, "<u>")), "<u>");
  EXPECT_EQ(tok.token_to_piece(id(tok, "Ġ")), " ");
  EXPECT_EQ(tok.decode(Ids{0, id(tok, "Ġ"), id(tok, "<c>")}, true), "<s> <c>");
  EXPECT_THROW(tok.token_to_piece(tok.n_vocab()), Error);
  EXPECT_THROW(tok.token_to_piece(-1), Error);
}

TEST(StreamingDecoder, HoldsBackASplitCharacterUntilComplete) {
  const Tokenizer tok = load(byte_vocab());
  StreamingDecoder decoder(tok);
  EXPECT_EQ(decoder.push(byte_id(tok, 'a')), "a");
  EXPECT_EQ(decoder.push(byte_id(tok, 0xE4)), "");
  EXPECT_EQ(decoder.push(byte_id(tok, 0xB8)), "");
  EXPECT_EQ(decoder.push(byte_id(tok, 0xAD)), "中");
  EXPECT_EQ(decoder.finish(), "");
}

TEST(StreamingDecoder, InvalidBytesBecomeReplacementCharactersAtOnce) {
  const Tokenizer tok = load(byte_vocab());
  const std::string fffd = utf8_encode(kReplacementCharacter);
  StreamingDecoder decoder(tok);
  EXPECT_EQ(decoder.push(byte_id(tok, 0xFF)), fffd);
  EXPECT_EQ(decoder.push(byte_id(tok, 0xE4)), "");
  // A started character interrupted by ASCII: the start is invalid, the ASCII passes.
  EXPECT_EQ(decoder.push(byte_id(tok, 'x')), fffd + "x");
  // A lone continuation byte.
  EXPECT_EQ(decoder.push(byte_id(tok, 0x80)), fffd);
  // Cut off at the end.
  EXPECT_EQ(decoder.push(byte_id(tok, 0xF0)), "");
  EXPECT_EQ(decoder.push(byte_id(tok, 0x9F)), "");
  EXPECT_EQ(decoder.finish(), fffd);
  EXPECT_EQ(decoder.push(byte_id(tok, 'y')), "y");  // finish() reset it
}

TEST(Utf8Scan, RejectsOverlongSurrogateAndOutOfRange) {
  EXPECT_TRUE(is_valid_utf8("aé中😀"));
  EXPECT_FALSE(is_valid_utf8("\xC0\x80"));          // overlong NUL
  EXPECT_FALSE(is_valid_utf8("\xE0\x80\x80"));      // overlong
  EXPECT_FALSE(is_valid_utf8("\xED\xA0\x80"));      // surrogate U+D800
  EXPECT_FALSE(is_valid_utf8("\xF4\x90\x80\x80"));  // above U+10FFFF
  EXPECT_FALSE(is_valid_utf8("\xE4\xB8"));          // truncated
  // One U+FFFD per maximal subpart: E4 B8 is one, 80 another.
  EXPECT_EQ(sanitize_utf8("a\xE4\xB8"
                          "b\x80"),
            "a\uFFFD"
            "b\uFFFD");
}

// ---- metadata errors ---------------------------------------------------------------------------

void expect_error(const VocabSpec& spec, std::vector<std::string> fragments) {
  const std::string message = load_error(spec);
  ASSERT_FALSE(message.empty()) << "expected an error";
  for (const std::string& fragment : fragments)
    EXPECT_NE(message.find(fragment), std::string::npos)
        << "'" << fragment << "' not in: " << message;
}

TEST(TokenizerErrors, UnknownModelNamesItAndWhatIsSupported) {
  VocabSpec spec = byte_vocab();
  spec.model = "llama";
  expect_error(spec, {"'llama'", "tokenizer.ggml.model", "'gpt2'"});
}

TEST(TokenizerErrors, UnknownPreTokenizerListsTheSupportedOnes) {
  VocabSpec spec = byte_vocab();
  spec.pre = "llama-bpe";
  expect_error(spec, {"'llama-bpe'", "tokenizer.ggml.pre", "deepseek-v3", "qwen2", "gpt-4o"});
}

TEST(TokenizerErrors, TokenTypeCountMustMatchTokens) {
  VocabSpec spec = byte_vocab();
  spec.types.pop_back();
  expect_error(spec, {"tokenizer.ggml.token_type", "257 entries", "258 tokens"});
}

TEST(TokenizerErrors, MergeOfAnUnknownToken) {
  VocabSpec spec = byte_vocab();
  spec.add("ab");
  spec.merges = {"a b", "x zz"};
  expect_error(spec, {"tokenizer.ggml.merges", "entry 1", "'zz'"});
}

TEST(TokenizerErrors, MergeWhoseResultIsNotAToken) {
  VocabSpec spec = byte_vocab();
  spec.merges = {"a b"};
  expect_error(spec, {"tokenizer.ggml.merges", "entry 0", "'ab'"});
}

TEST(TokenizerErrors, MergeWithoutASeparator) {
  VocabSpec spec = byte_vocab();
  spec.merges = {"ab"};
  expect_error(spec, {"tokenizer.ggml.merges", "entry 0", "separated by a space"});
}

TEST(TokenizerErrors, BosOutsideTheVocabulary) {
  VocabSpec spec = byte_vocab();
  spec.bos = 9999;
  expect_error(spec, {"tokenizer.ggml.bos_token_id", "9999", "258 tokens"});
}

TEST(TokenizerErrors, TokenTypeOutOfRange) {
  VocabSpec spec = byte_vocab();
  spec.types[5] = 42;
  expect_error(spec, {"tokenizer.ggml.token_type", "entry 5"});
}

}  // namespace
}  // namespace tandem
