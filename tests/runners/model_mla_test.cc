// The decoder family's DeepSeek-style pieces on small configs of the real
// kinds: multi-head latent attention, DeepSeek-V3 routing with dense first
// layers, the sparse attention indexer, quantized checkpoints built dense,
// gpt-oss and MiniMax-M2; and which real configs of those kinds plan.
#include <map>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "runners/model_builder.h"
#include "selection/features.h"
#include "tests/support/family_defaults.h"
#include "tests/support/profiles.h"

namespace coverage::runners {
namespace {

using nlohmann::json;
using testing::Decode;
using testing::Prefill;

// A DeepSeek-V3 config at toy dimensions: 4 layers, the first 3 dense.
json SmallDeepseekV3() {
  return json{{"architectures", {"DeepseekV3ForCausalLM"}},
              {"model_type", "deepseek_v3"},
              {"hidden_size", 64},
              {"intermediate_size", 96},
              {"moe_intermediate_size", 32},
              {"num_hidden_layers", 4},
              {"num_attention_heads", 4},
              {"num_key_value_heads", 4},
              {"n_routed_experts", 8},
              {"n_shared_experts", 1},
              {"num_experts_per_tok", 2},
              {"n_group", 4},
              {"topk_group", 2},
              {"first_k_dense_replace", 3},
              {"kv_lora_rank", 32},
              {"q_lora_rank", 48},
              {"qk_nope_head_dim", 16},
              {"qk_rope_head_dim", 8},
              {"v_head_dim", 24},
              {"vocab_size", 256},
              {"max_position_embeddings", 4096},
              {"rope_theta", 10000},
              {"rope_scaling",
               {{"type", "yarn"}, {"factor", 40}, {"mscale", 1.0}, {"mscale_all_dim", 1.0},
                {"original_max_position_embeddings", 4096}, {"beta_fast", 32}, {"beta_slow", 1}}},
              {"routed_scaling_factor", 2.5},
              {"scoring_func", "sigmoid"},
              {"topk_method", "noaux_tc"},
              {"norm_topk_prob", true},
              {"rms_norm_eps", 1e-6},
              {"hidden_act", "silu"},
              {"tie_word_embeddings", false}};
}

struct BuiltRun {
  BuildPlan plan;
  std::vector<CapturedCall> calls;
};

BuiltRun BuildAndRun(const json& config, const CaptureProfile& profile) {
  BuiltRun run;
  auto f = selection::ExtractFeatures(config, *testing::RealFamilyDefaults());
  EXPECT_TRUE(f.has_value());
  if (!f) return run;
  run.plan = PlanModel(*f, config, profile, BuildOptions{});
  EXPECT_TRUE(run.plan.buildable) << run.plan.reason;
  if (!run.plan.buildable) return run;
  OpRecorder recorder;
  Status s = RunModel(*f, run.plan, profile, recorder);
  EXPECT_TRUE(s.ok()) << s.ToString();
  run.calls = recorder.TakeCalls();
  return run;
}

// Shapes of the weight (second argument) of every aten::linear in modules
// whose path ends with `suffix`.
std::set<std::vector<int64_t>> LinearWeights(const std::vector<CapturedCall>& calls, const std::string& suffix) {
  std::set<std::vector<int64_t>> shapes;
  for (const auto& c : calls) {
    if (c.op_case.op != "aten::linear" || c.op_case.args.size() < 2) continue;
    const std::string& p = c.module_path;
    if (p.size() < suffix.size() || p.compare(p.size() - suffix.size(), suffix.size(), suffix) != 0) continue;
    shapes.insert(c.op_case.args[1].tensor.shape);
  }
  return shapes;
}

std::multiset<std::string> OpsIn(const std::vector<CapturedCall>& calls, const std::string& path_part) {
  std::multiset<std::string> ops;
  for (const auto& c : calls) {
    if (c.module_path.find(path_part) != std::string::npos) ops.insert(c.op_case.op);
  }
  return ops;
}

bool HasNote(const BuildPlan& plan, const std::string& part) {
  for (const auto& n : plan.notes) {
    if (n.find(part) != std::string::npos) return true;
  }
  return false;
}

TEST(ModelMla, DeepseekV3LatentAttentionAndSigmoidGroupRouting) {
  BuiltRun r = BuildAndRun(SmallDeepseekV3(), Prefill(8));
  ASSERT_TRUE(r.plan.buildable);
  // first_k_dense_replace (3) covers both built layers: one dense, one MoE.
  EXPECT_TRUE(HasNote(r.plan, "layers built: 0 (dense MLP), 3 (MoE)")) << ::testing::PrintToString(r.plan.notes);
  std::set<std::string> paths;
  for (const auto& c : r.calls) paths.insert(c.module_path);
  EXPECT_TRUE(paths.count("layers.0.mlp"));
  EXPECT_TRUE(paths.count("layers.3.mlp"));
  EXPECT_FALSE(paths.count("layers.1.mlp"));

  // q_a [48, 64], q_b [4 x 24, 48], kv_a [32 + 8, 64], kv_b [4 x (16 + 24), 32], o [64, 4 x 24].
  const auto attn = LinearWeights(r.calls, ".self_attn");
  for (std::vector<int64_t> w : std::vector<std::vector<int64_t>>{{48, 64}, {96, 48}, {40, 64}, {160, 32}, {64, 96}}) {
    EXPECT_TRUE(attn.count(w)) << w[0] << "x" << w[1];
  }
  const auto attn_ops = OpsIn(r.calls, "layers.0.self_attn");
  EXPECT_TRUE(attn_ops.count("aten::split_with_sizes"));
  int64_t rsqrt = 0;  // identical calls are merged: count them
  for (const auto& c : r.calls) {
    if (c.module_path == "layers.0.self_attn" && c.op_case.op == "aten::rsqrt") rsqrt += c.count;
  }
  EXPECT_GE(rsqrt, 2);  // q_a_layernorm, kv_a_layernorm
  EXPECT_TRUE(attn_ops.count("aten::expand"));   // the shared rope key over the heads

  // Routing: sigmoid scores, group top-2 sums, group and expert top-k, gather.
  const auto moe_ops = OpsIn(r.calls, "layers.3.mlp");
  EXPECT_TRUE(moe_ops.count("aten::sigmoid"));
  EXPECT_GE(moe_ops.count("aten::topk"), 3u);
  EXPECT_TRUE(moe_ops.count("aten::gather"));
  EXPECT_TRUE(moe_ops.count("aten::scatter_"));
  EXPECT_TRUE(moe_ops.count("aten::masked_fill"));
  EXPECT_FALSE(moe_ops.count("aten::softmax"));
  // Experts fuse gate and up: [2 x 32, 64]; the shared expert is 1 x 32 wide.
  const auto mlp = LinearWeights(r.calls, "layers.3.mlp");
  EXPECT_TRUE(mlp.count({64, 64}));
  EXPECT_TRUE(mlp.count({32, 64}));
  EXPECT_TRUE(mlp.count({64, 32}));
  // The dense layer's MLP is intermediate_size wide.
  EXPECT_TRUE(LinearWeights(r.calls, "layers.0.mlp").count({96, 64}));
}

TEST(ModelMla, DecodeCachesTheExpandedKeysAndValues) {
  BuiltRun r = BuildAndRun(SmallDeepseekV3(), Decode());
  ASSERT_TRUE(r.plan.buildable);
  // Keys [2, 4, 15, 24] and values [2, 4, 15, 24] of the past joined to the new token's.
  int cache_cats = 0;
  for (const auto& c : r.calls) {
    if (c.op_case.op != "aten::cat" || c.module_path != "layers.0.self_attn") continue;
    const auto& list = c.op_case.args[0].tensors;
    if (list.size() == 2 && list[0].has_value() && list[0]->shape == std::vector<int64_t>{2, 4, 15, 24}) ++cache_cats;
  }
  EXPECT_EQ(cache_cats, 2);
}

TEST(ModelMla, DeepseekV2ComplexRopeSoftmaxRoutingWithoutQLora) {
  json c = SmallDeepseekV3();
  c["model_type"] = "deepseek_v2";
  c["architectures"] = {"DeepseekV2ForCausalLM"};
  c["q_lora_rank"] = nullptr;
  c["scoring_func"] = "softmax";
  c["topk_method"] = "greedy";
  c["norm_topk_prob"] = false;
  c["first_k_dense_replace"] = 1;
  c["rope_scaling"]["mscale"] = 0.707;
  c["rope_scaling"]["mscale_all_dim"] = 0.707;
  BuiltRun r = BuildAndRun(c, Prefill(8));
  ASSERT_TRUE(r.plan.buildable);
  const auto attn_ops = OpsIn(r.calls, "layers.0.self_attn");
  EXPECT_TRUE(attn_ops.count("aten::view_as_complex"));
  EXPECT_TRUE(LinearWeights(r.calls, "layers.0.self_attn").count({96, 64}));  // q_proj
  const auto moe_ops = OpsIn(r.calls, "layers.1.mlp");
  EXPECT_TRUE(moe_ops.count("aten::softmax"));
  EXPECT_FALSE(moe_ops.count("aten::sigmoid"));
}

TEST(ModelMla, SparseAttentionIndexerSelectsKeys) {
  for (const std::string type : {"deepseek_v32", "glm_moe_dsa"}) {
    json c = SmallDeepseekV3();
    c["model_type"] = type;
    c["index_topk"] = 4;  // fewer than the 8 tokens: the selection masks keys
    c["index_n_heads"] = 2;
    c["index_head_dim"] = 16;
    for (const auto& profile : {Prefill(8), Decode()}) {
      BuiltRun r = BuildAndRun(c, profile);
      ASSERT_TRUE(r.plan.buildable) << type;
      const auto ops = OpsIn(r.calls, "layers.0.self_attn.indexer");
      EXPECT_TRUE(ops.count("aten::relu")) << type;
      EXPECT_TRUE(ops.count("aten::topk")) << type;
      EXPECT_TRUE(ops.count("aten::layer_norm")) << type;
      EXPECT_TRUE(ops.count(type == "glm_moe_dsa" ? "aten::einsum" : "aten::matmul")) << type;
      // wq_b [2 x 16, 48], wk [16, 64], weights_proj [2, 64].
      const auto w = LinearWeights(r.calls, ".indexer");
      EXPECT_TRUE(w.count({32, 48}) && w.count({16, 64}) && w.count({2, 64})) << type;
    }
    // GLM-5.2's shared indexers: a "shared" layer reuses the previous top-k.
    c["indexer_types"] = {"full", "full", "full", "shared"};
    BuiltRun r = BuildAndRun(c, Prefill(8));
    ASSERT_TRUE(r.plan.buildable) << type;
    EXPECT_TRUE(OpsIn(r.calls, "layers.0.self_attn.indexer").count("aten::topk")) << type;
    EXPECT_FALSE(OpsIn(r.calls, "layers.3.self_attn.indexer").count("aten::topk")) << type;
    EXPECT_TRUE(OpsIn(r.calls, "layers.3.self_attn").count("aten::scatter") +
                OpsIn(r.calls, "layers.3.self_attn").count("aten::scatter_")) << type;
  }
}

TEST(ModelMla, QuantizedConfigBuildsDenseWithANote) {
  json c = SmallDeepseekV3();
  c["quantization_config"] = {{"quant_method", "fp8"}, {"fmt", "e4m3"}, {"weight_block_size", {128, 128}}};
  BuiltRun r = BuildAndRun(c, Prefill(8));
  ASSERT_TRUE(r.plan.buildable);
  EXPECT_TRUE(HasNote(r.plan, "quantization (fp8) not built: weights dense in float32, the quantization library's "
                              "kernels are not exercised"))
      << ::testing::PrintToString(r.plan.notes);
  EXPECT_FALSE(r.calls.empty());
}

TEST(ModelMla, GptOssSinksSlidingWindowAndClampedSwiglu) {
  json c = {{"architectures", {"GptOssForCausalLM"}},
            {"model_type", "gpt_oss"},
            {"hidden_size", 64},
            {"intermediate_size", 32},
            {"head_dim", 16},
            {"num_attention_heads", 4},
            {"num_key_value_heads", 2},
            {"num_hidden_layers", 4},
            {"num_local_experts", 4},
            {"num_experts_per_tok", 2},
            {"experts_per_token", 2},
            {"vocab_size", 256},
            {"sliding_window", 4},
            {"layer_types", {"sliding_attention", "full_attention", "sliding_attention", "full_attention"}},
            {"attention_bias", true},
            {"rope_theta", 150000},
            {"rope_scaling", {{"rope_type", "yarn"}, {"factor", 32.0}, {"beta_fast", 32.0}, {"beta_slow", 1.0},
                              {"original_max_position_embeddings", 4096}}},
            {"swiglu_limit", 7.0},
            {"rms_norm_eps", 1e-5},
            {"max_position_embeddings", 131072},
            {"hidden_act", "silu"},
            {"quantization_config", {{"quant_method", "mxfp4"}}}};
  BuiltRun r = BuildAndRun(c, Prefill(8));
  ASSERT_TRUE(r.plan.buildable);
  EXPECT_TRUE(HasNote(r.plan, "quantization (mxfp4)"));
  const auto attn = OpsIn(r.calls, "layers.0.self_attn");
  EXPECT_TRUE(attn.count("aten::max"));  // sinks: logits minus their max
  EXPECT_TRUE(attn.count("aten::chunk"));  // gpt-oss rope halves
  const auto mlp = OpsIn(r.calls, "layers.0.mlp");
  EXPECT_GE(mlp.count("aten::clamp"), 2u);
  EXPECT_TRUE(mlp.count("aten::sigmoid"));
  // The sliding layer's scores get the windowed mask, the full layer's the causal one.
  int mask_clamps = 0;
  for (const auto& call : r.calls) {
    if (call.module_path == "causal_mask" && call.op_case.op == "aten::clamp_min") ++mask_clamps;
  }
  EXPECT_EQ(mask_clamps, 1);
}

TEST(ModelMla, RealConfigsOfTheseKindsPlanOrSayWhy) {
  std::map<std::string, std::pair<int, int>> by_type;  // built, total
  for (const auto& [id, config] : testing::RealHubConfigs()) {
    auto f = selection::ExtractFeatures(config, *testing::RealFamilyDefaults());
    if (!f || f->structure != "decoder") continue;
    if (f->attention != "mla" && f->model_type != "gpt_oss" && f->model_type != "minimax_m2") continue;
    const BuildPlan plan = PlanModel(*f, config, Prefill(512), BuildOptions{2, 1e18});
    auto& t = by_type[f->model_type];
    ++t.second;
    if (plan.buildable) {
      ++t.first;
      EXPECT_EQ(plan.layers_built, 2) << id;
      EXPECT_GT(plan.weight_bytes, 0) << id;
    } else {
      EXPECT_FALSE(plan.reason.empty()) << id;
    }
  }
  for (const char* type : {"deepseek_v2", "deepseek_v3", "deepseek_v32", "kimi_k2", "glm4_moe_lite", "glm_moe_dsa",
                           "gpt_oss", "minimax_m2"}) {
    EXPECT_GT(by_type[type].first, 0) << type;
    EXPECT_EQ(by_type[type].first, by_type[type].second) << type;
  }
}

}  // namespace
}  // namespace coverage::runners
