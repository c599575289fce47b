// Program replay on programs the tracer captured from a tiny Llama
// (tests/fixtures/programs, regenerate.sh): a correct backend passes, a
// backend that breaks one op fails and that op's call is named as the first
// divergent one, the module check isolates it to its module, a wrong
// backward op is caught in the training program, a changed shape is
// shape_divergence, and liveness keeps the peak near the largest live set.
#include "replay/program_replay.h"

#include <fstream>
#include <sstream>

#include <gtest/gtest.h>

#include "capture/trace_reader.h"
#include "tests/support/fake_backend.h"
#include "tests/support/programs.h"

namespace coverage {
namespace {

using replay::ProgramReplayOptions;
using testing::FakeBackend;

using testing::LoadProgramFixture;

const Program& Prefill() {
  static const Program p = LoadProgramFixture("tiny_llama_prefill.jsonl");
  return p;
}
const Program& Train() {
  static const Program p = LoadProgramFixture("tiny_llama_train.jsonl");
  return p;
}

// Index of the first call of `op` (qualified, "aten::mm") in `phase`.
int64_t FirstCall(const Program& p, const std::string& op, const std::string& phase = "forward") {
  for (const auto& c : p.calls) {
    const std::string q = c.overload.empty() ? c.op : c.op + "." + c.overload;
    if ((q == op || c.op == op) && c.phase == phase) return c.index;
  }
  return -1;
}

TEST(ProgramReplay, ACorrectBackendPassesAndTheLogitsAreJudged) {
  FakeBackend backend;
  const auto item = replay::ReplayProgram(Prefill(), backend, ProgramReplayOptions{});
  EXPECT_EQ(item.outcome, Outcome::kPass) << item.error;
  EXPECT_TRUE(item.values_compared);
  EXPECT_DOUBLE_EQ(item.cosine, 1.0);
  EXPECT_EQ(item.detail["replay"]["calls_run"], Prefill().calls.size());
  EXPECT_EQ(backend.executions, static_cast<int>(Prefill().calls.size()));
  // The main output is the logits [1, 16, vocab 128], with top-k agreement.
  EXPECT_EQ(item.detail["output_shape"], (std::vector<int64_t>{1, 16, 128}));
  EXPECT_DOUBLE_EQ(item.detail["topk_agreement"].get<double>(), 1.0);
  EXPECT_FALSE(item.detail.contains("first_divergent"));
}

TEST(ProgramReplay, TheSameSeedGivesTheSameOutputsAndAnotherSeedOthers) {
  // A backend that adds 1e-3 to rsqrt's outputs (the norms): the error it
  // leaves in the logits depends on the leaves, so it repeats exactly per seed.
  auto run = [](uint64_t seed) {
    FakeBackend backend;
    ProgramReplayOptions o;
    o.check.seed = seed;
    o.check.golden = replay::GoldenMode::kNever;
    backend.add_offset["aten::rsqrt"] = 1e-3;
    o.locate_first_divergent = false;
    return replay::ReplayProgram(Prefill(), backend, o);
  };
  const auto a = run(1), b = run(1), c = run(2);
  EXPECT_NE(a.outcome, Outcome::kPass);
  EXPECT_EQ(a.max_abs_err, b.max_abs_err);
  EXPECT_NE(a.max_abs_err, c.max_abs_err);
}

TEST(ProgramReplay, ABrokenOpFailsTheModelAndItsFirstCallIsNamedAsFirstDivergent) {
  FakeBackend backend;
  backend.add_offset["aten::silu"] = 0.5;
  const auto item = replay::ReplayProgram(Prefill(), backend, ProgramReplayOptions{});
  EXPECT_EQ(item.outcome, Outcome::kMismatch) << item.error;
  ASSERT_TRUE(item.detail.contains("first_divergent")) << item.detail.dump();
  const auto& d = item.detail["first_divergent"];
  const int64_t silu = FirstCall(Prefill(), "aten::silu");
  ASSERT_GE(silu, 0);
  EXPECT_EQ(d["call"], silu);
  EXPECT_EQ(d["op"], "aten::silu");
  EXPECT_EQ(d["case_key"], Prefill().calls[static_cast<size_t>(silu)].op_case->Key());
  EXPECT_EQ(d["module"], "model.layers.0.mlp.act_fn");
  EXPECT_EQ(d["phase"], "forward");
}

TEST(ProgramReplay, AnErrorOnTheBackendNamesTheCallAndItsModule) {
  FakeBackend backend;
  backend.throw_message["aten::_scaled_dot_product_flash_attention_for_cpu"] = "no attention kernel on this device";
  const auto item = replay::ReplayProgram(Prefill(), backend, ProgramReplayOptions{});
  EXPECT_EQ(item.outcome, Outcome::kError);
  EXPECT_NE(item.error.find("no attention kernel on this device"), std::string::npos) << item.error;
  EXPECT_NE(item.error.find("model.layers.0.self_attn"), std::string::npos) << item.error;
  EXPECT_EQ(item.detail["first_divergent"]["op"], "aten::_scaled_dot_product_flash_attention_for_cpu");
}

TEST(ProgramReplay, AChangedShapeMidProgramIsShapeDivergenceNamingTheCall) {
  FakeBackend backend;
  backend.drop_last_row.insert("aten::embedding");
  const auto item = replay::ReplayProgram(Prefill(), backend, ProgramReplayOptions{});
  EXPECT_EQ(item.outcome, Outcome::kShapeDivergence) << item.error;
  EXPECT_EQ(item.detail["failed_call"], FirstCall(Prefill(), "aten::embedding"));
  EXPECT_NE(item.error.find("aten::embedding"), std::string::npos) << item.error;
}

TEST(ProgramReplay, TheModuleCheckIsolatesTheBrokenOpToItsModule) {
  const auto kinds = replay::ModuleKinds(Prefill());
  // One of each kind with calls of its own, the first layer's.
  for (const char* m : {"model.layers.0.mlp.act_fn", "model.layers.0.input_layernorm", "model.layers.0.self_attn",
                        "model.embed_tokens", "lm_head"}) {
    EXPECT_NE(std::find(kinds.begin(), kinds.end(), m), kinds.end()) << m;
  }
  for (const auto& k : kinds) EXPECT_EQ(k.find("layers.1."), std::string::npos) << k;

  FakeBackend backend;
  backend.add_offset["aten::silu"] = 0.5;
  const auto items = replay::ReplayModules(Prefill(), kinds, backend, ProgramReplayOptions{});
  ASSERT_EQ(items.size(), kinds.size());
  for (const auto& item : items) {
    if (item.item == "model.layers.0.mlp.act_fn") {
      EXPECT_EQ(item.outcome, Outcome::kMismatch) << item.error;
      EXPECT_GE(item.detail["boundary_outputs"].get<int>(), 1);
    } else {
      EXPECT_EQ(item.outcome, Outcome::kPass) << item.item << ": " << item.error;
    }
  }
  const auto none = replay::ReplayModule(Prefill(), "model.no_such_module", backend, ProgramReplayOptions{});
  EXPECT_EQ(none.outcome, Outcome::kSkipped);
}

TEST(ProgramReplay, TrainingStepsPassOnACorrectBackendAndTheLossMoves) {
  FakeBackend backend;
  ProgramReplayOptions o;
  o.check.train_steps = 3;
  const auto item = replay::ReplayTraining(Train(), backend, o);
  EXPECT_EQ(item.outcome, Outcome::kPass) << item.error;
  ASSERT_EQ(item.detail["losses"].size(), 3u);
  // Parameters carried over: the optimizer's updates change the next loss.
  EXPECT_NE(item.detail["losses"][0], item.detail["losses"][2]);
  EXPECT_EQ(item.detail["losses"], item.detail["reference_losses"]);
  // A forward-only program has no step to replay.
  EXPECT_EQ(replay::ReplayTraining(Prefill(), backend, o).outcome, Outcome::kSkipped);
}

TEST(ProgramReplay, AWrongBackwardOpIsCaughtInTheTrainingProgram) {
  FakeBackend backend;
  backend.add_offset["aten::silu_backward"] = 1e-2;
  ProgramReplayOptions o;
  o.check.train_steps = 2;
  const auto item = replay::ReplayTraining(Train(), backend, o);
  EXPECT_EQ(item.outcome, Outcome::kMismatch) << item.error;
  EXPECT_NE(item.error.find("gradient"), std::string::npos) << item.error;
  // The forward pass is untouched: the first loss agrees.
  EXPECT_EQ(item.detail["losses"][0], item.detail["reference_losses"][0]);
  ASSERT_TRUE(item.detail.contains("first_divergent")) << item.detail.dump();
  EXPECT_EQ(item.detail["first_divergent"]["op"], "aten::silu_backward");
  EXPECT_EQ(item.detail["first_divergent"]["phase"], "backward");
  EXPECT_EQ(item.detail["first_divergent"]["call"], FirstCall(Train(), "aten::silu_backward", "backward"));
}

TEST(ProgramReplay, LivenessKeepsThePeakNearTheLargestLiveSet) {
  FakeBackend backend;
  const Program& p = Train();
  const auto item = replay::ReplayProgram(p, backend, ProgramReplayOptions{});
  ASSERT_EQ(item.outcome, Outcome::kPass) << item.error;
  // What holding every value to the end would cost: each value's bytes.
  int64_t all = 0;
  for (const auto& v : p.values) {
    if (v.tensor) all += v.tensor->StorageNumel() * (DTypeSize(v.tensor->dtype));
  }
  for (const auto& c : p.calls) {
    for (const auto& s : c.output_specs) all += s.StorageNumel() * (DTypeSize(s.dtype));
  }
  const int64_t peak = item.detail["replay"]["peak_live_bytes"].get<int64_t>();
  EXPECT_GT(peak, 0);
  EXPECT_LT(peak, all / 2) << "peak " << peak << " of " << all << " bytes for every value";
}

TEST(ProgramReplay, ACallThatCannotBeReplayedSkipsTheProgramWithTheReason) {
  Program p = Prefill();
  p.calls[3].op_case.reset();
  p.calls[3].unsupported = "generator: a Generator argument";
  FakeBackend backend;
  const auto item = replay::ReplayProgram(p, backend, ProgramReplayOptions{});
  EXPECT_EQ(item.outcome, Outcome::kSkipped);
  EXPECT_NE(item.error.find("call 3"), std::string::npos) << item.error;
  EXPECT_NE(item.error.find("a Generator argument"), std::string::npos) << item.error;
  EXPECT_EQ(backend.executions, 0);
}

// A program the reference cannot run either (traced on meta, where nothing
// checks an index against its table: here the token ids are drawn far
// outside the vocabulary) is skipped with the reference's reason; no
// backend is blamed for the error it raises on the same call.
TEST(ProgramReplay, ACallTheReferenceCannotRunEitherIsNotTheBackendsFailure) {
  Program p = Prefill();
  bool widened = false;
  for (auto& v : p.values) {
    if (v.kind == "input" && v.name == "input_ids" && v.tensor) {
      v.tensor->domain.lo = 1'000'000;
      v.tensor->domain.hi = 2'000'000;
      widened = true;
    }
  }
  ASSERT_TRUE(widened) << "the fixture has an input_ids leaf";
  FakeBackend backend;
  const auto item = replay::ReplayProgram(p, backend, ProgramReplayOptions{});
  EXPECT_EQ(item.outcome, Outcome::kSkipped) << OutcomeName(item.outcome) << ": " << item.error;
  EXPECT_NE(item.error.find("the CPU reference cannot replay call"), std::string::npos) << item.error;
  EXPECT_NE(item.error.find("aten::embedding"), std::string::npos) << item.error;
}

}  // namespace
}  // namespace coverage
