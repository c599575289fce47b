#include "selection/features.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "core/json_capped.h"
#include "selection/feature_tables.h"
#include "tests/support/temp_dir.h"

namespace coverage::selection {
namespace {

using nlohmann::json;

std::string SourcePath(const std::string& relative) { return std::string(COVERAGE_SOURCE_DIR) + "/" + relative; }

// The real defaults table, loaded once for the whole suite.
const FamilyDefaults* RealDefaults() {
  static const std::shared_ptr<const FamilyDefaults> table = [] {
    auto loaded = FamilyDefaults::Load(SourcePath("data/transformers_defaults.jsonl"));
    return loaded ? *loaded : std::shared_ptr<const FamilyDefaults>();
  }();
  return table.get();
}

struct HubConfig {
  std::string id;
  json config;
};

// One `{"id", <key>: {...}, "source"}` object per line. Real configs contain
// Python's Infinity, which the capped parser reads as null.
std::vector<HubConfig> ReadHubConfigs(const std::string& relative, const std::string& key) {
  std::vector<HubConfig> out;
  std::ifstream in(SourcePath(relative));
  std::string line;
  while (std::getline(in, line)) {
    auto parsed = ParseJsonCapped(line, {.python_literals = true});
    if (!parsed || !parsed->contains("id") || !parsed->contains(key)) {
      ADD_FAILURE() << relative << ": unreadable line";
      continue;
    }
    out.push_back({(*parsed)["id"].get<std::string>(), (*parsed)[key]});
  }
  return out;
}

const std::vector<HubConfig>& FullConfigs() {
  static const std::vector<HubConfig> configs = ReadHubConfigs("data/hub/configs.jsonl", "config");
  return configs;
}

const std::vector<HubConfig>& PartialConfigs() {
  static const std::vector<HubConfig> configs = ReadHubConfigs("data/hub/configs_partial.jsonl", "config_subset");
  return configs;
}

const json& FullConfig(const std::string& id) {
  for (const HubConfig& c : FullConfigs()) {
    if (c.id == id) return c.config;
  }
  ADD_FAILURE() << id << " is not in data/hub/configs.jsonl";
  static const json missing = json::object();
  return missing;
}

Features Extract(const json& config) {
  auto f = ExtractFeatures(config, *RealDefaults());
  EXPECT_TRUE(f.has_value()) << f.error().ToString();
  return f.value_or(Features{});
}

bool Defaulted(const Features& f, const std::string& name) {
  return std::find(f.defaulted.begin(), f.defaulted.end(), name) != f.defaulted.end();
}

class FeaturesTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_NE(RealDefaults(), nullptr) << "data/transformers_defaults.jsonl does not load"; }
};

// ---------------------------------------------------------------------------
// FamilyDefaults

TEST_F(FeaturesTest, RealDefaultsFileLoadsEveryModelType) {
  const FamilyDefaults& d = *RealDefaults();
  EXPECT_GE(d.size(), 649u);
  const auto* gpt2 = d.Find("gpt2");
  ASSERT_NE(gpt2, nullptr);
  EXPECT_EQ(gpt2->config_class, "GPT2Config");
  EXPECT_EQ(gpt2->attribute_map.at("hidden_size"), "n_embd");
  ASSERT_NE(gpt2->defaults, nullptr);
  EXPECT_EQ(gpt2->defaults->at("n_embd"), 768);
  const auto* qwen3_vl = d.Find("qwen3_vl");
  ASSERT_NE(qwen3_vl, nullptr);
  EXPECT_EQ(qwen3_vl->sub_config_classes.at("vision_config"), "Qwen3VLVisionConfig");
  EXPECT_NE(std::find(qwen3_vl->sub_configs.begin(), qwen3_vl->sub_configs.end(), "text_config"),
            qwen3_vl->sub_configs.end());
  // Helper classes without a model type are found by class, not counted.
  const auto* mpt_attention = d.FindByConfigClass("MptAttentionConfig");
  ASSERT_NE(mpt_attention, nullptr);
  EXPECT_EQ(mpt_attention->model_type, "");
  EXPECT_EQ(d.Find("no_such_model"), nullptr);
}

TEST_F(FeaturesTest, ArchitectureNamesResolveToTheLongestClassPrefix) {
  const FamilyDefaults& d = *RealDefaults();
  auto type_of = [&](std::string_view architecture) -> std::string {
    const auto* f = d.FindByArchitecture(architecture);
    return f != nullptr ? f->model_type : "(none)";
  };
  EXPECT_EQ(type_of("AlbertForMaskedLM"), "albert");
  EXPECT_EQ(type_of("XLMRobertaForMaskedLM"), "xlm-roberta");
  EXPECT_EQ(type_of("GPT2LMHeadModel"), "gpt2");
  EXPECT_EQ(type_of("TFGPT2LMHeadModel"), "gpt2");
  EXPECT_EQ(type_of("LLaMAForCausalLM"), "llama");  // an old spelling, case-insensitive
  EXPECT_EQ(type_of("MarianMTModel"), "marian");
  EXPECT_EQ(type_of("GPTNeoXForCausalLM"), "gpt_neox");
  // A prefix followed by something that is not a head names another model.
  EXPECT_EQ(type_of("LlavaLlamaForCausalLM"), "(none)");
  EXPECT_EQ(type_of("QWenLMHeadModel"), "(none)");
}

TEST(FamilyDefaultsLoad, BrokenLineErrorNamesFileAndLine) {
  testing::TempDir dir;
  const std::string path = dir.File("defaults.jsonl");
  {
    std::ofstream out(path);
    out << R"({"model_type": "a", "config_class": "AConfig", "defaults": {"hidden_size": 8}})"
        << "\n\n";
    out << R"({"model_type": "b", "config_class": "BConfig", "defaults": {"hidden_size": 8)"
        << "\n";
  }
  auto loaded = FamilyDefaults::Load(path);
  ASSERT_FALSE(loaded.has_value());
  EXPECT_EQ(loaded.error().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(loaded.error().message().find(path + ":3"), std::string::npos) << loaded.error().message();
}

TEST(FamilyDefaultsLoad, WrongTypedFieldErrorNamesLineAndField) {
  testing::TempDir dir;
  const std::string path = dir.File("defaults.jsonl");
  {
    std::ofstream out(path);
    out << R"({"model_type": "a", "config_class": "AConfig", "defaults": [1, 2]})"
        << "\n";
  }
  auto loaded = FamilyDefaults::Load(path);
  ASSERT_FALSE(loaded.has_value());
  EXPECT_NE(loaded.error().message().find(path + ":1: defaults"), std::string::npos) << loaded.error().message();

  {
    std::ofstream out(path);
    out << R"({"model_type": "a", "config_class": "AConfig", "attribute_map": {"hidden_size": 3}})"
        << "\n";
  }
  loaded = FamilyDefaults::Load(path);
  ASSERT_FALSE(loaded.has_value());
  EXPECT_NE(loaded.error().message().find("attribute_map.hidden_size"), std::string::npos);
}

TEST(FamilyDefaultsLoad, MissingFileIsAnIoErrorNamingIt) {
  auto loaded = FamilyDefaults::Load("/nonexistent/defaults.jsonl");
  ASSERT_FALSE(loaded.has_value());
  EXPECT_EQ(loaded.error().code(), StatusCode::kIoError);
  EXPECT_NE(loaded.error().message().find("/nonexistent/defaults.jsonl"), std::string::npos);
}

TEST(FamilyDefaultsLoad, EmptyTableKnowsNoFamilyButCommonAliasesStillApply) {
  auto empty = FamilyDefaults::Empty();
  EXPECT_EQ(empty->size(), 0u);
  EXPECT_EQ(empty->Find("llama"), nullptr);
  auto f = ExtractFeatures(json{{"model_type", "gpt2"}, {"n_embd", 768}, {"n_head", 12}, {"n_layer", 12}}, *empty);
  ASSERT_TRUE(f.has_value());
  EXPECT_EQ(f->hidden, 768);
  EXPECT_EQ(f->heads, 12);
  EXPECT_EQ(f->layers, 12);
  EXPECT_FALSE(f->understood);
  EXPECT_TRUE(f->defaulted.empty());
}

// ---------------------------------------------------------------------------
// Feature tables (selection/feature_tables.json, compiled in)

TEST(FeatureTables, EmbeddedTablesParseAndHoldKnownFamilies) {
  auto tables = detail::ParseFeatureTables(detail::kFeatureTablesJson);
  ASSERT_TRUE(tables.has_value()) << tables.error().ToString();
  EXPECT_TRUE(detail::InTable("t5", tables->rms_norm));
  EXPECT_TRUE(detail::InTable("bert", tables->post_norm));
  EXPECT_TRUE(detail::InTable("llama", tables->gated_mlp));
  EXPECT_TRUE(detail::InTable("bloom", tables->alibi));
  EXPECT_FALSE(detail::InTable("llama", tables->post_norm));
  EXPECT_FALSE(detail::InTable("", tables->gated_mlp));
  const std::pair<std::string, std::string> bloom{"bloom", "gelu_tanh"}, refinedweb{"refinedweb", "falcon"};
  EXPECT_EQ(tables->fixed_activations.front(), bloom);  // file order is kept
  EXPECT_EQ(tables->legacy_model_types.front(), refinedweb);
  // What the extractor reads is the same text, parsed once.
  EXPECT_EQ(&detail::Tables(), &detail::Tables());
  EXPECT_EQ(detail::Tables().gated_mlp, tables->gated_mlp);
}

TEST(FeatureTables, MalformedTablesAreRefusedNamingTheTable) {
  const json good = json::parse(detail::kFeatureTablesJson);
  auto expect_refused = [](const json& tables, const std::string& reason) {
    auto parsed = detail::ParseFeatureTables(tables.dump());
    ASSERT_FALSE(parsed.has_value()) << reason;
    EXPECT_NE(parsed.error().message().find(reason), std::string::npos) << parsed.error().message();
  };
  json broken = good;
  broken["rms_norm"]["families"][1] = 7;
  expect_refused(broken, "rms_norm.families[1]: expected a non-empty string");
  broken = good;
  broken["gated_mlp"]["families"].push_back("llama");
  expect_refused(broken, "gated_mlp.families: \"llama\" is listed twice");
  broken = good;
  broken["alibi"]["families"][0] = "BLOOM";
  expect_refused(broken, "alibi.families[0]: expected lowercase");
  broken = good;
  broken.erase("ssm");
  expect_refused(broken, "ssm: missing table");
  broken = good;
  broken["speech"].erase("comment");
  expect_refused(broken, "speech.comment");
  broken = good;
  broken["rms_norms"] = good["rms_norm"];
  expect_refused(broken, "rms_norms: not a known table");
  EXPECT_FALSE(detail::ParseFeatureTables("{\"comment\": ").has_value());
}

// ---------------------------------------------------------------------------
// Every real config

// Observed: all 273 full configs extract; 248 of them understood (the rest are
// model types transformers does not know, e.g. kimi_k2, deepseek_v32, mimo,
// phi-msft, or Nemotron-3 Ultra, which gives no layer count).
TEST_F(FeaturesTest, EveryRealFullConfigExtracts) {
  ASSERT_EQ(FullConfigs().size(), 273u);
  int ok = 0, understood = 0;
  for (const HubConfig& c : FullConfigs()) {
    auto f = ExtractFeatures(c.config, *RealDefaults());
    if (!f) {
      EXPECT_FALSE(f.error().message().empty()) << c.id;
      continue;
    }
    ++ok;
    understood += f->understood;
  }
  EXPECT_EQ(ok, 273);
  EXPECT_GE(understood, 248);
}

// Observed: 2,940 of 2,980 partial configs extract, 2,872 understood; the 40
// failures are GGML repositories whose subset is `{}`.
TEST_F(FeaturesTest, EveryRealPartialConfigExtractsOrNamesWhyNot) {
  ASSERT_EQ(PartialConfigs().size(), 2980u);
  int ok = 0, understood = 0;
  for (const HubConfig& c : PartialConfigs()) {
    auto f = ExtractFeatures(c.config, *RealDefaults());
    if (!f) {
      EXPECT_EQ(f.error().code(), StatusCode::kInvalidArgument) << c.id;
      EXPECT_NE(f.error().message().find("no model_type"), std::string::npos) << c.id;
      EXPECT_TRUE(c.config.empty()) << c.id << " fails although its subset is not empty";
      continue;
    }
    ++ok;
    understood += f->understood;
  }
  EXPECT_EQ(ok, 2940);
  EXPECT_GE(understood, 2872);
}

TEST_F(FeaturesTest, JsonFormRoundTripsEveryRealConfig) {
  int checked = 0;
  for (const auto* set : {&FullConfigs(), &PartialConfigs()}) {
    for (const HubConfig& c : *set) {
      auto f = ExtractFeatures(c.config, *RealDefaults());
      if (!f) continue;
      const json j = ToJson(*f);
      auto back = FeaturesFromJson(j);
      ASSERT_TRUE(back.has_value()) << c.id << ": " << back.error().ToString();
      EXPECT_EQ(*back, *f) << c.id;
      // And through text, as the registry stores it.
      auto reparsed = FeaturesFromJson(json::parse(j.dump()));
      ASSERT_TRUE(reparsed.has_value());
      EXPECT_EQ(*reparsed, *f) << c.id;
      ++checked;
    }
  }
  EXPECT_EQ(checked, 273 + 2940);
}

// ---------------------------------------------------------------------------
// vLLM's derived architecture summaries as an independent oracle

TEST_F(FeaturesTest, MatchesVllmGroundTruthWhereWeHoldTheConfig) {
  std::ifstream in(SourcePath("data/hub/vllm_model_arch_groundtruth.json"));
  const json truth = json::parse(in, nullptr, false);
  ASSERT_TRUE(truth.is_object());
  std::map<std::string, const json*> configs;
  for (const HubConfig& c : PartialConfigs()) configs[c.id] = &c.config;
  for (const HubConfig& c : FullConfigs()) configs[c.id] = &c.config;  // a full config wins

  std::vector<std::string> compared;
  for (const auto& [id, want] : truth.items()) {
    auto it = configs.find(id);
    if (it == configs.end()) continue;
    compared.push_back(id);
    SCOPED_TRACE(id);
    const Features f = Extract(*it->second);
    EXPECT_EQ(f.hidden, want["hidden_size"].get<int64_t>());
    EXPECT_EQ(f.layers, want["total_num_hidden_layers"].get<int64_t>());
    EXPECT_EQ(f.heads, want["total_num_attention_heads"].get<int64_t>());
    EXPECT_EQ(f.vocab, want["vocab_size"].get<int64_t>());
    EXPECT_EQ(f.experts, want["num_experts"].get<int64_t>());
    EXPECT_EQ(f.attention == "mla", want["is_deepseek_mla"].get<bool>());
    // vLLM's head_size for MLA is the latent KV-cache width (576); ours is
    // the query/key width (see Features::head_dim). No MLA model of the
    // ground truth has a config here, so the two never meet in this test.
    if (!want["is_deepseek_mla"].get<bool>()) {
      EXPECT_EQ(f.head_dim, want["head_size"].get<int64_t>());
    }
    if (id == "tiiuae/falcon-40b") {
      // The partial config (gpu_poor's subset) keeps only architectures and
      // the main dimensions; without `new_decoder_architecture` and
      // `num_kv_heads` FalconConfig's defaults (multi_query=True) give one KV
      // head, where vLLM, reading the full config, has 8.
      EXPECT_EQ(f.kv_heads, 1);
      EXPECT_EQ(want["total_num_kv_heads"], 8);
    } else {
      EXPECT_EQ(f.kv_heads, want["total_num_kv_heads"].get<int64_t>());
    }
  }
  // Of vLLM's 17 models, 4 have a config in data/hub: Llama-4-Scout and
  // Nemotron-Super-49B (full), falcon-7b and falcon-40b (partial).
  EXPECT_EQ(compared.size(), 4u);
}

// ---------------------------------------------------------------------------
// Specific real configs

TEST_F(FeaturesTest, LlamaWithGroupedQueryAttention) {
  const Features f = Extract(FullConfig("TinyLlama/TinyLlama-1.1B-Chat-v1.0"));
  EXPECT_EQ(f.model_type, "llama");
  EXPECT_EQ(f.architecture, "LlamaForCausalLM");
  EXPECT_EQ(f.head, "ForCausalLM");
  EXPECT_EQ(f.structure, "decoder");
  EXPECT_EQ(f.attention, "gqa");
  EXPECT_EQ(f.heads, 32);
  EXPECT_EQ(f.kv_heads, 4);
  EXPECT_EQ(f.head_dim, 64);
  EXPECT_EQ(f.position, "rope");
  EXPECT_EQ(f.norm, "rmsnorm");
  EXPECT_EQ(f.norm_placement, "pre");
  EXPECT_EQ(f.activation, "silu");
  EXPECT_TRUE(f.gated_mlp);
  EXPECT_EQ(f.hidden, 2048);
  EXPECT_EQ(f.layers, 22);
  EXPECT_EQ(f.intermediate, 5632);
  EXPECT_EQ(f.vocab, 32000);
  EXPECT_EQ(f.context, 2048);
  EXPECT_EQ(f.dtype, "bfloat16");
  EXPECT_FALSE(f.tied_embeddings);
  EXPECT_TRUE(f.understood);

  const Features llama31 = Extract(FullConfig("meta-llama/Llama-3.1-8B"));
  EXPECT_EQ(llama31.kv_heads, 8);
  EXPECT_EQ(llama31.rope_scaling, "llama3");
  EXPECT_EQ(llama31.context, 131072);
}

TEST_F(FeaturesTest, Gpt2AliasesAndLearnedPositions) {
  const Features f = Extract(FullConfig("openai-community/gpt2"));
  EXPECT_EQ(f.head, "LMHeadModel");
  EXPECT_EQ(f.hidden, 768);         // n_embd
  EXPECT_EQ(f.heads, 12);           // n_head
  EXPECT_EQ(f.layers, 12);          // n_layer
  EXPECT_EQ(f.context, 1024);       // n_positions
  EXPECT_EQ(f.intermediate, 3072);  // n_inner null: 4 x n_embd
  EXPECT_EQ(f.attention, "mha");
  EXPECT_EQ(f.position, "learned");
  EXPECT_EQ(f.norm, "layernorm");
  EXPECT_EQ(f.activation, "gelu_tanh");  // gelu_new
  EXPECT_FALSE(f.gated_mlp);
  EXPECT_TRUE(f.tied_embeddings);
  EXPECT_TRUE(f.understood);
}

TEST_F(FeaturesTest, T5IsAnEncoderDecoderWithRelativePositions) {
  const Features small = Extract(FullConfig("google-t5/t5-small"));
  EXPECT_EQ(small.structure, "encoder-decoder");
  EXPECT_EQ(small.position, "relative");
  EXPECT_EQ(small.norm, "rmsnorm");  // T5LayerNorm, named layer_norm_epsilon
  EXPECT_EQ(small.activation, "relu");
  EXPECT_FALSE(small.gated_mlp);
  EXPECT_EQ(small.layers, 6);
  EXPECT_EQ(small.encoder_layers, 6);
  EXPECT_EQ(small.hidden, 512);
  EXPECT_EQ(small.heads, 8);
  EXPECT_EQ(small.head_dim, 64);  // d_kv
  EXPECT_EQ(small.intermediate, 2048);

  // T5 v1.1 / Flan layout: "gated-gelu" runs gelu_new through a gate.
  const Features gated = Extract(FullConfig("yhavinga/t5-eff-xl-8l-dutch-english-cased"));
  EXPECT_EQ(gated.activation, "gelu_tanh");
  EXPECT_TRUE(gated.gated_mlp);
  EXPECT_EQ(gated.layers, 8);
  EXPECT_EQ(gated.encoder_layers, 8);
}

TEST_F(FeaturesTest, BertIsAPostNormEncoder) {
  const Features f = Extract(FullConfig("Snowflake/snowflake-arctic-embed-m"));
  EXPECT_EQ(f.head, "Model");
  EXPECT_EQ(f.structure, "encoder");
  EXPECT_EQ(f.norm, "layernorm");
  EXPECT_EQ(f.norm_placement, "post");
  EXPECT_EQ(f.position, "learned");
  EXPECT_EQ(f.activation, "gelu");
  EXPECT_EQ(f.attention, "mha");
  EXPECT_EQ(f.context, 512);
  EXPECT_EQ(f.encoder_layers, 0);
}

TEST_F(FeaturesTest, MixtralRoutesTwoOfEightExperts) {
  const Features f = Extract(FullConfig("mistralai/Mixtral-8x7B-v0.1"));
  EXPECT_EQ(f.experts, 8);
  EXPECT_EQ(f.experts_per_token, 2);
  EXPECT_EQ(f.shared_experts, 0);
  EXPECT_EQ(f.attention, "gqa");
  EXPECT_TRUE(f.gated_mlp);
}

TEST_F(FeaturesTest, DeepSeekV3HasLatentAttentionAndASharedExpert) {
  const Features f = Extract(FullConfig("deepseek-ai/DeepSeek-V3"));
  EXPECT_EQ(f.attention, "mla");
  EXPECT_EQ(f.heads, 128);
  EXPECT_EQ(f.head_dim, 192);  // qk_nope_head_dim 128 + qk_rope_head_dim 64
  EXPECT_EQ(f.experts, 256);
  EXPECT_EQ(f.experts_per_token, 8);
  EXPECT_EQ(f.shared_experts, 1);
  EXPECT_EQ(f.rope_scaling, "yarn");
  EXPECT_EQ(f.quantization, "fp8");
  EXPECT_EQ(f.layers, 61);
}

TEST_F(FeaturesTest, VisionLanguageModelReadsItsTextAndVisionConfigs) {
  const Features f = Extract(FullConfig("Qwen/Qwen3-VL-2B-Instruct"));
  EXPECT_EQ(f.model_type, "qwen3_vl");
  EXPECT_EQ(f.structure, "multimodal");
  EXPECT_EQ(f.head, "ForConditionalGeneration");
  // The language model, from text_config.
  EXPECT_EQ(f.hidden, 2048);
  EXPECT_EQ(f.layers, 28);
  EXPECT_EQ(f.heads, 16);
  EXPECT_EQ(f.kv_heads, 8);
  EXPECT_EQ(f.head_dim, 128);
  EXPECT_EQ(f.vocab, 151936);
  EXPECT_EQ(f.rope_scaling, "mrope");
  EXPECT_EQ(f.dtype, "bfloat16");
  // The vision tower, from vision_config (depth, num_heads).
  EXPECT_EQ(f.vision.hidden, 1024);
  EXPECT_EQ(f.vision.layers, 24);
  EXPECT_EQ(f.vision.heads, 16);
  EXPECT_EQ(f.vision.intermediate, 4096);
  EXPECT_EQ(f.vision.patch_size, 16);
  EXPECT_TRUE(f.understood);

  const Features llama4 = Extract(FullConfig("meta-llama/Llama-4-Maverick-17B-128E-Instruct"));
  EXPECT_EQ(llama4.experts, 128);
  EXPECT_EQ(llama4.experts_per_token, 1);
  EXPECT_EQ(llama4.vision.image_size, 336);
  EXPECT_EQ(llama4.vision.patch_size, 14);
  EXPECT_EQ(llama4.vision.layers, 34);
}

TEST_F(FeaturesTest, WhisperIsSpeechWithAnEncoderTower) {
  const Features f = Extract(FullConfig("team-lucid/whisper-tiny.ko"));
  EXPECT_EQ(f.structure, "speech");
  EXPECT_EQ(f.layers, 4);
  EXPECT_EQ(f.encoder_layers, 4);
  EXPECT_EQ(f.hidden, 384);
  EXPECT_EQ(f.heads, 6);
  EXPECT_EQ(f.position, "sinusoidal");
  EXPECT_EQ(f.norm, "layernorm");
  EXPECT_EQ(f.audio.layers, 4);
  EXPECT_EQ(f.audio.hidden, 384);
  EXPECT_EQ(f.audio.heads, 6);
  EXPECT_EQ(f.audio.mel_bins, 80);
  EXPECT_TRUE(f.understood);
}

TEST_F(FeaturesTest, Wav2Vec2HasConvFeatureWidths) {
  const Features f = Extract(FullConfig("tommy19970714/wav2vec2-base-960h"));
  EXPECT_EQ(f.structure, "speech");
  EXPECT_EQ(f.head, "ForCTC");
  EXPECT_EQ(f.conv_widths, std::vector<int64_t>(7, 512));
  EXPECT_EQ(f.position, "conv");
  EXPECT_EQ(f.norm_placement, "post");  // do_stable_layer_norm false

  const Features large = Extract(FullConfig("facebook/wav2vec2-large-960h-lv60-self"));
  EXPECT_EQ(large.norm_placement, "pre");  // do_stable_layer_norm true
}

TEST_F(FeaturesTest, AlbertWithoutModelTypeIsInferredFromItsArchitecture) {
  const json& config = FullConfig("albert/albert-xxlarge-v1");
  ASSERT_FALSE(config.contains("model_type"));
  const Features f = Extract(config);
  EXPECT_EQ(f.model_type, "albert");
  EXPECT_EQ(f.head, "ForMaskedLM");
  EXPECT_EQ(f.structure, "encoder");
  EXPECT_EQ(f.hidden, 4096);
  EXPECT_EQ(f.heads, 64);
  EXPECT_TRUE(f.understood);
}

TEST_F(FeaturesTest, DebertaV3WithoutArchitecturesIsARelativeEncoder) {
  const json& config = FullConfig("microsoft/deberta-v3-base");
  ASSERT_FALSE(config.contains("architectures"));
  const Features f = Extract(config);
  EXPECT_EQ(f.model_type, "deberta-v2");
  EXPECT_EQ(f.architecture, "");
  EXPECT_EQ(f.head, "");
  EXPECT_EQ(f.structure, "encoder");
  EXPECT_EQ(f.position, "relative");
  EXPECT_TRUE(f.understood);
}

TEST_F(FeaturesTest, BloomUsesAlibi) {
  const Features f = Extract(FullConfig("bigscience/bloomz-7b1"));
  EXPECT_EQ(f.position, "alibi");
  EXPECT_EQ(f.activation, "gelu_tanh");  // hard-coded in BLOOM's MLP
  EXPECT_EQ(f.intermediate, 4 * f.hidden);
  EXPECT_EQ(f.structure, "decoder");
  // A tiny BLOOM test config writes type_vocab_size; it is still a decoder.
  EXPECT_EQ(Extract(FullConfig("optimum-intel-internal-testing/tiny-random-BloomModel")).structure, "decoder");
}

TEST_F(FeaturesTest, StringWithInfinityLiteralsParses) {
  // The real Nemotron-H config writes `"time_step_limit": [0.0, Infinity]`;
  // the data loader read it as null, so put the literal back.
  std::string body = FullConfig("nvidia/NVIDIA-Nemotron-3-Super-120B-A12B-FP8").dump();
  const std::string null_form = R"("time_step_limit":[0.0,null])";
  const size_t at = body.find(null_form);
  ASSERT_NE(at, std::string::npos);
  body.replace(at, null_form.size(), R"("time_step_limit":[0.0,Infinity])");
  ASSERT_FALSE(json::accept(body));

  auto f = ExtractFeatures(std::string_view(body), *RealDefaults());
  ASSERT_TRUE(f.has_value()) << f.error().ToString();
  EXPECT_EQ(f->model_type, "nemotron_h");
  EXPECT_EQ(f->structure, "hybrid");
  EXPECT_EQ(f->norm, "rmsnorm");
  EXPECT_EQ(f->activation, "relu2");
  EXPECT_FALSE(f->gated_mlp);
  EXPECT_EQ(f->experts, 512);
  EXPECT_EQ(f->experts_per_token, 22);
  EXPECT_EQ(f->layers, 88);
  EXPECT_TRUE(f->understood);

  auto bad = ExtractFeatures(std::string_view(R"({"model_type": "llama", "hidden_size": )"), *RealDefaults());
  ASSERT_FALSE(bad.has_value());
  EXPECT_EQ(bad.error().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.error().message().find("not valid JSON"), std::string::npos) << bad.error().message();
}

TEST_F(FeaturesTest, NemotronUltraTakesItsLayerCountFromTheLayerPattern) {
  const json& config = FullConfig("nvidia/NVIDIA-Nemotron-3-Ultra-550B-A55B-BF16");
  ASSERT_FALSE(config.contains("num_hidden_layers"));
  const Features f = Extract(config);
  EXPECT_EQ(f.layers, static_cast<int64_t>(config["layers_block_type"].size()));
  EXPECT_EQ(f.structure, "hybrid");
}

// ---------------------------------------------------------------------------
// Defaults and unknown families

TEST_F(FeaturesTest, MissingFieldsComeFromTheFamilyDefaultsAndAreListed) {
  // The real distilhubert config names no vocab_size; HubertConfig's is 32.
  const Features hubert = Extract(FullConfig("ntu-spml/distilhubert"));
  EXPECT_EQ(hubert.vocab, 32);
  EXPECT_TRUE(Defaulted(hubert, "vocab_size"));

  const Features f = Extract(json{{"model_type", "llama"}, {"hidden_size", 2048}, {"num_attention_heads", 16}});
  EXPECT_EQ(f.layers, 32);  // LlamaConfig default
  EXPECT_TRUE(Defaulted(f, "num_hidden_layers"));
  EXPECT_EQ(f.vocab, 32000);
  EXPECT_TRUE(Defaulted(f, "vocab_size"));
  EXPECT_EQ(f.intermediate, 11008);
  EXPECT_TRUE(Defaulted(f, "intermediate_size"));
  // Null defaults are derived, not listed: kv heads = heads, head_dim = hidden / heads.
  EXPECT_EQ(f.kv_heads, 16);
  EXPECT_FALSE(Defaulted(f, "num_key_value_heads"));
  EXPECT_EQ(f.head_dim, 128);
  EXPECT_FALSE(Defaulted(f, "head_dim"));
  // Given fields are not listed.
  EXPECT_FALSE(Defaulted(f, "hidden_size"));
  EXPECT_TRUE(f.understood);

  // A nested config's defaults carry its key.
  const Features vl = Extract(json{{"model_type", "qwen3_vl"}, {"text_config", {{"hidden_size", 1024}}}});
  EXPECT_EQ(vl.hidden, 1024);
  EXPECT_EQ(vl.layers, 32);  // Qwen3VLTextConfig default
  EXPECT_TRUE(Defaulted(vl, "text_config.num_hidden_layers"));
  EXPECT_EQ(vl.vision.layers, 27);  // Qwen3VLVisionConfig's depth
  EXPECT_TRUE(Defaulted(vl, "vision_config.num_hidden_layers"));
}

TEST_F(FeaturesTest, ExplicitNullIsDerivedNotDefaulted) {
  // qwen3's default head_dim is 128; a config that says null derives it.
  const Features f =
      Extract(json{{"model_type", "qwen3"}, {"hidden_size", 1024}, {"num_attention_heads", 8}, {"head_dim", nullptr}});
  EXPECT_EQ(f.head_dim, 128);  // 1024 / 8
  EXPECT_FALSE(Defaulted(f, "head_dim"));
}

TEST_F(FeaturesTest, UnknownModelTypeStillGivesGenericFields) {
  const Features f = Extract(json{{"model_type", "acme_lm"},
                                  {"architectures", {"AcmeForCausalLM"}},
                                  {"n_embd", 1024},
                                  {"n_head", 16},
                                  {"num_key_value_heads", 4},
                                  {"n_layer", 24},
                                  {"vocab_size", 50000},
                                  {"rope_theta", 10000.0},
                                  {"rms_norm_eps", 1e-6},
                                  {"hidden_act", "silu"}});
  EXPECT_EQ(f.model_type, "acme_lm");
  EXPECT_EQ(f.head, "ForCausalLM");
  EXPECT_EQ(f.structure, "decoder");
  EXPECT_EQ(f.hidden, 1024);
  EXPECT_EQ(f.heads, 16);
  EXPECT_EQ(f.attention, "gqa");
  EXPECT_EQ(f.layers, 24);
  EXPECT_EQ(f.position, "rope");
  EXPECT_EQ(f.norm, "rmsnorm");
  EXPECT_TRUE(f.gated_mlp);  // Note [Gated MLP]
  EXPECT_TRUE(f.defaulted.empty());
  EXPECT_FALSE(f.understood);
}

// ---------------------------------------------------------------------------
// Hostile input

TEST_F(FeaturesTest, NonObjectJsonIsRefusedWithAReason) {
  for (const json& j : {json::array({1, 2}), json("config"), json(3), json(nullptr), json(true)}) {
    auto f = ExtractFeatures(j, *RealDefaults());
    ASSERT_FALSE(f.has_value()) << j.dump();
    EXPECT_EQ(f.error().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(f.error().message().find("not a JSON object"), std::string::npos) << f.error().message();
  }
  for (const json& j : {json::object(), json{{"foo", 1}}, json{{"model_type", 3}, {"architectures", "X"}}}) {
    auto f = ExtractFeatures(j, *RealDefaults());
    ASSERT_FALSE(f.has_value()) << j.dump();
    EXPECT_NE(f.error().message().find("no model_type, no architectures and no dimension"), std::string::npos);
  }
}

TEST_F(FeaturesTest, WrongTypesAndAbsurdNumbersReadAsUnknown) {
  const json config = {{"model_type", "llama"},
                       {"architectures", "LlamaForCausalLM"},  // a string, not a list
                       {"hidden_size", "4096"},
                       {"num_attention_heads", {32}},
                       {"num_hidden_layers", -1},
                       {"vocab_size", 1e300},
                       {"num_key_value_heads", int64_t{1} << 41},
                       {"intermediate_size", 11008.5},
                       {"max_position_embeddings", {{"a", 1}}},
                       {"head_dim", true},
                       {"rope_scaling", "yarn"},
                       {"hidden_act", {{"name", "silu"}}},
                       {"layer_types", 5},
                       {"tie_word_embeddings", "yes"},
                       {"quantization_config", {1, 2}},
                       {"torch_dtype", 16},
                       {"text_config", "not an object"},
                       {"num_local_experts", -8}};
  auto f = ExtractFeatures(config, *RealDefaults());
  ASSERT_TRUE(f.has_value()) << f.error().ToString();
  EXPECT_EQ(f->architecture, "");
  EXPECT_EQ(f->hidden, 0);  // present but wrong: unknown, not defaulted
  EXPECT_EQ(f->heads, 0);
  EXPECT_EQ(f->layers, 0);
  EXPECT_EQ(f->vocab, 0);
  EXPECT_EQ(f->kv_heads, 0);
  EXPECT_EQ(f->intermediate, 0);
  EXPECT_EQ(f->context, 0);
  EXPECT_EQ(f->head_dim, 0);
  EXPECT_EQ(f->experts, 0);
  EXPECT_EQ(f->rope_scaling, "");
  EXPECT_EQ(f->activation, "");     // named, but not a name: unknown, not the default
  EXPECT_TRUE(f->tied_embeddings);  // not a bool: unknown, so transformers' default
  EXPECT_EQ(f->dtype, "");
  EXPECT_EQ(f->quantization, "");
  EXPECT_FALSE(Defaulted(*f, "hidden_size"));
  EXPECT_FALSE(Defaulted(*f, "hidden_act"));
  EXPECT_FALSE(f->understood);

  // Integral floats are counts; an overlong model_type is not a name.
  auto g = ExtractFeatures(json{{"model_type", std::string(10000, 'x')}, {"hidden_size", 768.0}}, *RealDefaults());
  ASSERT_TRUE(g.has_value());
  EXPECT_EQ(g->model_type, "");
  EXPECT_EQ(g->hidden, 768);
}

// Note [Dimension bounds]: a count that parses (below 2^40) but that no
// buildable model has is refused, naming the field; the real configs all pass
// (EveryRealFullConfigExtracts).
TEST_F(FeaturesTest, DimensionsBeyondTheBoundsAreRefusedNamingTheField) {
  struct Case {
    const char* field;
    json value;
    const char* named;
  };
  for (const Case& c : {Case{"hidden_size", int64_t{1000000000000}, "hidden_size is 1000000000000"},
                        Case{"num_hidden_layers", 100000, "num_hidden_layers is 100000"},
                        Case{"vocab_size", int64_t{1} << 30, "vocab_size is 1073741824"},
                        Case{"intermediate_size", 1e9, "intermediate_size is 1000000000"},
                        Case{"max_position_embeddings", int64_t{1} << 35, "max_position_embeddings"}}) {
    json config = FullConfig("meta-llama/Llama-3.1-8B");
    config[c.field] = c.value;
    auto f = ExtractFeatures(config, *RealDefaults());
    ASSERT_FALSE(f.has_value()) << c.field;
    EXPECT_EQ(f.error().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(f.error().message().find(c.named), std::string::npos) << f.error().message();
  }
  json vlm = FullConfig("Qwen/Qwen3-VL-2B-Instruct");
  vlm["vision_config"]["hidden_size"] = int64_t{1} << 30;
  auto v = ExtractFeatures(vlm, *RealDefaults());
  ASSERT_FALSE(v.has_value());
  EXPECT_NE(v.error().message().find("vision_config.hidden_size is 1073741824"), std::string::npos)
      << v.error().message();
  // The largest real dense model stays in.
  json big = FullConfig("meta-llama/Llama-3.1-8B");
  big["hidden_size"] = 16384;
  big["num_hidden_layers"] = 126;
  big["intermediate_size"] = 53248;
  EXPECT_TRUE(ExtractFeatures(big, *RealDefaults()).has_value());
}

TEST_F(FeaturesTest, DeepNestingNeitherCrashesNorParses) {
  json deep = json::object();
  for (int i = 0; i < 20000; ++i) {
    json next = json::object();
    next["rope_scaling"] = std::move(deep);
    deep = std::move(next);
  }
  json config = {{"model_type", "llama"}, {"hidden_size", 64}};
  config["rope_scaling"] = std::move(deep);
  config["text_config"] = {{"vision_config", {{"a", {{"b", {{"c", 1}}}}}}}};
  auto f = ExtractFeatures(config, *RealDefaults());
  ASSERT_TRUE(f.has_value());
  EXPECT_EQ(f->rope_scaling, "");

  std::string text(200, '[');
  text += std::string(200, ']');
  auto g = ExtractFeatures(std::string_view(text), *RealDefaults());
  ASSERT_FALSE(g.has_value());
  EXPECT_NE(g.error().message().find("deeper"), std::string::npos) << g.error().message();
}

// Every top-level field of one real config per model type, and the first 40
// fields of each nested config (text_config, vision_config, ...), replaced in
// turn by each hostile value: never a crash, always a value or a reason.
TEST_F(FeaturesTest, EveryFieldOfRealConfigsSurvivesHostileValues) {
  const std::vector<json> hostile = {
      json("x"), json::array({1, "a"}), json::object({{"k", -1}}), json(-1), json(1e20), json(nullptr), json(true),
      json(0.5)};
  int runs = 0;
  auto check = [&](const json& config) {
    auto f = ExtractFeatures(config, *RealDefaults());
    if (f) {
      EXPECT_TRUE(FeaturesFromJson(ToJson(*f)).has_value());
    } else {
      EXPECT_FALSE(f.error().message().empty());
    }
    ++runs;
  };
  // Replaces one member in place and puts it back, so no config is copied
  // per run (some quantization_configs list hundreds of layers).
  auto each_hostile = [&](json& object, const std::string& key, json& whole) {
    json saved = std::move(object[key]);
    for (const json& h : hostile) {
      object[key] = h;
      check(whole);
    }
    object[key] = std::move(saved);
  };
  std::set<std::string> types;
  for (const HubConfig& c : FullConfigs()) {
    if (!types.insert(c.config.value("model_type", std::string("(none)"))).second) continue;
    json config = c.config;
    std::vector<std::string> keys;
    for (const auto& [key, unused] : config.items()) keys.push_back(key);
    for (const std::string& key : keys) {
      each_hostile(config, key, config);
      if (!config[key].is_object()) continue;
      std::vector<std::string> inner;
      for (const auto& [k, unused] : config[key].items()) {
        if (inner.size() < 40) inner.push_back(k);
      }
      for (const std::string& k : inner) each_hostile(config[key], k, config);
    }
    EXPECT_EQ(config, c.config);
  }
  EXPECT_GT(runs, 10000);
}

// ---------------------------------------------------------------------------
// JSON form

TEST_F(FeaturesTest, FromJsonNamesTheBadField) {
  const json good = ToJson(Extract(FullConfig("Qwen/Qwen3-VL-2B-Instruct")));
  ASSERT_TRUE(FeaturesFromJson(good).has_value());

  json missing = good;
  missing.erase("heads");
  auto a = FeaturesFromJson(missing);
  ASSERT_FALSE(a.has_value());
  EXPECT_EQ(a.error().code(), StatusCode::kCorruption);
  EXPECT_NE(a.error().message().find("features.heads"), std::string::npos) << a.error().message();

  json nested = good;
  nested["vision"]["layers"] = "24";
  auto b = FeaturesFromJson(nested);
  ASSERT_FALSE(b.has_value());
  EXPECT_NE(b.error().message().find("features.vision.layers"), std::string::npos) << b.error().message();

  json list = good;
  list["conv_widths"] = {1, "2"};
  auto c = FeaturesFromJson(list);
  ASSERT_FALSE(c.has_value());
  EXPECT_NE(c.error().message().find("features.conv_widths"), std::string::npos);

  json flag = good;
  flag["understood"] = 1;
  EXPECT_FALSE(FeaturesFromJson(flag).has_value());
  EXPECT_FALSE(FeaturesFromJson(json::array()).has_value());
}

// ---------------------------------------------------------------------------
// The model-type report in selection/README.md ("Model types fully
// understood") is this test's output: rerun it with
//   build/bin/coverage_selection_tests --gtest_filter='*ModelTypeUnderstanding*'
// and paste the lines between the markers.

TEST_F(FeaturesTest, ModelTypeUnderstandingReport) {
  struct Tally {
    int configs = 0;
    std::set<std::string> missing;
  };
  std::map<std::string, Tally> by_type;
  for (const HubConfig& c : FullConfigs()) {
    const Features f = Extract(c.config);
    const std::string type = f.model_type.empty() ? "(none)" : f.model_type;
    Tally& t = by_type[type];
    ++t.configs;
    if (!f.understood) t.missing.insert("understood");
    if (f.attention.empty()) t.missing.insert("attention");
    if (f.position.empty()) t.missing.insert("position");
    if (f.norm.empty()) t.missing.insert("norm");
    if (f.activation.empty()) t.missing.insert("activation");
  }
  std::string full, partly;
  int full_count = 0;
  for (const auto& [type, t] : by_type) {
    if (t.missing.empty()) {
      full += "- `" + type + "` (" + std::to_string(t.configs) + ")\n";
      ++full_count;
    } else {
      std::string what;
      for (const std::string& m : t.missing) what += (what.empty() ? "" : ", ") + m;
      partly += "- `" + type + "` (" + std::to_string(t.configs) + "): " + what + "\n";
    }
  }
  std::printf("--- fully understood ---\n%s--- partly understood ---\n%s--- end ---\n", full.c_str(), partly.c_str());
  EXPECT_GE(full_count, 45);
  EXPECT_TRUE(by_type["llama"].missing.empty());
  EXPECT_TRUE(by_type["t5"].missing.empty());
  EXPECT_TRUE(by_type["whisper"].missing.empty());
  EXPECT_FALSE(by_type["step3p7"].missing.empty());  // not a transformers model type
}

}  // namespace
}  // namespace coverage::selection
