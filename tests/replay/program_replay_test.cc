// Program replay on programs the tracer captured from a tiny Llama
// (tests/fixtures/programs, regenerate.sh): a correct backend passes, a
// backend that breaks one op fails and that op's call is named as the first
// divergent one, the module check isolates it to its module, a wrong
// backward op is caught in the training program, a changed shape is
// shape_divergence, and liveness keeps the peak near the largest live set.
#include "replay/program_replay.h"

#include <fstream>
#include <memory>
#include <sstream>

#include <gtest/gtest.h>

#include "capture/trace_reader.h"
#include "replay/replay.h"
#include "tests/support/fake_backend.h"
#include "tests/support/integer_histc_backend.h"
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
  EXPECT_TRUE(item.values_compared());
  ASSERT_TRUE(item.cosine.has_value());
  EXPECT_DOUBLE_EQ(*item.cosine, 1.0);
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

// Note [Declared numerics]: a backend that computes every matmul from bf16
// operands fails the model at fp32 precision, passes it once it declares so
// (the reference's matmuls round the same operands), and still fails when
// one other op is worse than the CPU's, with that op's call named.
TEST(ProgramReplay, AModelIsJudgedAgainstTheNumericsTheBackendDeclares) {
  auto options = [](bool declared) {
    ProgramReplayOptions o;
    if (declared) {
      auto d = replay::DeclaredNumerics::FromJson(R"({"fp32_operands": "bf16", "ops": {"aten::mm": ["self", "mat2"]}})",
                                                  "numerics.json");
      EXPECT_TRUE(d.has_value());
      if (d) o.check.comparison.numerics = *d;
    }
    return o;
  };
  FakeBackend bf16;
  bf16.operand_mantissa_bits["aten::mm"] = 7;
  const auto undeclared = replay::ReplayProgram(Prefill(), bf16, options(false));
  EXPECT_NE(undeclared.outcome, Outcome::kPass);
  const auto declared = replay::ReplayProgram(Prefill(), bf16, options(true));
  EXPECT_EQ(declared.outcome, Outcome::kPass) << declared.error;
  EXPECT_EQ(declared.detail["replay"]["reference_rounded_operands"], 2 * 15) << declared.detail.dump();
  const auto train = replay::ReplayTraining(Train(), bf16, options(true));
  EXPECT_EQ(train.outcome, Outcome::kPass) << train.error;

  // rsqrt 1% off: a fault the model's logits show beyond bf16's rounding.
  FakeBackend worse = bf16;
  worse.scale_outputs["aten::rsqrt"] = 1.01;
  const auto item = replay::ReplayProgram(Prefill(), worse, options(true));
  EXPECT_NE(item.outcome, Outcome::kPass);
  ASSERT_TRUE(item.detail.contains("first_divergent")) << item.detail.dump();
  EXPECT_EQ(item.detail["first_divergent"]["op"], "aten::rsqrt");
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

// Note [One call engine]: the first divergent call is judged as the unit
// stage judges its op case, so the two name the same kind of miss.
TEST(ProgramReplay, TheFirstDivergentCallIsJudgedAsTheUnitStageJudgesItsCase) {
  auto backend = std::make_shared<FakeBackend>();
  backend->add_offset["aten::silu"] = 0.5;
  const auto item = replay::ReplayProgram(Prefill(), *backend, ProgramReplayOptions{});
  ASSERT_TRUE(item.detail.contains("first_divergent")) << item.detail.dump();
  const auto& d = item.detail["first_divergent"];
  const OpCase& silu = *Prefill().calls[static_cast<size_t>(FirstCall(Prefill(), "aten::silu"))].op_case;
  replay::ReplayExecutor unit(backend, replay::ReplayOptions{});
  const CaseResult r = unit.Run(silu);
  EXPECT_EQ(d["outcome"], std::string(OutcomeName(r.outcome))) << r.error;
  ASSERT_TRUE(r.max_abs_err.has_value());
  EXPECT_NEAR(*r.max_abs_err, 0.5, 1e-3);
  EXPECT_NEAR(d["max_abs_err"].get<double>(), 0.5, 1e-3);
}

TEST(ProgramReplay, AnErrorOnTheBackendNamesTheCallAndItsModule) {
  FakeBackend backend;
  // Attention is recorded whole (Note [Composites recorded whole]): the
  // backend receives aten::scaled_dot_product_attention and makes its own
  // choice; the CPU's kernel for it is named beside it.
  backend.throw_message["aten::scaled_dot_product_attention"] = "no attention kernel on this device";
  const auto item = replay::ReplayProgram(Prefill(), backend, ProgramReplayOptions{});
  EXPECT_EQ(item.outcome, Outcome::kError);
  EXPECT_NE(item.error.find("no attention kernel on this device"), std::string::npos) << item.error;
  EXPECT_NE(item.error.find("model.layers.0.self_attn"), std::string::npos) << item.error;
  EXPECT_EQ(item.detail["first_divergent"]["op"], "aten::scaled_dot_product_attention");
  EXPECT_EQ(item.detail["first_divergent"]["decomposition"],
            nlohmann::json::array({"aten::_scaled_dot_product_flash_attention_for_cpu"}));
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

// A failing module names the first call inside it that misses its tolerance
// given the reference's inputs, as the model stage does for the whole model:
// with every cat wrong, the attention's first own cat (the rotary
// embedding's, after a dozen views, muls and slices), not the KV cache's
// cats whose outputs leave the module.
TEST(ProgramReplay, AFailingModuleNamesItsFirstWrongCall) {
  const std::string attention = "model.layers.0.self_attn";
  int64_t first_cat = -1, own_calls_before = 0;
  for (const auto& c : Prefill().calls) {
    if (c.module != attention) continue;
    if (c.op == "aten::cat") {
      first_cat = c.index;
      break;
    }
    ++own_calls_before;
  }
  ASSERT_GT(first_cat, 0);
  ASSERT_GT(own_calls_before, 5);  // the wrong call is inside the module, not its first
  FakeBackend backend;
  backend.add_offset["aten::cat"] = 0.5;
  const auto items =
      replay::ReplayModules(Prefill(), {attention, "model.layers.0.mlp.act_fn"}, backend, ProgramReplayOptions{});
  ASSERT_EQ(items.size(), 2u);
  EXPECT_EQ(items[0].outcome, Outcome::kMismatch) << items[0].error << items[0].detail.dump();
  ASSERT_TRUE(items[0].detail.contains("first_divergent")) << items[0].detail.dump();
  EXPECT_EQ(items[0].detail["first_divergent"]["call"], first_cat);
  EXPECT_EQ(items[0].detail["first_divergent"]["op"], "aten::cat");
  EXPECT_EQ(items[0].detail["first_divergent"]["module"], attention);
  EXPECT_EQ(items[1].outcome, Outcome::kPass) << items[1].error;
  EXPECT_FALSE(items[1].detail.contains("first_divergent"));
}

// A call a module cannot run on the backend is that module's verdict; the
// other modules are still judged (the pass runs again without it), not "not
// reached".
TEST(ProgramReplay, AModuleThatCannotRunDoesNotHideTheOthers) {
  FakeBackend backend;
  backend.unsupported.insert("aten::silu");
  const auto items = replay::ReplayModules(Prefill(), {"model.layers.0.mlp.act_fn", "model.layers.0.self_attn", "lm_head"},
                                           backend, ProgramReplayOptions{});
  ASSERT_EQ(items.size(), 3u);
  EXPECT_EQ(items[0].outcome, Outcome::kUnsupported) << items[0].error;
  EXPECT_NE(items[0].error.find("aten::silu"), std::string::npos) << items[0].error;
  for (size_t i : {1u, 2u}) {
    EXPECT_EQ(items[i].outcome, Outcome::kPass) << items[i].item << ": " << items[i].error;
    EXPECT_GT(items[i].detail["calls"].get<int64_t>(), 0) << items[i].item;
  }
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

// A layer norm without weight or bias (OLMo's) asks its backward for one
// gradient of three (output_mask [true, false, false]); the other two are
// absent outputs, recorded and replayed as such.
TEST(ProgramReplay, ABackwardWithOptionalOutputsReplays) {
  static const Program olmo = LoadProgramFixture("tiny_olmo_train.jsonl");
  const int64_t backward = FirstCall(olmo, "aten::native_layer_norm_backward", "backward");
  ASSERT_GE(backward, 0);
  FakeBackend backend;
  ProgramReplayOptions o;
  o.check.train_steps = 2;
  const auto item = replay::ReplayTraining(olmo, backend, o);
  EXPECT_EQ(item.outcome, Outcome::kPass) << item.error;
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
  // The forward pass: in a training step the parameters, their gradients
  // and AdamW's state (and its foreach step's lists over every parameter)
  // are alive together, whatever the liveness.
  const Program& p = Prefill();
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

// Note [Random calls]: noise = rand(64, 64), then sorted, as ViT-MAE picks
// the patches it masks; y = x + sorted noise. The indices of the sort are
// an output judged exactly.
Program ProgramFromLines(const std::vector<std::string>& lines) {
  capture::TraceReader reader;
  for (const auto& line : lines) {
    const Status s = reader.Feed(line);
    EXPECT_TRUE(s.ok()) << s.message();
  }
  auto outcome = reader.Finish();
  EXPECT_TRUE(outcome.has_value() && outcome->program.has_value());
  return outcome.has_value() && outcome->program ? *outcome->program : Program{};
}

const char* const kStart =
    R"({"type":"start","tracer_version":3,"model":"t/small","profile":"prefill","class":"Small","model_type":"small",)"
    R"("kind":"vision","torch":"","transformers":"","device":"meta","layers":{},"dtype":"f32","estimated_gb":0})";

// Note [Memory estimate]: sized on meta with the replay's own liveness, so
// its replay term bounds what the replay holds, and not by much.
TEST(ProgramReplay, TheMemoryEstimateBoundsTheReplaysLiveValues) {
  FakeBackend backend;
  const auto item = replay::ReplayProgram(Prefill(), backend, ProgramReplayOptions{});
  ASSERT_EQ(item.outcome, Outcome::kPass) << item.error;
  const double peak = item.detail["replay"]["peak_live_bytes"].get<double>();
  const replay::MemoryEstimate e = replay::EstimateMemory(Prefill(), "model", {}, /*backend_copies=*/false);
  EXPECT_TRUE(e.error.empty()) << e.error;
  const double tensors = (e.replay_bytes - replay::kStageWorkingBytes) / replay::kStageMemoryMargin;
  EXPECT_GE(tensors, peak - 1);  // bytes, up to rounding
  EXPECT_LE(tensors, 1.5 * peak);
  // The fp32 program's golden holds the same values in float64, and the
  // replay's verdicts (the logits, both sides) while it runs.
  EXPECT_GT(e.golden_bytes, e.replay_bytes);
  EXPECT_LT(e.golden_bytes, 1.5 * e.replay_bytes);
  EXPECT_EQ(e.bytes, std::max(e.replay_bytes, e.golden_bytes));
  // The module stage also keeps a copy per side of what each checked module
  // hands on; with every module left out it holds what the model stage holds.
  EXPECT_GT(replay::EstimateMemory(Prefill(), "module", {}, false).replay_bytes, e.replay_bytes);
  ProgramReplayOptions none;
  for (const auto& m : replay::ModuleKinds(Prefill())) none.skip_modules.insert(m);
  EXPECT_DOUBLE_EQ(replay::EstimateMemory(Prefill(), "module", none, false).replay_bytes, e.replay_bytes);
  // A backend that is not the CPU's own returns every result through a copy.
  EXPECT_GT(replay::EstimateMemory(Prefill(), "model", {}, /*backend_copies=*/true).replay_bytes, e.replay_bytes);
}

TEST(ProgramReplay, TrainingsEstimateKeepsItsParametersForTheGolden) {
  double params = 0;
  for (const auto& v : Train().values) {
    if (v.kind == "parameter") params += static_cast<double>(v.tensor->StorageNumel() * DTypeSize(v.tensor->dtype));
  }
  const replay::MemoryEstimate e = replay::EstimateMemory(Train(), "train", {}, false);
  EXPECT_TRUE(e.error.empty()) << e.error;
  // Both sides' parameters, gradients and AdamW moments, and the first
  // parameters; the golden's in float64 beside three sets kept for it.
  EXPECT_GE(e.replay_bytes, 2 * 4 * params + params);
  EXPECT_GE(e.golden_bytes, 2 * 4 * params + 3 * params);
  // Measured: one training step on a correct backend never holds more.
  FakeBackend backend;
  ProgramReplayOptions o;
  o.check.train_steps = 2;
  const auto item = replay::ReplayTraining(Train(), backend, o);
  ASSERT_EQ(item.outcome, Outcome::kPass) << item.error;
  EXPECT_GE(e.replay_bytes, item.detail["replay"]["peak_live_bytes"].get<double>());
}

// Views share their base's storage: a weight and its transpose are one
// tensor's bytes, not two.
TEST(ProgramReplay, TheMemoryEstimateCountsAStorageOnceWhateverViewsLookIntoIt) {
  const std::string w = R"({"dtype":"f32","shape":[1024,1024],"strides":[1024,1],"storage_offset":0})";
  const std::string wt = R"({"dtype":"f32","shape":[1024,1024],"strides":[1,1024],"storage_offset":0})";
  const std::string x = R"({"dtype":"f32","shape":[4,1024],"strides":[1024,1],"storage_offset":0})";
  const Program p = ProgramFromLines({
      kStart,
      R"({"type":"value","id":0,"kind":"parameter","name":"w","tensor":)" + w + R"(,"init":{"rule":"normal","std":0.02}})",
      R"({"type":"value","id":1,"kind":"input","name":"x","tensor":)" + x + R"(,"domain":{"kind":"real"}})",
      R"({"type":"call","index":0,"op":"aten::t","overload":"","args":[{"name":"self","kind":"tensor","value":0,"tensor":)" +
          w + R"(}],"outputs":[{"value":2,"tensor":)" + wt + R"(}],"module":"proj","phase":"forward"})",
      R"({"type":"call","index":1,"op":"aten::mm","overload":"","args":[{"name":"self","kind":"tensor","value":1,"tensor":)" +
          x + R"(},{"name":"mat2","kind":"tensor","value":2,"tensor":)" + wt + R"(}],"outputs":[{"value":3,"tensor":)" + x +
          R"(}],"module":"proj","phase":"forward"})",
      R"({"type":"end","calls":2,"values":4,"seconds":0,"peak_rss_mb":0})"});
  ASSERT_EQ(p.calls.size(), 2u);
  const replay::MemoryEstimate e = replay::EstimateMemory(p, "model", {}, false);
  EXPECT_TRUE(e.error.empty()) << e.error;
  const double weight = 1024.0 * 1024 * 4, act = 4.0 * 1024 * 4;
  auto tensors = [](double bytes) { return (bytes - replay::kStageWorkingBytes) / replay::kStageMemoryMargin; };
  EXPECT_DOUBLE_EQ(tensors(e.replay_bytes), 2 * (weight + 2 * act));
  // An op the backend declares rounds its fp32 operands in a copy.
  ProgramReplayOptions o;
  auto d = replay::DeclaredNumerics::FromJson(R"({"fp32_operands": "bf16", "ops": {"aten::mm": []}})", "numerics.json");
  ASSERT_TRUE(d.has_value());
  o.check.comparison.numerics = *d;
  EXPECT_DOUBLE_EQ(tensors(replay::EstimateMemory(p, "model", o, false).replay_bytes),
                   2 * (weight + 2 * act) + 1.5 * (weight + act));
}

Program RandomProgram() {
  const std::string f32 = R"({"dtype":"f32","shape":[64,64],"strides":[64,1],"storage_offset":0})";
  const std::string i64 = R"({"dtype":"i64","shape":[64,64],"strides":[64,1],"storage_offset":0})";
  const std::vector<std::string> lines = {
      kStart,
      R"({"type":"value","id":0,"kind":"input","name":"x","tensor":)" + f32 + R"(,"domain":{"kind":"real"}})",
      R"({"type":"call","index":0,"op":"aten::rand","overload":"","args":[{"name":"size","kind":"int_list","ints":[64,64]},)"
      R"({"name":"dtype","kind":"none"},{"name":"layout","kind":"none"},{"name":"device","kind":"device"},)"
      R"({"name":"pin_memory","kind":"none"}],"outputs":[{"value":1,"tensor":)" + f32 + R"(}],"module":"noise","phase":"forward"})",
      R"({"type":"call","index":1,"op":"aten::sort","overload":"","args":[{"name":"self","kind":"tensor","value":1,"tensor":)" +
          f32 + R"(},{"name":"dim","kind":"int","i":-1},{"name":"descending","kind":"bool","b":false}],)"
      R"("outputs":[{"value":2,"tensor":)" + f32 + R"(},{"value":3,"tensor":)" + i64 + R"(}],"module":"noise","phase":"forward"})",
      R"({"type":"call","index":2,"op":"aten::add","overload":"Tensor","args":[{"name":"self","kind":"tensor","value":0,"tensor":)" +
          f32 + R"(},{"name":"other","kind":"tensor","value":2,"tensor":)" + f32 +
          R"(},{"name":"alpha","kind":"int","i":1}],"outputs":[{"value":4,"tensor":)" + f32 + R"(}],"module":"","phase":"forward"})",
      R"({"type":"end","calls":3,"values":5,"seconds":0,"peak_rss_mb":0})"};
  return ProgramFromLines(lines);
}

TEST(ProgramReplay, ARandomCallIsJudgedAsADrawAndFeedsTheReferencesValuesOn) {
  const Program p = RandomProgram();
  ASSERT_EQ(p.calls.size(), 3u);
  // A backend that draws from its own generator (the CPU's here, as the
  // `cpu` backend does): the sort's indices still agree, run after run.
  FakeBackend backend;
  for (int run = 0; run < 2; ++run) {
    const auto item = replay::ReplayProgram(p, backend, ProgramReplayOptions{});
    EXPECT_EQ(item.outcome, Outcome::kPass) << "run " << run << ": " << item.error;
  }
  // Draws from another distribution are the random call's failure.
  backend.add_offset["aten::rand"] = 0.5;
  const auto item = replay::ReplayProgram(p, backend, ProgramReplayOptions{});
  EXPECT_EQ(item.outcome, Outcome::kMismatch);
  EXPECT_NE(item.error.find("call 0 (aten::rand"), std::string::npos) << item.error;
  EXPECT_NE(item.error.find("a random call"), std::string::npos) << item.error;
  EXPECT_EQ(item.detail["first_divergent"]["op"], "aten::rand") << item.detail.dump();
}

// An index the model built itself (head indices, an arange kept as a
// constant), traced on meta where its values are unknown: no recorded range.
// Drawn like any integer ([0, 16)), it indexes past a 4-row table and the
// reference itself raises; its use as an index bounds it instead.
TEST(ProgramReplay, AnIndexWithNoRecordedRangeStaysInsideWhatItIndexes) {
  const std::string table = R"({"dtype":"f32","shape":[4,8],"strides":[8,1],"storage_offset":0})";
  const std::string heads = R"({"dtype":"i64","shape":[64],"strides":[1],"storage_offset":0})";
  const std::string out = R"({"dtype":"f32","shape":[64,8],"strides":[8,1],"storage_offset":0})";
  const Program p = ProgramFromLines({
      kStart,
      R"({"type":"value","id":0,"kind":"parameter","name":"heads.table","tensor":)" + table +
          R"(,"init":{"rule":"normal","mean":0.0,"std":0.02}})",
      R"({"type":"value","id":1,"kind":"constant","name":"","tensor":)" + heads + "}",
      R"({"type":"call","index":0,"op":"aten::index_select","overload":"","args":[{"name":"self","kind":"tensor","value":0,"tensor":)" +
          table + R"(},{"name":"dim","kind":"int","i":0},{"name":"index","kind":"tensor","value":1,"tensor":)" + heads +
          R"(}],"outputs":[{"value":2,"tensor":)" + out + R"(}],"module":"heads","phase":"forward"})",
      R"({"type":"end","calls":1,"values":3,"seconds":0,"peak_rss_mb":0})"});
  ASSERT_EQ(p.calls.size(), 1u);
  ASSERT_NE(p.values[1].tensor->domain.kind, ValueDomain::Kind::kInteger) << "the fixture records no range";
  FakeBackend backend;
  const auto item = replay::ReplayProgram(p, backend, ProgramReplayOptions{});
  EXPECT_EQ(item.outcome, Outcome::kPass) << item.error;
}

// Note [Reference upcast] in program replay: a program traced on meta takes
// transformers' accelerator branch of the MoE experts and counts tokens with
// histc on int32 ids, which the CPU reference has no kernel for. The
// reference counts in float64, so a backend with the integer kernel is
// judged and the module is reached.
TEST(ProgramReplay, AnInt32HistcHasAReferenceSoTheModelIsJudged) {
  const std::string ids = R"({"dtype":"i32","shape":[256],"strides":[1],"storage_offset":0})";
  const std::string counts = R"({"dtype":"i32","shape":[8],"strides":[1],"storage_offset":0})";
  const Program p = ProgramFromLines({
      kStart,
      R"({"type":"value","id":0,"kind":"input","name":"expert_ids","tensor":)" + ids +
          R"(,"domain":{"kind":"integer","lo":0,"hi":8}})",
      R"({"type":"call","index":0,"op":"aten::histc","overload":"","args":[{"name":"self","kind":"tensor","value":0,"tensor":)" +
          ids + R"(,"domain":{"kind":"integer","lo":0,"hi":8}},{"name":"bins","kind":"int","i":8},)"
          R"({"name":"min","kind":"int","i":0},{"name":"max","kind":"int","i":7}],)"
          R"("outputs":[{"value":1,"tensor":)" + counts + R"(}],"module":"model.layers.0.mlp.experts","phase":"forward"})",
      R"({"type":"end","calls":1,"values":2,"seconds":0,"peak_rss_mb":0})"});
  ASSERT_EQ(p.calls.size(), 1u);
  testing::IntegerHistcBackend good;
  auto item = replay::ReplayProgram(p, good, ProgramReplayOptions{});
  EXPECT_EQ(item.outcome, Outcome::kPass) << item.error;
  EXPECT_EQ(item.detail["replay"]["reference_upcasts"], 1) << item.detail.dump();
  testing::IntegerHistcBackend wrong;
  wrong.off_by = 1;
  item = replay::ReplayProgram(p, wrong, ProgramReplayOptions{});
  EXPECT_EQ(item.outcome, Outcome::kMismatch) << item.error;
  // The CPU as a backend has no such kernel: unsupported on the call, named.
  FakeBackend cpu;
  item = replay::ReplayProgram(p, cpu, ProgramReplayOptions{});
  EXPECT_EQ(item.outcome, Outcome::kUnsupported) << item.error;
  EXPECT_NE(item.error.find("model.layers.0.mlp.experts"), std::string::npos) << item.error;
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


// Note [Training verdicts]: the tolerances come from the fp64 golden of the
// same steps. An AdamW step without its weight decay (the foreach mul by
// 1 - lr * weight_decay skipped) and an rsqrt 1e-4 off move the parameters
// and gradient norms a little, far more than the CPU's own error: both fail,
// named, while the exact backend passes (TrainingStepsPassOnACorrectBackend
// above) and so does one with declared bf16 operands
// (AModelIsJudgedAgainstTheNumericsTheBackendDeclares).
TEST(ProgramReplay, SmallTrainingFaultsFailAgainstTheGolden) {
  ProgramReplayOptions o;
  o.check.train_steps = 3;
  FakeBackend no_decay;
  no_decay.skip_when_scalar["aten::_foreach_mul_.Scalar"] = 1 - 1e-3 * 1e-2;  // lr 1e-3, weight decay 0.01
  const auto decay = replay::ReplayTraining(Train(), no_decay, o);
  EXPECT_EQ(decay.outcome, Outcome::kMismatch) << decay.error;
  // The first miss names the item: the loss after the first update.
  EXPECT_NE(decay.error.find("step 1: the loss"), std::string::npos) << decay.error;
  EXPECT_NE(decay.error.find("fp64 golden"), std::string::npos) << decay.error;
  ASSERT_TRUE(decay.detail.contains("golden")) << decay.detail.dump();
  EXPECT_GT(decay.detail["golden"]["param_err"].get<double>(), 10 * decay.detail["golden"]["cpu_param_err"].get<double>());
  // Losses and gradients of the first step come before any update.
  EXPECT_EQ(decay.detail["losses"][0], decay.detail["reference_losses"][0]);

  FakeBackend rsqrt;
  rsqrt.scale_outputs["aten::rsqrt"] = 1 + 1e-4;
  const auto wrong = replay::ReplayTraining(Train(), rsqrt, o);
  EXPECT_EQ(wrong.outcome, Outcome::kMismatch) << wrong.error;
  EXPECT_NE(wrong.error.find("step 0"), std::string::npos) << wrong.error;
  EXPECT_NE(wrong.error.find("fp64 golden"), std::string::npos) << wrong.error;

  // --golden never: the dtype's tolerance of the reference alone.
  o.check.golden = replay::GoldenMode::kNever;
  const auto never = replay::ReplayTraining(Train(), rsqrt, o);
  EXPECT_EQ(never.outcome, Outcome::kMismatch) << never.error;
  EXPECT_NE(never.error.find("no fp64 golden"), std::string::npos) << never.error;
  EXPECT_FALSE(never.detail.contains("golden"));
}

// Note [Model verdicts], Note [By-products]: y = layer_norm(x) * 1e-7. The
// layer norm's saved mean and rstd are by-products nothing reads: wrong,
// they are counted, not judged. y's values are tiny: an error within the
// absolute tolerance everywhere turns its direction around (cosine far below
// 0.99) and still passes, since cosine judges only outputs with elements
// outside the tolerance; ten times that error fails.
TEST(ProgramReplay, CosineAndByProductsJudgeOnlyWhatTheyMean) {
  const std::string x = R"({"dtype":"f32","shape":[4,64],"strides":[64,1],"storage_offset":0})";
  const std::string w = R"({"dtype":"f32","shape":[64],"strides":[1],"storage_offset":0})";
  const std::string stat = R"({"dtype":"f32","shape":[4,1],"strides":[1,1],"storage_offset":0})";
  const Program p = ProgramFromLines({
      kStart,
      R"({"type":"value","id":0,"kind":"input","name":"x","tensor":)" + x + R"(,"domain":{"kind":"real"}})",
      R"({"type":"value","id":1,"kind":"parameter","name":"norm.weight","tensor":)" + w +
          R"(,"init":{"rule":"normal","mean":1.0,"std":0.02}})",
      R"({"type":"value","id":2,"kind":"parameter","name":"norm.bias","tensor":)" + w +
          R"(,"init":{"rule":"normal","mean":0.0,"std":0.02}})",
      R"({"type":"call","index":0,"op":"aten::native_layer_norm","overload":"","args":[{"name":"input","kind":"tensor","value":0,"tensor":)" +
          x + R"(},{"name":"normalized_shape","kind":"int_list","ints":[64]},{"name":"weight","kind":"tensor","value":1,"tensor":)" +
          w + R"(},{"name":"bias","kind":"tensor","value":2,"tensor":)" + w +
          R"(},{"name":"eps","kind":"double","d":1e-5}],"outputs":[{"value":3,"tensor":)" + x + R"(},{"value":4,"tensor":)" +
          stat + R"(},{"value":5,"tensor":)" + stat + R"(}],"module":"norm","phase":"forward"})",
      R"({"type":"call","index":1,"op":"aten::mul","overload":"Scalar","args":[{"name":"self","kind":"tensor","value":3,"tensor":)" +
          x + R"(},{"name":"other","kind":"double","d":1e-7}],"outputs":[{"value":6,"tensor":)" + x +
          R"(}],"module":"","phase":"forward"})",
      R"({"type":"end","calls":2,"values":7,"seconds":0,"peak_rss_mb":0})"});
  ASSERT_EQ(p.calls.size(), 2u);
  FakeBackend stats;
  stats.add_offset["aten::native_layer_norm"] = 1e-2;
  const auto by_products = replay::ReplayProgram(p, stats, ProgramReplayOptions{});
  EXPECT_EQ(by_products.outcome, Outcome::kPass) << by_products.error;
  EXPECT_EQ(by_products.detail["by_products_not_judged"], 2) << by_products.detail.dump();

  FakeBackend within;
  within.add_offset["aten::mul.Scalar"] = 5e-6;
  const auto turned = replay::ReplayProgram(p, within, ProgramReplayOptions{});
  EXPECT_EQ(turned.outcome, Outcome::kPass) << turned.error;
  FakeBackend outside;
  outside.add_offset["aten::mul.Scalar"] = 5e-5;
  const auto wrong = replay::ReplayProgram(p, outside, ProgramReplayOptions{});
  EXPECT_EQ(wrong.outcome, Outcome::kMismatch) << wrong.error;
  EXPECT_NE(wrong.error.find("call 1 (aten::mul.Scalar)"), std::string::npos) << wrong.error;
}
}  // namespace
}  // namespace coverage
