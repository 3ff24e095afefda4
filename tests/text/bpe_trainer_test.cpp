#include "text/bpe_trainer.h"

#include <gtest/gtest.h>

namespace tandem {
namespace {

TEST(BpeTrainer, MergesTheMostFrequentPairFirst) {
  const BpeVocabulary vocab = train_byte_level_bpe("aaab aaab aaab xy", 10);
  ASSERT_FALSE(vocab.merges.empty());
  EXPECT_EQ(vocab.merges[0], "a a");
  EXPECT_EQ(vocab.merged_tokens[0], "aa");
}

TEST(BpeTrainer, WordsKeepTheirLeadingSpace) {
  const BpeVocabulary vocab = train_byte_level_bpe("the the the the", 20);
  bool has_space_the = false;
  for (const std::string& token : vocab.merged_tokens) has_space_the |= token == "Ġthe";
  EXPECT_TRUE(has_space_the);
}

TEST(BpeTrainer, StopsWhenNoPairRepeatsAndRespectsTheLimit) {
  EXPECT_TRUE(train_byte_level_bpe("abcdefg", 100).merges.empty());
  EXPECT_EQ(train_byte_level_bpe("hello hello hello world world world", 2).merges.size(), 2u);
}

TEST(BpeTrainer, IsDeterministic) {
  const std::string text = "one two three one two three four four";
  EXPECT_EQ(train_byte_level_bpe(text, 50).merges, train_byte_level_bpe(text, 50).merges);
}

}  // namespace
}  // namespace tandem
