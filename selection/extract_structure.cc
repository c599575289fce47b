// Modality and block structure, tied embeddings and the towers of
// multimodal and speech models.
#include <nlohmann/json.hpp>

#include "selection/config_reader.h"
#include "selection/extract.h"
#include "selection/feature_tables.h"

namespace coverage::selection::detail {
namespace {

// Layer patterns: is attention mixed with other mixers?
struct LayerMix {
  bool attention = false;
  bool other = false;  // mamba, linear attention, conv, recurrent
};

void AddLayerKind(std::string_view kind, LayerMix* mix) {
  std::string k = Lower(kind);
  if (Contains(k, "linear") || Contains(k, "mamba") || Contains(k, "ssm") || Contains(k, "conv") ||
      Contains(k, "recurrent") || Contains(k, "rwkv") || Contains(k, "delta") || Contains(k, "lightning")) {
    mix->other = true;
  } else if (Contains(k, "attention") || k == "attn" || k == "full" || k == "sliding" || k == "global" ||
             k == "local" || k == "hybrid") {
    mix->attention = true;
  }
}

LayerMix LayerMixOf(Reader& r) {
  LayerMix mix;
  for (std::string_view key : {"layer_types", "layers_block_type", "block_types", "layer_block_types"}) {
    const json* v = r.Raw(key);
    if (v == nullptr || !v->is_array() || v->size() > kMaxList) continue;
    for (const json& e : *v) {
      if (auto s = AsText(&e)) AddLayerKind(*s, &mix);
    }
  }
  // Nemotron-H: "M-M-M-MM*-..." (M mamba, * attention, - MLP, E experts).
  if (auto pattern = AsText(r.Raw("hybrid_override_pattern"))) {
    if (Contains(*pattern, "M")) mix.other = true;
    if (Contains(*pattern, "*")) mix.attention = true;
  }
  // MiniMax: 0 = lightning (linear) attention, 1 = softmax attention.
  if (const json* v = r.Raw("attn_type_list"); v != nullptr && v->is_array() && v->size() <= kMaxList) {
    for (const json& e : *v) {
      if (!e.is_number_integer()) continue;
      (e.get<int64_t>() == 0 ? mix.other : mix.attention) = true;
    }
  }
  // Jamba: one attention layer every attn_layer_period layers, Mamba elsewhere.
  if (auto period = AsCount(r.Raw("attn_layer_period")); period && *period > 1) mix.attention = mix.other = true;
  return mix;
}

enum class Direction { kUnknown, kEncoder, kDecoder };

// Whether the stack is a decoder (causal) or an encoder (bidirectional), from
// its head, its keys and its family; kUnknown when none of them says.
Direction DirectionOf(Reader& main, std::string_view main_family, std::string_view head) {
  const FeatureTables& tables = Tables();
  if (OneOf(head, {"ForCausalLM", "LMHeadModel", "CausalLM"}) || AsBool(main.Raw("is_decoder")).value_or(false) ||
      InTable(main_family, tables.decoders) || InTable(main_family, tables.gated_mlp)) {
    return Direction::kDecoder;
  }
  if (OneOf(head, {"ForMaskedLM", "ForPreTraining", "ForTokenClassification", "ForMultipleChoice",
                   "ForNextSentencePrediction"}) ||
      main.Mentions("type_vocab_size") || InTable(main_family, tables.encoders)) {
    return Direction::kEncoder;
  }
  if (NamesRope(main) || main.Mentions("num_key_value_heads") || main.Mentions("rms_norm_eps") ||
      main.Raw("alibi") != nullptr || StartsWith(head, "For") ||
      (main.family() != nullptr && main.Mentions("vocab_size"))) {
    // A known family with a vocabulary and no encoder marker is a decoder
    // (GPT-2 configs whose architectures say just "gpt2").
    return Direction::kDecoder;
  }
  return Direction::kUnknown;
}

}  // namespace

Structure ReadStructure(Stack& s, Features* out) {
  Features& f = *out;
  Reader& main = s.main;
  const json& config = *s.config;
  const Family* family = s.family;
  const std::string& main_family = s.main_family;
  const FeatureTables& tables = Tables();

  const LayerMix mix = LayerMixOf(main);
  const bool enc_dec = s.composite_seq2seq || main.Bool("is_encoder_decoder").value_or(false) ||
                       s.top.Bool("is_encoder_decoder").value_or(false);
  const json* vision_sub = Object(&config, "vision_config");
  const json* audio_sub = Object(&config, "audio_config");
  const bool family_has_vision = family != nullptr && family->sub_config_classes.count("vision_config") > 0;
  const bool family_has_audio = family != nullptr && family->sub_config_classes.count("audio_config") > 0;
  const bool multimodal =
      (s.text != nullptr && (vision_sub != nullptr || audio_sub != nullptr || family_has_vision || family_has_audio)) ||
      ((vision_sub != nullptr || Object(&config, "img_processor") != nullptr ||
        AsText(Member(&config, "mm_vision_tower")).has_value()) &&
       main.Mentions("vocab_size"));
  const bool speech = InTable(Lower(f.model_type), tables.speech) ||
                      InTable(family != nullptr ? family->model_type : "", tables.speech) ||
                      main.Raw("num_mel_bins") != nullptr || main.Raw("feat_extract_norm") != nullptr ||
                      StartsWith(f.head, "ForCTC") || StartsWith(f.head, "ForAudio") ||
                      StartsWith(f.head, "ForSpeech") || StartsWith(f.head, "ForXVector");
  const std::string lower_type = Lower(f.model_type);
  const bool ssm = InTable(main_family, tables.ssm) || StartsWith(lower_type, "rwkv") ||
                   StartsWith(lower_type, "mamba") || main.Raw("ssm_cfg") != nullptr ||
                   (main.Mentions("state_size") && !main.Mentions("num_attention_heads") && !mix.attention);
  const bool hybrid = !ssm && ((mix.attention && mix.other) || InTable(main_family, tables.hybrid));
  const bool rwkv = StartsWith(lower_type, "rwkv") || main_family == "rwkv";
  const bool heads_named = main.Mentions("num_attention_heads") || main.Mentions("n_head") ||
                           main.Mentions("num_heads") || main.Mentions("n_heads");
  const bool conv =
      !heads_named && main.Mentions("hidden_sizes") && (main.Mentions("depths") || main.Mentions("depth"));
  const bool vision =
      !multimodal && !conv && !main.Mentions("vocab_size") &&
      (main.Mentions("image_size") || main.Mentions("img_size") || main.Mentions("patch_size") ||
       OneOf(f.head, {"ForImageClassification", "ForMaskedImageModeling", "ForObjectDetection",
                      "ForSemanticSegmentation", "ForDepthEstimation", "ForImageClassificationWithTeacher"}));
  const Direction direction = DirectionOf(main, main_family, f.head);

  if (multimodal) {
    f.structure = "multimodal";
  } else if (speech) {
    f.structure = "speech";
  } else if (enc_dec) {
    f.structure = "encoder-decoder";
  } else if (hybrid) {
    f.structure = "hybrid";
  } else if (ssm) {
    f.structure = "ssm";
  } else if (conv) {
    f.structure = "conv";
  } else if (vision) {
    f.structure = "vision";
  } else if (direction == Direction::kEncoder) {
    f.structure = "encoder";
  } else if (direction == Direction::kDecoder) {
    f.structure = "decoder";
  }
  return Structure{enc_dec, rwkv, family_has_vision, vision_sub, audio_sub};
}

// The language model's setting, then the top level's, then the families'
// defaults; transformers' default is true.
void ReadTiedEmbeddings(Stack& s, Features* f) {
  Reader& main = s.main;
  std::optional<bool> tied = AsBool(main.Raw("tie_word_embeddings"));
  if (!tied) tied = AsBool(Member(s.config, "tie_word_embeddings"));
  if (!tied) tied = main.Bool("tie_word_embeddings");
  if (!tied && main.family() != s.family) tied = s.top.Bool("tie_word_embeddings");
  f->tied_embeddings = tied.value_or(true);
}

void ReadTowers(const Context& ctx, Stack& s, const Structure& st, Features* out) {
  Features& f = *out;
  Reader& main = s.main;
  const json& config = *s.config;
  const Family* family = s.family;
  const json* vision_sub = st.vision_sub;
  const json* audio_sub = st.audio_sub;
  if (vision_sub != nullptr ||
      (st.family_has_vision && Member(&config, "vision_config") == nullptr && f.structure == "multimodal")) {
    Reader vr = SubReader(ctx, vision_sub != nullptr ? vision_sub : &EmptyObject(), nullptr, family, "vision_config");
    if (vr.family() != family || vision_sub != nullptr) f.vision = ReadTower(vr);
  }
  if (audio_sub != nullptr) {
    Reader ar = SubReader(ctx, audio_sub, nullptr, family, "audio_config");
    f.audio = ReadTower(ar);
  } else if (f.structure == "speech" && st.enc_dec) {
    // Whisper / Speech2Text: the encoder is the audio tower.
    f.audio.hidden = f.hidden;
    f.audio.layers = f.encoder_layers;
    f.audio.heads = main.Count("encoder_attention_heads").value_or(0);
    f.audio.intermediate = main.Count("encoder_ffn_dim").value_or(0);
    f.audio.mel_bins = main.Count("num_mel_bins", {"input_feat_per_channel"}).value_or(0);
  }
}

}  // namespace coverage::selection::detail
