#include <cmath>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/case_result.h"
#include "core/cost.h"
#include "core/json_capped.h"
#include "core/op_case.h"
#include "core/outcome.h"
#include "core/progress.h"
#include "core/result.h"
#include "core/sha256.h"
#include "core/text_safety.h"
#include "tests/support/case_builder.h"

namespace coverage {
namespace {

using testing::MakeCase;
using testing::MmCase;
using testing::TensorArg;

Status FailsWith(StatusCode code) { return Status(code, "boom"); }

Status Chain(bool fail) {
  COV_RETURN_IF_ERROR(fail ? FailsWith(StatusCode::kIoError) : Status::Ok());
  return Status::InvalidArgument("reached the end");
}

Result<int> Half(int v) {
  if (v % 2) return Status::InvalidArgument("odd: " + std::to_string(v));
  return v / 2;
}

Result<int> Quarter(int v) {
  COV_ASSIGN_OR_RETURN(int h, Half(v));
  return Half(h);
}

TEST(Status, ReturnIfErrorPropagatesTheFirstFailure) {
  EXPECT_EQ(Chain(true).code(), StatusCode::kIoError);
  EXPECT_EQ(Chain(false).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(Status::NotFound("x").WithContext("loading y").ToString(), "NotFound: loading y: x");
}

TEST(Result, HoldsAValueOrAnError) {
  EXPECT_EQ(*Quarter(8), 2);
  auto odd = Quarter(6);
  ASSERT_FALSE(odd.has_value());
  EXPECT_EQ(odd.error().message(), "odd: 3");
  EXPECT_EQ(odd.value_or(-1), -1);
}

TEST(Sha256, MatchesPublishedTestVectors) {
  EXPECT_EQ(Sha256Hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(Sha256Hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(Sha256Hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
}

TEST(Outcome, NamesRoundTripAndFailuresAreClassified) {
  for (Outcome o : kAllOutcomes) EXPECT_EQ(OutcomeFromName(OutcomeName(o)), o);
  EXPECT_FALSE(OutcomeFromName("nope").has_value());
  EXPECT_FALSE(IsUnexpectedFailure(Outcome::kPass));
  EXPECT_FALSE(IsUnexpectedFailure(Outcome::kSkipped));
  EXPECT_FALSE(IsUnexpectedFailure(Outcome::kExpectedFailure));
  EXPECT_TRUE(IsUnexpectedFailure(Outcome::kMismatch));
  EXPECT_TRUE(IsUnexpectedFailure(Outcome::kUnexpectedPass));
  EXPECT_TRUE(IsUnexpectedFailure(Outcome::kCrash));
}

// Note [Missing kernels]: the words PyTorch 2.13 uses when a backend has no
// kernel, each an unsupported case naming what is missing; a kernel that
// fails for another reason stays an error.
TEST(Outcome, MissingKernelsAreUnsupportedAndNamed) {
  struct Message {
    std::string text;
    std::string missing;
  };
  const Message lacking[] = {
      {"Could not run 'aten::mm' with arguments from the 'PrivateUse1' backend. This could be because the operator "
       "doesn't exist for this backend, or was omitted during the selective/custom build process (if using custom "
       "build).",
       "aten::mm"},
      {"convolution_overrideable not implemented. You are likely triggering this with tensor backend other than "
       "CPU/CUDA/MKLDNN, if this is intended, please use TORCH_LIBRARY_IMPL to override this function ",
       "convolution_overrideable"},
      {"convolution_backward_overrideable: You are likely triggering this with tensor backend other than "
       "CPU/CUDA/MKLDNN, if this is intended, please use TORCH_LIBRARY_IMPL to override this function ",
       "convolution_backward_overrideable"},
      {"\"abs_cpu\" not implemented for 'Int'", "abs_cpu for 'Int'"},
      {"derivative for aten::_weight_int4pack_mm is not implemented", "aten::_weight_int4pack_mm"},
      {"NotImplementedError: The operator 'aten::nonzero' is not currently implemented for the device", ""},
      {"dtype torch.float8_e4m3fn is not supported on this device", ""},
  };
  for (const Message& m : lacking) {
    EXPECT_TRUE(LooksUnsupported(m.text)) << m.text;
    EXPECT_EQ(MissingKernel(m.text), m.missing) << m.text;
  }
  for (const char* text : {"injected error in aten::mul.Tensor", "Expected all tensors to be on the same device",
                           "CUDA error: an illegal memory access was encountered", ""}) {
    EXPECT_FALSE(LooksUnsupported(text)) << text;
    EXPECT_EQ(MissingKernel(text), "") << text;
  }
}

OpCase RichCase() {
  OpCase c = MakeCase("aten::index_put_", "", {});
  TensorSpec strided = testing::Spec(DType::kBFloat16, {4, 8});
  strided.strides = {1, 4};  // transposed
  c.args.push_back(TensorArg("self", strided));
  Argument list;
  list.name = "indices";
  list.kind = Argument::Kind::kTensorList;
  list.tensors.push_back(testing::Spec(DType::kInt64, {3}, ValueDomain{ValueDomain::Kind::kInteger, 0, 4}));
  list.tensors.push_back(std::nullopt);
  c.args.push_back(list);
  c.args.push_back(testing::DoubleArg("value", -std::numeric_limits<double>::infinity()));
  c.args.push_back(testing::BoolArg("accumulate", true));
  c.args.push_back(testing::IntListArg("size", {2, -1}));
  c.args.push_back(testing::NoneArg("out"));
  Argument s;
  s.name = "reduce";
  s.kind = Argument::Kind::kString;
  s.s = "sum";
  c.args.push_back(s);
  Argument d;
  d.name = "scales";
  d.kind = Argument::Kind::kDoubleList;
  d.doubles = {0.5, std::numeric_limits<double>::quiet_NaN()};
  c.args.push_back(d);
  return c;
}

TEST(OpCase, CanonicalJsonRoundTripsEveryArgumentKind) {
  OpCase c = RichCase();
  auto back = OpCase::FromJson(c.ToCanonicalJson());
  ASSERT_TRUE(back.has_value()) << back.error().ToString();
  EXPECT_EQ(back->ToCanonicalJson(), c.ToCanonicalJson());
  EXPECT_EQ(back->Key(), c.Key());
  EXPECT_TRUE(std::isinf(back->args[2].d));
  EXPECT_EQ(back->args[1].tensors.size(), 2u);
  EXPECT_FALSE(back->args[1].tensors[1].has_value());
}

// Found by fuzz/op_case.cc: a shape whose element count overflows int64
// parsed, and Numel() on it was undefined behaviour.
TEST(OpCase, RefusesTensorsWhoseSizeOverflows) {
  auto c = OpCase::FromJson(
      R"({"v":1,"op":"aten::cat","overload":"","args":[{"name":"t","type":"tensor[]","items":[)"
      R"({"dtype":"f32","shape":[2,1111111111111111116,8],"strides":[128,1,16],"offset":0}]}]})");
  ASSERT_FALSE(c);
  EXPECT_EQ(c.error().code(), StatusCode::kCorruption);
  EXPECT_NE(c.error().message().find("overflows 64 bits"), std::string::npos) << c.error().message();
  TensorSpec t{.shape = {int64_t{1} << 62, 4, 0}, .strides = {0, 0, 0}};
  EXPECT_FALSE(t.SizesFit());  // Numel() multiplies in order, so the last zero does not save it
  t.shape = {4, int64_t{1} << 40};
  t.strides = {int64_t{1} << 40, 1};
  EXPECT_TRUE(t.SizesFit());
  EXPECT_EQ(t.StorageNumel(), int64_t{1} << 42);
  t.strides = {-5, 1};  // negative strides do not extend the storage
  EXPECT_TRUE(t.SizesFit());
}

TEST(OpCase, KeyIsStableAndSensitiveToEveryDimension) {
  OpCase a = MmCase(512, 2048, 5632);
  EXPECT_EQ(a.Key(), MmCase(512, 2048, 5632).Key());
  EXPECT_EQ(a.Key().size(), 16u);
  EXPECT_NE(a.Key(), MmCase(512, 2048, 5633).Key());
  EXPECT_NE(a.Key(), MmCase(512, 2048, 5632, DType::kBFloat16).Key());
  OpCase strided = a;
  strided.args[1].tensor.strides = {1, 2048};
  EXPECT_NE(a.Key(), strided.Key());
}

TEST(OpCase, ParsingIgnoresKeyOrderAndWhitespace) {
  const std::string text = R"({ "args": [ {"type":"int","value":3,"name":"dim"} ],
                                "overload": "int", "op": "aten::softmax", "v": 1 })";
  auto c = OpCase::FromJson(text);
  ASSERT_TRUE(c.has_value()) << c.error().ToString();
  EXPECT_EQ(c->ToCanonicalJson(), R"({"args":[{"name":"dim","type":"int","value":3}],"op":"aten::softmax","overload":"int","v":1})");
}

TEST(OpCase, BadJsonNamesTheField) {
  auto bad_dtype = OpCase::FromJson(
      R"({"v":1,"op":"aten::mm","overload":"","args":[{"name":"self","type":"tensor","tensor":{"dtype":"f33","shape":[2],"strides":[1]}}]})");
  ASSERT_FALSE(bad_dtype.has_value());
  EXPECT_NE(bad_dtype.error().message().find("args[0] (self).tensor.dtype"), std::string::npos)
      << bad_dtype.error().message();
  EXPECT_NE(bad_dtype.error().message().find("f33"), std::string::npos);
  auto bad_version = OpCase::FromJson(R"({"v":99,"op":"aten::mm","args":[]})");
  ASSERT_FALSE(bad_version.has_value());
  EXPECT_NE(bad_version.error().message().find("version 99"), std::string::npos);
  EXPECT_FALSE(OpCase::FromJson("{not json").has_value());
  auto wrong_type = OpCase::FromJson(
      R"({"v":1,"op":"aten::mm","overload":"","args":[{"name":"self","type":"tensor","tensor":{"dtype":"f32","shape":[2],"strides":[1],"offset":"0"}}]})");
  ASSERT_FALSE(wrong_type.has_value());
  EXPECT_NE(wrong_type.error().message().find("offset: expected a whole number"), std::string::npos)
      << wrong_type.error().message();
  EXPECT_FALSE(OpCase::FromJson(R"({"v":"1","op":"aten::mm"})").has_value());
  EXPECT_FALSE(OpCase::FromJson(R"({"v":1,"op":"aten::mm","overload":3,"args":[]})").has_value());
  auto mismatch = OpCase::FromJson(
      R"({"v":1,"op":"aten::mm","overload":"","args":[{"name":"self","type":"tensor","tensor":{"dtype":"f32","shape":[2,3],"strides":[1]}}]})");
  ASSERT_FALSE(mismatch.has_value());
  EXPECT_NE(mismatch.error().message().find("strides"), std::string::npos);
}

TEST(OpCase, SummaryIsReadable) {
  OpCase c = MmCase(8, 16, 32);
  c.args[1].tensor.strides = {1, 16};
  EXPECT_EQ(c.Summary(), "aten::mm(f32[8,16], f32[16,32]{s=1,16})");
  EXPECT_EQ(testing::AddCase({4}).Summary(), "aten::add.Tensor(f32[4], f32[4], alpha=1)");
}

TEST(TensorSpec, StorageNumelCoversStridesAndOffset) {
  TensorSpec t = testing::Spec(DType::kFloat32, {4, 8});
  EXPECT_EQ(t.StorageNumel(), 32);
  EXPECT_TRUE(t.IsContiguous());
  t.strides = {0, 1};  // expanded along dim 0
  EXPECT_EQ(t.StorageNumel(), 8);
  EXPECT_FALSE(t.IsContiguous());
  t.storage_offset = 5;
  EXPECT_EQ(t.StorageNumel(), 13);
}

TEST(CaseResult, JsonRoundTripKeepsMetricsAndTiming) {
  CaseResult r;
  r.outcome = Outcome::kMismatch;
  r.error = "3 of 4 elements";
  r.max_abs_err = 0.5;
  r.error_ratio = std::numeric_limits<double>::infinity();
  r.warm_us = 12.5;
  r.timing.backend_us = 40;
  r.timing.total_us = 100;
  auto back = CaseResult::FromJson(r.ToJson());
  ASSERT_TRUE(back.has_value()) << back.error().ToString();
  EXPECT_EQ(back->outcome, Outcome::kMismatch);
  EXPECT_EQ(back->error, r.error);
  EXPECT_DOUBLE_EQ(*back->max_abs_err, 0.5);
  EXPECT_TRUE(std::isinf(*back->error_ratio));
  EXPECT_FALSE(back->cosine.has_value());
  EXPECT_DOUBLE_EQ(back->timing.total_us, 100);
  EXPECT_FALSE(back->warm_spread_us.has_value());
  EXPECT_TRUE(back->counters.empty());
}

// Found by fuzz/worker_protocol.cc: members of another type made nlohmann's
// value() throw out of FromJson, which reads what a worker sends.
TEST(CaseResult, MemberOfAnotherTypeIsCorruptionNotAnException) {
  for (const char* text : {R"({"outcome": "pass", "error": 3})", R"({"outcome": 1})",
                           R"({"outcome": "pass", "timing": {"total_us": "slow"}})",
                           R"({"outcome": "pass", "attempts": "two"})", R"({"outcome": "pass", "flaky": 1})",
                           R"({"outcome": "pass", "detail": 3})", R"({"outcome": "pass", "detail": [1]})",
                           // fuzz_worker_protocol: a float for an integer was converted with a cast (undefined)
                           R"({"outcome": "pass", "attempts": 9.22337e+19})", R"({"outcome": "pass", "attempts": 2.5})",
                           R"({"outcome": "pass", "attempts": 0})",
                           R"({"outcome": "pass", "attempts": 18446744073709551615})"}) {
    auto r = CaseResult::FromJson(text);
    ASSERT_FALSE(r) << text;
    EXPECT_EQ(r.error().code(), StatusCode::kCorruption) << text;
  }
}

TEST(CaseResult, JsonRoundTripKeepsWarmSpreadFastestCallAndCounters) {
  CaseResult r;
  r.warm_spread_us = 3.25;
  r.warm_min_us = 17.5;
  r.counters = {{"compiles", 1}, {"cache_hits", 3}, {"fallback:aten::mm", 4}, {"bytes_allocated", int64_t{1} << 40}};
  auto back = CaseResult::FromJson(r.ToJson());
  ASSERT_TRUE(back.has_value()) << back.error().ToString();
  EXPECT_DOUBLE_EQ(*back->warm_spread_us, 3.25);
  EXPECT_DOUBLE_EQ(*back->warm_min_us, 17.5);
  EXPECT_EQ(back->counters, r.counters);
  EXPECT_FALSE(CaseResult::FromJson(R"({"outcome": "pass", "counters": {"compiles": 1.5}})").has_value());
  EXPECT_FALSE(CaseResult::FromJson(R"({"outcome": "pass", "counters": [1]})").has_value());
}

// The unit stage runs its largest cases first: the estimate of the time left
// follows the share of the work done, not the count of cases.
TEST(Progress, TheEstimateFollowsTheShareOfWorkDoneWhenGiven) {
  auto line_for = [](double work_done) {
    ::testing::internal::CaptureStderr();
    Progress p("job", 10, /*enabled=*/true, /*log_every_s=*/0.0);
    std::this_thread::sleep_for(std::chrono::milliseconds(1100));
    p.Update(5, "note", work_done);
    p.Finish();
    return ::testing::internal::GetCapturedStderr();
  };
  const std::string by_count = line_for(-1), by_work = line_for(0.1);
  EXPECT_NE(by_count.find("[5/10  50%]"), std::string::npos) << by_count;
  EXPECT_NE(by_count.find("~1s left"), std::string::npos) << by_count;   // 1.1 s for half the cases
  EXPECT_NE(by_work.find("[5/10  50%]"), std::string::npos) << by_work;
  EXPECT_NE(by_work.find("~10s left"), std::string::npos) << by_work;   // 1.1 s for a tenth of the work
}

}  // namespace
}  // namespace coverage

TEST(RawJsonMember, KeepsTheValueAsWrittenPythonLiteralsIncluded) {
  const std::string line =
      R"({"id": "a/b", "note": "x, } ] \" y", "config": {"time_step_limit": [0.0, Infinity], "n": {"a": "}"}} , "z": 1})";
  using coverage::ParseJsonCapped;
  using coverage::RawJsonMember;
  ASSERT_TRUE(ParseJsonCapped(line, {.python_literals = true}).has_value());
  auto config = RawJsonMember(line, "config");
  ASSERT_TRUE(config.has_value());
  EXPECT_EQ(*config, R"({"time_step_limit": [0.0, Infinity], "n": {"a": "}"}})");
  EXPECT_EQ(RawJsonMember(line, "id").value_or(""), "\"a/b\"");
  EXPECT_EQ(RawJsonMember(line, "z").value_or(""), "1");
  EXPECT_FALSE(RawJsonMember(line, "a").has_value());  // nested members are not top-level ones
  EXPECT_FALSE(RawJsonMember(line, "missing").has_value());
  EXPECT_FALSE(RawJsonMember("[1, 2]", "config").has_value());
  EXPECT_FALSE(RawJsonMember(R"({"config": [1, 2)", "config").has_value());
}

namespace coverage {
namespace {

// The unit stage's memory cap: both sides' inputs and outputs, and the fp64
// golden scaled from the smallest floating element size.
TEST(EstimateReplayBytes, CountsBothSidesAndTheGoldenAtItsWidth) {
  EXPECT_DOUBLE_EQ(EstimateReplayBytes(testing::MmCase(8, 8, 8), 768.0), 5 * 768.0);                       // f32: golden 2x
  EXPECT_DOUBLE_EQ(EstimateReplayBytes(testing::MmCase(8, 8, 8, DType::kBFloat16), 384.0), 7 * 384.0);   // bf16: 4x
  EXPECT_DOUBLE_EQ(EstimateReplayBytes(testing::AddCase({8}, DType::kInt64), 192.0), 3 * 192.0);          // no golden
}

TEST(RunId, LettersDigitsDotsDashesAndUnderscoresOnly) {
  EXPECT_TRUE(CheckRunId("main-20261205T064542Z-unit").ok());
  EXPECT_TRUE(CheckRunId("r1.2_b").ok());
  EXPECT_TRUE(CheckRunId(std::string(kMaxRunIdLength, 'a')).ok());
  // Each of these was accepted once: a path, a newline, an option, a quote.
  for (const std::string& bad : std::vector<std::string>{"../../escaped", "a/b", "line\nbreak", "--run", ".hidden", "..", "q'; DELETE FROM results; --",
                                std::string(), std::string(kMaxRunIdLength + 1, 'a'), std::string("nul\0x", 5)}) {
    Status s = CheckRunId(bad, "--run");
    EXPECT_FALSE(s.ok()) << bad;
    EXPECT_NE(s.message().find("--run"), std::string::npos) << s.message();
  }
  EXPECT_NE(CheckRunId("line\nbreak").message().find("a newline"), std::string::npos);
  EXPECT_NE(CheckRunId(std::string(5000, 'x')).message().find("5000"), std::string::npos);
}

// Note [Terminal-safe text]: escapes, NULs, line breaks and bytes that are
// not UTF-8 become visible \xNN; UTF-8 text is kept; long text is cut.
TEST(TextSafety, TerminalSafeTextCannotSteerTheTerminal) {
  EXPECT_EQ(TerminalSafe("meta-llama/Llama-3.1-8B"), "meta-llama/Llama-3.1-8B");
  EXPECT_EQ(TerminalSafe("\x1b[31mred\x1b[0m"), "\\x1b[31mred\\x1b[0m");
  EXPECT_EQ(TerminalSafe(std::string("a\0b\r\nc\x7f", 7)), "a\\x00b\\x0d\\x0ac\\x7f");
  EXPECT_EQ(TerminalSafe("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80"), "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80");
  EXPECT_EQ(TerminalSafe("\xc2\x9b" "2J"), "\\xc2\\x9b2J");  // C1 CSI: a terminal would act on it
  EXPECT_EQ(TerminalSafe("\xff\xc0\xaf\xed\xa0\x80"), "\\xff\\xc0\\xaf\\xed\\xa0\\x80");
  EXPECT_EQ(TerminalSafe("abcdef", 3), "abc...");
  std::string junk;
  for (int i = 0; i < 1 << 16; ++i) junk += static_cast<char>(i * 131 % 256);
  const std::string shown = TerminalSafe(junk, 120);
  EXPECT_LE(shown.size(), 4 * 120 + 3);
  for (char c : shown) EXPECT_GE(static_cast<unsigned char>(c), 0x20) << "a control byte got through";
}

TEST(Quoting, ShellWordsAndSqlLiteralsSurvivePasting) {
  EXPECT_EQ(ShellQuote("out/main.db"), "out/main.db");
  EXPECT_EQ(ShellQuote("my registry.db"), "'my registry.db'");
  EXPECT_EQ(ShellQuote(""), "''");
  EXPECT_EQ(ShellQuote("a'b"), "'a'\\''b'");
  EXPECT_EQ(ShellQuote("$(rm -rf ~)"), "'$(rm -rf ~)'");
  EXPECT_EQ(SqlQuote("pm"), "'pm'");
  EXPECT_EQ(SqlQuote("q'; DELETE FROM results; --"), "'q''; DELETE FROM results; --'");
}

}  // namespace
// Worker messages carry records as JSON values (Note [Test stages] in
// apps/test_stages.h): one serializer each, the value and the text agree.
TEST(Records, AnOpCaseAndACaseResultTravelAsJsonValues) {
  const OpCase c = testing::MmCase(2, 3, 4);
  EXPECT_EQ(c.ToJsonValue().dump(), c.ToCanonicalJson());
  auto back = OpCase::FromJsonValue(c.ToJsonValue());
  ASSERT_TRUE(back.has_value()) << back.error().ToString();
  EXPECT_EQ(back->Key(), c.Key());
  EXPECT_FALSE(OpCase::FromJsonValue(nlohmann::json::array()).has_value());

  CaseResult r;
  r.outcome = Outcome::kMismatch;
  r.detail_json = R"({"golden":true,"outputs":[{"outcome":"mismatch","output":0}]})";  // as nlohmann writes it
  const nlohmann::json value = r.ToJsonValue();
  ASSERT_TRUE(value["detail"].is_object()) << value.dump();  // a value, not JSON text in a string
  auto again = CaseResult::FromJsonValue(value);
  ASSERT_TRUE(again.has_value()) << again.error().ToString();
  EXPECT_EQ(again->detail_json, r.detail_json);
  EXPECT_EQ(again->outcome, Outcome::kMismatch);
}

}  // namespace coverage
