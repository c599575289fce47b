// The builder's encoder-only and encoder-decoder families (runners/model_encoder.cc)
// on real configs: which of them it builds (and why not the others), and
// forward passes of small real models with the ops that prove each variant.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "core/json_capped.h"
#include "runners/model_builder.h"
#include "selection/features.h"
#include "tests/support/family_defaults.h"
#include "tests/support/profiles.h"

namespace coverage::runners {
namespace {

using nlohmann::json;

const std::map<std::string, json>& RealConfigs() { return testing::RealHubConfigs(); }

json Config(const std::string& id) {
  auto it = RealConfigs().find(id);
  EXPECT_NE(it, RealConfigs().end()) << id;
  return it == RealConfigs().end() ? json::object() : it->second;
}

using testing::Decode;
using testing::Prefill;

struct BuiltRun {
  BuildPlan plan;
  std::vector<CapturedCall> calls;
  std::multiset<std::string> ops;
  std::set<std::string> paths;

  bool Has(const std::string& op) const { return ops.count(op) > 0; }
  // Whether `op` ran under a module path starting with `prefix`.
  bool RanUnder(const std::string& op, const std::string& prefix) const {
    for (const auto& c : calls) {
      if (c.op_case.op == op && c.module_path.rfind(prefix, 0) == 0) return true;
    }
    return false;
  }
  bool AnyPathStartsWith(const std::string& prefix) const {
    for (const auto& p : paths) {
      if (p.rfind(prefix, 0) == 0) return true;
    }
    return false;
  }
};

BuiltRun BuildAndRun(const json& config, const CaptureProfile& profile, const std::string& label) {
  BuiltRun run;
  auto f = selection::ExtractFeatures(config, *testing::RealFamilyDefaults());
  EXPECT_TRUE(f.has_value()) << label;
  if (!f) return run;
  run.plan = PlanModel(*f, config, profile, BuildOptions{});
  EXPECT_TRUE(run.plan.buildable) << label << ": " << run.plan.reason;
  if (!run.plan.buildable) return run;
  OpRecorder recorder;
  Status s = RunModel(*f, run.plan, profile, recorder);
  EXPECT_TRUE(s.ok()) << label << ": " << s.ToString();
  run.calls = recorder.TakeCalls();
  for (const auto& c : run.calls) {
    for (int64_t i = 0; i < c.count; ++i) run.ops.insert(c.op_case.op);
    run.paths.insert(c.module_path);
  }
  return run;
}

BuiltRun BuildAndRun(const std::string& id, const CaptureProfile& profile = Prefill()) {
  return BuildAndRun(Config(id), profile, id);
}

BuildPlan PlanOf(const json& config, double max_bytes = 1e18) {
  auto f = selection::ExtractFeatures(config, *testing::RealFamilyDefaults());
  EXPECT_TRUE(f.has_value());
  if (!f) return {};
  return PlanModel(*f, config, Prefill(512), BuildOptions{2, max_bytes});
}

TEST(ModelEncoder, BuildsMostRealEncoderAndSeq2SeqConfigsAndSaysWhyNotTheRest) {
  int total = 0, built = 0;
  std::map<std::string, std::pair<int, int>> by_type;         // built, of
  std::map<std::string, std::map<std::string, int>> reasons;  // model_type -> reason -> count
  for (const auto& [id, config] : RealConfigs()) {
    auto f = selection::ExtractFeatures(config, *testing::RealFamilyDefaults());
    if (!f || (f->structure != "encoder" && f->structure != "encoder-decoder")) continue;
    ++total;
    ++by_type[f->model_type].second;
    // Capability, not memory: an unlimited budget.
    BuildPlan plan = PlanModel(*f, config, Prefill(512), BuildOptions{2, 1e18});
    if (plan.buildable) {
      ++built;
      ++by_type[f->model_type].first;
      EXPECT_GT(plan.weight_bytes, 0) << id;
      EXPECT_GT(plan.layers_built, 0) << id;
      EXPECT_LE(plan.layers_built, plan.layers_total) << id;
    } else {
      EXPECT_FALSE(plan.reason.empty()) << id;
      ++reasons[f->model_type][plan.reason];
    }
  }
  for (const auto& [type, counts] : by_type) {
    std::printf("%-12s built %2d of %2d\n", type.c_str(), counts.first, counts.second);
  }
  for (const auto& [type, by_reason] : reasons) {
    for (const auto& [reason, n] : by_reason)
      std::printf("not built: %-12s %2d  %s\n", type.c_str(), n, reason.c_str());
  }
  std::printf("encoder and encoder-decoder configs built: %d of %d\n", built, total);
  // Measured: 74 of 74 (albert 6, bert 9, deberta-v2 7, distilbert 10,
  // electra 8, marian 9, roberta 9, t5 9, xlm-roberta 7).
  EXPECT_GE(total, 70);
  EXPECT_GE(built * 10, total * 9) << built << " of " << total;
}

TEST(ModelEncoder, BertLayerNormGeluTokenTypesPositionsAndPooler) {
  BuiltRun r = BuildAndRun("sentence-transformers/all-MiniLM-L6-v2");
  EXPECT_EQ(r.plan.family, "encoder");
  EXPECT_EQ(r.plan.layers_total, 6);
  EXPECT_EQ(r.plan.layers_built, 2);
  // 2 flops per weight per token: 2 layers x 1.77M weights x 16 tokens,
  // plus attention and the pooler.
  EXPECT_GT(r.plan.flops, 1.1e8);
  EXPECT_LT(r.plan.flops, 1.3e8);
  EXPECT_TRUE(r.Has("aten::layer_norm"));
  EXPECT_TRUE(r.Has("aten::gelu"));
  EXPECT_EQ(r.ops.count("aten::embedding"), 3u);  // words, token types, positions
  EXPECT_TRUE(r.RanUnder("aten::tanh", "pooler"));
  EXPECT_TRUE(r.paths.count("encoder.layer.1.attention.self"));
  EXPECT_FALSE(r.AnyPathStartsWith("encoder.layer.2"));
  EXPECT_FALSE(r.Has("aten::cumsum"));  // BERT's positions are a buffer
  // Post-norm: embeddings + 2 per layer.
  EXPECT_EQ(r.ops.count("aten::layer_norm"), 5u);
}

TEST(ModelEncoder, RobertaCountsPositionsFromInputIdsAndRunsItsLmHead) {
  BuiltRun r = BuildAndRun("sourgum/tcrBERTn");
  EXPECT_TRUE(r.RanUnder("aten::cumsum", "embeddings"));
  EXPECT_TRUE(r.RanUnder("aten::ne", "embeddings"));
  EXPECT_EQ(r.ops.count("aten::embedding"), 3u);  // type_vocab_size 1 still embeds
  EXPECT_TRUE(r.RanUnder("aten::layer_norm", "lm_head"));
  EXPECT_TRUE(r.RanUnder("aten::linear", "lm_head"));
  EXPECT_FALSE(r.paths.count("pooler"));  // RobertaForMaskedLM has none
  // XLM-RoBERTa shares the layout.
  BuiltRun x = BuildAndRun("uitnlp/visobert");
  EXPECT_TRUE(x.RanUnder("aten::cumsum", "embeddings"));
}

TEST(ModelEncoder, RobertaSequenceIsCappedAtItsPositionTable) {
  // tcrBERTn: 45 positions past padding index 1 leave 43 tokens.
  BuildPlan plan = PlanOf(Config("sourgum/tcrBERTn"));
  ASSERT_TRUE(plan.buildable) << plan.reason;
  bool capped = false;
  for (const auto& n : plan.notes) capped = capped || n.find("43 tokens") != std::string::npos;
  EXPECT_TRUE(capped);
}

TEST(ModelEncoder, DistilBertMaskedFillAttentionAndQuestionAnsweringHead) {
  BuiltRun r = BuildAndRun("distilbert/distilbert-base-uncased-distilled-squad");
  EXPECT_EQ(r.ops.count("aten::embedding"), 2u);  // no token types
  EXPECT_TRUE(r.RanUnder("aten::masked_fill", "transformer.layer.0.attention"));
  EXPECT_TRUE(r.RanUnder("aten::split", "qa_outputs"));
  EXPECT_FALSE(r.Has("aten::tanh"));  // no pooler
  EXPECT_TRUE(r.paths.count("transformer.layer.1.ffn"));
}

TEST(ModelEncoder, AlbertFactorizedEmbeddingAndSharedLayers) {
  BuiltRun r = BuildAndRun("qwant/fralbert-base");
  EXPECT_TRUE(r.RanUnder("aten::linear", "encoder.embedding_hidden_mapping_in"));
  EXPECT_TRUE(r.Has("aten::gelu"));  // gelu_new: the tanh approximation
  // Both built layers run group 0's weights under the same path, so their
  // calls merge.
  const std::string layer = "encoder.albert_layer_groups.0.albert_layers.0";
  bool merged = false;
  for (const auto& c : r.calls) {
    if (c.module_path.rfind(layer, 0) == 0 && c.op_case.op == "aten::linear" && c.count >= 2) merged = true;
  }
  EXPECT_TRUE(merged);
  EXPECT_FALSE(r.AnyPathStartsWith("encoder.albert_layer_groups.1"));
  EXPECT_TRUE(r.RanUnder("aten::layer_norm", "cls.predictions"));
}

TEST(ModelEncoder, ElectraProjectsItsEmbeddingAndRunsTheDiscriminator) {
  BuiltRun r = BuildAndRun("loodos/electra-small-turkish-cased-discriminator");
  EXPECT_TRUE(r.RanUnder("aten::linear", "embeddings_project"));  // embedding_size 128 -> 256
  EXPECT_TRUE(r.RanUnder("aten::squeeze", "discriminator_predictions"));
  EXPECT_FALSE(r.paths.count("pooler"));
}

TEST(ModelEncoder, DebertaV3DisentangledAttentionWithLogBuckets) {
  BuiltRun r = BuildAndRun("AI-team-UoA/GreekDeBERTaV3-xsmall");
  // Relative positions: log buckets, then LayerNorm of the relative embeddings.
  EXPECT_TRUE(r.RanUnder("aten::sign", "encoder.rel_embeddings"));
  EXPECT_TRUE(r.RanUnder("aten::ceil", "encoder.rel_embeddings"));
  EXPECT_TRUE(r.RanUnder("aten::layer_norm", "encoder.rel_embeddings"));
  // c2p and p2c: scores gathered from the relative positions.
  EXPECT_EQ(r.ops.count("aten::gather"), 4u);  // 2 layers x (c2p, p2c)
  EXPECT_TRUE(r.RanUnder("aten::bmm", "encoder.layer.0.attention.self"));
  EXPECT_TRUE(r.RanUnder("aten::masked_fill", "encoder.layer.0.attention.self"));
  EXPECT_EQ(r.ops.count("aten::embedding"), 1u);  // position_biased_input false, no token types
  EXPECT_FALSE(r.Has("aten::conv1d"));
}

TEST(ModelEncoder, DebertaV2ConvolutionAfterTheFirstLayer) {
  // deberta-v2-xlarge's conv settings on a small DeBERTa config.
  json config = Config("AI-team-UoA/GreekDeBERTaV3-xsmall");
  config["conv_kernel_size"] = 3;
  config["conv_act"] = "gelu";
  BuiltRun r = BuildAndRun(config, Prefill(), "deberta with conv");
  EXPECT_TRUE(r.RanUnder("aten::conv1d", "encoder.conv"));
  EXPECT_TRUE(r.RanUnder("aten::layer_norm", "encoder.conv"));
}

TEST(ModelEncoder, EncoderIgnoresTheKvCacheOfADecodeProfile) {
  BuiltRun r = BuildAndRun("sentence-transformers/all-MiniLM-L6-v2", Decode());
  bool noted = false;
  for (const auto& n : r.plan.notes) noted = noted || n.find("past_len is ignored") != std::string::npos;
  EXPECT_TRUE(noted);
  EXPECT_FALSE(r.Has("aten::cat"));
}

TEST(ModelEncoder, T5RmsNormRelativeBiasAndCrossAttention) {
  BuiltRun r = BuildAndRun("google-t5/t5-small");
  EXPECT_EQ(r.plan.family, "encoder-decoder");
  EXPECT_EQ(r.plan.layers_total, 12);  // 6 encoder + 6 decoder
  EXPECT_EQ(r.plan.layers_built, 4);
  // 2 encoder layers over 16 tokens (~0.2 GFLOP), 2 decoder layers over 16
  // (~0.27), the LM head on 16 tokens (~0.53).
  EXPECT_GT(r.plan.flops, 0.9e9);
  EXPECT_LT(r.plan.flops, 1.1e9);
  EXPECT_FALSE(r.Has("aten::layer_norm"));
  EXPECT_TRUE(r.Has("aten::rsqrt"));
  EXPECT_TRUE(r.Has("aten::pow"));
  EXPECT_TRUE(r.Has("aten::relu"));
  // The relative bias is bucketed in the first block of each stack only.
  EXPECT_TRUE(r.RanUnder("aten::log", "encoder.block.0.layer.0.SelfAttention"));
  EXPECT_TRUE(r.RanUnder("aten::where", "decoder.block.0.layer.0.SelfAttention"));
  EXPECT_FALSE(r.RanUnder("aten::log", "encoder.block.1"));
  EXPECT_TRUE(r.paths.count("decoder.block.0.layer.1.EncDecAttention"));
  EXPECT_TRUE(r.paths.count("decoder.block.1.layer.1.EncDecAttention"));
  EXPECT_TRUE(r.RanUnder("aten::triu", "decoder"));
  // Tied embeddings: the decoder output is rescaled before the LM head.
  EXPECT_TRUE(r.RanUnder("aten::mul", "lm_head"));
  EXPECT_TRUE(r.RanUnder("aten::linear", "lm_head"));
}

TEST(ModelEncoder, T5GatedGeluFeedForward) {
  json config = Config("google-t5/t5-small");
  config["feed_forward_proj"] = "gated-gelu";
  config.erase("dense_act_fn");
  config.erase("is_gated_act");
  config["tie_word_embeddings"] = false;  // as in Flan-T5 / mT5
  BuiltRun r = BuildAndRun(config, Prefill(), "t5-small gated-gelu");
  EXPECT_TRUE(r.RanUnder("aten::gelu", "encoder.block.0.layer.1.DenseReluDense"));
  EXPECT_TRUE(r.RanUnder("aten::mul", "encoder.block.0.layer.1.DenseReluDense"));
  EXPECT_FALSE(r.Has("aten::relu"));
  EXPECT_FALSE(r.RanUnder("aten::mul", "lm_head"));  // untied: no rescale
}

TEST(ModelEncoder, T5DecodeStepUsesCachesAndSkipsTheEncoder) {
  BuiltRun r = BuildAndRun("qgallouedec/tiny-T5ForConditionalGeneration", Decode());
  EXPECT_FALSE(r.AnyPathStartsWith("encoder"));
  EXPECT_TRUE(r.RanUnder("aten::cat", "decoder.block.0.layer.0.SelfAttention"));  // self-attention KV cache
  EXPECT_TRUE(r.paths.count("decoder.block.0.layer.1.EncDecAttention"));
  EXPECT_FALSE(r.Has("aten::triu"));  // one new token: nothing to mask
  // Cross-attention reads cached K/V: only q and o projections run there.
  int cross_linears = 0;
  for (const auto& c : r.calls) {
    if (c.module_path == "decoder.block.0.layer.1.EncDecAttention" && c.op_case.op == "aten::linear") {
      cross_linears += static_cast<int>(c.count);
    }
  }
  EXPECT_EQ(cross_linears, 2);
}

TEST(ModelEncoder, MarianSinusoidalPostNormWithCrossAttention) {
  BuiltRun r = BuildAndRun("MT-Distillation/s-nor-eng");
  EXPECT_TRUE(r.Has("aten::layer_norm"));
  EXPECT_TRUE(r.Has("aten::relu"));
  EXPECT_EQ(r.ops.count("aten::embedding"), 4u);                 // tokens and positions, each stack
  EXPECT_TRUE(r.RanUnder("aten::mul", "encoder.embed_tokens"));  // scale_embedding
  EXPECT_TRUE(r.paths.count("decoder.layers.0.encoder_attn"));
  EXPECT_TRUE(r.paths.count("decoder.layers.1.encoder_attn_layer_norm"));
  EXPECT_FALSE(r.paths.count("encoder.layer_norm"));  // post-norm: no final norm
  EXPECT_TRUE(r.RanUnder("aten::add", "lm_head"));    // final_logits_bias
  BuiltRun tiny = BuildAndRun("hf-internal-testing/tiny-random-MarianMTModel", Decode());
  EXPECT_TRUE(tiny.RanUnder("aten::cat", "decoder.layers.0.self_attn"));
  EXPECT_FALSE(tiny.AnyPathStartsWith("encoder"));
}

TEST(ModelEncoder, MbartPreNormLayernormEmbeddingAndOffsetPositions) {
  // No mBART config in the data: a small one in its real layout.
  json config = {{"model_type", "mbart"},
                 {"architectures", {"MBartForConditionalGeneration"}},
                 {"is_encoder_decoder", true},
                 {"d_model", 64},
                 {"encoder_layers", 3},
                 {"decoder_layers", 3},
                 {"encoder_attention_heads", 4},
                 {"decoder_attention_heads", 4},
                 {"encoder_ffn_dim", 128},
                 {"decoder_ffn_dim", 128},
                 {"activation_function", "gelu"},
                 {"max_position_embeddings", 128},
                 {"vocab_size", 1000},
                 {"scale_embedding", true},
                 {"pad_token_id", 1}};
  BuiltRun r = BuildAndRun(config, Prefill(), "mbart");
  EXPECT_TRUE(r.paths.count("encoder.layernorm_embedding"));
  EXPECT_TRUE(r.paths.count("encoder.layer_norm"));
  EXPECT_TRUE(r.paths.count("decoder.layer_norm"));
  EXPECT_TRUE(r.RanUnder("aten::add", "decoder.embed_positions"));  // BART's offset of 2
  EXPECT_TRUE(r.Has("aten::gelu"));
}

TEST(ModelEncoder, RefusesWhatItDoesNotBuildWithTheReason) {
  json deberta_v1 = {{"model_type", "deberta"},    {"architectures", {"DebertaForMaskedLM"}},
                     {"hidden_size", 64},          {"num_hidden_layers", 2},
                     {"num_attention_heads", 4},   {"intermediate_size", 128},
                     {"vocab_size", 100},          {"max_position_embeddings", 64},
                     {"relative_attention", true}, {"type_vocab_size", 0}};
  BuildPlan v1 = PlanOf(deberta_v1);
  EXPECT_FALSE(v1.buildable);
  EXPECT_NE(v1.reason.find("DeBERTa v1"), std::string::npos) << v1.reason;

  json multiple_choice = Config("sentence-transformers/all-MiniLM-L6-v2");
  multiple_choice["architectures"] = {"BertForMultipleChoice"};
  BuildPlan mc = PlanOf(multiple_choice);
  EXPECT_FALSE(mc.buildable);
  EXPECT_NE(mc.reason.find("ForMultipleChoice"), std::string::npos) << mc.reason;

  json longt5 = Config("google-t5/t5-small");
  longt5["model_type"] = "longt5";
  longt5["architectures"] = {"LongT5ForConditionalGeneration"};
  BuildPlan lt = PlanOf(longt5);
  EXPECT_FALSE(lt.buildable);
  EXPECT_NE(lt.reason.find("longt5"), std::string::npos) << lt.reason;

  BuildPlan big = PlanOf(Config("FacebookAI/xlm-roberta-large"), 1e8);
  EXPECT_FALSE(big.buildable);
  EXPECT_NE(big.reason.find("budget"), std::string::npos) << big.reason;
  OpRecorder recorder;
  EXPECT_FALSE(RunModel(selection::Features{}, big, Prefill(), recorder).ok());
}

}  // namespace
}  // namespace coverage::runners
