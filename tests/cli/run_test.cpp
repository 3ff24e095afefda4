// `tandem run`, `tokenize` and `chat` end to end on the fixture models.
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "cli_runner.h"
#include "test_support.h"

namespace tandem {
namespace {

std::string model(const char* name) { return test::fixture(name).string(); }

nlohmann::json reference(const char* name) {
  return nlohmann::json::parse(test::read_text_file(test::fixture(name)));
}

TEST(Run, GreedyContinuationIsTheReferenceText) {
  const auto ref = reference("micro-v2-F32.p1.json");
  const CliResult r = run_tandem("run " + model("micro-v2-F32.gguf") + " -p " + shell_quote(ref["prompt"].get<std::string>()) +
                                 " -n 32 --temp 0 -t 2");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output.substr(0, ref["generated_text"].get<std::string>().size()), ref["generated_text"]);
  EXPECT_NE(r.output.find("prompt: 19 tokens"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("decode: 32 tokens"), std::string::npos) << r.output;
}

// --mlock reads the whole file into locked memory first (a progress line says so) and changes
// nothing else; where the lock is refused (memlock limit) the run warns and goes on.
TEST(Run, MlockLocksTheModelAndKeepsTheOutput) {
  const auto ref = reference("micro-v2-F32.p1.json");
  const CliResult r = run_tandem("run " + model("micro-v2-F32.gguf") + " -p " + shell_quote(ref["prompt"].get<std::string>()) +
                                 " -n 32 --temp 0 -t 2 --mlock");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const bool locked = r.output.find("locking the model in RAM: 100.0%") != std::string::npos;
  const bool refused = r.output.find("warning: --mlock: cannot lock") != std::string::npos;
  EXPECT_TRUE(locked != refused) << r.output;
  EXPECT_NE(r.output.find(ref["generated_text"].get<std::string>()), std::string::npos) << r.output;
}

TEST(Run, SameSeedSameTextOtherSeedOtherText) {
  const std::string base = "run " + model("micro-v3-F32.gguf") + " -p 'Once upon a time' -n 24 --temp 1 -t 2 ";
  const CliResult a = run_tandem(base + "--seed 5"), b = run_tandem(base + "--seed 5"), c = run_tandem(base + "--seed 6");
  ASSERT_EQ(a.exit_code, 0) << a.output;
  auto text = [](const CliResult& r) { return r.output.substr(0, r.output.find("\n\nprompt:")); };
  EXPECT_EQ(text(a), text(b));
  EXPECT_NE(text(a), text(c));
}

TEST(Run, GenerationStopsAtAFullContext) {
  const CliResult r = run_tandem("run " + model("micro-v2-F32.gguf") + " -p 'The quick brown fox' --ctx 12 -n 50 --temp 0");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("| length"), std::string::npos) << r.output;
}

TEST(Tokenize, PromptTokensMatchTheFixture) {
  for (const char* name : {"micro-v2-F32.p1.json", "micro-v2-F32.p2.json"}) {
    const auto ref = reference(name);
    const CliResult r = run_tandem("tokenize --json " + model("micro-v2-F32.gguf") + " " +
                                   shell_quote(ref["prompt"].get<std::string>()));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_EQ(nlohmann::json::parse(r.output)["tokens"], ref["prompt_tokens"]) << name;
  }
}

TEST(Tokenize, SpecialTokensOnlyWhenAsked) {
  const std::string text = "'<｜User｜>hi'";
  const auto plain = nlohmann::json::parse(run_tandem("tokenize --json --no-bos " + model("micro-v2-F32.gguf") + " " + text).output);
  const auto special = nlohmann::json::parse(
      run_tandem("tokenize --json --no-bos --special " + model("micro-v2-F32.gguf") + " " + text).output);
  EXPECT_EQ(special["tokens"][0], 4099);
  EXPECT_GT(plain["tokens"].size(), special["tokens"].size());
}

TEST(Chat, TwoTurnsFromStdinThenEndOfInputQuits) {
  const CliResult r = run_tandem("chat " + model("micro-v3-F32.gguf") + " -n 8 --temp 0 -t 2", "Hello\\nAnd again\\n");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("deepseek3 template"), std::string::npos) << r.output;
}

// The slot keeps the conversation between turns: the second turn's prompt starts with the first
// turn's prompt and reply, which are not evaluated again.
TEST(Chat, TheSecondTurnEvaluatesOnlyWhatChanged) {
  const CliResult r = run_tandem("chat " + model("micro-v3-F32.gguf") + " -n 8 --temp 0 -t 2 -v",
                                 "Hello\nAnd again\n");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::vector<std::array<int, 3>> turns;  // prompt tokens, evaluated, cached
  for (size_t at = r.output.find("[prompt "); at != std::string::npos;
       at = r.output.find("[prompt ", at + 1)) {
    std::array<int, 3> t{};
    ASSERT_EQ(std::sscanf(r.output.c_str() + at, "[prompt %d tokens, %d evaluated, %d cached",
                          &t[0], &t[1], &t[2]),
              3)
        << r.output;
    turns.push_back(t);
  }
  ASSERT_EQ(turns.size(), 2u) << r.output;
  EXPECT_EQ(turns[0][1], turns[0][0]);  // the first turn evaluates its whole prompt
  EXPECT_GE(turns[1][2], turns[0][0]);  // the second reuses at least the first turn's prompt
  EXPECT_EQ(turns[1][1] + turns[1][2], turns[1][0]);
}

}  // namespace
}  // namespace tandem
