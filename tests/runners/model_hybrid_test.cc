// The model builder's hybrid and state-space families
// (runners/model_hybrid.cc) on real configs: which ones it plans (and why
// not the others), which layers a short build keeps, and forward passes of
// Nemotron-H (Mamba-2, attention, MLP, MoE), Qwen3-Next and Qwen3.5
// (Gated DeltaNet and gated attention) and RWKV-5 under the op observer.
//
// The real configs of these models need tens of gigabytes at their real
// dimensions; the runs below keep every layer dimension and shrink only the
// vocabulary and the number of routed experts, which change no op of a layer.
#include <gtest/gtest.h>

#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "runners/model_builder.h"
#include "selection/features.h"
#include "tests/support/family_defaults.h"
#include "tests/support/profiles.h"

namespace coverage::runners {
namespace {

using nlohmann::json;
using testing::Decode;
using testing::Prefill;

std::shared_ptr<const selection::FamilyDefaults> Defaults() { return testing::RealFamilyDefaults(); }

const std::map<std::string, json>& HubConfigs() {
  static const auto configs = testing::ConfigsOf("/data/hub/configs.jsonl");
  return configs;
}

json Hub(const std::string& id) {
  auto it = HubConfigs().find(id);
  EXPECT_NE(it, HubConfigs().end()) << id;
  return it == HubConfigs().end() ? json::object() : it->second;
}

struct HybridRun {
  BuildPlan plan;
  std::vector<CapturedCall> calls;
  // module path -> ops recorded in it
  std::map<std::string, std::multiset<std::string>> by_path;
  std::multiset<std::string> ops;
  bool Has(const std::string& path, const std::string& op) const {
    auto it = by_path.find(path);
    return it != by_path.end() && it->second.count(op) > 0;
  }
};

HybridRun BuildAndRun(const json& config, const CaptureProfile& profile, const std::string& structure) {
  HybridRun run;
  auto f = selection::ExtractFeatures(config, *Defaults());
  EXPECT_TRUE(f.has_value());
  if (!f) return run;
  EXPECT_EQ(f->structure, structure);
  run.plan = PlanModel(*f, config, profile, BuildOptions{});
  EXPECT_TRUE(run.plan.buildable) << run.plan.reason;
  if (!run.plan.buildable) return run;
  OpRecorder recorder;
  Status s = RunModel(*f, run.plan, profile, recorder);
  EXPECT_TRUE(s.ok()) << s.ToString();
  run.calls = recorder.TakeCalls();
  for (const auto& c : run.calls) {
    run.by_path[c.module_path].insert(c.op_case.op);
    run.ops.insert(c.op_case.op);
  }
  return run;
}

BuildPlan PlanOf(const json& config, const CaptureProfile& profile = Prefill(512), int64_t max_layers = 2) {
  auto f = selection::ExtractFeatures(config, *Defaults());
  EXPECT_TRUE(f.has_value());
  return f ? PlanModel(*f, config, profile, BuildOptions{max_layers, 1e18}) : BuildPlan{};
}

std::string Notes(const BuildPlan& p) {
  std::string all;
  for (const auto& n : p.notes) all += n + "\n";
  return all;
}

TEST(ModelHybrid, PlansTheRealHybridAndSsmConfigsAndSaysWhyNotTheRest) {
  std::map<std::string, std::pair<int, int>> by_type;  // model_type -> (built, total)
  std::map<std::string, int> reasons;
  for (const auto& [id, config] : HubConfigs()) {
    auto f = selection::ExtractFeatures(config, *Defaults());
    if (!f || (f->structure != "hybrid" && f->structure != "ssm")) continue;
    BuildPlan plan = PlanModel(*f, config, Prefill(512), BuildOptions{2, 1e18});
    auto& t = by_type[f->model_type];
    ++t.second;
    if (plan.buildable) {
      ++t.first;
      EXPECT_GT(plan.weight_bytes, 0) << id;
      EXPECT_GT(plan.flops, 0) << id;
      EXPECT_GE(plan.layers_built, 2) << id;
    } else {
      EXPECT_FALSE(plan.reason.empty()) << id;
      ++reasons[plan.reason];
    }
  }
  for (const auto& [type, t] : by_type) std::printf("built %-18s %2d of %2d\n", type.c_str(), t.first, t.second);
  for (const auto& [reason, n] : reasons) std::printf("not built %2d: %s\n", n, reason.c_str());
  // Every model type the families know builds for its unquantized configs.
  EXPECT_GE(by_type["nemotron_h"].first, 3);
  EXPECT_EQ(by_type["qwen3_next"].first, 1);
  EXPECT_EQ(by_type["rwkv5"].first, 1);
  EXPECT_GE(by_type["qwen3_5_moe_text"].first, 1);
}

TEST(ModelHybrid, ShortBuildsKeepOneLayerOfEachKind) {
  // Nemotron-H 56B: "M-M-M-M*-...": mamba 0, mlp 1, attention 7.
  BuildPlan nem = PlanOf(Hub("nvidia/Nemotron-H-56B-Base-8K"));
  ASSERT_TRUE(nem.buildable) << nem.reason;
  EXPECT_EQ(nem.family, "hybrid");
  EXPECT_EQ(nem.layers_total, 118);
  EXPECT_EQ(nem.layers_built, 3);
  EXPECT_NE(Notes(nem).find("0 (mamba), 1 (mlp), 7 (attention)"), std::string::npos) << Notes(nem);
  // Nemotron-3 Nano: mamba, moe and attention ("MEMEM*...").
  BuildPlan nano = PlanOf(Hub("nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16"));
  ASSERT_TRUE(nano.buildable) << nano.reason;
  EXPECT_NE(Notes(nano).find("0 (mamba), 1 (moe), 5 (attention)"), std::string::npos) << Notes(nano);
  // Qwen3-Next: full attention every 4th layer.
  BuildPlan next = PlanOf(Hub("Qwen/Qwen3-Next-80B-A3B-Thinking"));
  ASSERT_TRUE(next.buildable) << next.reason;
  EXPECT_EQ(next.layers_built, 2);
  EXPECT_NE(Notes(next).find("0 (linear_attention), 3 (full_attention)"), std::string::npos) << Notes(next);
  // More layers asked for: the lowest indices fill up.
  BuildPlan four = PlanOf(Hub("Qwen/Qwen3-Next-80B-A3B-Thinking"), Prefill(512), 4);
  EXPECT_EQ(four.layers_built, 4);
  EXPECT_NE(Notes(four).find("0 (linear_attention), 1 (linear_attention), 2 (linear_attention), 3 (full_attention)"),
            std::string::npos);
  // The scan estimates grow with the sequence.
  EXPECT_GT(PlanOf(Hub("nvidia/Nemotron-H-56B-Base-8K"), Prefill(512)).flops,
            PlanOf(Hub("nvidia/Nemotron-H-56B-Base-8K"), Prefill(16)).flops * 10);
}

TEST(ModelHybrid, BuildsQuantizedDenseAndRefusesUnknownHybridsWithTheReason) {
  // (The NVFP4 / FP8 Nemotron-H checkpoints keep their quantization outside
  // config.json, so nothing here says they are quantized.)
  // Quantized checkpoints build dense, and say so (Note [Quantized checkpoints]).
  BuildPlan fp8 = PlanOf(Hub("Qwen/Qwen3.8-2.4T-A95B-FP8"));
  EXPECT_TRUE(fp8.buildable) << fp8.reason;
  bool noted = false;
  for (const auto& n : fp8.notes) noted |= n.rfind("quantization (fp8) not built: weights dense in", 0) == 0;
  EXPECT_TRUE(noted);
  json jamba = {{"model_type", "jamba"}, {"architectures", {"JambaForCausalLM"}}, {"hidden_size", 64},
                {"num_hidden_layers", 4}, {"num_attention_heads", 4}, {"vocab_size", 100},
                {"attn_layer_period", 2}, {"attn_layer_offset", 1}};
  BuildPlan j = PlanOf(jamba);
  EXPECT_FALSE(j.buildable);
  EXPECT_NE(j.reason.find("jamba"), std::string::npos) << j.reason;
  BuildPlan big = PlanOf(Hub("RWKV/rwkv-5-world-3b"));
  ASSERT_TRUE(big.buildable);
  auto f = selection::ExtractFeatures(Hub("RWKV/rwkv-5-world-3b"), *Defaults());
  ASSERT_TRUE(f.has_value());
  BuildPlan over = PlanModel(*f, Hub("RWKV/rwkv-5-world-3b"), Prefill(), BuildOptions{2, 1e8});
  EXPECT_FALSE(over.buildable);
  EXPECT_NE(over.reason.find("budget"), std::string::npos) << over.reason;
}

// Nemotron-3 Nano at its layer dimensions, with a pattern of one layer of
// each kind and 8 of its 128 experts.
json SmallNemotron() {
  json c = Hub("nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16");
  c["vocab_size"] = 512;
  c["n_routed_experts"] = 8;
  c["hybrid_override_pattern"] = "M*-E";
  c["num_hidden_layers"] = 4;
  return c;
}

TEST(ModelHybrid, NemotronHPrefillRunsTheMamba2ChunkedScanAttentionMlpAndMoe) {
  HybridRun r = BuildAndRun(SmallNemotron(), Prefill(), "hybrid");
  ASSERT_EQ(r.plan.layers_built, 4);
  // Mamba-2: depthwise causal conv, the SSD scan's cumulative sums and decays, gated group norm.
  for (const char* op : {"aten::conv1d", "aten::cumsum", "aten::exp", "aten::softplus", "aten::repeat_interleave",
                         "aten::masked_fill", "aten::silu", "aten::rsqrt"}) {
    EXPECT_TRUE(r.Has("layers.0.mixer", op)) << op;
  }
  EXPECT_FALSE(r.Has("layers.0.mixer", "aten::softmax"));
  // Attention without positions.
  EXPECT_TRUE(r.Has("layers.1.mixer", "aten::softmax"));
  EXPECT_FALSE(r.ops.count("aten::cos"));
  // relu2 MLP.
  EXPECT_TRUE(r.Has("layers.2.mixer", "aten::relu"));
  EXPECT_TRUE(r.Has("layers.2.mixer", "aten::square"));
  // Sigmoid routing with group-limited top-k and non-gated experts.
  for (const char* op : {"aten::sigmoid", "aten::topk", "aten::scatter_", "aten::gather", "aten::index_add_"}) {
    EXPECT_TRUE(r.Has("layers.3.mixer", op)) << op;
  }
  EXPECT_TRUE(r.Has("layers.3.norm", "aten::rsqrt"));
  EXPECT_TRUE(r.Has("lm_head", "aten::linear"));
}

TEST(ModelHybrid, NemotronHDecodeStepsTheSsmAndConvStates) {
  HybridRun r = BuildAndRun(SmallNemotron(), Decode(), "hybrid");
  // One token: the conv state rolls, the SSM state updates, no chunked scan.
  for (const char* op : {"aten::roll", "aten::bmm", "aten::softplus", "aten::clamp"}) {
    EXPECT_TRUE(r.Has("layers.0.mixer", op)) << op;
  }
  EXPECT_FALSE(r.Has("layers.0.mixer", "aten::cumsum"));
  EXPECT_FALSE(r.Has("layers.0.mixer", "aten::conv1d"));
  EXPECT_TRUE(r.Has("layers.1.mixer", "aten::cat"));  // the KV cache
}

json SmallQwenNext() {
  json c = Hub("Qwen/Qwen3-Next-80B-A3B-Thinking");
  c["vocab_size"] = 512;
  c["num_experts"] = 16;  // of 512; 10 per token
  return c;
}

TEST(ModelHybrid, Qwen3NextPrefillRunsTheChunkedGatedDeltaRuleAndGatedAttention) {
  HybridRun r = BuildAndRun(SmallQwenNext(), Prefill(), "hybrid");
  ASSERT_EQ(r.plan.layers_built, 2);
  // Gated DeltaNet: conv, l2norm, the chunk's decay mask and triangular solve.
  for (const char* op : {"aten::conv1d", "aten::cumsum", "aten::exp", "aten::tril", "aten::triu", "aten::eye",
                         "aten::softplus", "aten::repeat_interleave", "aten::masked_fill", "aten::matmul"}) {
    EXPECT_TRUE(r.Has("layers.0.linear_attn", op)) << op;
  }
  // Gated full attention with partial rope.
  for (const char* op : {"aten::softmax", "aten::sigmoid", "aten::chunk"}) {
    EXPECT_TRUE(r.Has("layers.3.self_attn", op)) << op;
  }
  EXPECT_TRUE(r.Has("rotary_emb", "aten::cos"));
  // MoE with a gated shared expert in both layers.
  EXPECT_TRUE(r.Has("layers.0.mlp", "aten::topk"));
  EXPECT_TRUE(r.Has("layers.3.mlp", "aten::index_add_"));
  EXPECT_FALSE(r.by_path.count("layers.1.linear_attn"));
}

TEST(ModelHybrid, Qwen3NextDecodeRunsTheRecurrentDeltaRuleOverItsStates) {
  HybridRun r = BuildAndRun(SmallQwenNext(), Decode(), "hybrid");
  EXPECT_TRUE(r.Has("layers.0.linear_attn", "aten::conv1d"));  // the conv update over the state window
  EXPECT_TRUE(r.Has("layers.0.linear_attn", "aten::copy_"));   // the conv state written back
  EXPECT_FALSE(r.Has("layers.0.linear_attn", "aten::cumsum"));
  EXPECT_FALSE(r.Has("layers.0.linear_attn", "aten::eye"));
  EXPECT_TRUE(r.Has("layers.3.self_attn", "aten::cat"));
}

TEST(ModelHybrid, Qwen35TextConfigsBuildAloneWithInterleavedMrope) {
  // What the multimodal family hands over: the text_config by itself.
  json text = Hub("Qwen/Qwen3.5-35B-A3B")["text_config"];
  text["vocab_size"] = 512;
  text["num_experts"] = 8;
  HybridRun r = BuildAndRun(text, Prefill(), "hybrid");
  EXPECT_NE(Notes(r.plan).find("interleaved multimodal rope"), std::string::npos);
  EXPECT_TRUE(r.Has("rotary_emb", "aten::copy_"));  // the sections interleaved into the t frequencies
  EXPECT_TRUE(r.Has("layers.0.linear_attn", "aten::cumsum"));
  EXPECT_TRUE(r.Has("layers.3.self_attn", "aten::softmax"));
  // The dense Qwen3.5 text model plans too.
  BuildPlan dense = PlanOf(Hub("Qwen/Qwen3.5-27B")["text_config"]);
  EXPECT_TRUE(dense.buildable) << dense.reason;
  EXPECT_EQ(dense.layers_built, 2);
}

json SmallRwkv() {
  json c = Hub("RWKV/rwkv-5-world-3b");
  c["vocab_size"] = 512;
  return c;
}

TEST(ModelHybrid, Rwkv5PrefillRunsTimeAndChannelMixing) {
  HybridRun r = BuildAndRun(SmallRwkv(), Prefill(), "ssm");
  EXPECT_EQ(r.plan.family, "ssm");
  EXPECT_EQ(r.plan.layers_total, 32);
  EXPECT_EQ(r.plan.layers_built, 2);
  for (const char* op : {"aten::constant_pad_nd", "aten::group_norm", "aten::matmul", "aten::exp", "aten::silu"}) {
    EXPECT_TRUE(r.Has("blocks.0.attention", op)) << op;
  }
  for (const char* op : {"aten::relu", "aten::square", "aten::sigmoid"}) {
    EXPECT_TRUE(r.Has("blocks.1.feed_forward", op)) << op;
  }
  EXPECT_TRUE(r.Has("embeddings", "aten::layer_norm"));  // pre_ln folded on the first forward
  EXPECT_TRUE(r.Has("head", "aten::linear"));
}

TEST(ModelHybrid, Rwkv5DecodeReadsAndWritesItsState) {
  HybridRun r = BuildAndRun(SmallRwkv(), Decode(), "ssm");
  EXPECT_FALSE(r.Has("blocks.0.attention", "aten::constant_pad_nd"));
  EXPECT_TRUE(r.Has("blocks.0.attention", "aten::copy_"));
  EXPECT_TRUE(r.Has("blocks.0.attention", "aten::group_norm"));
  EXPECT_FALSE(r.Has("embeddings", "aten::layer_norm"));
}

}  // namespace
}  // namespace coverage::runners
