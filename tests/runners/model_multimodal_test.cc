// The model builder's multimodal family (runners/model_multimodal.cc) on real
// configs (data/hub/configs.jsonl): a Qwen3-VL model builds its vision
// tower, merger and text tower; models whose text tower is not buildable say
// so; a decode step runs the text tower only.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "runners/model_builder.h"
#include "runners/model_builder_internal.h"
#include "selection/features.h"
#include "tests/support/family_defaults.h"
#include "tests/support/profiles.h"

namespace coverage::runners {
namespace {

using nlohmann::json;
using testing::Decode;
using testing::Prefill;

constexpr const char* kQwen3Vl = "Qwen/Qwen3-VL-2B-Instruct";

selection::Features FeaturesOf(const std::string& id) {
  const auto& configs = testing::RealHubConfigs();
  auto it = configs.find(id);
  EXPECT_NE(it, configs.end()) << id;
  if (it == configs.end()) return {};
  auto f = selection::ExtractFeatures(it->second, *testing::RealFamilyDefaults());
  EXPECT_TRUE(f.has_value()) << id;
  return f ? *f : selection::Features{};
}

const json& ConfigOf(const std::string& id) { return testing::RealHubConfigs().at(id); }

struct MultimodalRun {
  BuildPlan plan;
  std::vector<CapturedCall> calls;
  bool Has(const std::string& op, const std::string& path_prefix) const {
    return std::any_of(calls.begin(), calls.end(), [&](const CapturedCall& c) {
      return c.op_case.op == op && c.module_path.rfind(path_prefix, 0) == 0;
    });
  }
  bool AnyPath(const std::string& path_prefix) const {
    return std::any_of(calls.begin(), calls.end(),
                       [&](const CapturedCall& c) { return c.module_path.rfind(path_prefix, 0) == 0; });
  }
  bool Noted(const std::string& what) const {
    return std::any_of(plan.notes.begin(), plan.notes.end(),
                       [&](const std::string& n) { return n.find(what) != std::string::npos; });
  }
};

// One layer of each tower keeps the forward pass to seconds.
MultimodalRun BuildAndRun(const std::string& id, const CaptureProfile& profile) {
  MultimodalRun run;
  const selection::Features f = FeaturesOf(id);
  run.plan = PlanModel(f, ConfigOf(id), profile, BuildOptions{1, 1e18});
  EXPECT_TRUE(run.plan.buildable) << id << ": " << run.plan.reason;
  if (!run.plan.buildable) return run;
  OpRecorder recorder;
  Status s = RunModel(f, run.plan, profile, recorder);
  EXPECT_TRUE(s.ok()) << id << ": " << s.ToString();
  run.calls = recorder.TakeCalls();
  return run;
}

TEST(ModelMultimodal, Qwen3VlPrefillRecordsVisionTowerMergerAndTextTower) {
  const MultimodalRun run = BuildAndRun(kQwen3Vl, Prefill(8));
  ASSERT_TRUE(run.plan.buildable);
  EXPECT_EQ(run.plan.family, "multimodal");
  EXPECT_EQ(run.plan.layers_total, 28);  // the text tower's
  EXPECT_EQ(run.plan.layers_built, 1);
  EXPECT_TRUE(run.Noted("vision tower: 1 of 24 blocks built"));
  EXPECT_TRUE(run.Noted("576 tokens"));  // 48 x 48 patches merged 2 x 2
  // The vision tower: Conv3d patches, 2-D rotary attention, the merger's linears.
  bool conv3d = false;
  for (const auto& c : run.calls) {
    if (c.op_case.op != "aten::conv3d") continue;
    conv3d = true;
    EXPECT_EQ(c.module_path, "model.visual.patch_embed");
    ASSERT_GE(c.op_case.args.size(), 2u);
    EXPECT_EQ(c.op_case.args[0].tensor.shape, (std::vector<int64_t>{2304, 3, 2, 16, 16}));
    EXPECT_EQ(c.op_case.args[1].tensor.shape, (std::vector<int64_t>{1024, 3, 2, 16, 16}));
  }
  EXPECT_TRUE(conv3d);
  EXPECT_TRUE(run.Has("aten::embedding", "model.visual.pos_embed"));
  EXPECT_TRUE(run.Has("aten::linear", "model.visual.blocks.0.attn"));
  EXPECT_TRUE(run.Has("aten::softmax", "model.visual.blocks.0.attn"));
  EXPECT_TRUE(run.Has("aten::layer_norm", "model.visual.blocks.0.norm1"));
  EXPECT_TRUE(run.Has("aten::linear", "model.visual.blocks.0.mlp"));
  // The main merger: LayerNorm over 1024, linear 4096 -> 4096, GELU, 4096 -> 2048.
  std::set<std::vector<int64_t>> merger_weights;
  for (const auto& c : run.calls) {
    if (c.op_case.op == "aten::linear" && c.module_path == "model.visual.merger") {
      merger_weights.insert(c.op_case.args.at(1).tensor.shape);
    }
  }
  EXPECT_EQ(merger_weights, (std::set<std::vector<int64_t>>{{4096, 4096}, {2048, 4096}}));
  // Deepstack merger of block 5 runs after the last built block.
  EXPECT_TRUE(run.Has("aten::linear", "model.visual.deepstack_merger_list.0"));
  // Image features replace the placeholder tokens' embeddings.
  EXPECT_TRUE(run.Has("aten::masked_scatter", "model"));
  EXPECT_TRUE(run.Has("aten::embedding", "model.language_model.embed_tokens"));
  // The text tower (the decoder family) over 8 text + 576 image tokens, with q/k norm.
  bool q_proj = false;
  for (const auto& c : run.calls) {
    if (c.op_case.op == "aten::linear" && c.module_path == "layers.0.self_attn" &&
        c.op_case.args.at(1).tensor.shape == std::vector<int64_t>{2048, 2048}) {
      q_proj = true;
      EXPECT_EQ(c.op_case.args.at(0).tensor.shape, (std::vector<int64_t>{1, 584, 2048}));
    }
  }
  EXPECT_TRUE(q_proj);
  EXPECT_TRUE(run.Has("aten::rsqrt", "layers.0.self_attn"));  // q_norm / k_norm
  EXPECT_TRUE(run.Has("aten::linear", "lm_head"));
  EXPECT_TRUE(run.Noted("mrope"));
  EXPECT_TRUE(run.Noted("image features are merged"));
}

TEST(ModelMultimodal, DecodeRunsTheTextTowerOnly) {
  const MultimodalRun run = BuildAndRun(kQwen3Vl, Decode());
  ASSERT_TRUE(run.plan.buildable);
  EXPECT_TRUE(run.Noted("the text tower only"));
  EXPECT_FALSE(run.AnyPath("model.visual"));
  EXPECT_FALSE(run.Has("aten::masked_scatter", ""));
  EXPECT_TRUE(run.Has("aten::linear", "layers.0.self_attn"));
  EXPECT_TRUE(run.Has("aten::cat", "layers.0.self_attn"));  // the KV cache
}

TEST(ModelMultimodal, ImageProfileRunsTheVisionTowerAndMergerOnly) {
  CaptureProfile image = Prefill(0);
  image.name = "image";
  const MultimodalRun run = BuildAndRun(kQwen3Vl, image);
  ASSERT_TRUE(run.plan.buildable);
  EXPECT_EQ(run.plan.layers_total, 24);  // the vision tower's
  EXPECT_TRUE(run.Has("aten::conv3d", "model.visual.patch_embed"));
  EXPECT_TRUE(run.Has("aten::linear", "model.visual.merger"));
  EXPECT_FALSE(run.AnyPath("layers."));
  EXPECT_FALSE(run.Has("aten::masked_scatter", ""));
}

TEST(ModelMultimodal, PlanReportsTheTextTowersReasonWhenItIsNotBuildable) {
  // Kimi K3's language model is Kimi linear attention, which no family builds.
  const BuildPlan k3 = PlanModel(FeaturesOf("moonshotai/Kimi-K3"), ConfigOf("moonshotai/Kimi-K3"), Prefill(16),
                                 BuildOptions{1, 1e18});
  EXPECT_FALSE(k3.buildable);
  EXPECT_EQ(k3.reason.rfind("text tower: ", 0), 0u) << k3.reason;
  EXPECT_NE(k3.reason.find("kimi_linear"), std::string::npos) << k3.reason;
  // Qwen3.5's language model mixes linear attention with full attention: the
  // hybrid family builds it, so the whole model builds.
  const BuildPlan qwen35 =
      PlanModel(FeaturesOf("Qwen/Qwen3.5-27B"), ConfigOf("Qwen/Qwen3.5-27B"), Prefill(16), BuildOptions{1, 1e18});
  EXPECT_TRUE(qwen35.buildable) << qwen35.reason;
  // A vision tower that is not built says so, after a buildable text tower.
  constexpr const char* kGlimmer = "meta-models/Muse-Glimmer-30B";
  const BuildPlan plan = PlanModel(FeaturesOf(kGlimmer), ConfigOf(kGlimmer), Prefill(16), BuildOptions{1, 1e18});
  EXPECT_FALSE(plan.buildable);
  EXPECT_EQ(plan.reason.rfind("vision tower: the muse_glimmer_vision vision tower", 0), 0u) << plan.reason;
  // Decode needs the text tower only.
  EXPECT_TRUE(PlanModel(FeaturesOf(kGlimmer), ConfigOf(kGlimmer), Decode(), BuildOptions{1, 1e18}).buildable);
}

TEST(ModelMultimodal, Phi3VisionRunsTheVisionFamilysClipOnItsCropsThenTheHdTransform) {
  constexpr const char* kPhi3v = "microsoft/Phi-3.5-vision-instruct";
  // 2 x 2 crops and the global one: (4 + 1) * 144 + 1 + 3 * 12 = 757 tokens.
  const MultimodalRun run = BuildAndRun(kPhi3v, Prefill(4));
  ASSERT_TRUE(run.plan.buildable);
  EXPECT_TRUE(run.Noted("2 x 2 crops of 336"));
  bool clip = false;
  for (const auto& c : run.calls) {
    if (c.op_case.op != "aten::conv2d") continue;
    clip = true;
    EXPECT_EQ(c.module_path, "embeddings.patch_embeddings");
    EXPECT_EQ(c.op_case.args.at(0).tensor.shape, (std::vector<int64_t>{5, 3, 336, 336}));
  }
  EXPECT_TRUE(clip);
  EXPECT_TRUE(run.Has("aten::linear", "encoder.layers.0.self_attn"));
  std::set<std::vector<int64_t>> projection;
  for (const auto& c : run.calls) {
    if (c.op_case.op == "aten::linear" && c.module_path == "model.vision_embed_tokens.img_projection") {
      projection.insert(c.op_case.args.at(0).tensor.shape);
    }
  }
  EXPECT_EQ(projection, (std::set<std::vector<int64_t>>{{1, 757, 4096}, {1, 757, 3072}}));
  EXPECT_TRUE(run.Has("aten::nonzero", "model.vision_embed_tokens"));
  EXPECT_TRUE(run.Has("aten::embedding", "model.embed_tokens"));
  EXPECT_TRUE(run.Has("aten::copy_", "model.vision_embed_tokens"));
  // The text tower over 4 text + 757 image tokens.
  bool text = false;
  for (const auto& c : run.calls) {
    if (c.op_case.op == "aten::linear" && c.module_path == "layers.0.self_attn") {
      text = true;
      EXPECT_EQ(c.op_case.args.at(0).tensor.shape[1], 761);
    }
  }
  EXPECT_TRUE(text);
}

TEST(ModelMultimodal, Gemma4VisionTowerEmbedsPositionsByOneHotAndPoolsToSoftTokens) {
  constexpr const char* kGemma4 = "google/gemma-4-26B-A4B";
  const BuildPlan prefill = PlanModel(FeaturesOf(kGemma4), ConfigOf(kGemma4), Prefill(16), BuildOptions{1, 1e18});
  ASSERT_TRUE(prefill.buildable) << prefill.reason;
  CaptureProfile image = Prefill(0);
  image.name = "image";
  const MultimodalRun run = BuildAndRun(kGemma4, image);
  ASSERT_TRUE(run.plan.buildable);
  EXPECT_TRUE(run.Noted("pooled to 256 soft tokens"));
  EXPECT_TRUE(run.Has("aten::one_hot", "model.vision_tower.patch_embedder"));
  EXPECT_TRUE(run.Has("aten::matmul", "model.vision_tower.patch_embedder"));
  EXPECT_TRUE(run.Has("aten::linear", "model.vision_tower.encoder.layers.0.self_attn"));
  EXPECT_TRUE(run.Has("aten::linear", "model.vision_tower.encoder.layers.0.mlp"));
  EXPECT_TRUE(run.Has("aten::pow", "model.vision_tower.encoder.layers.0.post_feedforward_layernorm"));
  EXPECT_TRUE(run.Has("aten::matmul", "model.vision_tower.pooler"));
  bool projected = false;
  for (const auto& c : run.calls) {
    if (c.op_case.op != "aten::linear" || c.module_path != "model.embed_vision") continue;
    projected = true;
    EXPECT_EQ(c.op_case.args.at(0).tensor.shape, (std::vector<int64_t>{256, 1152}));
  }
  EXPECT_TRUE(projected);
}

TEST(ModelMultimodal, Llama4VisionTowerUnfoldsPatchesRotatesComplexAndShufflesPixels) {
  constexpr const char* kScout = "meta-llama/Llama-4-Scout-17B-16E-Instruct";
  // Prefill plans both towers: 336 / 14 = 24 x 24 patches, shuffled by 0.5 to 144 tokens.
  const BuildPlan prefill = PlanModel(FeaturesOf(kScout), ConfigOf(kScout), Prefill(16), BuildOptions{1, 1e18});
  ASSERT_TRUE(prefill.buildable) << prefill.reason;
  EXPECT_TRUE(std::any_of(prefill.notes.begin(), prefill.notes.end(),
                          [](const std::string& n) { return n.find("144 tokens") != std::string::npos; }));
  // The image profile runs the vision tower and the projector (the text
  // tower's experts would make a prefill test slow).
  CaptureProfile image = Prefill(0);
  image.name = "image";
  const MultimodalRun run = BuildAndRun(kScout, image);
  ASSERT_TRUE(run.plan.buildable);
  EXPECT_EQ(run.plan.layers_total, 34);
  bool unfold = false;
  for (const auto& c : run.calls) {
    if (c.op_case.op != "aten::im2col") continue;
    unfold = true;
    EXPECT_EQ(c.module_path, "vision_model.patch_embedding");
    EXPECT_EQ(c.op_case.args.at(0).tensor.shape, (std::vector<int64_t>{1, 3, 336, 336}));
  }
  EXPECT_TRUE(unfold);
  EXPECT_TRUE(run.Has("aten::view_as_complex", "vision_model.model.layers.0.self_attn"));
  EXPECT_TRUE(run.Has("aten::view_as_real", "vision_model.model.layers.0.self_attn"));
  EXPECT_TRUE(run.Has("aten::layer_norm", "vision_model.layernorm_pre"));
  EXPECT_TRUE(run.Has("aten::gelu", "vision_model.vision_adapter"));
  std::set<std::vector<int64_t>> projector;
  for (const auto& c : run.calls) {
    if (c.op_case.op == "aten::linear" && c.module_path == "multi_modal_projector") {
      projector.insert(c.op_case.args.at(0).tensor.shape);
      projector.insert(c.op_case.args.at(1).tensor.shape);
    }
  }
  EXPECT_EQ(projector, (std::set<std::vector<int64_t>>{{144, 4096}, {5120, 4096}}));
}

TEST(ModelMultimodal, TrainingSessionReusesVisionAndTextWeightsInOrder) {
  // The text tower runs in the multimodal model's session without a new
  // BeginRun, so a second training call gets the same weights, in order.
  const selection::Features f = FeaturesOf(kQwen3Vl);
  const CaptureProfile profile = Prefill(4);
  const BuildPlan plan = PlanModel(f, ConfigOf(kQwen3Vl), profile, BuildOptions{1, 1e18});
  ASSERT_TRUE(plan.buildable) << plan.reason;
  ModelSession session;
  session.training = true;
  ASSERT_TRUE(builder::RunInSession(f, plan, profile, session, 3).ok());
  const size_t weights = session.weights().size();
  const at::Tensor first = session.weights().front();
  ASSERT_TRUE(builder::RunInSession(f, plan, profile, session, 3).ok());
  EXPECT_EQ(session.weights().size(), weights);
  EXPECT_TRUE(session.weights().front().is_same(first));
  EXPECT_EQ(session.output().size(1), 4 + 576);  // logits for every position in training
}

}  // namespace
}  // namespace coverage::runners
