#include <cmath>
#include <limits>

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "backends/backend.h"
#include "backends/backends.h"
#include "replay/call_engine.h"
#include "replay/compare.h"
#include "replay/materialize.h"
#include "replay/reference_upcast.h"
#include "replay/replay.h"
#include "tests/support/case_builder.h"
#include "tests/support/shipped_rules.h"
#include "tests/support/integer_histc_backend.h"
#include "tests/support/fake_backend.h"

namespace coverage::replay {
using namespace coverage::backends;  // backends/'s names, unqualified in these tests
namespace {

using testing::FakeBackend;
using testing::MakeCase;
using testing::TensorArg;

std::shared_ptr<Backend> Cpu() {
  BackendRegistry backends;
  RegisterCpuBackend(backends);
  return *backends.Create("cpu");
}

CaseResult RunOn(std::shared_ptr<Backend> backend, const OpCase& c, ReplayOptions options = {}) {
  ReplayExecutor executor(std::move(backend), options);
  return executor.Run(c);
}

// The inputs replay builds for case `c` on the CPU (no double copies, no
// verification), to look at what the materialize rules drew.
std::vector<c10::IValue> CpuInputs(const OpCase& c, uint64_t seed) {
  auto schema = c10::Dispatcher::singleton().findSchema({c.op, c.overload});
  EXPECT_TRUE(schema.has_value()) << c.op;
  if (!schema.has_value()) return {};
  auto m = Materialize(c, schema->schema(), seed);
  EXPECT_TRUE(m.has_value()) << m.error().message();
  if (!m.has_value()) return {};
  auto inputs = m->Build(c10::Device(c10::kCPU), /*to_double=*/false, /*verify=*/false);
  EXPECT_TRUE(inputs.has_value());
  return inputs.has_value() ? *inputs : std::vector<c10::IValue>{};
}

TEST(Replay, CpuBackendPassesWithZeroError) {
  ReplayOptions always;
  always.golden = GoldenMode::kAlways;
  CaseResult r = RunOn(Cpu(), testing::MmCase(64, 128, 32), always);
  EXPECT_EQ(r.outcome, Outcome::kPass) << r.error;
  EXPECT_DOUBLE_EQ(*r.max_abs_err, 0.0);
  EXPECT_DOUBLE_EQ(*r.mismatch_frac, 0.0);
  EXPECT_NEAR(*r.cosine, 1.0, 1e-12);
  ASSERT_TRUE(r.error_ratio.has_value());  // the golden ran
  EXPECT_DOUBLE_EQ(*r.error_ratio, 1.0);
  EXPECT_GT(*r.first_call_us, 0);
  EXPECT_TRUE(r.warm_us.has_value());
  EXPECT_GT(r.timing.ComputeUs(), 0);
}

// Program replay's parameters: the initialiser's distribution, in the
// spec's dtype, shape and strides, the same for the same stream only.
TEST(Replay, InitialisedParametersFollowTheirRuleAndStream) {
  TensorSpec spec;
  spec.dtype = DType::kFloat32;
  spec.shape = {1000, 3000};
  spec.strides = {1, 1000};  // a transposed weight
  const at::Tensor w = MakeInitialised(spec, InitRule::kNormal, 0.5, 0.02, 7);
  EXPECT_EQ(w.scalar_type(), at::kFloat);
  EXPECT_EQ(w.sizes(), at::IntArrayRef({1000, 3000}));
  EXPECT_EQ(w.strides(), at::IntArrayRef({1, 1000}));
  EXPECT_NEAR(w.mean().item<double>(), 0.5, 1e-3);
  EXPECT_NEAR(w.std().item<double>(), 0.02, 1e-3);
  // About 95% within two standard deviations, as for a normal distribution.
  const double within = (w - 0.5).abs().lt(0.04).to(at::kDouble).mean().item<double>();
  EXPECT_NEAR(within, 0.954, 0.01);
  EXPECT_TRUE(at::equal(w, MakeInitialised(spec, InitRule::kNormal, 0.5, 0.02, 7)));
  EXPECT_FALSE(at::equal(w, MakeInitialised(spec, InitRule::kNormal, 0.5, 0.02, 8)));

  const at::Tensor u = MakeInitialised(spec, InitRule::kUniform, -0.1, 0.3, 7);
  EXPECT_GE(u.min().item<double>(), -0.1);
  EXPECT_LT(u.max().item<double>(), 0.3);
  EXPECT_NEAR(u.mean().item<double>(), 0.1, 1e-3);

  // A float64 tensor holds the float32 one's values exactly (the golden's
  // leaves); a bfloat16 one holds them rounded.
  spec.dtype = DType::kFloat64;
  EXPECT_TRUE(at::equal(MakeInitialised(spec, InitRule::kNormal, 0.5, 0.02, 7), w.to(at::kDouble)));
  spec.dtype = DType::kBFloat16;
  EXPECT_TRUE(at::equal(MakeInitialised(spec, InitRule::kNormal, 0.5, 0.02, 7), w.to(at::kBFloat16)));
}

TEST(Replay, GoldenRunsOnlyWhenTheReferenceToleranceIsMissedByDefault) {
  CaseResult pass = RunOn(Cpu(), testing::MmCase(16, 16, 16));
  EXPECT_EQ(pass.outcome, Outcome::kPass);
  EXPECT_FALSE(pass.error_ratio.has_value());
  EXPECT_EQ(pass.timing.golden_us, 0);
  auto fake = std::make_shared<FakeBackend>();
  fake->add_offset["aten::mm"] = 1e-3;
  CaseResult off = RunOn(fake, testing::MmCase(16, 16, 16));
  EXPECT_EQ(off.outcome, Outcome::kMismatch);
  ASSERT_TRUE(off.error_ratio.has_value());
  EXPECT_GT(off.timing.golden_us, 0);
  EXPECT_EQ(nlohmann::json::parse(off.detail_json)["outputs"][0]["golden"], true) << off.detail_json;
  ReplayOptions never;
  never.golden = GoldenMode::kNever;
  EXPECT_FALSE(RunOn(fake, testing::MmCase(16, 16, 16), never).error_ratio.has_value());
}

TEST(Replay, ARerunOfAFailingCaseRunsOnlyTheBackendAgainAndReproducesIt) {
  auto fake = std::make_shared<FakeBackend>();
  fake->add_offset["aten::mm"] = 1e-3;
  ReplayOptions options;
  options.warm_iterations = 3;
  ReplayExecutor executor(fake, options);
  const OpCase mm = testing::MmCase(32, 32, 32);
  CaseResult first = executor.Run(mm);
  ASSERT_EQ(first.outcome, Outcome::kMismatch);
  EXPECT_GT(first.timing.reference_us, 0);
  EXPECT_GT(first.timing.golden_us, 0);
  CaseResult again = executor.RunAgain(mm);
  EXPECT_EQ(again.outcome, first.outcome);
  EXPECT_EQ(again.error, first.error);
  EXPECT_EQ(again.max_abs_err, first.max_abs_err);
  EXPECT_EQ(again.error_ratio, first.error_ratio);
  EXPECT_EQ(again.timing.reference_us, 0);  // the first run's reference and golden, kept
  EXPECT_EQ(again.timing.golden_us, 0);
  EXPECT_EQ(executor.inputs_made(), 1);     // and its inputs
  EXPECT_FALSE(again.warm_us.has_value());  // one backend call
  // Its outputs are the first run's bits: judged without another comparison
  // (Note [Identical outputs]).
  EXPECT_NE(again.detail_json.find("\"rerun\""), std::string::npos) << again.detail_json;
  EXPECT_EQ(first.detail_json.find("\"rerun\""), std::string::npos);
  // A backend whose answer changed between the runs is compared afresh.
  ASSERT_EQ(executor.Run(mm).outcome, Outcome::kMismatch);
  fake->add_offset["aten::mm"] = 2e-3;
  CaseResult changed = executor.RunAgain(mm);
  EXPECT_EQ(changed.outcome, Outcome::kMismatch);
  EXPECT_EQ(changed.detail_json.find("\"rerun\""), std::string::npos);
  ASSERT_TRUE(changed.max_abs_err.has_value() && first.max_abs_err.has_value());
  EXPECT_NEAR(*changed.max_abs_err, 2 * *first.max_abs_err, 1e-4);
  fake->add_offset["aten::mm"] = 1e-3;
  // Another case in between: the rerun computes its CPU side afresh.
  EXPECT_EQ(executor.Run(testing::MmCase(16, 16, 16)).outcome, Outcome::kMismatch);
  CaseResult later = executor.RunAgain(mm);
  EXPECT_EQ(later.outcome, first.outcome);
  EXPECT_EQ(later.max_abs_err, first.max_abs_err);
  EXPECT_GT(later.timing.reference_us, 0);
  EXPECT_EQ(executor.inputs_made(), 4);
  // A passing case keeps nothing.
  fake->add_offset.clear();
  EXPECT_EQ(executor.Run(mm).outcome, Outcome::kPass);
  EXPECT_GT(executor.RunAgain(mm).timing.reference_us, 0);
}

TEST(Replay, WrongValuesGiveMismatchWithMetricsForTheAffectedOpOnly) {
  auto fake = std::make_shared<FakeBackend>();
  fake->add_offset["aten::mul.Tensor"] = 0.5;
  CaseResult bad = RunOn(fake, testing::MulCase({16, 32}));
  EXPECT_EQ(bad.outcome, Outcome::kMismatch);
  EXPECT_NEAR(*bad.max_abs_err, 0.5, 1e-6);
  EXPECT_DOUBLE_EQ(*bad.mismatch_frac, 1.0);
  EXPECT_LT(*bad.cosine, 1.0);
  EXPECT_GT(*bad.error_ratio, 2.0);
  EXPECT_NE(bad.error.find("512 of 512 elements"), std::string::npos) << bad.error;
  CaseResult good = RunOn(fake, testing::AddCase({16, 32}));
  EXPECT_EQ(good.outcome, Outcome::kPass) << good.error;
}

// Note [Declared numerics]: a backend that computes fp32 matmuls from bf16
// operands fails at fp32 precision, passes once it declares so, and one that
// is worse than it declares (5 mantissa bits) still fails. TF32 likewise.
TEST(Replay, ABackendIsJudgedAgainstTheNumericsItDeclares) {
  auto declare = [](std::string_view rounding) {
    ReplayOptions o;
    auto d = DeclaredNumerics::FromJson(
        std::string(R"({"fp32_operands": ")") + std::string(rounding) + R"(", "ops": {"aten::mm": ["self", "mat2"]}})",
        "numerics.json");
    EXPECT_TRUE(d.has_value()) << d.error().ToString();
    if (d) o.comparison.numerics = *d;
    return o;
  };
  const OpCase mm = testing::MmCase(64, 256, 48);
  auto bf16 = std::make_shared<FakeBackend>();
  bf16->operand_mantissa_bits["aten::mm"] = 7;
  EXPECT_EQ(RunOn(bf16, mm).outcome, Outcome::kMismatch) << "bf16 operands at fp32 precision";
  const CaseResult declared = RunOn(bf16, mm, declare("bf16"));
  EXPECT_EQ(declared.outcome, Outcome::kPass) << declared.error;
  // The error against exact fp32 stays on record.
  const auto detail = nlohmann::json::parse(declared.detail_json);
  ASSERT_TRUE(detail.contains("declared")) << declared.detail_json;
  EXPECT_EQ(detail["declared"]["rounded_operands"], 2);
  EXPECT_EQ(detail["declared"]["fp32_operands"], "bf16");
  EXPECT_GT(detail["declared"]["exact_fp32"]["max_rel_err"].get<double>(), 1e-4);

  auto coarse = std::make_shared<FakeBackend>();
  coarse->operand_mantissa_bits["aten::mm"] = 5;
  const CaseResult worse = RunOn(coarse, mm, declare("bf16"));
  EXPECT_EQ(worse.outcome, Outcome::kMismatch) << "coarser operands than declared";

  auto tf32 = std::make_shared<FakeBackend>();
  tf32->operand_mantissa_bits["aten::mm"] = 10;
  EXPECT_EQ(RunOn(tf32, mm).outcome, Outcome::kMismatch);
  EXPECT_EQ(RunOn(tf32, mm, declare("tf32")).outcome, Outcome::kPass);
  // An op the declaration does not name is judged at fp32 as before.
  auto bmm = std::make_shared<FakeBackend>();
  bmm->operand_mantissa_bits["aten::bmm"] = 7;
  const OpCase batched = MakeCase("aten::bmm", "", {TensorArg("self", DType::kFloat32, {4, 32, 128}),
                                                    TensorArg("mat2", DType::kFloat32, {4, 128, 16})});
  EXPECT_EQ(RunOn(bmm, batched, declare("bf16")).outcome, Outcome::kMismatch);
}

TEST(Replay, TheReferenceRoundsOnlyDeclaredReadOnlyOperandsKeepingTheirViews) {
  // An expanded (stride 0) operand stays the view it was; tf32 keeps 10 bits.
  const at::Tensor base = at::tensor({1.0f + 1.0f / 1024 + 1.0f / 4096, 3.0f});
  const at::Tensor expanded = base.view({2, 1}).expand({2, 5});
  const at::Tensor r = RoundFp32(expanded, DeclaredNumerics::Rounding::kTf32);
  EXPECT_EQ(r.strides(), expanded.strides());
  EXPECT_FLOAT_EQ(r[0][4].item<float>(), 1.0f + 1.0f / 1024);
  EXPECT_FLOAT_EQ(RoundFp32(at::tensor({INFINITY}), DeclaredNumerics::Rounding::kTf32).item<float>(), INFINITY);
  EXPECT_FLOAT_EQ(RoundFp32(base, DeclaredNumerics::Rounding::kBf16)[0].item<float>(), 1.0f);
}

TEST(DeclaredNumerics, ADeclarationThatDoesNotParseNamesTheFileAndMember) {
  for (const auto& [text, expected] : std::vector<std::pair<const char*, const char*>>{
           {R"({"fp32_operands": "fp8", "ops": {"aten::mm": []}})", "n.json.fp32_operands: expected \"bf16\" or \"tf32\""},
           {R"({"fp32_operands": "bf16", "ops": {}})", "n.json.ops: expected an object"},
           {R"({"fp32_operands": "bf16", "ops": {"aten::mm.out": []}})", "n.json.ops.aten::mm.out: expected an op name"},
           {R"({"fp32_operands": "bf16", "ops": {"aten::mm": "self"}})", "n.json.ops.aten::mm: expected an array"},
           {R"({"fp32_operands": "bf16", "ops": {"aten::mm": []}, "rounding": 1})", "n.json.rounding: unknown member"},
           {"{", "n.json: not valid JSON"}}) {
    auto d = DeclaredNumerics::FromJson(text, "n.json");
    ASSERT_FALSE(d.has_value()) << text;
    EXPECT_EQ(d.error().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(d.error().message().find(expected), std::string::npos) << d.error().message();
  }
  auto none = DeclaredNumerics::FromJson("", "n.json");
  ASSERT_TRUE(none.has_value());
  EXPECT_TRUE(none->empty());
  EXPECT_EQ(none->Summary(), "exact fp32");
}

// Note [Warm calls judged]: a kernel right on the first call and wrong on
// the warm ones fails, flaky, with the call named; one right every time passes.
TEST(Replay, ABackendWrongOnlyOnWarmCallsIsFlaggedWithTheCall) {
  auto fake = std::make_shared<FakeBackend>();
  fake->right_for_calls["aten::mul.Tensor"] = 2;
  const CaseResult r = RunOn(fake, testing::MulCase({16, 32}));
  EXPECT_EQ(r.outcome, Outcome::kMismatch) << r.error;
  EXPECT_TRUE(r.flaky);
  EXPECT_NE(r.error.find("call 3 of 4 (warm) differs from the first call"), std::string::npos) << r.error;
  const auto detail = nlohmann::json::parse(r.detail_json);
  EXPECT_EQ(detail["warm_changed"]["call"], 3);
  EXPECT_NEAR(*r.max_abs_err, 0.5, 1e-6);
  const CaseResult steady = RunOn(fake, testing::AddCase({16, 32}));
  EXPECT_EQ(steady.outcome, Outcome::kPass) << steady.error;
  EXPECT_FALSE(nlohmann::json::parse(steady.detail_json).contains("warm_changed"));
}

TEST(Replay, BackendExceptionBecomesErrorWithTheMessage) {
  auto fake = std::make_shared<FakeBackend>();
  fake->throw_message["aten::mm"] = "device lost: queue 3 faulted";
  CaseResult r = RunOn(fake, testing::MmCase(4, 4, 4));
  EXPECT_EQ(r.outcome, Outcome::kError);
  EXPECT_EQ(r.error, "device lost: queue 3 faulted");
  EXPECT_FALSE(r.max_abs_err.has_value());
}

TEST(Replay, BackendWritingIntoItsInputsIsAnError) {
  auto fake = std::make_shared<FakeBackend>();
  fake->scribble_inputs.insert("aten::mm");
  CaseResult r = RunOn(fake, testing::MmCase(4, 4, 4));
  EXPECT_EQ(r.outcome, Outcome::kError);
  EXPECT_NE(r.error.find("wrote into argument 'self'"), std::string::npos) << r.error;
}

TEST(Replay, MissingKernelIsUnsupported) {
  auto fake = std::make_shared<FakeBackend>();
  fake->unsupported.insert("aten::mm");
  CaseResult r = RunOn(fake, testing::MmCase(4, 4, 4));
  EXPECT_EQ(r.outcome, Outcome::kUnsupported);
  EXPECT_NE(r.error.find("Could not run"), std::string::npos);
}

TEST(Replay, NanWhereTheReferenceIsFiniteIsANonFiniteMismatch) {
  auto fake = std::make_shared<FakeBackend>();
  fake->make_nan.insert("aten::add");
  CaseResult r = RunOn(fake, testing::AddCase({8, 8}));
  EXPECT_EQ(r.outcome, Outcome::kNonFiniteMismatch) << r.error;
  EXPECT_NE(r.error.find("flat index 0"), std::string::npos) << r.error;
}

TEST(Replay, WrongShapeIsAShapeMismatch) {
  auto fake = std::make_shared<FakeBackend>();
  fake->drop_last_row.insert("aten::mm");
  CaseResult r = RunOn(fake, testing::MmCase(4, 4, 4));
  EXPECT_EQ(r.outcome, Outcome::kShapeMismatch);
  EXPECT_NE(r.error.find("[3, 4]"), std::string::npos) << r.error;
}

TEST(Replay, InPlaceOutAndTupleVariantsRun) {
  using testing::Spec;
  // add_.Tensor mutates self and returns it.
  OpCase inplace = MakeCase("aten::add_", "Tensor",
                            {TensorArg("self", DType::kFloat32, {8, 8}), TensorArg("other", DType::kFloat32, {8, 8}),
                             testing::IntArg("alpha", 2)});
  EXPECT_EQ(RunOn(Cpu(), inplace).outcome, Outcome::kPass);
  // add.out writes into `out`.
  OpCase out = MakeCase("aten::add", "out",
                        {TensorArg("self", DType::kFloat32, {8, 8}), TensorArg("other", DType::kFloat32, {8, 8}),
                         testing::IntArg("alpha", 1), TensorArg("out", DType::kFloat32, {8, 8})});
  CaseResult out_r = RunOn(Cpu(), out);
  EXPECT_EQ(out_r.outcome, Outcome::kPass) << out_r.error;
  // max.dim returns (values, indices).
  OpCase tuple = MakeCase("aten::max", "dim",
                          {TensorArg("self", DType::kFloat32, {8, 16}), testing::IntArg("dim", 1),
                           testing::BoolArg("keepdim", false)});
  CaseResult tr = RunOn(Cpu(), tuple);
  EXPECT_EQ(tr.outcome, Outcome::kPass) << tr.error;
  EXPECT_NE(tr.detail_json.find("\"output\":1"), std::string::npos) << tr.detail_json;
  // A wrong offset on a tuple op is caught on the floating output.
  auto fake = std::make_shared<FakeBackend>();
  fake->add_offset["aten::max.dim"] = 1.0;
  EXPECT_EQ(RunOn(fake, tuple).outcome, Outcome::kMismatch);
}

TEST(Replay, IndexInputsStayInsideTheIndexedDimension) {
  // A hand-written case whose index range exceeds the table: the index rule
  // clamps it, so the op runs instead of failing on the reference.
  TensorSpec idx = testing::Spec(DType::kInt64, {4, 64}, ValueDomain{ValueDomain::Kind::kInteger, 0, 1 << 20});
  OpCase c = MakeCase("aten::embedding", "",
                      {TensorArg("weight", DType::kFloat32, {100, 16}), TensorArg("indices", idx),
                       testing::IntArg("padding_idx", -1), testing::BoolArg("scale_grad_by_freq", false),
                       testing::BoolArg("sparse", false)});
  CaseResult r = RunOn(Cpu(), c);
  EXPECT_EQ(r.outcome, Outcome::kPass) << r.error;
}

// Note [Structured arguments]: _grouped_mm's offsets are cumulative group ends
// inside the split dimension, ending at its size, so the kernel stays in
// bounds and its result is the same on every run.
TEST(Replay, GroupedMatmulOffsetsAreSortedGroupEndsCoveringTheRows) {
  TensorSpec offs = testing::Spec(DType::kInt32, {8}, ValueDomain{ValueDomain::Kind::kInteger, 0, 1 << 20});
  OpCase c = MakeCase("aten::_grouped_mm", "",
                      {TensorArg("self", DType::kFloat32, {96, 32}), TensorArg("mat2", DType::kFloat32, {8, 32, 16}),
                       TensorArg("offs", offs), testing::NoneArg("bias"), testing::NoneArg("out_dtype")});
  const std::vector<c10::IValue> inputs = CpuInputs(c, /*seed=*/1);
  ASSERT_FALSE(inputs.empty());
  const at::Tensor o = inputs[2].toTensor();
  EXPECT_EQ(o.scalar_type(), at::kInt);
  EXPECT_TRUE(at::equal(o, std::get<0>(o.sort())));
  EXPECT_GE(o.min().item<int64_t>(), 0);
  EXPECT_EQ(o[-1].item<int64_t>(), 96);
  CaseResult r = RunOn(Cpu(), c);
  EXPECT_EQ(r.outcome, Outcome::kPass) << r.error;
}

// Note [Structured arguments]: embedding_bag's offsets start each bag inside the
// indices: sorted, the first 0, and with include_last_offset the last the
// number of indices; the indices stay inside the table. Drawn freely, the
// reference refuses the case ("offsets[0] has to be 0").
TEST(Replay, EmbeddingBagOffsetsStartAtZeroAndStayInsideTheIndices) {
  for (bool include_last : {false, true}) {
    TensorSpec idx = testing::Spec(DType::kInt64, {40}, ValueDomain{ValueDomain::Kind::kInteger, 0, 1000});
    TensorSpec offs = testing::Spec(DType::kInt64, {6}, ValueDomain{ValueDomain::Kind::kInteger, 0, 1000});
    OpCase c = MakeCase("aten::_embedding_bag_forward_only", "",
                        {TensorArg("weight", DType::kFloat32, {10, 4}), TensorArg("indices", idx), TensorArg("offsets", offs),
                         testing::BoolArg("scale_grad_by_freq", false), testing::IntArg("mode", 0),
                         testing::BoolArg("sparse", false), testing::NoneArg("per_sample_weights"),
                         testing::BoolArg("include_last_offset", include_last), testing::IntArg("padding_idx", -1)});
    const std::vector<c10::IValue> inputs = CpuInputs(c, /*seed=*/3);
    ASSERT_FALSE(inputs.empty());
    const at::Tensor i = inputs[1].toTensor();
    const at::Tensor o = inputs[2].toTensor();
    EXPECT_LT(i.max().item<int64_t>(), 10);
    EXPECT_TRUE(at::equal(o, std::get<0>(o.sort())));
    EXPECT_EQ(o[0].item<int64_t>(), 0);
    EXPECT_LE(o.max().item<int64_t>(), 40);
    if (include_last) {
      EXPECT_EQ(o[-1].item<int64_t>(), 40);
    }
    CaseResult r = RunOn(Cpu(), c);
    EXPECT_EQ(r.outcome, Outcome::kPass) << "include_last_offset " << include_last << ": " << r.error;
  }
}

// Note [Value domains]: a unit-domain input (a probability: softmax output,
// Bernoulli parameter, binary cross-entropy's input) is replayed strictly
// inside (0, 1), at least 0.002 from either end, so log(x) and log(1 - x)
// stay finite and well conditioned on the reference.
TEST(Replay, UnitDomainInputsAreProbabilitiesStrictlyInsideTheUnitInterval) {
  TensorSpec p = testing::Spec(DType::kFloat32, {64, 64}, ValueDomain{ValueDomain::Kind::kUnit});
  OpCase c = MakeCase("aten::binary_cross_entropy", "",
                      {TensorArg("self", p), TensorArg("target", p), testing::NoneArg("weight"),
                       testing::IntArg("reduction", 0)});
  const std::vector<c10::IValue> inputs = CpuInputs(c, /*seed=*/5);
  ASSERT_FALSE(inputs.empty());
  const at::Tensor x = inputs[0].toTensor();
  EXPECT_GE(x.min().item<double>(), 0.002);  // 4096 draws from [0, 1) would go below
  EXPECT_LE(x.max().item<double>(), 0.998);
  EXPECT_GT(x.max().item<double>(), 0.9);  // the whole interval, not a corner of it
  CaseResult r = RunOn(Cpu(), c);
  EXPECT_EQ(r.outcome, Outcome::kPass) << r.error;
}

// Found by UBSan (scripts/sanitize.sh): an int64 domain from INT64_MIN
// overflowed hi - lo; values also stay inside a narrower dtype's range.
TEST(Replay, IntegerDomainsAsWideAsTheirDtypeStayInsideIt) {
  const int64_t min64 = std::numeric_limits<int64_t>::min(), max64 = std::numeric_limits<int64_t>::max();
  struct Want {
    DType dtype;
    int64_t lo, hi;        // the recorded domain
    double want_lo, want_hi;  // where the values must lie (inclusive)
  };
  for (const Want& w : {Want{DType::kInt64, min64, 16, -9.3e18, 15}, Want{DType::kInt64, 0, max64, 0, 9.3e18},
                        Want{DType::kInt64, min64, max64, -9.3e18, 9.3e18}, Want{DType::kInt8, -1000, 1000, -128, 127},
                        Want{DType::kUInt8, -5, 300, 0, 255}}) {
    TensorSpec t = testing::Spec(w.dtype, {4096}, ValueDomain{ValueDomain::Kind::kInteger, w.lo, w.hi});
    OpCase c = MakeCase("aten::neg", "", {TensorArg("self", t)});
    const std::vector<c10::IValue> inputs = CpuInputs(c, /*seed=*/2);
    ASSERT_FALSE(inputs.empty()) << DTypeName(w.dtype) << " [" << w.lo << ", " << w.hi << ")";
    const at::Tensor x = inputs[0].toTensor().to(at::kDouble);
    EXPECT_GE(x.min().item<double>(), w.want_lo) << DTypeName(w.dtype) << " [" << w.lo << ", " << w.hi << ")";
    EXPECT_LE(x.max().item<double>(), w.want_hi) << DTypeName(w.dtype) << " [" << w.lo << ", " << w.hi << ")";
    // Spread over the range, not piled at a bound.
    EXPECT_GT(x.max().item<double>() - x.min().item<double>(), 0.5 * (w.want_hi - w.want_lo));
  }
}

// Note [Value domains]: integer inputs reach both ends of their range, and
// an index takes the whole indexed dimension. GPT-2's token ids were
// recorded in [1, 32768) (the values' range coarsened); against its table of
// 50,257 rows they replay in [0, 50257), row 50256 included.
TEST(Replay, IntegerInputsReachBothEndsAndIndicesTheWholeDimension) {
  TensorSpec ids = testing::Spec(DType::kInt64, {1, 64}, ValueDomain{ValueDomain::Kind::kInteger, 1, 32768});
  OpCase embedding = MakeCase("aten::embedding", "",
                              {TensorArg("weight", DType::kFloat32, {50257, 4}), TensorArg("indices", ids),
                               testing::IntArg("padding_idx", -1), testing::BoolArg("scale_grad_by_freq", false),
                               testing::BoolArg("sparse", false)});
  const at::Tensor i = CpuInputs(embedding, /*seed=*/0)[1].toTensor();
  EXPECT_EQ(i.min().item<int64_t>(), 0);
  EXPECT_EQ(i.max().item<int64_t>(), 50256);
  EXPECT_EQ(RunOn(Cpu(), embedding).outcome, Outcome::kPass);

  // Any integer domain: its first element lo, its last hi - 1, the rest drawn.
  TensorSpec t = testing::Spec(DType::kInt32, {3, 5}, ValueDomain{ValueDomain::Kind::kInteger, -7, 50257});
  const at::Tensor x = CpuInputs(MakeCase("aten::neg", "", {TensorArg("self", t)}), /*seed=*/5)[0].toTensor();
  EXPECT_EQ(x.flatten()[0].item<int64_t>(), -7);
  EXPECT_EQ(x.flatten()[14].item<int64_t>(), 50256);
  EXPECT_GT(std::get<0>(at::_unique(x.flatten())).numel(), 10) << "the rest is drawn";
}

// A Python number the model passed for a Tensor argument (AdamW's
// param.mul_(1 - lr * weight_decay)) replays as the recorded value.
TEST(Replay, ARecordedConstantReplaysAsItself) {
  ValueDomain decay{ValueDomain::Kind::kConstant};
  decay.value = 0.99999;
  OpCase c = MakeCase("aten::mul_", "Tensor",
                      {TensorArg("self", DType::kFloat32, {8}), TensorArg("other", testing::Spec(DType::kFloat64, {}, decay))});
  const at::Tensor other = CpuInputs(c, /*seed=*/0)[1].toTensor();
  EXPECT_EQ(other.dim(), 0);
  EXPECT_EQ(other.item<double>(), 0.99999);
  EXPECT_EQ(RunOn(Cpu(), c).outcome, Outcome::kPass);
  // The value is part of the case: another constant is another case.
  OpCase other_case = c;
  other_case.args[1].tensor.domain.value = 0.5;
  EXPECT_NE(c.Key(), other_case.Key());
  auto back = OpCase::FromJson(c.ToCanonicalJson());
  ASSERT_TRUE(back.has_value()) << back.error().ToString();
  EXPECT_EQ(back->args[1].tensor.domain, decay);
}

// The backward of nll_loss reads its target as class indices too; drawn
// from the recorded domain (negative here) it was refused by the reference.
TEST(Replay, NllLossBackwardTargetsAreClassIndices) {
  TensorSpec target = testing::Spec(DType::kInt64, {16}, ValueDomain{ValueDomain::Kind::kInteger, -100, 50});
  OpCase c = MakeCase("aten::nll_loss_backward", "",
                      {TensorArg("grad_output", DType::kFloat32, {}), TensorArg("self", DType::kFloat32, {16, 8}),
                       TensorArg("target", target), testing::NoneArg("weight"), testing::IntArg("reduction", 1),
                       testing::IntArg("ignore_index", -100), TensorArg("total_weight", DType::kFloat32, {})});
  const at::Tensor t = CpuInputs(c, /*seed=*/4)[2].toTensor();
  EXPECT_GE(t.min().item<int64_t>(), 0);
  EXPECT_LT(t.max().item<int64_t>(), 8);
  CaseResult r = RunOn(Cpu(), c);
  EXPECT_EQ(r.outcome, Outcome::kPass) << r.error;
}

// An input larger than the cache's whole budget is kept apart for the cases
// that follow and read it, and let go before a case that does not.
TEST(InputCache, OneInputOverTheBudgetStaysOnlyWhileTheCasesReadIt) {
  InputCache cache(/*budget_bytes=*/1024);
  int made = 0;
  auto make = [&](int64_t n) {
    return [&made, n]() {
      ++made;
      return at::zeros({n}, at::kFloat);
    };
  };
  cache.GetOrMake("small", make(16));
  cache.GetOrMake("large", make(4096));
  cache.GetOrMake("large", make(4096));
  EXPECT_EQ(made, 2);  // the large one was kept
  EXPECT_EQ(cache.bytes(), 64);  // outside the budgeted bytes
  cache.KeepLargeOnlyFor({"small", "large"});
  cache.GetOrMake("large", make(4096));
  EXPECT_EQ(made, 2);
  cache.KeepLargeOnlyFor({"small"});  // a case that does not read it
  cache.GetOrMake("large", make(4096));
  cache.GetOrMake("small", make(16));
  EXPECT_EQ(made, 3);  // made again; the small one stayed
  cache.GetOrMake("other large", make(8192));  // takes the large one's place
  cache.GetOrMake("large", make(4096));
  EXPECT_EQ(made, 5);
  cache.Evict("large");
  cache.GetOrMake("large", make(4096));
  EXPECT_EQ(made, 6);
  // Through Materialize: two cases reading one weight over the budget make it once.
  InputCache small_budget(/*budget_bytes=*/1024);
  TensorSpec w = testing::Spec(DType::kFloat32, {64, 32});
  auto schema = c10::Dispatcher::singleton().findSchema({"aten::mm", ""});
  ASSERT_TRUE(schema.has_value());
  for (int64_t rows : {4, 1}) {
    OpCase mm = MakeCase("aten::mm", "", {TensorArg("self", DType::kFloat32, {rows, 64}), TensorArg("mat2", w)});
    ASSERT_TRUE(Materialize(mm, schema->schema(), 3, &small_budget).has_value());
  }
  EXPECT_EQ(small_budget.hits(), 1);
}

// Note [Storage keys]: a weight and its transposed view hold the same
// values, so `t(W)` and `mm(x, W^T)` read one storage.
TEST(Replay, ViewsOfOneStorageHoldTheSameValuesAcrossCases) {
  TensorSpec w = testing::Spec(DType::kFloat32, {48, 32});
  TensorSpec wt = w;
  wt.shape = {32, 48};
  wt.strides = {1, 32};
  EXPECT_EQ(w.StorageKey(), wt.StorageKey());
  const at::Tensor a = CpuInputs(MakeCase("aten::t", "", {TensorArg("self", w)}), 7)[0].toTensor();
  OpCase mm = MakeCase("aten::mm", "", {TensorArg("self", DType::kFloat32, {4, 32}), TensorArg("mat2", wt)});
  const at::Tensor b = CpuInputs(mm, 7)[1].toTensor();
  EXPECT_TRUE(at::equal(a, b.t()));
  // Another domain or size is another storage.
  TensorSpec positive = w;
  positive.domain.kind = ValueDomain::Kind::kPositive;
  EXPECT_NE(w.StorageKey(), positive.StorageKey());
  EXPECT_NE(w.StorageKey(), testing::Spec(DType::kFloat32, {48, 33}).StorageKey());
  // Two arguments of one storage key in one case still differ.
  OpCase add = MakeCase("aten::mul", "Tensor", {TensorArg("self", w), TensorArg("other", w)});
  const std::vector<c10::IValue> two = CpuInputs(add, 7);
  EXPECT_FALSE(at::equal(two[0].toTensor(), two[1].toTensor()));
}

TEST(Replay, UninitialisedAndRandomOutputsAreNotComparedByValue) {
  // The per-op rules are data: configs/tolerances.json's "ops".
  const ComparisonOptions rules = testing::ShippedComparison();
  for (const char* op : {"aten::empty", "aten::empty_like", "aten::empty_strided", "aten::new_empty",
                         "aten::empty_permuted", "aten::randn", "aten::bernoulli_", "aten::geometric_", "aten::cauchy_"}) {
    OpCase c;
    c.op = op;
    EXPECT_FALSE(rules.ValuesCompared(c, 0)) << op;
    // Without the rules every output is compared.
    EXPECT_TRUE(ComparisonOptions().ValuesCompared(c, 0)) << op;
  }
  EXPECT_TRUE(rules.ValuesCompared(testing::MmCase(2, 3, 4), 0));
  // rrelu draws its slopes only in training mode.
  OpCase rrelu = MakeCase("aten::rrelu_with_noise", "", {TensorArg("self", DType::kFloat32, {8}), testing::BoolArg("training", true)});
  EXPECT_FALSE(rules.ValuesCompared(rrelu, 0));
  rrelu.args[1].b = false;
  EXPECT_TRUE(rules.ValuesCompared(rrelu, 0));
  // _ctc_loss's log_alpha (output 1) is partly uninitialised; the loss is not.
  OpCase ctc;
  ctc.op = "aten::_ctc_loss";
  EXPECT_TRUE(rules.ValuesCompared(ctc, 0));
  EXPECT_FALSE(rules.ValuesCompared(ctc, 1));
}

TEST(Replay, ValuesRulesAreCheckedAsTheyAreRead) {
  for (const char* bad : {R"({"ops": {"aten::empty": {"values_not_compared": "some"}}})",
                          R"({"ops": {"aten::empty": {"values_not_compared": {"outputs": [-1]}}}})",
                          R"({"ops": {"aten::empty": {"values_not_compared": {"when": 3}}}})",
                          R"({"ops": {"aten::empty": {"values_not_compared": {"if": "train"}}}})"}) {
    auto o = ComparisonOptions::FromJson(bad, "tol.json");
    ASSERT_FALSE(o.has_value()) << bad;
    EXPECT_NE(o.error().message().find("ops.aten::empty.values_not_compared"), std::string::npos) << o.error().message();
  }
  // A rule and a tolerance in one entry.
  auto o = ComparisonOptions::FromJson(
      R"({"ops": {"aten::dropout": {"values_not_compared": {"when": "train"}, "dtypes": {"f32": {"rtol": 0.5}}, "reason": "r"}}})",
      "tol.json");
  ASSERT_TRUE(o.has_value()) << o.error().message();
  EXPECT_EQ(o->For("aten::dropout", "", DType::kFloat32).rtol, 0.5);
  OpCase dropout = MakeCase("aten::dropout", "", {TensorArg("input", DType::kFloat32, {8}), testing::BoolArg("train", true)});
  EXPECT_FALSE(o->ValuesCompared(dropout, 0));
}

// Note [Structured arguments]: segment_reduce's lengths are >= 0 and sum to
// the reduced axis (drawn freely, the reference refuses them), its offsets
// run from 0 to it.
TEST(Replay, SegmentReduceLengthsAndOffsetsCoverTheReducedAxis) {
  for (const char* arg : {"lengths", "offsets"}) {
    const bool lengths = std::string_view(arg) == "lengths";
    TensorSpec cuts = testing::Spec(DType::kInt64, {3, lengths ? 4 : 5}, ValueDomain{ValueDomain::Kind::kInteger, -3, 50});
    OpCase c = MakeCase("aten::segment_reduce", "",
                        {TensorArg("data", DType::kFloat32, {3, 20, 2}), testing::StrArg("reduce", "sum"),
                         lengths ? TensorArg("lengths", cuts) : testing::NoneArg("lengths"), testing::NoneArg("indices"),
                         lengths ? testing::NoneArg("offsets") : TensorArg("offsets", cuts), testing::IntArg("axis", 1),
                         testing::BoolArg("unsafe", false), testing::NoneArg("initial")});
    const std::vector<c10::IValue> inputs = CpuInputs(c, /*seed=*/7);
    ASSERT_FALSE(inputs.empty());
    const at::Tensor t = inputs[lengths ? 2 : 4].toTensor();
    if (lengths) {
      EXPECT_GE(t.min().item<int64_t>(), 0);
      EXPECT_TRUE(at::equal(t.sum(-1), at::full({3}, 20, at::kLong))) << t;
    } else {
      EXPECT_TRUE(at::equal(t, std::get<0>(t.sort(-1)))) << t;
      EXPECT_TRUE(at::equal(t.select(-1, 0), at::zeros({3}, at::kLong))) << t;
      EXPECT_TRUE(at::equal(t.select(-1, -1), at::full({3}, 20, at::kLong))) << t;
    }
    CaseResult r = RunOn(Cpu(), c);
    EXPECT_EQ(r.outcome, Outcome::kPass) << arg << ": " << r.error;
  }
}

// Note [Structured arguments]: max_unpool's indices are distinct in each
// plane; with duplicates the CPU's own threads wrote in a different order
// from run to run (OpInfo's samples "failed" on cpu).
TEST(Replay, MaxUnpoolIndicesAreDistinctInsideEachPlane) {
  TensorSpec idx = testing::Spec(DType::kInt64, {2, 3, 4, 5}, ValueDomain{ValueDomain::Kind::kInteger, 0, 3});
  OpCase c = MakeCase("aten::max_unpool2d", "",
                      {TensorArg("self", DType::kFloat32, {2, 3, 4, 5}), TensorArg("indices", idx),
                       testing::IntListArg("output_size", {8, 10})});
  const std::vector<c10::IValue> inputs = CpuInputs(c, /*seed=*/11);
  ASSERT_FALSE(inputs.empty());
  const at::Tensor planes = inputs[1].toTensor().reshape({6, 20});
  EXPECT_LT(planes.max().item<int64_t>(), 80);
  EXPECT_GE(planes.min().item<int64_t>(), 0);
  for (int64_t p = 0; p < 6; ++p) EXPECT_EQ(std::get<0>(at::_unique2(planes[p])).numel(), 20) << planes[p];
  CaseResult r = RunOn(Cpu(), c);
  EXPECT_EQ(r.outcome, Outcome::kPass) << r.error;
}

// Note [Structured arguments]: the cholesky ops get a positive definite input.
TEST(Replay, CholeskyInputsArePositiveDefinite) {
  OpCase c = MakeCase("aten::cholesky", "", {TensorArg("self", DType::kFloat32, {2, 6, 6}), testing::BoolArg("upper", false)});
  const std::vector<c10::IValue> inputs = CpuInputs(c, /*seed=*/13);
  ASSERT_FALSE(inputs.empty());
  const at::Tensor a = inputs[0].toTensor().to(at::kDouble);
  EXPECT_TRUE(at::allclose(a, a.transpose(-2, -1)));
  EXPECT_GT(at::linalg_eigvalsh(a).min().item<double>(), 0.0);
  CaseResult r = RunOn(Cpu(), c);
  EXPECT_EQ(r.outcome, Outcome::kPass) << r.error;
}

TEST(Replay, SparseOutputsAreSkippedWithTheReasonNotAnInternalError) {
  auto none = [](const char* name) {
    Argument a;
    a.name = name;
    a.kind = Argument::Kind::kNone;
    return a;
  };
  CaseResult r = RunOn(Cpu(), MakeCase("aten::_to_sparse", "", {TensorArg("self", DType::kFloat32, {5, 5}),
                                                                 none("layout"), none("blocksize"),
                                                                 none("dense_dim")}));
  EXPECT_EQ(r.outcome, Outcome::kSkipped) << r.error;
  EXPECT_NE(r.error.find("layout Sparse"), std::string::npos) << r.error;
}

TEST(Replay, UnknownOpIsSkippedWithAReason) {
  CaseResult r = RunOn(Cpu(), MakeCase("aten::no_such_op", "", {}));
  EXPECT_EQ(r.outcome, Outcome::kSkipped);
  EXPECT_NE(r.error.find("aten::no_such_op"), std::string::npos);
}

TEST(Replay, CaseThatDoesNotFitTheSchemaIsSkipped) {
  CaseResult r = RunOn(Cpu(), MakeCase("aten::mm", "", {TensorArg("self", DType::kFloat32, {2, 2})}));
  EXPECT_EQ(r.outcome, Outcome::kSkipped);
  EXPECT_NE(r.error.find("schema"), std::string::npos) << r.error;
}

TEST(Replay, ReferenceFailureIsSkippedNotBlamedOnTheBackend) {
  // Inner dimensions disagree: the CPU itself cannot run it.
  CaseResult r = RunOn(Cpu(), MakeCase("aten::mm", "", {TensorArg("self", DType::kFloat32, {2, 3}),
                                                         TensorArg("mat2", DType::kFloat32, {4, 5})}));
  EXPECT_EQ(r.outcome, Outcome::kSkipped);
  EXPECT_NE(r.error.find("CPU reference"), std::string::npos) << r.error;
}

TEST(Compare, BackendWithinTheMultiplierOfTheCpuErrorPasses) {
  // Golden 1.0; CPU off by 1e-4; backend off by 1.5e-4 in the other direction:
  // beyond fp32 tolerance of the reference, but only 1.5x the CPU's own error.
  at::Tensor golden = at::ones({4}, at::kDouble);
  at::Tensor ref = (golden + 1e-4).to(at::kFloat);
  Tolerance tol{1.3e-6, 1e-5};
  TensorComparison close = CompareTensors((golden - 1.5e-4).to(at::kFloat), ref, golden, tol, 2.0, true);
  EXPECT_EQ(close.outcome, Outcome::kPass);
  EXPECT_EQ(close.mismatched, 4);
  EXPECT_NEAR(*close.error_ratio, 1.5, 1e-3);
  TensorComparison far = CompareTensors((golden + 3e-4).to(at::kFloat), ref, golden, tol, 2.0, true);
  EXPECT_EQ(far.outcome, Outcome::kMismatch);
  EXPECT_NEAR(*far.error_ratio, 3.0, 1e-3);
  TensorComparison no_golden = CompareTensors((golden - 1.5e-4).to(at::kFloat), ref, at::Tensor(), tol, 2.0, true);
  EXPECT_EQ(no_golden.outcome, Outcome::kMismatch);
  // A golden asked for once the tolerance is missed judges as a given one,
  // and is not asked for otherwise.
  int asked = 0;
  auto lazy = [&]() {
    ++asked;
    return golden;
  };
  TensorComparison late = CompareTensors((golden - 1.5e-4).to(at::kFloat), ref, at::Tensor(), tol, 2.0, true, lazy);
  EXPECT_EQ(asked, 1);
  EXPECT_EQ(late.outcome, close.outcome);
  EXPECT_EQ(late.mismatched, close.mismatched);
  EXPECT_EQ(late.max_abs_err, close.max_abs_err);
  EXPECT_EQ(*late.error_ratio, *close.error_ratio);
  EXPECT_EQ(CompareTensors((golden + 3e-4).to(at::kFloat), ref, at::Tensor(), tol, 2.0, true, lazy).outcome,
            Outcome::kMismatch);
  EXPECT_EQ(asked, 2);
  EXPECT_EQ(CompareTensors(ref + 1e-7f, ref, at::Tensor(), tol, 2.0, true, lazy).outcome, Outcome::kPass);
  EXPECT_EQ(asked, 2);
  // A golden in another layout than the values (a transposed output).
  at::Tensor g2 = at::ones({3, 4}, at::kDouble);
  at::Tensor r2 = (g2 + 1e-4).to(at::kFloat).t().contiguous().t();
  TensorComparison layout = CompareTensors((g2 - 1.5e-4).to(at::kFloat).t().contiguous().t(), r2, at::Tensor(), tol,
                                           2.0, true, [&]() { return g2; });
  EXPECT_EQ(layout.outcome, Outcome::kPass);
  EXPECT_NEAR(*layout.error_ratio, 1.5, 1e-3);
}

// Note [Identical outputs]: bit-identical values pass with the best figures
// (NaN and Inf included), and a golden rates them alike.
TEST(Compare, BitIdenticalOutputsPassWithTheBestFigures) {
  at::Tensor f = at::tensor({1.0f, -2.5f, INFINITY, NAN, 0.0f});
  TensorComparison same = CompareTensors(f.clone(), f, at::Tensor(), {0, 0}, 2, true);
  EXPECT_EQ(same.outcome, Outcome::kPass);
  EXPECT_EQ(same.elements, 5);
  EXPECT_EQ(same.max_abs_err, 0);
  EXPECT_EQ(same.cosine, 1);
  EXPECT_FALSE(same.error_ratio.has_value());
  TensorComparison with_golden = CompareTensors(f.clone(), f, f.to(at::kDouble) + 1, {0, 0}, 2, true);
  EXPECT_EQ(*with_golden.error_ratio, 1.0);
  // The same values in another layout are read by position, not by bytes.
  at::Tensor m = at::arange(12, at::kFloat).reshape({3, 4});
  EXPECT_EQ(CompareTensors(m.t().contiguous(), m.t(), at::Tensor(), {0, 0}, 2, true).outcome, Outcome::kPass);
  EXPECT_TRUE(SameValues(m, m.clone()));
  EXPECT_FALSE(SameValues(m, m.t().contiguous().t()));  // same values, another layout: not matched bit for bit
  EXPECT_FALSE(SameValues(m, m.to(at::kDouble)));
  at::Tensor z = m.clone();
  z[0][0] = -0.0f;  // equal to 0.0 by value, not by bits: scanned, and passes by value
  EXPECT_FALSE(SameValues(m, z));
  EXPECT_EQ(CompareTensors(z, m, at::Tensor(), {0, 0}, 2, true).outcome, Outcome::kPass);
  z[2][3] = 12.0f;
  EXPECT_EQ(CompareTensors(z, m, at::Tensor(), {0, 0}, 2, true).outcome, Outcome::kMismatch);
}

// Note [Views compared by their metadata].
TEST(Compare, AViewWithTheReferencesMetadataPassesWithoutAScanAndAnyOtherTakesTheScan) {
  at::Tensor rin = at::arange(24, at::kFloat).reshape({4, 6});
  at::Tensor bin = rin.clone();  // the backend's own copy of the input
  auto as_view = [&](const at::Tensor& b, const at::Tensor& r) { return CompareAsViews(b, bin, r, rin); };
  std::optional<TensorComparison> t = as_view(bin.t(), rin.t());
  ASSERT_TRUE(t.has_value());
  EXPECT_EQ(t->outcome, Outcome::kPass);
  EXPECT_EQ(t->elements, 24);
  EXPECT_TRUE(as_view(bin.expand({2, 4, 6}), rin.expand({2, 4, 6})).has_value());
  EXPECT_TRUE(as_view(bin.view(at::kInt), rin.view(at::kInt)).has_value());
  // A copy, another offset or strides, another dtype view, a view of another
  // storage, or a lost conjugate bit: compared element by element.
  EXPECT_FALSE(as_view(bin.t().contiguous(), rin.t()).has_value());
  EXPECT_FALSE(as_view(bin.narrow(0, 1, 2), rin.narrow(0, 0, 2)).has_value());
  EXPECT_FALSE(as_view(bin.as_strided({4, 6}, {1, 4}), rin.as_strided({4, 6}, {6, 1})).has_value());
  EXPECT_FALSE(as_view(bin.view(at::kInt), rin).has_value());
  EXPECT_FALSE(as_view(rin.clone().t(), rin.t()).has_value());
  at::Tensor c = at::complex(rin, rin);
  at::Tensor cb = c.clone();
  EXPECT_TRUE(CompareAsViews(cb.conj(), cb, c.conj(), c).has_value());
  EXPECT_FALSE(CompareAsViews(cb.conj().resolve_conj(), cb, c.conj(), c).has_value());
  EXPECT_FALSE(CompareAsViews(cb, cb, c.conj(), c).has_value());
}

// Through the replay: a view op on the CPU backend passes with every element
// counted; a backend whose `t` returns other values (not a view of its
// input) is compared element by element and fails.
TEST(Replay, ViewOpsPassAsViewsAndAViewOpThatComputesWrongValuesFails) {
  OpCase t = MakeCase("aten::t", "", {TensorArg("self", DType::kFloat32, {64, 32})});
  CaseResult pass = RunOn(Cpu(), t);
  EXPECT_EQ(pass.outcome, Outcome::kPass) << pass.error;
  EXPECT_EQ(pass.max_abs_err, 0.0);
  EXPECT_NE(pass.detail_json.find("\"elements\":2048"), std::string::npos) << pass.detail_json;
  auto fake = std::make_shared<FakeBackend>();
  fake->add_offset["aten::t"] = 1e-2;
  CaseResult off = RunOn(fake, t);
  EXPECT_EQ(off.outcome, Outcome::kMismatch) << off.error;
}

TEST(Compare, IntegersMustBeExactAndMatchingNonFiniteValuesAreFine) {
  at::Tensor a = at::arange(10, at::kLong);
  EXPECT_EQ(CompareTensors(a, a.clone(), at::Tensor(), {0, 0}, 2, true).outcome, Outcome::kPass);
  EXPECT_EQ(CompareTensors(a + 1, a, at::Tensor(), {0, 0}, 2, true).outcome, Outcome::kMismatch);
  at::Tensor f = at::tensor({1.0f, INFINITY, -INFINITY, NAN});
  EXPECT_EQ(CompareTensors(f.clone(), f, at::Tensor(), {1e-6, 1e-5}, 2, true).outcome, Outcome::kPass);
  at::Tensor g = f.clone();
  g[1] = -INFINITY;
  EXPECT_EQ(CompareTensors(g, f, at::Tensor(), {1e-6, 1e-5}, 2, true).outcome, Outcome::kNonFiniteMismatch);
  EXPECT_EQ(CompareTensors(f.to(at::kDouble), f, at::Tensor(), {1e-6, 1e-5}, 2, true).outcome, Outcome::kDtypeMismatch);
}

TEST(ComparisonOptions, ConfigOverridesDefaultsPerDtypeAndOp) {
  auto o = ComparisonOptions::FromJson(
      R"({"default_multiplier": 4, "dtypes": {"f32": {"rtol": 1e-4}},
          "ops": {"aten::softmax": {"bf16": {"atol": 0.1, "multiplier": 10}}}})", "t.json");
  ASSERT_TRUE(o.has_value()) << o.error().ToString();
  EXPECT_DOUBLE_EQ(o->For("aten::mm", "", DType::kFloat32).rtol, 1e-4);
  EXPECT_DOUBLE_EQ(o->For("aten::mm", "", DType::kFloat32).atol, 1e-5);  // default kept
  EXPECT_DOUBLE_EQ(o->For("aten::softmax", "int", DType::kBFloat16).atol, 0.1);
  EXPECT_DOUBLE_EQ(o->For("aten::softmax", "int", DType::kBFloat16).rtol, 1.6e-2);
  EXPECT_DOUBLE_EQ(o->MultiplierFor("aten::softmax", "int", DType::kBFloat16), 10);
  EXPECT_DOUBLE_EQ(o->MultiplierFor("aten::mm", "", DType::kFloat32), 4);
  EXPECT_DOUBLE_EQ(o->For("aten::mm", "", DType::kInt64).atol, 0);  // integers exact
}

// A file that sets only per-op entries keeps assert_close's per-dtype
// defaults: it is never rtol = atol = 0.
TEST(ComparisonOptions, AFileWithoutDtypesKeepsTheDefaults) {
  for (const char* text : {"{}", R"({"ops": {}})", R"({"ops": {"aten::mm": {"f16": {"rtol": 0.1}}}})",
                           R"({"default_multiplier": 3})"}) {
    auto o = ComparisonOptions::FromJson(text, "t.json");
    ASSERT_TRUE(o.has_value()) << text << ": " << o.error().ToString();
    EXPECT_DOUBLE_EQ(o->For("aten::mm", "", DType::kFloat32).rtol, 1.3e-6) << text;
    EXPECT_DOUBLE_EQ(o->For("aten::mm", "", DType::kFloat32).atol, 1e-5) << text;
    EXPECT_DOUBLE_EQ(o->For("aten::add", "Tensor", DType::kBFloat16).rtol, 1.6e-2) << text;
  }
}

// The input rules are built in (core/input_rules.h): a tolerances file may
// repeat an op's inputs as shipped, but not change them, and an entry with
// only inputs leaves that op's tolerances at the defaults.
TEST(ComparisonOptions, AFileMayRepeatTheBuiltInInputRulesButNotChangeThem) {
  const ComparisonOptions shipped = testing::ShippedComparison();  // it lists inputs for 39 ops
  EXPECT_DOUBLE_EQ(shipped.For("aten::embedding", "", DType::kFloat32).rtol, 1.3e-6);
  auto same = ComparisonOptions::FromJson(
      R"({"dtypes": {"f32": {"rtol": 1e-4}}, "ops": {"aten::embedding": {"inputs": {"index": {"arg": "indices", "of": "weight", "dim": 0}}, "reason": "r"}}})",
      "t.json");
  ASSERT_TRUE(same.has_value()) << same.error().ToString();
  EXPECT_DOUBLE_EQ(same->For("aten::embedding", "", DType::kFloat32).rtol, 1e-4);
  auto changed = ComparisonOptions::FromJson(
      R"({"ops": {"aten::embedding": {"inputs": {"index": {"arg": "indices", "of": "weight", "dim": 1}}}}})", "t.json");
  ASSERT_FALSE(changed.has_value());
  EXPECT_NE(changed.error().message().find("t.json: ops.aten::embedding.inputs: differs from the input rules built"),
            std::string::npos)
      << changed.error().message();
}

TEST(ComparisonOptions, NotJsonNamesTheLineAndColumn) {
  auto o = ComparisonOptions::FromJson("{\n  \"dtypes\": {\n    \"f32\": {\"rtol\": 1e-3,}\n  }\n}", "tol.json");
  ASSERT_FALSE(o.has_value());
  EXPECT_NE(o.error().message().find("tol.json: not valid JSON: parse error at line 3, column"), std::string::npos)
      << o.error().message();
}

// Found by fuzzing: "aten::softmax." was stored as an override no call
// could ever match (For("aten::softmax", "") looks up "aten::softmax").
TEST(ComparisonOptions, OpKeysThatCanNeverMatchAreRefused) {
  for (const char* op : {"aten::softmax.", "aten::.int", "::softmax", "aten::", "aten::add.Tensor.out",
                         "aten::x::y"}) {
    const std::string text = std::string(R"({"ops": {")") + op + R"(": {"f32": {"rtol": 0.5}}}})";
    auto o = ComparisonOptions::FromJson(text, "tol.json");
    ASSERT_FALSE(o.has_value()) << op;
    EXPECT_NE(o.error().message().find("tol.json: ops: '" + std::string(op) + "' is not an op name"),
              std::string::npos)
        << o.error().message();
  }
  for (const char* op : {"aten::softmax", "aten::add.Tensor", "prims::_foo.out"}) {
    const std::string text = std::string(R"({"ops": {")") + op + R"(": {"f32": {"rtol": 0.5}}}})";
    EXPECT_TRUE(ComparisonOptions::FromJson(text, "tol.json").has_value()) << op;
  }
}

TEST(ComparisonOptions, BadConfigNamesTheKey) {
  for (const char* bad : {R"({"dtypes": {"f33": {"rtol": 0.5}}})", R"({"dtypes": {"f32": {"rtol": -1}}})",
                          R"({"ops": {"softmax": {}}})", R"({"typo": 1})", "not json",
                          R"({"ops": {"aten::relu": {"dtypes": {"f32": {"rtol": 0.5}}, "typo": 3}}})"}) {
    auto o = ComparisonOptions::FromJson(bad, "configs/tolerances.json");
    ASSERT_FALSE(o.has_value()) << bad;
    EXPECT_NE(o.error().message().find("configs/tolerances.json"), std::string::npos);
  }
}

// Tolerances that would judge nothing (every value passes) or nothing a
// real backend can meet (only bit-identical values pass) are refused by name.
TEST(ComparisonOptions, TolerancesThatJudgeNothingAreRefused) {
  const std::pair<const char*, const char*> bad[] = {
      {R"({"dtypes": {"f32": {"rtol": 1e300}}})", "dtypes.f32.rtol: 1e+300 passes any value"},
      {R"({"dtypes": {"f32": {"rtol": 1}}})", "dtypes.f32.rtol: 1 passes any value"},
      {R"({"dtypes": {"f32": {"rtol": 0, "atol": 0}}})", "dtypes.f32: rtol and atol both 0"},
      {R"({"dtypes": {"bf16": {"multiplier": 0.5}}})", "dtypes.bf16.multiplier: 0.5"},
  };
  for (const auto& [text, why] : bad) {
    auto o = ComparisonOptions::FromJson(text, "tol.json");
    ASSERT_FALSE(o.has_value()) << text;
    EXPECT_NE(o.error().message().find(why), std::string::npos) << o.error().message();
  }
  // Integers are compared exactly anyway; zero there is what they get.
  EXPECT_TRUE(ComparisonOptions::FromJson(R"({"dtypes": {"i64": {"rtol": 0, "atol": 0}}})", "tol.json").has_value());
}

TEST(BackendRegistry, UnknownBackendListsTheKnownOnes) {
  BackendRegistry backends;
  RegisterCpuBackend(backends);
  auto b = backends.Create("neuron");
  ASSERT_FALSE(b.has_value());
  EXPECT_NE(b.error().message().find("known: cpu"), std::string::npos);
}

// Note [Reference upcast]: the CPU has no histc kernel for int32, which
// accelerators do have and transformers' MoE path calls. The reference runs
// it in float64 and casts the counts back, so a backend with the integer
// kernel is judged; the CPU as a backend is `unsupported` on the call.
OpCase IntHistcCase() {
  ValueDomain ids;
  ids.kind = ValueDomain::Kind::kInteger;
  ids.lo = 0;
  ids.hi = 8;
  return MakeCase("aten::histc", "",
                  {TensorArg("self", testing::Spec(DType::kInt32, {256}, ids)), testing::IntArg("bins", 8),
                   testing::IntArg("min", 0), testing::IntArg("max", 7)});
}

TEST(Replay, AnIntegerCallTheCpuLacksIsJudgedAgainstAnUpcastReference) {
  ASSERT_TRUE(IsMissingIntegerKernel("\"histogram_cpu\" not implemented for 'Int'"));
  EXPECT_FALSE(IsMissingIntegerKernel("\"histogram_cpu\" not implemented for 'Half'"));
  EXPECT_FALSE(IsMissingIntegerKernel("shape mismatch"));

  auto good = std::make_shared<testing::IntegerHistcBackend>();
  CaseResult r = RunOn(good, IntHistcCase());
  EXPECT_EQ(r.outcome, Outcome::kPass) << r.error;
  ASSERT_TRUE(r.max_abs_err.has_value());
  EXPECT_EQ(*r.max_abs_err, 0.0);

  auto wrong = std::make_shared<testing::IntegerHistcBackend>();
  wrong->off_by = 1;
  EXPECT_EQ(RunOn(wrong, IntHistcCase()).outcome, Outcome::kMismatch);

  // The CPU itself has no such kernel: unsupported, not a skipped case.
  CaseResult cpu = RunOn(Cpu(), IntHistcCase());
  EXPECT_EQ(cpu.outcome, Outcome::kUnsupported) << OutcomeName(cpu.outcome) << " " << cpu.error;
}

TEST(Replay, TheUpcastLeavesCallsWithFloatingOrWrittenIntegerTensorsAlone) {
  auto histc = c10::Dispatcher::singleton().findSchemaOrThrow("aten::histc", "");
  torch::jit::Stack floating{at::ones({4}), int64_t{4}, at::Scalar(0), at::Scalar(1)};
  EXPECT_FALSE(CallUpcast(histc, {false, false, false, false}, &floating));
  torch::jit::Stack ints{at::arange(4, at::kInt), int64_t{4}, at::Scalar(0), at::Scalar(3)};
  EXPECT_FALSE(CallUpcast(histc, {true, false, false, false}, &ints)) << "an integer tensor written in place";
  ASSERT_TRUE(CallUpcast(histc, {false, false, false, false}, &ints));
  ASSERT_EQ(ints.size(), 1u);
  EXPECT_EQ(ints[0].toTensor().scalar_type(), at::kInt);
  EXPECT_TRUE(at::equal(ints[0].toTensor(), at::ones({4}, at::kInt)));
}

}  // namespace
}  // namespace coverage::replay
