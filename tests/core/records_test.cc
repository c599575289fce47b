// The shared field reader (core/json_fields.h) and the model item's record
// (core/model_item.h): what they accept, and that every wrong member is an
// error naming its source and the member.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include <nlohmann/json.hpp>

#include "core/case_result.h"
#include "core/input_rules.h"
#include "core/json_fields.h"
#include "core/model_item.h"
#include "core/shipped_rules.h"
#include "tests/support/case_builder.h"

namespace coverage {
namespace {

using nlohmann::json;

TEST(JsonFields, AbsentMembersLeaveDefaultsAndPresentOnesAreRead) {
  const json j = json::parse(R"({"n": 7, "x": 2.5, "inf": "inf", "s": "text", "b": true, "ints": [1, -2],
                                 "names": ["a"], "o": "crash", "os": ["pass", "timeout"], "obj": {"k": 1}})");
  const JsonFields f(j, "thing");
  int n = -1, absent = 42;
  double x = 0, inf = 0;
  std::string s;
  bool b = false;
  std::vector<int64_t> ints;
  std::vector<std::string> names;
  Outcome o = Outcome::kPass;
  std::vector<Outcome> os;
  json obj;
  ASSERT_TRUE(f.Int("n", &n).ok());
  ASSERT_TRUE(f.Int("missing", &absent).ok());
  ASSERT_TRUE(f.Double("x", &x).ok());
  ASSERT_TRUE(f.Double("inf", &inf).ok());
  ASSERT_TRUE(f.String("s", &s).ok());
  ASSERT_TRUE(f.Bool("b", &b).ok());
  ASSERT_TRUE(f.Ints("ints", &ints).ok());
  ASSERT_TRUE(f.Strings("names", &names).ok());
  ASSERT_TRUE(f.OutcomeField("o", &o).ok());
  ASSERT_TRUE(f.Outcomes("os", &os).ok());
  ASSERT_TRUE(f.Object("obj", &obj).ok());
  EXPECT_EQ(n, 7);
  EXPECT_EQ(absent, 42);
  EXPECT_EQ(x, 2.5);
  EXPECT_TRUE(std::isinf(inf));
  EXPECT_EQ(s, "text");
  EXPECT_TRUE(b);
  EXPECT_EQ(ints, (std::vector<int64_t>{1, -2}));
  EXPECT_EQ(names, (std::vector<std::string>{"a"}));
  EXPECT_EQ(o, Outcome::kCrash);
  EXPECT_EQ(os, (std::vector<Outcome>{Outcome::kPass, Outcome::kTimeout}));
  EXPECT_EQ(obj, json({{"k", 1}}));
}

TEST(JsonFields, WrongTypesAndRangesAreErrorsNamingSourceAndMember) {
  struct Bad {
    const char* text;
    const char* member;
  };
  for (const Bad& bad : {Bad{R"({"n": 2.5})", "n"}, Bad{R"({"n": 1e33})", "n"}, Bad{R"({"n": "3"})", "n"},
                         Bad{R"({"n": 4294967296})", "n"}, Bad{R"({"n": 18446744073709551615})", "n"}}) {
    int n = 0;
    const json j = json::parse(bad.text);
    const Status s = JsonFields(j, "setup", StatusCode::kInvalidArgument).Int("n", &n);
    ASSERT_FALSE(s.ok()) << bad.text;
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find(std::string("setup.") + bad.member + ": expected a whole number"), std::string::npos)
        << s.message();
    EXPECT_EQ(n, 0) << "a rejected member leaves the value as it was";
  }
  const json j = json::parse(R"({"s": 1, "b": "yes", "ints": [1, 2.5], "o": "exploded", "obj": [], "x": "many"})");
  const JsonFields f(j, "case");
  std::string s;
  bool b = false;
  std::vector<int64_t> ints;
  Outcome o = Outcome::kPass;
  json obj;
  double x = 0;
  EXPECT_EQ(f.String("s", &s).message(), "case.s: expected a string, not 1");
  EXPECT_EQ(f.Bool("b", &b).message(), "case.b: expected true or false, not \"yes\"");
  EXPECT_EQ(f.Ints("ints", &ints).message(), "case.ints: expected an array of integers, found 2.5");
  EXPECT_EQ(f.OutcomeField("o", &o).message(), "case.o: expected an outcome name, not \"exploded\"");
  EXPECT_EQ(f.Object("obj", &obj).message(), "case.obj: expected a JSON object, not []");
  EXPECT_EQ(f.Double("x", &x).message(), "case.x: expected a number, not \"many\"");
  EXPECT_EQ(f.RequiredString("absent", &s).message(), "case.absent: missing");
  EXPECT_EQ(f.String("s", &s).code(), StatusCode::kCorruption);
  // Not an object at all.
  const json array = json::array();
  EXPECT_EQ(JsonFields(array, "case").String("s", &s).message(), "case: expected a JSON object");
  // The full range of a 64-bit unsigned member (a seed).
  uint64_t seed = 0;
  const json seeded = json::parse(R"({"seed": 18446744073709551615})");
  ASSERT_TRUE(JsonFields(seeded, "setup").Int("seed", &seed).ok());
  // Below the range: 0 where 1 is the least (nlohmann reads 0 as unsigned).
  const json zero = json::parse(R"({"attempts": 0})");
  int attempts = 1;
  EXPECT_FALSE(JsonFields(zero, "r").Int("attempts", &attempts, 1, 1000).ok());
  EXPECT_EQ(seed, std::numeric_limits<uint64_t>::max());
}

TEST(ModelItemResult, JsonValueRoundTripsEveryMember) {
  ModelItemResult r;
  r.item = "model.layers.0.mlp";
  r.outcome = Outcome::kMismatch;
  r.error = "output 0: max abs error 0.5";
  r.max_abs_err = 0.5;
  r.max_rel_err = std::numeric_limits<double>::infinity();
  r.cosine = 0.25;
  r.error_ratio = 12;
  r.detail = {{"first_divergent", {{"call", 3}}}};
  r.seconds = 1.5;
  r.attempts = 3;
  r.flaky = true;
  r.attempt_outcomes = {Outcome::kMismatch, Outcome::kPass, Outcome::kMismatch};
  auto back = ModelItemResult::FromJsonValue(r.ToJsonValue());
  ASSERT_TRUE(back.has_value()) << back.error().ToString();
  EXPECT_EQ(back->ToJsonValue(), r.ToJsonValue());
  EXPECT_EQ(back->item, r.item);
  EXPECT_TRUE(std::isinf(*back->max_rel_err));
  EXPECT_EQ(back->attempt_outcomes, r.attempt_outcomes);
  EXPECT_EQ(back->AttemptOutcomesText(), "mismatch,pass,mismatch");
  // No values compared: the figures stay empty through the round trip.
  ModelItemResult skipped;
  skipped.item = "*";
  skipped.outcome = Outcome::kSkipped;
  auto skipped_back = ModelItemResult::FromJsonValue(skipped.ToJsonValue());
  ASSERT_TRUE(skipped_back.has_value());
  EXPECT_FALSE(skipped_back->values_compared());
  EXPECT_FALSE(skipped_back->cosine.has_value());
}

TEST(ModelItemResult, ACorruptItemIsAnErrorNamingTheMember) {
  for (const auto& [text, expected] : std::vector<std::pair<const char*, const char*>>{
           {R"({"outcome": "pass"})", "model item.item: missing"},
           {R"({"item": "forward", "outcome": 3})", "model item.outcome: expected an outcome name, not 3"},
           {R"({"item": "forward", "outcome": "pass", "attempts": 0})", "model item.attempts: expected a whole number"},
           {R"({"item": "forward", "outcome": "pass", "detail": "text"})", "model item.detail: expected a JSON object"},
           {R"({"item": "forward", "outcome": "pass", "cosine": [1]})", "model item.cosine: expected a number"}}) {
    auto r = ModelItemResult::FromJsonValue(json::parse(text));
    ASSERT_FALSE(r.has_value()) << text;
    EXPECT_EQ(r.error().code(), StatusCode::kCorruption);
    EXPECT_NE(r.error().message().find(expected), std::string::npos) << r.error().message();
  }
}

TEST(CaseResult, CorruptMembersAreErrorsNamingTheMember) {
  for (const auto& [text, expected] : std::vector<std::pair<const char*, const char*>>{
           {R"({"error": "x"})", "case result JSON.outcome: missing"},
           {R"({"outcome": "pass", "counters": {"compiles": 1.5}})", "case result JSON.counters.compiles"},
           {R"({"outcome": "pass", "timing": {"total_us": "slow"}})", "case result JSON.timing.total_us"},
           {R"({"outcome": "pass", "attempts": 9.2e19})", "case result JSON.attempts"},
           {R"({"outcome": "pass", "attempt_outcomes": ["pass", "boom"]})", "case result JSON.attempt_outcomes"}}) {
    auto r = CaseResult::FromJsonValue(json::parse(text));
    ASSERT_FALSE(r.has_value()) << text;
    EXPECT_NE(r.error().message().find(expected), std::string::npos) << r.error().message();
  }
}

// The per-op input rules are data (configs/tolerances.json's "inputs"): the
// built-in copy parses, and a broken rule is an error naming the op and member.
TEST(InputRules, TheBuiltInRulesParseAndBrokenRulesNameTheOpAndMember) {
  EXPECT_TRUE(CheckInputRules(kShippedRulesJson, "configs/tolerances.json").ok());
  EXPECT_FALSE(BuiltInInputRules("aten::embedding").is_null());
  EXPECT_TRUE(BuiltInInputRules("aten::mm").is_null());
  for (const auto& [rules, expected] : std::vector<std::pair<const char*, const char*>>{
           {R"({"aten::gather": {"inputs": {"index": {"arg": "index", "of": "self", "dim": "rows"}}}})",
            "ops.aten::gather.inputs.index.dim: expected an integer or \"class\""},
           {R"({"aten::gather": {"inputs": {"index": {"of": "self"}}}})", "give one of 'arg' and 'list'"},
           {R"({"aten::cumsum": {"inputs": {"values": [{"arg": "self", "kind": "sorted"}]}}})",
            "ops.aten::cumsum.inputs.values[0].kind: unknown kind 'sorted'"},
           {R"({"aten::segment_reduce": {"inputs": {"values": [{"arg": "lengths", "kind": "lengths"}]}}})",
            "values[0].total: missing"},
           {R"({"aten::add.Tensor": {"inputs": {"index": {"arg": "x", "of": "self"}}}})", "without an overload"},
           {R"({"aten::gather": {"inputs": {"indexes": {}}}})", "inputs.indexes: unknown member"}}) {
    const std::string text = std::string(R"({"ops": )") + rules + "}";
    const Status s = CheckInputRules(text, "mine.json");
    ASSERT_FALSE(s.ok()) << rules;
    EXPECT_NE(s.message().find(expected), std::string::npos) << s.message();
    EXPECT_NE(s.message().find("mine.json"), std::string::npos) << s.message();
  }
}

TEST(InputRules, IndexArgumentsTakeTheWholeDimensionTheyIndex) {
  using testing::MakeCase;
  using testing::Spec;
  using testing::TensorArg;
  const ValueDomain recorded{ValueDomain::Kind::kInteger, 1, 300};
  OpCase embedding = MakeCase("aten::embedding", "", {TensorArg("weight", DType::kFloat32, {50257, 8}),
                                                      TensorArg("indices", Spec(DType::kInt64, {4}, recorded))});
  IndexRules(embedding);
  EXPECT_EQ(embedding.args[1].tensor.domain.lo, 0);
  EXPECT_EQ(embedding.args[1].tensor.domain.hi, 50257);
  // nll_loss: the class dimension, 1 for a batch of rows and 0 for one row.
  for (const auto& [shape, classes] : std::vector<std::pair<std::vector<int64_t>, int64_t>>{{{6, 11}, 11}, {{11}, 11}}) {
    OpCase nll = MakeCase("aten::nll_loss", "", {TensorArg("self", DType::kFloat32, shape),
                                                 TensorArg("target", Spec(DType::kInt64, {6}, recorded))});
    IndexRules(nll);
    EXPECT_EQ(nll.args[1].tensor.domain.hi, classes);
  }
  // gather along dim -1 of a [3, 7] self; IndexedSizes reports it per tensor argument.
  OpCase gather = MakeCase("aten::gather", "", {TensorArg("self", DType::kFloat32, {3, 7}), testing::IntArg("dim", -1),
                                                TensorArg("index", Spec(DType::kInt64, {3, 2}, recorded))});
  EXPECT_EQ(IndexedSizes(gather), (std::vector<int64_t>{0, 7}));
}

TEST(InputRules, StructuredValuesFollowTheOperandsRanks) {
  using testing::MakeCase;
  using testing::TensorArg;
  auto grouped = [](std::vector<int64_t> a, std::vector<int64_t> b) {
    return StructuredValuesOf(MakeCase("aten::_grouped_mm", "",
                                       {TensorArg("self", DType::kBFloat16, a), TensorArg("mat2", DType::kBFloat16, b),
                                        TensorArg("offs", DType::kInt32, {4})}));
  };
  EXPECT_EQ(grouped({64, 16}, {4, 16, 8}).total, 64);  // the rows of a 2-D self
  EXPECT_EQ(grouped({8, 64}, {64, 16}).total, 64);     // the shared K
  EXPECT_EQ(grouped({4, 8, 16}, {16, 48}).total, 48);  // the columns of a 2-D mat2
  const StructuredValues none = grouped({4, 8, 16}, {4, 16, 8});
  EXPECT_EQ(none.kind, StructuredValues::Kind::kNone);
  const StructuredValues offsets = grouped({64, 16}, {4, 16, 8});
  EXPECT_EQ(offsets.kind, StructuredValues::Kind::kOffsets);
  EXPECT_EQ(offsets.arg, "offs");
  EXPECT_TRUE(offsets.last_total);
  EXPECT_EQ(offsets.KeySuffix(), "|offsets64l");
  // embedding_bag: the last offset is pinned only with include_last_offset.
  for (bool last : {false, true}) {
    const StructuredValues bag = StructuredValuesOf(MakeCase(
        "aten::_embedding_bag", "",
        {TensorArg("weight", DType::kFloat32, {10, 4}), TensorArg("indices", DType::kInt64, {9}),
         TensorArg("offsets", DType::kInt64, {3}), testing::BoolArg("include_last_offset", last)}));
    EXPECT_EQ(bag.total, 9);
    EXPECT_TRUE(bag.first_zero);
    EXPECT_EQ(bag.last_total, last);
  }
}

}  // namespace
}  // namespace coverage
