// Architectural features of a Hub model, read from its config.json.
//
// A feature is anything that changes what a backend executes: which family of
// blocks runs, how attention is shaped, where positions come from, which
// norm and activation kernels run, whether experts are routed, and the
// dimensions every op sees. ExtractFeatures reads them from a config.json
// object, resolving
//   - aliases (`n_embd`, `d_model`, `n_head`, ... -> the canonical names),
//     from the family's attribute map and a table of common ones;
//   - missing fields, from the family's defaults (FamilyDefaults, loaded from
//     data/transformers_defaults.jsonl: the default values transformers
//     writes for 649 model types); every defaulted field is listed in
//     Features::defaulted;
//   - nested configs: `text_config` / `language_config` / `llm_config` hold
//     the language model of a multimodal model, `vision_config` and
//     `audio_config` its towers; encoder-decoder configs give both stacks.
//
// Unknown values are "" (strings) or 0 (numbers), never guessed. Every
// vocabulary below is closed; ToJson/FromJson round-trip exactly.
//
// The input is untrusted: a member of the wrong type (a string where a count
// belongs, a list where an int belongs), a negative count or one beyond 2^40
// reads as unknown; nothing in ExtractFeatures throws or aborts on any JSON
// value. Where a feature is derived from family knowledge rather than read
// (which families use RMSNorm under a `layer_norm_epsilon` name, which have
// gated MLPs, post-norm encoders), that knowledge is in named tables, each
// with the reason: selection/feature_tables.json, compiled into the library.
//
// Thread safety: FamilyDefaults is immutable after Load; ExtractFeatures is
// a pure function and may run on many threads at once.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "core/result.h"

namespace coverage::selection {

// Bump whenever ExtractFeatures or the signatures can give a different result
// for the same config: stored features of an older version are re-derived.
constexpr int kFeatureExtractorVersion = 2;  // 2: dimension bounds

struct Tower {
  int64_t hidden = 0;
  int64_t layers = 0;
  int64_t heads = 0;
  int64_t intermediate = 0;
  int64_t image_size = 0;  // vision
  int64_t patch_size = 0;  // vision
  int64_t mel_bins = 0;    // audio (num_mel_bins)
  bool operator==(const Tower&) const = default;
};

struct Features {
  // --- family
  std::string model_type;    // as written, or inferred from the architecture ("" if neither)
  std::string architecture;  // architectures[0] ("" if absent)
  // The task head: the architecture class minus its family prefix
  // ("ForCausalLM", "ForMaskedLM", "ForConditionalGeneration",
  // "ForSequenceClassification", "ForImageClassification", "ForCTC", "Model", ...).
  std::string head;
  // "decoder" | "encoder" | "encoder-decoder" | "vision" | "speech" |
  // "multimodal" | "ssm" | "hybrid" | "conv" | "" (unknown)
  std::string structure;

  // --- attention
  std::string attention;  // "mha" | "gqa" | "mqa" | "mla" | "linear" | "none" | ""
  int64_t heads = 0;
  int64_t kv_heads = 0;
  // Per-head query/key width. For MLA the width attention runs at,
  // qk_nope_head_dim + qk_rope_head_dim (DeepSeek-V3: 192), not the latent
  // KV-cache width vLLM reports (kv_lora_rank + qk_rope_head_dim = 576).
  int64_t head_dim = 0;
  int64_t sliding_window = 0;  // 0: full attention everywhere
  // "learned" | "rope" | "alibi" | "relative" | "sinusoidal" | "conv" | "none" | ""
  // ("conv": wav2vec2-style convolutional position embedding; "none": no
  // position signal at all, e.g. Mamba, RWKV, conv nets). Encoder-decoder
  // models whose stacks differ report the encoder's (Whisper: sinusoidal).
  std::string position;
  std::string rope_scaling;  // "" (none) | "linear" | "dynamic" | "yarn" | "llama3" | "longrope" | "mrope" | ...

  // --- norms, activation, MLP
  std::string norm;            // "layernorm" | "rmsnorm" | ""
  std::string norm_placement;  // "pre" | "post" | ""
  std::string activation;      // normalised hidden_act: "gelu", "gelu_tanh", "silu", "relu", "quick_gelu", ...
  bool gated_mlp = false;      // SwiGLU / GeGLU style (gate and up projections)

  // --- mixture of experts
  int64_t experts = 0;  // routed experts; 0 = dense
  int64_t experts_per_token = 0;
  int64_t shared_experts = 0;

  bool tied_embeddings = false;

  // --- dimensions of the main (language or only) stack
  int64_t hidden = 0;
  int64_t layers = 0;          // decoder layers for encoder-decoder models
  int64_t encoder_layers = 0;  // encoder-decoder only
  int64_t intermediate = 0;
  int64_t vocab = 0;
  int64_t context = 0;  // max_position_embeddings or its alias
  int64_t image_size = 0;
  int64_t patch_size = 0;
  std::vector<int64_t> conv_widths;  // conv feature extractor channel widths (speech), conv stage widths

  // --- towers of multimodal models (all zero when absent)
  Tower vision;
  Tower audio;

  // --- numerics
  std::string dtype;         // "float32" | "float16" | "bfloat16" | "float8" | ""
  std::string quantization;  // "" | "gptq" | "awq" | "bnb-4bit" | "bnb-8bit" | "fp8" | other quant_method

  // Canonical field names whose value came from the family's defaults
  // ("hidden_size", "num_key_value_heads", ...), in the order they were
  // read; a field of a nested config carries its key ("text_config.vocab_size",
  // "vision_config.patch_size").
  std::vector<std::string> defaulted;
  // False when the model type is not in FamilyDefaults, or when any of
  // hidden, layers, heads, vocab is still unknown after defaults. Vocab is
  // not required of vision and conv models (they have none), heads not of
  // ssm and conv models; conv models need conv_widths instead of hidden.
  bool understood = false;

  bool operator==(const Features&) const = default;
};

// Every field, always present (towers as objects). FeaturesFromJson accepts
// exactly that form; a missing or wrongly typed field is a Corruption that
// names it ("features.vision.layers: expected a non-negative integer").
nlohmann::json ToJson(const Features& f);
Result<Features> FeaturesFromJson(const nlohmann::json& j);

// OK, or InvalidArgument naming the first dimension beyond the bounds of
// Note [Dimension bounds] (hidden_size 10^12); ExtractFeatures applies it.
Status CheckDimensionBounds(const Features& f);

// The defaults and alias maps of the model types transformers knows.
class FamilyDefaults {
 public:
  struct Family {
    std::string model_type;    // "" for helper classes without one (MptAttentionConfig)
    std::string config_class;  // "GPT2Config"
    // The class's default field values, as stored: an object, never null.
    std::shared_ptr<const nlohmann::json> defaults;
    // transformers' attribute_map as written: alias -> the field that holds
    // it (GPT-2: hidden_size -> n_embd; the config writes `n_embd`).
    std::map<std::string, std::string> attribute_map;
    std::vector<std::string> sub_configs;                   // "text_config", "vision_config"
    std::map<std::string, std::string> sub_config_classes;  // "vision_config" -> "SiglipVisionConfig"
  };

  // Reads data/transformers_defaults.jsonl (one JSON object per line; blank
  // lines are skipped). When a model type has several classes the first line
  // wins (the file is sorted by model type, then class). Errors: IoError when
  // the file cannot be read, InvalidArgument for a bad line; both name the
  // file and line.
  static Result<std::shared_ptr<const FamilyDefaults>> Load(const std::string& path);
  // An empty table: every model type is unknown, only common aliases apply.
  static std::shared_ptr<const FamilyDefaults> Empty();

  // Exact model_type match; nullptr if unknown.
  const Family* Find(std::string_view model_type) const;
  // By class name ("Qwen3VLVisionConfig"), including helper classes without
  // a model type; nullptr if unknown.
  const Family* FindByConfigClass(std::string_view config_class) const;
  // The family whose class prefix ("AlbertConfig" -> "Albert") starts the
  // architecture class name, compared case-insensitively and followed by a
  // head ("ForMaskedLM", "Model", "LMHeadModel", ...); the longest prefix
  // wins ("XLMRobertaForMaskedLM" is xlm-roberta, not xlm). A leading "TF"
  // or "Flax" is ignored. nullptr if none.
  const Family* FindByArchitecture(std::string_view architecture) const;
  // Number of model types (classes without one are not counted).
  size_t size() const;

  ~FamilyDefaults();
  FamilyDefaults(const FamilyDefaults&) = delete;
  FamilyDefaults& operator=(const FamilyDefaults&) = delete;

 private:
  FamilyDefaults();
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Errors (InvalidArgument, with a reason a person can act on): the value is
// not a JSON object; it names no model type, no architecture and no
// dimension at all. (Internal only if a bug let an exception escape.)
Result<Features> ExtractFeatures(const nlohmann::json& config, const FamilyDefaults& defaults);
// Parses `config_json` first (nesting depth capped; Python's NaN, Infinity
// and -Infinity read as null); a parse error is the reason.
Result<Features> ExtractFeatures(std::string_view config_json, const FamilyDefaults& defaults);

}  // namespace coverage::selection
