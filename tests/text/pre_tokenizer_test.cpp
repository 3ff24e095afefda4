#include "text/pre_tokenizer.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/error.h"

namespace tandem {
namespace {

std::vector<std::string> split(const PreTokenizer& pre, std::string_view text) {
  std::vector<std::string> pieces;
  for (const TextSpan span : pre.split(text))
    pieces.emplace_back(text.substr(span.offset, span.size));
  return pieces;
}

using Pieces = std::vector<std::string>;

// ---- DeepSeek-LLM (V2): expected splits worked out by hand from the regex list ---------------

class DeepseekLlmSplit : public ::testing::Test {
 protected:
  PreTokenizer pre = PreTokenizer::for_name("deepseek-llm");
};

TEST_F(DeepseekLlmSplit, WordsKeepOneLeadingSpace) {
  EXPECT_EQ(split(pre, "Hello world"), (Pieces{"Hello", " world"}));
  // The first space of a double space is left between the words as its own piece.
  EXPECT_EQ(split(pre, "a  b"), (Pieces{"a", " ", " b"}));
}

TEST_F(DeepseekLlmSplit, DigitRunsStayWholeAndLoseTheirSpace) {
  // Unlike V3 there is no grouping by three, and the space before a number is not attached
  // to it (only letters and punctuation take a leading space).
  EXPECT_EQ(split(pre, "abc 12345 def"), (Pieces{"abc", " ", "12345", " def"}));
}

TEST_F(DeepseekLlmSplit, CjkRunsAreSeparateFromLatin) {
  EXPECT_EQ(split(pre, "你好世界abc"), (Pieces{"你好世界", "abc"}));
  EXPECT_EQ(split(pre, "한국어 text"), (Pieces{"한국어", " text"}));
}

TEST_F(DeepseekLlmSplit, PunctuationRunsTakeOneLeadingSpace) {
  EXPECT_EQ(split(pre, "Hi !!! there"), (Pieces{"Hi", " !!!", " there"}));
  EXPECT_EQ(split(pre, "(a+b)"), (Pieces{"(", "a", "+", "b", ")"}));
}

TEST_F(DeepseekLlmSplit, EveryNewlineIsItsOwnPiece) {
  EXPECT_EQ(split(pre, "a\n\nb"), (Pieces{"a", "\n", "\n", "b"}));
  EXPECT_EQ(split(pre, "a\r\nb"), (Pieces{"a", "\r", "\n", "b"}));
}

TEST_F(DeepseekLlmSplit, LetterClassIsTheVocabularysOwnList) {
  EXPECT_EQ(split(pre, "Привет мир"), (Pieces{"Привет", " мир"}));
  // Lowercase Armenian is not in the list, so it does not join the following word.
  EXPECT_EQ(split(pre, "բարեւ ok"), (Pieces{"բարեւ", " ok"}));
}

TEST_F(DeepseekLlmSplit, LaterRegexesAlsoSplitWhatEarlierOnesMatched) {
  // Each regex applies to every piece, matched or not. "！。" is one punctuation run for the
  // third regex, but the CJK regex after it (U+0800..U+4E00 includes U+3002) cuts off "。".
  EXPECT_EQ(split(pre, "好！。"), (Pieces{"好", "！", "。"}));
  // U+1F7D and U+212A (Kelvin sign) are listed letters, yet inside the CJK regex's range.
  EXPECT_EQ(split(pre, "x\u1f7d\u212ay z"), (Pieces{"x", "\u1f7d\u212a", "y", " z"}));
}

// ---- DeepSeek-V3 -------------------------------------------------------------------------------

class DeepseekV3Split : public ::testing::Test {
 protected:
  PreTokenizer pre = PreTokenizer::for_name("deepseek-v3");
};

TEST_F(DeepseekV3Split, DigitsGroupInThreesFromTheLeft) {
  EXPECT_EQ(split(pre, "12345"), (Pieces{"123", "45"}));
  EXPECT_EQ(split(pre, "x1234567"), (Pieces{"x", "123", "456", "7"}));
}

TEST_F(DeepseekV3Split, PunctuationAndWords) {
  EXPECT_EQ(split(pre, "Hello, world!"), (Pieces{"Hello", ",", " world", "!"}));
  // One ASCII punctuation mark may lead a run of ASCII letters...
  EXPECT_EQ(split(pre, "x.NET"), (Pieces{"x", ".NET"}));
  // ...but a space before it makes it a punctuation piece instead.
  EXPECT_EQ(split(pre, "use .NET"), (Pieces{"use", " .", "NET"}));
}

TEST_F(DeepseekV3Split, WhitespaceBeforeAWordLeavesItsLastSpaceToTheWord) {
  EXPECT_EQ(split(pre, "  hello"), (Pieces{" ", " hello"}));
  EXPECT_EQ(split(pre, "a\r\n\r\nb"), (Pieces{"a", "\r\n\r\n", "b"}));
}

TEST_F(DeepseekV3Split, CjkAndKanaRunsAreSeparate) {
  EXPECT_EQ(split(pre, "中文abc"), (Pieces{"中文", "abc"}));
  EXPECT_EQ(split(pre, "ひらがなカタカナ"), (Pieces{"ひらがなカタカナ"}));
}

TEST_F(DeepseekV3Split, InvalidUtf8BytesAreKeptAsTheirOwnPiece) {
  EXPECT_EQ(split(pre,
                  "ab\xff"
                  "cd"),
            (Pieces{"ab", "\xff", "cd"}));
}

TEST_F(DeepseekV3Split, PiecesCoverLongRunsExactly) {
  const std::string spaces(200000, ' ');
  const std::string letters(200000, 'a');
  const std::string text = spaces + "x" + letters;
  size_t covered = 0;
  for (const TextSpan span : pre.split(text)) {
    EXPECT_EQ(span.offset, covered);
    covered += span.size;
  }
  EXPECT_EQ(covered, text.size());
}

// ---- others ------------------------------------------------------------------------------------

TEST(DeepseekCoderSplit, EveryDigitAlone) {
  const PreTokenizer pre = PreTokenizer::for_name("deepseek-coder");
  EXPECT_EQ(split(pre, "x12"), (Pieces{"x", "1", "2"}));
}

// ---- the MoE families' pre-tokenizers (the fixtures check qwen2, gpt-4o and glm4 in full)
// --------

TEST(Qwen2Split, DigitsAloneAndContractionsApart) {
  const PreTokenizer pre = PreTokenizer::for_name("qwen2");
  EXPECT_EQ(split(pre, "I'm 2024!"), (Pieces{"I", "'m", " ", "2", "0", "2", "4", "!"}));
}

TEST(Glm4Split, DigitsInThrees) {
  const PreTokenizer pre = PreTokenizer::for_name("glm4");
  EXPECT_EQ(split(pre, "x 12345"), (Pieces{"x", " ", "123", "45"}));
}

TEST(O200kSplit, CaseChangesCutWordsAndMarksStayWithTheirLetters) {
  const PreTokenizer pre = PreTokenizer::for_name("gpt-4o");
  EXPECT_EQ(split(pre, "HTTPServer's"), (Pieces{"HTTPServer's"}));
  EXPECT_EQ(split(pre, "helloWorld"), (Pieces{"hello", "World"}));
  // A combining mark (U+0301) stays in the word.
  EXPECT_EQ(split(pre, "cafe\u0301 ok"), (Pieces{"cafe\u0301", " ok"}));
}

// Kimi-K2 puts Han runs in pieces of their own, then o200k's rules over the other letters.
TEST(KimiK2Split, HanRunsArePiecesOfTheirOwn) {
  const PreTokenizer pre = PreTokenizer::for_name("kimi-k2");
  EXPECT_EQ(split(pre, "中文English混合"), (Pieces{"中文", "English", "混合"}));
  EXPECT_EQ(split(pre, "汉字abc"), (Pieces{"汉字", "abc"}));
  EXPECT_EQ(split(pre, "北京市 Pascal"), (Pieces{"北京市", " Pascal"}));
  EXPECT_EQ(split(pre, "1234567"), (Pieces{"123", "456", "7"}));
}

TEST(PreTokenizerNames, UnknownNameListsTheSupportedOnes) {
  try {
    PreTokenizer::for_name("llama-bpe");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("'llama-bpe'"), std::string::npos) << message;
    EXPECT_NE(
        message.find("deepseek-v3, deepseek-llm, deepseek-coder, qwen2, gpt-4o, glm4, kimi-k2"),
        std::string::npos)
        << message;
  }
}

}  // namespace
}  // namespace tandem
