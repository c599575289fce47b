// The module, model and train stages over a selection, replaying captured
// programs: results per model and stage in the registry, gating, cost caps,
// resuming, and models without a program shown with the capture's reason.
#include <atomic>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "capture/trace_reader.h"
#include "registry/registry.h"
#include "backends/backend.h"
#include "backends/backends.h"
#include "stages/model_stage.h"
#include "tests/support/fake_backend.h"
#include "tests/support/real_models.h"
#include "tests/support/temp_dir.h"

namespace coverage::stages {
namespace {

const std::vector<std::string> kModels = {
    "vosap52/robot-navigation-command-tr-v1",                 // GPT-2, 80 wide
    "optimum-intel-internal-testing/tiny-random-BloomModel",  // ALiBi
    "deepseek-ai/DeepSeek-V4-Flash",                          // not built by the tracer
};

std::vector<capture::CaptureProfile> Profiles() {
  capture::CaptureProfile prefill;
  prefill.name = "prefill";
  prefill.families = {"decoder"};
  prefill.seq_len = 16;
  capture::CaptureProfile decode = prefill;  // has a KV cache: never chosen for these stages
  decode.name = "decode";
  decode.seq_len = 1;
  decode.past_len = 15;
  capture::CaptureProfile train = prefill;
  train.name = "train";
  train.batch = 2;
  train.seq_len = 8;
  train.training = true;
  return {decode, prefill, train};
}

// A program the tracer captured (tests/fixtures/programs), as one model's.
Program Traced(const std::string& file, const std::string& model_id) {
  std::ifstream in(std::string(COVERAGE_SOURCE_DIR) + "/tests/fixtures/programs/" + file);
  capture::TraceReader reader;
  std::string line;
  while (std::getline(in, line)) EXPECT_TRUE(reader.Feed(line).ok());
  auto outcome = reader.Finish();
  EXPECT_TRUE(outcome.has_value() && outcome->program.has_value());
  Program p = *outcome->program;
  p.info.model_id = model_id;
  return p;
}

struct Fixture {
  testing::TempDir dir;
  std::unique_ptr<registry::Registry> reg;
  Fixture() {
    auto r = registry::Registry::Open(dir.File("r.db"));
    EXPECT_TRUE(r.has_value());
    reg = std::move(*r);
    testing::StoreRealModels(*reg, kModels);
    testing::SelectAll(*reg, 3);
    // The first two have programs for prefill and train (the tiny Llama's
    // stand in for theirs); DeepSeek-V4 was not built.
    for (size_t i = 0; i < 2; ++i) {
      for (const char* profile : {"prefill", "train"}) {
        Program p = Traced(std::string("tiny_llama_") + profile + ".jsonl", kModels[i]);
        registry::ProgramRecord rec;
        rec.model_id = kModels[i];
        rec.profile = profile;
        rec.tracer_version = p.info.tracer_version;
        rec.status = "captured";
        rec.info = p.info;
        EXPECT_TRUE(reg->StoreProgram({kModels[i], "gpt2", "test", ""}, &rec, &p).ok());
      }
    }
    for (const char* profile : {"prefill", "train"}) {
      registry::ProgramRecord rec;
      rec.model_id = kModels[2];
      rec.profile = profile;
      rec.status = "not_built";
      rec.stage = "config";
      rec.reason = "The checkpoint you are trying to load has model type `deepseek_v4` but Transformers does not "
                   "recognize this architecture";
      EXPECT_TRUE(reg->StoreProgram({kModels[2], "deepseek_v4", "test", ""}, &rec, nullptr).ok());
    }
  }
  int64_t Count(const std::string& sql) { return std::stoll(reg->Query(sql)->rows[0][0]); }
};

ModelStageOptions Options(const std::string& run_id) {
  ModelStageOptions o;
  o.run_id = run_id;
  o.stages = {"train", "model", "module"};  // run in stage order whatever the order given
  o.profiles = Profiles();
  o.progress = false;
  o.checks.train_steps = 2;
  return o;
}

std::shared_ptr<backends::Backend> Cpu() {
  backends::BackendRegistry registry;
  backends::RegisterCpuBackend(registry);
  return *registry.Create("cpu");
}

TEST(ModelStage, CpuPassesEveryStageAndModelsWithoutAProgramShowTheCapturesReason) {
  Fixture fx;
  auto cpu = Cpu();
  auto s = RunModelStages(*fx.reg, *cpu, Options("r1"));
  ASSERT_TRUE(s.has_value()) << s.error().ToString();
  EXPECT_FALSE(s->Failed());
  EXPECT_EQ(s->models, 3);
  EXPECT_EQ(s->executed, 6);  // two captured models x three stages
  EXPECT_EQ(s->not_captured, 3);
  EXPECT_EQ(s->per_stage.at("model").at(Outcome::kPass), 2);
  EXPECT_EQ(s->per_stage.at("train").at(Outcome::kPass), 2);
  EXPECT_EQ(s->per_stage.at("module").at(Outcome::kSkipped), 1);
  // The stages ran on the profiles they choose: module and model on prefill, train on train.
  EXPECT_EQ(fx.Count("SELECT COUNT(*) FROM model_results WHERE stage = 'model' AND outcome = 'pass' AND "
                     "profile = 'prefill'"),
            2);
  EXPECT_EQ(fx.Count("SELECT COUNT(*) FROM model_results WHERE stage = 'train' AND profile = 'train' AND "
                     "outcome = 'pass'"),
            2);
  // One item per module kind, named by its first instance's path.
  EXPECT_GE(fx.Count("SELECT COUNT(*) FROM model_results WHERE stage = 'module' AND model_id LIKE 'vosap52%' AND "
                     "item IN ('model.layers.0.self_attn', 'model.layers.0.mlp.act_fn', 'model.norm', "
                     "'model.embed_tokens', 'lm_head') AND outcome = 'pass'"),
            5);
  EXPECT_EQ(fx.Count("SELECT COUNT(*) FROM model_results WHERE model_id = 'deepseek-ai/DeepSeek-V4-Flash' AND "
                     "outcome = 'skipped' AND error LIKE 'not captured (not_built, config): %deepseek_v4%'"),
            3);
  EXPECT_EQ(fx.Count("SELECT models FROM v_model_stage_outcomes WHERE run_id = 'r1' AND stage = 'model' AND "
                     "outcome = 'pass'"),
            2);
  // The run is finished; running it again does nothing new.
  EXPECT_EQ(fx.Count("SELECT COUNT(*) FROM runs WHERE run_id = 'r1' AND finished_at IS NOT NULL AND "
                     "stage = 'module,model,train'"),
            1);
  auto again = RunModelStages(*fx.reg, *cpu, Options("r1"));
  ASSERT_TRUE(again.has_value());
  EXPECT_TRUE(again->resumed);
  EXPECT_EQ(again->executed, 0);
  EXPECT_EQ(again->already_done, 6);
  EXPECT_EQ(again->per_stage, s->per_stage);
}

TEST(ModelStage, GateSkipsLaterStagesOfAModelWhoseModulesFailAndSaysWhy) {
  Fixture fx;
  testing::FakeBackend fake;
  fake.add_offset["aten::scaled_dot_product_attention"] = 0.25;
  ModelStageOptions o = Options("gated");
  o.gate = true;
  auto s = RunModelStages(*fx.reg, fake, o);
  ASSERT_TRUE(s.has_value()) << s.error().ToString();
  EXPECT_TRUE(s->Failed());
  EXPECT_EQ(s->blocked, 4);  // model and train of both built models
  EXPECT_EQ(s->failing_items.at("module").at("model.layers.0.self_attn"), 2);
  EXPECT_EQ(fx.Count("SELECT COUNT(*) FROM model_results WHERE run_id = 'gated' AND stage IN ('model', 'train') AND "
                     "outcome = 'skipped' AND blocked_by = 'module:model.layers.0.self_attn'"),
            4);
  // Without the gate every stage runs and fails on its own.
  auto ungated = RunModelStages(*fx.reg, fake, Options("ungated"));
  ASSERT_TRUE(ungated.has_value());
  EXPECT_EQ(ungated->blocked, 0);
  EXPECT_EQ(ungated->per_stage.at("model").at(Outcome::kMismatch), 2);
  EXPECT_EQ(ungated->per_stage.at("train").at(Outcome::kMismatch), 2);
  // The failing model links to the call and op case that broke it.
  auto row = fx.reg->Query("SELECT detail_json FROM model_results WHERE run_id = 'ungated' AND stage = 'model' LIMIT 1");
  ASSERT_TRUE(row.has_value() && !row->rows.empty());
  const auto detail = nlohmann::json::parse(row->rows[0][0]);
  EXPECT_EQ(detail["first_divergent"]["op"], "aten::scaled_dot_product_attention");
  EXPECT_EQ(fx.Count("SELECT COUNT(*) FROM op_cases WHERE key = '" + detail["first_divergent"]["case_key"].get<std::string>() + "'"), 1);
}

TEST(ModelStage, CostCapSkipsWithTheEstimateAndAResumeRetriesThem) {
  Fixture fx;
  auto cpu = Cpu();
  ModelStageOptions o = Options("capped");
  o.stages = {"model"};
  o.max_model_flops = 1.0;
  auto s = RunModelStages(*fx.reg, *cpu, o);
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->skipped_by_cost, 2);
  EXPECT_EQ(fx.Count("SELECT COUNT(*) FROM model_results WHERE outcome = 'skipped' AND error LIKE "
                     "'estimated % FLOPs exceeds --max-model-flops 1'"),
            2);
  o.max_model_flops.reset();
  auto resumed = RunModelStages(*fx.reg, *cpu, o);
  ASSERT_TRUE(resumed.has_value());
  EXPECT_EQ(resumed->executed, 2);
  EXPECT_EQ(resumed->per_stage.at("model").at(Outcome::kPass), 2);
}

TEST(ModelStage, StopResumesAndBadInputIsRefusedNamingIt) {
  Fixture fx;
  auto cpu = Cpu();
  std::atomic<bool> stop{true};
  ModelStageOptions o = Options("stopped");
  o.stop = &stop;
  auto s = RunModelStages(*fx.reg, *cpu, o);
  ASSERT_TRUE(s.has_value());
  EXPECT_TRUE(s->interrupted);
  EXPECT_EQ(fx.Count("SELECT COUNT(*) FROM runs WHERE run_id = 'stopped' AND finished_at IS NULL"), 1);
  stop = false;
  auto resumed = RunModelStages(*fx.reg, *cpu, o);
  ASSERT_TRUE(resumed.has_value());
  EXPECT_FALSE(resumed->interrupted);
  EXPECT_EQ(resumed->executed, 6);

  ModelStageOptions bad = Options("bad");
  bad.stages = {"unit"};
  auto not_a_stage = RunModelStages(*fx.reg, *cpu, bad);
  ASSERT_FALSE(not_a_stage.has_value());
  EXPECT_NE(not_a_stage.error().message().find("'unit'"), std::string::npos);
  bad.stages = {"model"};
  bad.models = {"nobody/*"};
  auto no_model = RunModelStages(*fx.reg, *cpu, bad);
  ASSERT_FALSE(no_model.has_value());
  EXPECT_NE(no_model.error().message().find("--model"), std::string::npos);
  // Resuming a run with other check options is refused.
  ModelStageOptions other = Options("stopped");
  other.config_json = R"({"checks": {"seed": 7}})";
  auto refused = RunModelStages(*fx.reg, *cpu, other);
  ASSERT_FALSE(refused.has_value());
  EXPECT_NE(refused.error().message().find("started with checks options"), std::string::npos);
}

}  // namespace
}  // namespace coverage::stages
