#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>
#include <gtest/gtest.h>

#include "runners/blocks.h"
#include "runners/capture.h"
#include "runners/materialize.h"
#include "tests/support/case_builder.h"

namespace coverage::runners {
namespace {

const CapturedCall* Find(const std::vector<CapturedCall>& calls, const std::string& qualified, int depth = 0) {
  for (const auto& c : calls) {
    if (c.op_case.QualifiedName() == qualified && c.depth == depth) return &c;
  }
  return nullptr;
}

// A tiny "module": linear -> rms-style normalisation -> softmax.
void TinyModule(const at::Tensor& x, const at::Tensor& w) {
  at::Tensor h = at::linear(x, w);
  at::Tensor var = h.pow(2).mean({-1}, true);
  at::Tensor n = h * at::rsqrt(var + 1e-6);
  (void)at::softmax(n, -1);
}

TEST(Capture, RecordsTopLevelCallsMergedWithCounts) {
  at::Tensor x = at::randn({2, 8, 16});
  at::Tensor w = at::randn({32, 16});
  OpRecorder rec;
  rec.Start();
  {
    ModuleScope scope(&rec, "block");
    TinyModule(x, w);
    TinyModule(x, w);  // identical calls merge
  }
  rec.Stop();
  TinyModule(x, w);  // not recorded after Stop
  auto calls = rec.TakeCalls();
  const CapturedCall* linear = Find(calls, "aten::linear");
  ASSERT_NE(linear, nullptr);
  EXPECT_EQ(linear->count, 2);
  EXPECT_EQ(linear->module_path, "block");
  EXPECT_DOUBLE_EQ(linear->flops, 2.0 * 2 * 8 * 32 * 16);
  EXPECT_EQ(linear->op_case.args[0].tensor.shape, (std::vector<int64_t>{2, 8, 16}));
  // aten::linear's children (matmul/addmm/t) belong to it: not top-level.
  EXPECT_EQ(Find(calls, "aten::t"), nullptr);
  EXPECT_EQ(Find(calls, "aten::mm"), nullptr);
  EXPECT_NE(Find(calls, "aten::softmax.int"), nullptr);
  // The variance fed to rsqrt was recorded as positive, so replay keeps it valid.
  const CapturedCall* rsqrt = Find(calls, "aten::rsqrt");
  ASSERT_NE(rsqrt, nullptr);
  EXPECT_EQ(rsqrt->op_case.args[0].tensor.domain.kind, ValueDomain::Kind::kPositive);
}

TEST(Capture, NestedCallsAreKeptWithTheirParentWhenAsked) {
  at::Tensor x = at::randn({4, 16});
  at::Tensor w = at::randn({8, 16});
  OpRecorder rec(CaptureOptions{.max_depth = 1});
  rec.Start();
  (void)at::linear(x, w);
  rec.Stop();
  auto calls = rec.TakeCalls();
  ASSERT_NE(Find(calls, "aten::linear", 0), nullptr);
  bool nested = false;
  for (const auto& c : calls) {
    if (c.depth == 1) {
      EXPECT_EQ(c.parent_op, "aten::linear");
      nested = true;
    }
    EXPECT_LE(c.depth, 1);
  }
  EXPECT_TRUE(nested);
}

TEST(Capture, IntegerInputsGetACoarsenedRangeInsideTheValuesSeen) {
  at::Tensor table = at::randn({1000, 8});
  OpRecorder rec;
  rec.Start();
  (void)at::embedding(table, at::tensor({3, 999, 17}, at::kLong));
  (void)at::embedding(table, at::tensor({5, 998, 1}, at::kLong));  // different ids, same case
  rec.Stop();
  auto calls = rec.TakeCalls();
  const CapturedCall* emb = Find(calls, "aten::embedding");
  ASSERT_NE(emb, nullptr);
  EXPECT_EQ(emb->count, 2);
  const ValueDomain& d = emb->op_case.args[1].tensor.domain;
  EXPECT_EQ(d.kind, ValueDomain::Kind::kInteger);
  EXPECT_EQ(d.lo, 1);    // no zero was seen
  EXPECT_EQ(d.hi, 512);  // largest power of two <= max+1
}

TEST(Capture, PositiveIntegerDivisorsAreNeverReplayedAsZero) {
  OpRecorder rec;
  rec.Start();
  (void)at::remainder(at::arange(100, at::kLong), at::tensor({3, 5, 8}, at::kLong).repeat({34}).narrow(0, 0, 100));
  rec.Stop();
  auto calls = rec.TakeCalls();
  const CapturedCall* rem = Find(calls, "aten::remainder.Tensor");
  ASSERT_NE(rem, nullptr);
  EXPECT_GE(rem->op_case.args[1].tensor.domain.lo, 1);
}

void StartTwoRecorders() {
  OpRecorder outer;
  OpRecorder inner;
  outer.Start();
  inner.Start();
}

TEST(Capture, ASecondRecorderOnTheSameThreadIsAProgrammingError) {
  EXPECT_DEATH(StartTwoRecorders(), "already recording");
}

TEST(Capture, CausalMaskIsRecognised) {
  at::Tensor mask = at::full({4, 4}, -std::numeric_limits<float>::infinity()).triu(1);
  at::Tensor scores = at::randn({4, 4});
  OpRecorder rec;
  rec.Start();
  (void)at::add(scores, mask);
  rec.Stop();
  auto calls = rec.TakeCalls();
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0].op_case.args[1].tensor.domain.kind, ValueDomain::Kind::kMask);
}

TEST(Materialize, InputsAreDeterministicAndFollowTheSpec) {
  using testing::Spec;
  TensorSpec strided = Spec(DType::kFloat32, {16, 8});
  strided.strides = {1, 16};  // a transposed view
  TensorSpec nonneg = Spec(DType::kFloat32, {64}, ValueDomain{ValueDomain::Kind::kNonNegative});
  OpCase c = testing::MakeCase("aten::add", "Tensor", {testing::TensorArg("self", strided),
                                                       testing::TensorArg("other", nonneg), testing::IntArg("alpha", 1)});
  const auto& schema = c10::Dispatcher::singleton().findSchemaOrThrow("aten::add", "Tensor").schema();
  auto a = Materialize(c, schema, 42);
  auto b = Materialize(c, schema, 42);
  ASSERT_TRUE(a.has_value() && b.has_value());
  auto ia = a->Build(c10::Device(c10::kCPU), false, true);
  auto ib = b->Build(c10::Device(c10::kCPU), false, true);
  at::Tensor sa = (*ia)[0].toTensor();
  EXPECT_EQ(sa.strides().vec(), (std::vector<int64_t>{1, 16}));
  EXPECT_TRUE(at::equal(sa, (*ib)[0].toTensor()));
  at::Tensor other = (*ia)[1].toTensor();
  EXPECT_GE(other.min().item<float>(), 0.0f);
  EXPECT_FALSE(at::equal(sa.reshape({-1}).narrow(0, 0, 64), other));  // arguments differ
  auto golden = a->Build(c10::Device(c10::kCPU), true, false);
  EXPECT_EQ((*golden)[0].toTensor().scalar_type(), at::kDouble);
  auto c2 = Materialize(c, schema, 43);
  EXPECT_FALSE(at::equal(sa, (*c2->Build(c10::Device(c10::kCPU), false, true))[0].toTensor()));
}

TEST(Materialize, CasesSharingASpecShareCachedValues) {
  InputCache cache(int64_t{1} << 30);
  const auto& mm = c10::Dispatcher::singleton().findSchemaOrThrow("aten::mm", "").schema();
  // Same weight spec [64, 32] in two cases with different activations.
  auto a = Materialize(testing::MmCase(4, 64, 32), mm, 0, &cache);
  auto b = Materialize(testing::MmCase(8, 64, 32), mm, 0, &cache);
  ASSERT_TRUE(a.has_value() && b.has_value());
  EXPECT_EQ(cache.hits(), 1);
  EXPECT_EQ(cache.misses(), 3);
  const c10::Device cpu(c10::kCPU);
  at::Tensor wa = (*a->Build(cpu, false, false))[1].toTensor();
  at::Tensor wb = (*b->Build(cpu, false, false))[1].toTensor();
  EXPECT_TRUE(at::equal(wa, wb));
  EXPECT_TRUE(a->VerifyReadOnlyInputs().ok());
}

TEST(Materialize, ABackendWritingIntoAReadOnlyInputIsCaughtAndCannotPoisonTheCache) {
  InputCache cache(int64_t{1} << 30);
  const auto& mm = c10::Dispatcher::singleton().findSchemaOrThrow("aten::mm", "").schema();
  const c10::Device cpu(c10::kCPU);
  auto a = Materialize(testing::MmCase(4, 64, 32), mm, 0, &cache);
  at::Tensor original = (*a->Build(cpu, false, false))[1].toTensor().clone();
  at::Tensor backend_view = (*a->Build(cpu, false, /*verify=*/true))[1].toTensor();
  backend_view.fill_(7.0);
  Status s = a->VerifyReadOnlyInputs();
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("'mat2'"), std::string::npos) << s.message();
  // The scribbled base was evicted: the next case with that spec gets the
  // original values again.
  auto b = Materialize(testing::MmCase(8, 64, 32), mm, 0, &cache);
  EXPECT_TRUE(at::equal((*b->Build(cpu, false, false))[1].toTensor(), original));
}

TEST(Blocks, DecoderBlocksCaptureAttentionAndMlpOps) {
  BlockModel m;
  m.id = "test/tiny-llama";
  m.family = "decoder";
  m.config = {{"hidden_size", 64}, {"num_attention_heads", 4}, {"num_key_value_heads", 2},
              {"intermediate_size", 128}, {"vocab_size", 100}, {"model_type", "llama"}};
  CaptureProfile decode{.name = "decode", .families = {"decoder"}, .batch = 2, .seq_len = 1, .past_len = 7};
  OpRecorder rec;
  ASSERT_TRUE(RunBlocks(m, decode, rec).ok());
  auto calls = rec.TakeCalls();
  const CapturedCall* silu = Find(calls, "aten::silu");
  ASSERT_NE(silu, nullptr);
  EXPECT_EQ(silu->module_path, "layers.0.mlp");
  // The KV cache is concatenated: 7 past + 1 new position.
  const CapturedCall* cat = Find(calls, "aten::cat");
  ASSERT_NE(cat, nullptr);
  const CapturedCall* emb = Find(calls, "aten::embedding");
  ASSERT_NE(emb, nullptr);
  EXPECT_EQ(emb->op_case.args[0].tensor.shape, (std::vector<int64_t>{100, 64}));
  m.config.erase("vocab_size");
  Status missing = RunBlocks(m, decode, rec);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.message().find("vocab_size"), std::string::npos);
}

}  // namespace
}  // namespace coverage::runners
