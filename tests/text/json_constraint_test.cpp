// The JSON recognizer of constrained output: documents of the schema pass byte by byte, what the
// schema or JSON forbids fails at the first byte that makes it so, and a random writer that only
// ever picks bytes the recognizer allows within a byte budget always ends with a complete,
// parseable document of the schema inside that budget (so min_remaining neither under- nor
// over-counts where it matters).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <random>
#include <string>

#include "text/json_constraint.h"

namespace tandem {
namespace {

using Kind = JsonSchemaNode::Kind;

// {"name": string (1-8 chars), "age": integer, "score": number, "tags": [enum "a"|"bc"|1|10, 0-3 of
// them], "ok": boolean, "extra": {"note": null | any object}}; name and age required.
JsonSchema person() {
  JsonSchema s;
  const int32_t name = s.add({.kind = Kind::String, .min_length = 1, .max_length = 8});
  const int32_t age = s.add({.kind = Kind::Integer});
  const int32_t score = s.add({.kind = Kind::Number});
  const int32_t tag = s.add({.kind = Kind::Literals, .literals = {"\"a\"", "\"bc\"", "1", "10"}});
  const int32_t tags = s.add({.kind = Kind::Array, .items = tag, .min_items = 0, .max_items = 3});
  const int32_t ok = JsonSchema::kTrueFalse;
  const int32_t note =
      s.add({.kind = Kind::Object, .names = {"note"}, .properties = {JsonSchema::kNull}});
  s.add({.kind = Kind::Object,
         .names = {"name", "age", "score", "tags", "ok", "extra"},
         .properties = {name, age, score, tags, ok, note},
         .required = 0b11});
  return s;
}

bool accepts(const JsonSchema& schema, std::string_view text) {
  JsonRecognizer r(schema);
  return r.feed(text) && r.complete();
}

// The length of the longest prefix of `text` the recognizer takes.
size_t accepted_prefix(const JsonSchema& schema, std::string_view text) {
  JsonRecognizer r(schema);
  for (size_t i = 0; i < text.size(); ++i)
    if (!r.feed(text[i])) return i;
  return text.size();
}

TEST(JsonConstraint, DocumentsOfTheSchemaPass) {
  const JsonSchema s = person();
  EXPECT_TRUE(accepts(s, R"({"name":"Ann","age":41})"));
  EXPECT_TRUE(accepts(s, R"({"age":-7,"name":"Bo","score":1.5e-3,"tags":["a",10,1,],"ok":true})") ==
              false);
  EXPECT_TRUE(accepts(s, R"({"age":-7,"name":"Bo","score":1.5e-3,"tags":["a",10,1],"ok":true})"));
  EXPECT_TRUE(
      accepts(s, R"({"name":"\u00e9\n","age":0,"tags":[],"extra":{"note":null},"ok":false})"));
  EXPECT_TRUE(accepts(s, "{\"name\":\"caf\xc3\xa9\",\"age\":3}"));
  EXPECT_TRUE(accepts(JsonSchema::any_object(), R"({"a":[1,{"b":null},"x",true,-0.5],"":{}})"));
}

TEST(JsonConstraint, WhatTheSchemaOrJsonForbidsFailsAtItsFirstByte) {
  const JsonSchema s = person();
  EXPECT_EQ(accepted_prefix(s, R"( {"name":"A","age":1})"), 0u);          // no whitespace
  EXPECT_EQ(accepted_prefix(s, R"({"nam":"A","age":1})"), 5u);            // not a property
  EXPECT_EQ(accepted_prefix(s, R"({"age":1,"age":2,"name":"A"})"), 10u);  // written twice
  EXPECT_EQ(accepted_prefix(s, R"({"name":"A"})"), 11u);                  // age is required
  EXPECT_EQ(accepted_prefix(s, R"({"name":"","age":1})"), 9u);            // at least one character
  EXPECT_EQ(accepted_prefix(s, R"({"name":"123456789","age":1})"), 17u);  // at most eight
  EXPECT_EQ(accepted_prefix(s, R"({"name":"A","age":1.5})"), 19u);        // an integer
  EXPECT_EQ(accepted_prefix(s, R"({"name":"A","age":01})"), 19u);         // no leading zero
  EXPECT_EQ(accepted_prefix(s, R"({"name":"A","age":1,"tags":["b"]})"), 30u);  // not in the enum
  EXPECT_EQ(accepted_prefix(s, R"({"name":"A","age":1,"tags":[1,1,1,1]})"), 33u);  // three at most
  EXPECT_EQ(accepted_prefix(s, R"({"name":"A","age":1,"score":1e123})"), 32u);  // a finite double
  EXPECT_EQ(accepted_prefix(s, "{\"name\":\"\x01\""), 9u);    // control characters are escaped
  EXPECT_EQ(accepted_prefix(s, "{\"name\":\"\xc3(\""), 10u);  // a broken UTF-8 character
  EXPECT_EQ(accepted_prefix(s, "{\"name\":\"\xe0\x83\xae\""), 10u);  // an overlong form
  EXPECT_EQ(accepted_prefix(s, "{\"name\":\"\xed\xa0\x80\""), 10u);  // a surrogate
  EXPECT_EQ(accepted_prefix(s, R"({"name":"A\q"})"), 11u);    // not an escape
  JsonRecognizer done(s);
  ASSERT_TRUE(done.feed(R"({"name":"A","age":1})"));
  EXPECT_TRUE(done.complete());
  EXPECT_FALSE(done.feed('}'));  // nothing after the document
}

TEST(JsonConstraint, ANumberOrLiteralEndsWhereTheNextByteIsNotItsOwn) {
  const JsonSchema s = person();
  JsonRecognizer r(s);
  ASSERT_TRUE(r.feed(R"({"name":"A","age":12)"));
  EXPECT_FALSE(r.complete());
  EXPECT_EQ(r.min_remaining(), 1);       // '}'
  ASSERT_TRUE(r.feed(R"(,"tags":[1)"));  // 1, or the start of 10
  EXPECT_EQ(r.min_remaining(), 2);       // "]}"
  EXPECT_TRUE(r.feed("0]}"));
  EXPECT_TRUE(r.complete());
  JsonSchema number;
  number.add({.kind = Kind::Number});
  JsonRecognizer n(number);
  EXPECT_TRUE(n.feed("-3"));
  EXPECT_TRUE(n.complete());  // a document of one number may end after any digit
  EXPECT_TRUE(n.feed(".25"));
  EXPECT_TRUE(n.complete());
}

// Writes a document one byte at a time, each byte drawn at random among those the recognizer
// takes and after which the budget still covers min_remaining; returns the document.
std::string random_document(const JsonSchema& schema, int64_t budget, std::mt19937& rng) {
  static const std::string alphabet = [] {
    std::string a;
    for (int c = 0x20; c < 0x7f; ++c) a += char(c);
    for (int c = 0x80; c < 0x100; ++c) a += char(c);  // every byte, valid UTF-8 or not
    return a;
  }();
  JsonRecognizer r(schema);
  std::string out;
  while (!r.complete()) {
    std::vector<char> allowed;
    for (char c : alphabet) {
      JsonRecognizer trial = r;
      if (!trial.feed(c)) continue;
      const int64_t left = budget - int64_t(out.size()) - 1;
      if (trial.complete() || trial.min_remaining() <= left) allowed.push_back(c);
    }
    if (allowed.empty()) {
      ADD_FAILURE() << "no byte can continue " << out << " within " << budget;
      return out;
    }
    const char c = allowed[std::uniform_int_distribution<size_t>(0, allowed.size() - 1)(rng)];
    EXPECT_TRUE(r.feed(c));
    out += c;
  }
  return out;
}

TEST(JsonConstraint, ARandomWriterAlwaysFinishesAValidDocumentWithinItsBudget) {
  const JsonSchema s = person();
  std::mt19937 rng(5);
  const int64_t shortest = JsonRecognizer(s).min_remaining();
  EXPECT_EQ(shortest, int64_t(std::string(R"({"name":"x","age":0})").size()));
  for (int round = 0; round < 300; ++round) {
    const int64_t budget = shortest + round % 40;
    const std::string doc = random_document(s, budget, rng);
    ASSERT_LE(int64_t(doc.size()), budget) << doc;
    const nlohmann::json j = nlohmann::json::parse(doc, nullptr, /*allow_exceptions=*/false);
    ASSERT_FALSE(j.is_discarded()) << doc;
    EXPECT_TRUE(j.contains("name") && j["name"].is_string() && j.contains("age") &&
                j["age"].is_number_integer())
        << doc;
  }
  for (int round = 0; round < 100; ++round) {
    const std::string doc = random_document(JsonSchema::any_object(), 2 + round, rng);
    EXPECT_TRUE(nlohmann::json::parse(doc, nullptr, false).is_object()) << doc;
  }
}

}  // namespace
}  // namespace tandem
