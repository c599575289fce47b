#include "selection/features.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <fstream>
#include <initializer_list>
#include <nlohmann/json.hpp>
#include <optional>
#include <unordered_map>
#include <utility>

#include "core/json_capped.h"

namespace coverage::selection {
namespace {

using nlohmann::json;
using Family = FamilyDefaults::Family;
using Names = std::initializer_list<std::string_view>;

// Note [Untrusted configs]
// A config.json comes from anyone. Every read goes through Member, AsCount,
// AsBool, AsText or AsCountList, which answer "unknown" for a missing member,
// a wrong type, a count that is not positive or is beyond 2^40, or an
// overlong string. Nothing here calls nlohmann's throwing accessors
// (`at`, `get<T>` on an unchecked value) or `operator[]` on input data, and
// nothing recurses into the input, so nesting depth cannot hurt.
constexpr int64_t kMaxCount = int64_t{1} << 40;
constexpr size_t kMaxText = 256;
constexpr size_t kMaxList = 4096;

bool OneOf(std::string_view s, Names names) { return std::find(names.begin(), names.end(), s) != names.end(); }

std::string Lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

bool StartsWith(std::string_view s, std::string_view prefix) { return s.substr(0, prefix.size()) == prefix; }

bool Contains(std::string_view s, std::string_view part) { return s.find(part) != std::string_view::npos; }

const json* Member(const json* object, std::string_view key) {
  if (object == nullptr || !object->is_object()) return nullptr;
  auto it = object->find(key);
  return it == object->end() ? nullptr : &*it;
}

const json* Object(const json* object, std::string_view key) {
  const json* v = Member(object, key);
  return v != nullptr && v->is_object() ? v : nullptr;
}

// A positive count or size; integral floats (768.0) are accepted.
std::optional<int64_t> AsCount(const json* v) {
  if (v == nullptr) return std::nullopt;
  if (v->is_number_unsigned()) {
    const uint64_t u = v->get<uint64_t>();
    if (u == 0 || u > static_cast<uint64_t>(kMaxCount)) return std::nullopt;
    return static_cast<int64_t>(u);
  }
  if (v->is_number_integer()) {
    const int64_t i = v->get<int64_t>();
    if (i <= 0 || i > kMaxCount) return std::nullopt;
    return i;
  }
  if (v->is_number_float()) {
    const double d = v->get<double>();
    if (!std::isfinite(d) || d < 1 || d > static_cast<double>(kMaxCount) || d != std::floor(d)) return std::nullopt;
    return static_cast<int64_t>(d);
  }
  return std::nullopt;
}

std::optional<double> AsNumber(const json* v) {
  if (v == nullptr || !v->is_number()) return std::nullopt;
  const double d = v->get<double>();
  if (!std::isfinite(d)) return std::nullopt;
  return d;
}

std::optional<bool> AsBool(const json* v) {
  if (v == nullptr || !v->is_boolean()) return std::nullopt;
  return v->get<bool>();
}

std::optional<std::string> AsText(const json* v) {
  if (v == nullptr || !v->is_string()) return std::nullopt;
  const std::string& s = v->get_ref<const std::string&>();
  if (s.empty() || s.size() > kMaxText) return std::nullopt;
  return s;
}

// A list of positive counts; anything else (a wrong element, an overlong
// list) is unknown and gives an empty list.
std::vector<int64_t> AsCountList(const json* v) {
  std::vector<int64_t> out;
  if (v == nullptr || !v->is_array() || v->size() > kMaxList) return out;
  for (const json& e : *v) {
    auto c = AsCount(&e);
    if (!c) return {};
    out.push_back(*c);
  }
  return out;
}

// A name from the vocabulary of a config (an activation, a rope type, a quant
// method): lowercase letters, digits, '_', '-' and '.', at most 64 chars.
std::string AsToken(const json* v) {
  auto s = AsText(v);
  if (!s || s->size() > 64) return "";
  std::string out = Lower(*s);
  for (char c : out) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '-' && c != '.') return "";
  }
  return out;
}

// ---------------------------------------------------------------------------
// Family knowledge. Each table says why it exists; the defaults file cannot
// say these things because they live in modeling code, not in config fields.
// (The name tables are `const` initializer_lists, whose arrays are static;
// GCC 12 refuses them as `constexpr` at namespace scope.)

// Remote-code names that transformers' own config classes read as a family.
// Falcon shipped as "RefinedWeb"/"RefinedWebModel" with RWForCausalLM before
// it moved into transformers; FalconConfig loads those checkpoints.
constexpr std::pair<std::string_view, std::string_view> kLegacyModelTypes[] = {
    {"refinedweb", "falcon"},
    {"refinedwebmodel", "falcon"},
};
constexpr std::pair<std::string_view, std::string_view> kLegacyArchitecturePrefixes[] = {
    {"RW", "falcon"},
};

// Families whose norm is RMSNorm although the eps field is called
// `layer_norm_epsilon` or `norm_eps` (T5LayerNorm has no mean and no bias;
// MambaRMSNorm, NemotronHRMSNorm, Lfm2RMSNorm).
const Names kRmsNormFamilies = {"t5",         "mt5",       "umt5",     "longt5", "switch_transformers",
                                "udop",       "pop2piano", "mamba",    "mamba2", "falcon_mamba",
                                "nemotron_h", "lfm2",      "lfm2_moe", "lfm2_vl"};
// Families with a LayerNorm whose eps is hard-coded, so no config field names
// it (BART-style seq2seq, Whisper, OPT, DistilBERT); Nemotron's LayerNorm1P
// is named by `norm_eps`, which other families use for RMSNorm.
const Names kLayerNormFamilies = {
    "bart",           "mbart",  "marian", "pegasus",    "pegasus_x",       "blenderbot", "blenderbot-small", "m2m_100",
    "nllb-moe",       "plbart", "mvp",    "led",        "bigbird_pegasus", "whisper",    "speech_to_text",   "fsmt",
    "prophetnet",     "xglm",   "opt",    "distilbert", "trocr",           "nemotron",   "biogpt",           "musicgen",
    "musicgen_melody"};
// Norm after the residual add (the original Transformer / BERT layout).
// Every other known family normalises before each block (pre-norm), except
// where a config key says otherwise (see NormPlacement).
const Names kPostNormFamilies = {"bert",
                                 "roberta",
                                 "xlm-roberta",
                                 "camembert",
                                 "electra",
                                 "albert",
                                 "distilbert",
                                 "deberta",
                                 "deberta-v2",
                                 "ernie",
                                 "mpnet",
                                 "longformer",
                                 "big_bird",
                                 "flaubert",
                                 "xlm",
                                 "funnel",
                                 "layoutlm",
                                 "layoutlmv2",
                                 "layoutlmv3",
                                 "lilt",
                                 "markuplm",
                                 "squeezebert",
                                 "mobilebert",
                                 "convbert",
                                 "rembert",
                                 "roformer",
                                 "nezha",
                                 "ibert",
                                 "data2vec-text",
                                 "xmod",
                                 "luke",
                                 "canine",
                                 "bros",
                                 "mra",
                                 "nystromformer",
                                 "yoso",
                                 "splinter",
                                 "tapas",
                                 "roc_bert",
                                 "fnet",
                                 "dpr",
                                 "bert-generation",
                                 "nomic_bert",
                                 "xlnet",
                                 "bart",
                                 "marian",
                                 "blenderbot-small",
                                 "fsmt",
                                 "prophetnet",
                                 "mvp",
                                 "led",
                                 "plbart",
                                 "jina_embeddings_v3"};
// Decoders whose configs may carry encoder-looking keys (a tiny BLOOM test
// config writes type_vocab_size) or no head at all.
const Names kDecoderFamilies = {"bloom",      "gpt2", "gpt_bigcode", "gptj",     "codegen",   "gpt_neo",
                                "gpt_neox",   "opt",  "falcon",      "mpt",      "ctrl",      "xglm",
                                "openai-gpt", "phi",  "starcoder2",  "nemotron", "persimmon", "biogpt"};
// Encoders (bidirectional, no causal mask) that no config key marks as such:
// the others carry BERT's `type_vocab_size`.
const Names kEncoderFamilies = {"distilbert", "esm",    "modernbert",  "mpnet",      "xlnet", "flaubert",
                                "xlm",        "funnel", "squeezebert", "mobilebert", "dpr",   "bert-generation"};
// BLOOM adds ALiBi biases unconditionally; no config key says so.
const Names kAlibiFamilies = {"bloom"};
// Fixed sinusoidal position tables (Whisper: its encoder; its decoder learns).
const Names kSinusoidalFamilies = {"marian", "pegasus", "pegasus_x",      "m2m_100", "nllb-moe",
                                   "xglm",   "fsmt",    "speech_to_text", "whisper"};
// Activations the modeling code hard-codes (no config field): BLOOM's
// bloom_gelu_forward is the tanh approximation; MPT's MLP is exact GELU;
// RWKV's channel mix squares a ReLU.
constexpr std::pair<std::string_view, std::string_view> kFixedActivations[] = {
    {"bloom", "gelu_tanh"},
    {"mpt", "gelu"},
    {"rwkv", "relu2"},
};
// Note [Gated MLP]
// Families whose MLP multiplies a gate projection into an up projection
// (SwiGLU/GeGLU: gate_proj, up_proj, down_proj or a fused gate_up_proj). A
// family outside this table counts as gated when its activation is SiLU and
// its norm RMSNorm: every such decoder in transformers uses the Llama MLP.
const Names kGatedFamilies = {"llama",
                              "llama4",
                              "llama4_text",
                              "mistral",
                              "mistral3",
                              "ministral",
                              "mixtral",
                              "qwen2",
                              "qwen2_moe",
                              "qwen3",
                              "qwen3_moe",
                              "qwen3_next",
                              "qwen3_5_text",
                              "qwen3_5_moe_text",
                              "qwen2_vl_text",
                              "qwen2_5_vl_text",
                              "qwen3_vl_text",
                              "qwen3_vl_moe_text",
                              "gemma",
                              "gemma2",
                              "gemma3_text",
                              "gemma3n_text",
                              "gemma4_text",
                              "vaultgemma",
                              "recurrent_gemma",
                              "phi3",
                              "phimoe",
                              "deepseek_v2",
                              "deepseek_v3",
                              "glm",
                              "glm4",
                              "glm4_moe",
                              "glm4_moe_lite",
                              "glm_moe_dsa",
                              "cohere",
                              "cohere2",
                              "olmo",
                              "olmo2",
                              "olmo3",
                              "olmoe",
                              "granite",
                              "granitemoe",
                              "granitemoeshared",
                              "granitemoehybrid",
                              "jamba",
                              "bamba",
                              "falcon_h1",
                              "zamba2",
                              "dbrx",
                              "exaone4",
                              "hunyuan_v1_dense",
                              "hunyuan_v1_moe",
                              "smollm3",
                              "seed_oss",
                              "ernie4_5",
                              "ernie4_5_moe",
                              "minimax",
                              "lfm2",
                              "lfm2_moe",
                              "afmoe",
                              "stablelm",
                              "helium",
                              "diffllama",
                              "dots1",
                              "longcat_flash",
                              "bitnet",
                              "gpt_oss",
                              "chameleon",
                              "mllama",
                              "emu3",
                              "aria_text",
                              "doge"};
// Families whose MLP width defaults to 4 x hidden when no field sets it
// (GPT-2's n_inner=None, Falcon's ffn_hidden_size=None, BLOOM with no field).
const Names kFourTimesHiddenFamilies = {"gpt2",     "gpt_bigcode", "gptj",  "codegen", "gpt_neo",
                                        "imagegpt", "openai-gpt",  "bloom", "falcon",  "rwkv"};
// Attention mixed with state-space, linear-attention or conv layers where the
// config may leave the layer pattern to its defaults.
const Names kHybridFamilies = {
    "jamba",      "zamba",      "zamba2",       "falcon_h1",        "bamba",       "granitemoehybrid",
    "nemotron_h", "qwen3_next", "qwen3_5_text", "qwen3_5_moe_text", "kimi_linear", "lfm2",
    "lfm2_moe",   "minimax",    "plamo2",       "recurrent_gemma"};
// No softmax attention at all.
const Names kSsmFamilies = {"mamba", "mamba2", "falcon_mamba", "rwkv", "xlstm"};
const Names kSpeechFamilies = {
    "wav2vec2",  "wav2vec2-conformer", "wav2vec2-bert",  "hubert",  "wavlm",          "sew",      "sew-d",
    "unispeech", "unispeech-sat",      "data2vec-audio", "whisper", "speech_to_text", "speecht5", "mctct",
    "moonshine", "parakeet_encoder",   "parakeet_ctc"};

// Language models that always rotate by multimodal (3-D) RoPE, whatever their
// rope_scaling says (Qwen3-VL writes null; its rotary embedding falls back to
// mrope_section [24, 20, 20]).
const Names kMropeFamilies = {"qwen2_vl_text", "qwen2_5_vl_text", "qwen3_vl_text", "qwen3_vl_moe_text",
                              "qwen3_5_text",  "glm4v_text",      "glm4v_moe_text"};

bool InTable(std::string_view family, Names table) { return !family.empty() && OneOf(family, table); }

// Keys that name a nested language model, in the order they are tried.
const Names kTextConfigKeys = {"text_config", "language_config", "llm_config", "text_model"};

// Common aliases of canonical names, beyond each family's attribute_map.
// `hidden_dim` is the model width except next to `dim` (DistilBERT), where
// it is the MLP width; see ReadHidden / ReadIntermediate.
const Names kHiddenAliases = {"n_embd", "n_embed", "d_model", "dim", "embed_dim", "model_dim"};
const Names kLayerAliases = {"n_layer", "n_layers", "num_layers", "depth"};
const Names kHeadAliases = {"n_head", "n_heads", "num_heads", "attention_heads"};
const Names kKvHeadAliases = {"num_kv_heads", "n_head_kv", "n_kv_heads"};
const Names kHeadDimAliases = {"d_kv", "kv_channels", "attention_head_dim", "attention_head_size", "dim_head"};
const Names kIntermediateAliases = {"n_inner",          "d_ff",    "ffn_dim",          "ffn_hidden_size",
                                    "intermediate_dim", "mlp_dim", "inner_hidden_size"};
const Names kVocabAliases = {"n_vocab", "padded_vocab_size"};
const Names kContextAliases = {"n_positions", "n_ctx",          "max_sequence_length", "seq_length",
                               "max_seq_len", "max_seq_length", "context_length",      "max_target_positions"};
const Names kExpertAliases = {"num_local_experts", "n_routed_experts", "moe_num_experts", "n_experts"};
const Names kTopKAliases = {"moe_top_k",
                            "moe_k",
                            "moe_topk",
                            "num_selected_experts",
                            "top_k_experts",
                            "experts_per_token",
                            "num_experts_per_token"};
const Names kActivationKeys = {"hidden_activation", "hidden_act", "activation_function", "activation",
                               "mlp_hidden_act",    "act_fn",     "hidden_act_fn"};

// ---------------------------------------------------------------------------
// Reading one config object with its family's aliases and defaults.

struct Scope {
  const json* config = nullptr;    // read first; always an object
  const json* fallback = nullptr;  // read next (the top level of a nested text config), may be null
  const Family* family = nullptr;  // whose aliases and defaults apply; null when unknown
  std::string prefix;              // for Features::defaulted: "" or "text_config."
};

class Reader {
 public:
  Reader(Scope scope, std::vector<std::string>* defaulted) : scope_(std::move(scope)), defaulted_(defaulted) {}

  const Family* family() const { return scope_.family; }
  std::string family_name() const { return scope_.family != nullptr ? scope_.family->model_type : ""; }
  const json* config() const { return scope_.config; }

  // The value of `canonical`: from the config (under its own name, the
  // family's alias or a common alias), then the fallback, then the family's
  // defaults. An explicit null stops the search (transformers would derive
  // the value), as does a value of the wrong type (it reads as unknown).
  std::optional<int64_t> Count(std::string_view canonical, Names aliases = {}) {
    Found f = Resolve(canonical, aliases);
    auto c = AsCount(f.value);
    if (c && f.from_defaults) NoteDefault(canonical);
    return c;
  }
  std::optional<bool> Bool(std::string_view canonical, Names aliases = {}) {
    Found f = Resolve(canonical, aliases);
    auto b = AsBool(f.value);
    if (b && f.from_defaults) NoteDefault(canonical);
    return b;
  }
  std::optional<double> Number(std::string_view canonical, Names aliases = {}) {
    Found f = Resolve(canonical, aliases);
    auto d = AsNumber(f.value);
    if (d && f.from_defaults) NoteDefault(canonical);
    return d;
  }
  // The raw value (not null) with where it came from; the caller decides
  // whether to record it as defaulted (NoteDefault).
  const json* Value(std::string_view canonical, Names aliases, bool* from_defaults) {
    Found f = Resolve(canonical, aliases);
    *from_defaults = f.from_defaults;
    return f.value;
  }
  // Whether the config, the fallback or the defaults name `key`, even as null.
  bool Mentions(std::string_view key) const {
    if (Member(scope_.config, key) != nullptr || Member(scope_.fallback, key) != nullptr) return true;
    return scope_.family != nullptr && Member(scope_.family->defaults.get(), key) != nullptr;
  }
  // Only the config and its fallback, no defaults.
  const json* Raw(std::string_view key) const {
    if (const json* v = Member(scope_.config, key)) return v;
    return Member(scope_.fallback, key);
  }
  void NoteDefault(std::string_view canonical) {
    std::string name = scope_.prefix + std::string(canonical);
    if (std::find(defaulted_->begin(), defaulted_->end(), name) == defaulted_->end()) defaulted_->push_back(name);
  }

 private:
  struct Found {
    const json* value = nullptr;  // null when absent, or null where found
    bool from_defaults = false;
  };

  Found Resolve(std::string_view canonical, Names aliases) const {
    std::vector<std::string_view> names{canonical};
    if (scope_.family != nullptr) {
      if (auto it = scope_.family->attribute_map.find(std::string(canonical));
          it != scope_.family->attribute_map.end()) {
        names.push_back(it->second);
      }
    }
    names.insert(names.end(), aliases.begin(), aliases.end());
    for (const json* object : {scope_.config, scope_.fallback}) {
      bool named_as_null = false;
      for (std::string_view name : names) {
        const json* v = Member(object, name);
        if (v == nullptr) continue;
        if (!v->is_null()) return {v, false};
        named_as_null = true;
      }
      if (named_as_null) return {};
    }
    if (scope_.family != nullptr) {
      for (std::string_view name : names) {
        const json* v = Member(scope_.family->defaults.get(), name);
        if (v == nullptr) continue;
        if (v->is_null()) return {};
        return {v, true};
      }
    }
    return {};
  }

  Scope scope_;
  std::vector<std::string>* defaulted_;
};

// ---------------------------------------------------------------------------
// Families and architecture names.

const Family* FindFamily(const FamilyDefaults& defaults, std::string_view model_type) {
  if (model_type.empty()) return nullptr;
  if (const Family* f = defaults.Find(model_type)) return f;
  std::string lower = Lower(model_type);
  if (const Family* f = defaults.Find(lower)) return f;
  std::string swapped = lower;
  for (char& c : swapped) c = c == '-' ? '_' : c == '_' ? '-' : c;
  if (const Family* f = defaults.Find(swapped)) return f;
  for (auto [legacy, family] : kLegacyModelTypes) {
    if (lower == legacy) return defaults.Find(family);
  }
  return nullptr;
}

// Architecture names of TF and Flax classes carry a framework prefix.
std::string_view StripFramework(std::string_view architecture) {
  for (std::string_view prefix : {std::string_view("TF"), std::string_view("Flax")}) {
    if (architecture.size() > prefix.size() + 1 && StartsWith(architecture, prefix) &&
        std::isupper(static_cast<unsigned char>(architecture[prefix.size()]))) {
      return architecture.substr(prefix.size());
    }
  }
  return architecture;
}

const Names kHeadStarts = {"For",     "Model",   "LMHead",   "WithLMHead",     "MTModel",
                           "Encoder", "Decoder", "Backbone", "PreTrainedModel"};

bool StartsWithHead(std::string_view rest) {
  return std::any_of(kHeadStarts.begin(), kHeadStarts.end(), [&](std::string_view h) { return StartsWith(rest, h); });
}

const Family* FamilyFromArchitecture(const FamilyDefaults& defaults, std::string_view architecture) {
  std::string_view name = StripFramework(architecture);
  for (auto [prefix, family] : kLegacyArchitecturePrefixes) {
    if (StartsWith(name, prefix) && StartsWithHead(name.substr(prefix.size()))) return defaults.Find(family);
  }
  return defaults.FindByArchitecture(name);
}

// "AlbertForMaskedLM" -> "ForMaskedLM"; "BertModel" -> "Model".
std::string HeadOf(std::string_view architecture, const Family* family) {
  std::string_view name = StripFramework(architecture);
  if (family != nullptr) {
    std::string_view cls = family->config_class;
    if (cls.size() > 6 && cls.substr(cls.size() - 6) == "Config") {
      std::string prefix = Lower(cls.substr(0, cls.size() - 6));
      if (name.size() > prefix.size() && Lower(name.substr(0, prefix.size())) == prefix &&
          StartsWithHead(name.substr(prefix.size()))) {
        return std::string(name.substr(prefix.size()));
      }
    }
  }
  for (size_t i = 1; i + 3 < name.size(); ++i) {
    if (name.substr(i, 3) == "For" && std::isupper(static_cast<unsigned char>(name[i + 3]))) {
      return std::string(name.substr(i));
    }
  }
  for (std::string_view suffix :
       {"WithLMHeadModel", "LMHeadModel", "MTModel", "EncoderModel", "DecoderModel", "Model", "Encoder", "Decoder"}) {
    if (name.size() >= suffix.size() && name.substr(name.size() - suffix.size()) == suffix) return std::string(suffix);
  }
  return "";
}

// ---------------------------------------------------------------------------
// Vocabulary normalisation.

// hidden_act values as transformers' ACT2FN names them, folded to one name
// per kernel. Unknown names are "" (the vocabulary is closed).
std::string NormaliseActivation(std::string_view raw, bool* gated) {
  std::string a = Lower(raw);
  if (OneOf(a, {"gelu", "gelu_python", "gelu_10", "gelu_erf"})) return "gelu";
  if (OneOf(a, {"gelu_new", "gelu_fast", "gelu_pytorch_tanh", "gelu_accurate", "gelu_tanh", "gelu_approximate",
                "bloom_gelu", "gelu_new_python"})) {
    return "gelu_tanh";
  }
  if (a == "quick_gelu") return "quick_gelu";
  if (OneOf(a, {"silu", "swish"})) return "silu";
  if (OneOf(a, {"relu", "relu6"})) return a;
  if (OneOf(a, {"relu2", "relu_squared", "squared_relu", "relu_sq"})) return "relu2";
  if (OneOf(a, {"tanh", "sigmoid", "mish", "elu", "selu", "leaky_relu", "linear", "identity", "softplus", "xielu",
                "laplace"})) {
    return a;
  }
  // "swigluoai": gpt-oss's clamped SwiGLU.
  if (OneOf(a, {"swiglu", "silu_glu", "swish_glu", "swigluoai", "swiglu_oai"})) {
    *gated = true;
    return "silu";
  }
  if (OneOf(a, {"geglu", "gelu_glu"})) {
    *gated = true;
    return "gelu";
  }
  if (a == "reglu") {
    *gated = true;
    return "relu";
  }
  return "";
}

std::string NormaliseDtype(std::string_view raw) {
  std::string d = Lower(raw);
  if (StartsWith(d, "torch.")) d = d.substr(6);
  if (OneOf(d, {"float32", "fp32", "float", "f32"})) return "float32";
  if (OneOf(d, {"float16", "fp16", "half", "f16"})) return "float16";
  if (OneOf(d, {"bfloat16", "bf16"})) return "bfloat16";
  if (StartsWith(d, "float8") || StartsWith(d, "fp8") || StartsWith(d, "f8")) return "float8";
  return "";
}

// rope_scaling / rope_parameters -> the scaling type; "" for default rope.
std::string RopeTypeOf(const json* rope) {
  if (rope == nullptr || !rope->is_object()) return "";
  const json* params = rope;
  if (Member(rope, "rope_type") == nullptr && Member(rope, "type") == nullptr) {
    // transformers v5 keeps one entry per layer type (Gemma 3/4); the full
    // attention layers' entry is the one that scales.
    params = Object(rope, "full_attention");
    if (params == nullptr) {
      for (const auto& [key, value] : rope->items()) {
        if (value.is_object()) {
          params = &value;
          break;
        }
      }
    }
    if (params == nullptr) return "";
  }
  std::string type = AsToken(Member(params, "rope_type"));
  if (type.empty()) type = AsToken(Member(params, "type"));
  if (type == "default") type.clear();
  if (type.empty() && Member(params, "mrope_section") != nullptr) type = "mrope";
  return type;
}

// ---------------------------------------------------------------------------
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

// ---------------------------------------------------------------------------
// The extraction proper.

std::optional<int64_t> ReadHidden(Reader& r) {
  if (auto h = r.Count("hidden_size", kHiddenAliases)) return h;
  if (r.Raw("dim") == nullptr) {
    if (auto h = AsCount(r.Raw("hidden_dim"))) return h;
  }
  return std::nullopt;
}

std::optional<int64_t> ReadIntermediate(Reader& r, int64_t hidden, int64_t experts) {
  // Read in order: the config's own fields, then widths derived from other
  // config fields, then the family's defaults.
  bool from_defaults = false;
  const json* v = r.Value("intermediate_size", kIntermediateAliases, &from_defaults);
  if (!from_defaults && v != nullptr) return AsCount(v);
  if (r.Raw("dim") != nullptr) {
    if (auto c = AsCount(r.Raw("hidden_dim"))) return c;
  }
  if (hidden > 0) {
    if (auto ratio = AsNumber(r.Raw("mlp_ratio")); ratio && *ratio > 0 && *ratio < 1024) {
      return static_cast<int64_t>(std::llround(*ratio * static_cast<double>(hidden)));
    }
  }
  if (experts > 0) {
    if (auto c = AsCount(r.Raw("moe_intermediate_size"))) return c;
  }
  if (v != nullptr) {
    auto c = AsCount(v);
    if (c) r.NoteDefault("intermediate_size");
    return c;
  }
  if (hidden > 0) {
    // MPT: expansion_ratio x d_model.
    if (auto ratio = r.Number("expansion_ratio"); ratio && *ratio > 0 && *ratio < 1024) {
      return static_cast<int64_t>(std::llround(*ratio * static_cast<double>(hidden)));
    }
    // GPT-2 layout: n_inner = None means 4 x n_embd.
    if (InTable(r.family_name(), kFourTimesHiddenFamilies) || r.Mentions("n_inner")) return 4 * hidden;
  }
  return std::nullopt;
}

// Per-block configs of NAS-derived models (DeciLM / Nemotron-NAS): the first
// block with attention gives the grouping of query heads per KV head.
std::optional<int64_t> KvHeadsFromBlockConfigs(Reader& r, int64_t heads) {
  const json* blocks = r.Raw("block_configs");
  if (blocks == nullptr || !blocks->is_array() || blocks->size() > kMaxList || heads <= 0) return std::nullopt;
  for (const json& block : *blocks) {
    auto group = AsCount(Member(Object(&block, "attention"), "n_heads_in_group"));
    if (group && heads % *group == 0) return heads / *group;
  }
  return std::nullopt;
}

int64_t SlidingWindowOf(Reader& r) {
  if (auto use = r.Bool("use_sliding_window"); use && !*use) return 0;
  bool from_defaults = false;
  const json* v = r.Value("sliding_window", {"attention_window", "sliding_window_size"}, &from_defaults);
  int64_t window = 0;
  if (auto c = AsCount(v)) {
    window = *c;
  } else if (v != nullptr && v->is_array()) {
    // Longformer: one window per layer.
    for (int64_t w : AsCountList(v)) window = std::max(window, w);
  }
  if (window > 0 && from_defaults) r.NoteDefault("sliding_window");
  return window;
}

bool NamesRope(Reader& r) {
  for (std::string_view key : {"rope_theta", "rope_scaling", "rope_parameters", "rotary_dim", "rotary_pct",
                               "rotary_emb_base", "partial_rotary_factor", "rotary_emb_fraction", "rope_type",
                               "rope_local_base_freq", "qk_rope_head_dim", "rotary_emb_dim", "use_rotary_emb"}) {
    if (r.Mentions(key)) return true;
  }
  if (auto b = AsBool(r.Raw("use_rotary_position_embeddings")); b && *b) return true;
  if (auto b = AsBool(r.Raw("rotary")); b && *b) return true;
  return false;
}

struct Context {
  const FamilyDefaults& defaults;
  std::vector<std::string>* defaulted;
};

Reader SubReader(const Context& ctx, const json* sub, const json* fallback, const Family* parent,
                 std::string_view key) {
  const Family* family = FindFamily(ctx.defaults, AsText(Member(sub, "model_type")).value_or(""));
  // Qwen3-VL's vision_config repeats the parent's model_type; the class the
  // parent names for the key is the one that describes it.
  if (family == parent) family = nullptr;
  if (family == nullptr && parent != nullptr) {
    if (auto it = parent->sub_config_classes.find(std::string(key)); it != parent->sub_config_classes.end()) {
      family = ctx.defaults.FindByConfigClass(it->second);
    }
  }
  if (family == nullptr) family = parent;
  return Reader(Scope{sub, fallback, family, std::string(key) + "."}, ctx.defaulted);
}

Tower ReadTower(Reader& r) {
  Tower t;
  // vt_*: Kimi's MoonViT names its fields so.
  t.hidden = ReadHidden(r).value_or(0);
  if (t.hidden == 0) t.hidden = AsCount(r.Raw("vt_hidden_size")).value_or(0);
  t.layers = r.Count("num_hidden_layers", {"depth", "num_layers", "n_layers", "encoder_layers", "vt_num_hidden_layers"})
                 .value_or(0);
  t.heads = r.Count("num_attention_heads",
                    {"num_heads", "n_heads", "encoder_attention_heads", "attention_heads", "vt_num_attention_heads"})
                .value_or(0);
  t.intermediate = ReadIntermediate(r, t.hidden, 0).value_or(0);
  if (t.intermediate == 0) t.intermediate = AsCount(r.Raw("vt_intermediate_size")).value_or(0);
  for (std::string_view key : {"image_size", "img_size"}) {
    bool from_defaults = false;
    const json* v = r.Value(key, {}, &from_defaults);
    int64_t size = AsCount(v).value_or(0);
    if (size == 0 && v != nullptr && v->is_array()) {
      auto sizes = AsCountList(v);
      if (!sizes.empty()) size = sizes.front();
    }
    if (size > 0) {
      if (from_defaults) r.NoteDefault(key);
      t.image_size = size;
      break;
    }
  }
  t.patch_size = r.Count("patch_size").value_or(0);
  t.mel_bins = r.Count("num_mel_bins", {"n_mels"}).value_or(0);
  return t;
}

bool TowerEmpty(const Tower& t) { return t == Tower{}; }

}  // namespace

// ---------------------------------------------------------------------------

// Note [Dimension bounds]
// A config can claim any size (hidden_size 10^12), which selection would
// place in the design space and capture would hand to libtorch to fail
// there, or to exhaust the machine. Each dimension has a bound at least 16x
// the largest in the 3,253 real configs of data/hub/configs.jsonl (largest
// in brackets): widths 2^20 (intermediate 65,536, T5-11B's d_ff), layers 2^12
// (126), heads 2^14 (232), vocabulary 2^24 (274,701), experts 2^16 (896),
// context 2^30 (10,485,760, Llama 4 Scout), image size 2^16 (2,016). A
// config beyond one is refused, naming the field: no buildable model has it.
Status CheckDimensionBounds(const Features& f) {
  constexpr int64_t kWidth = int64_t{1} << 20, kLayers = int64_t{1} << 12, kHeads = int64_t{1} << 14,
                    kVocab = int64_t{1} << 24, kExperts = int64_t{1} << 16, kContext = int64_t{1} << 30,
                    kImage = int64_t{1} << 16;
  struct Bound {
    std::string field;
    int64_t value;
    int64_t max;
  };
  std::vector<Bound> bounds = {
      {"hidden_size", f.hidden, kWidth},
      {"num_hidden_layers", f.layers, kLayers},
      {"encoder_layers", f.encoder_layers, kLayers},
      {"num_attention_heads", f.heads, kHeads},
      {"num_key_value_heads", f.kv_heads, kHeads},
      {"head_dim", f.head_dim, kWidth},
      {"intermediate_size", f.intermediate, kWidth},
      {"vocab_size", f.vocab, kVocab},
      {"max_position_embeddings", f.context, kContext},
      {"sliding_window", f.sliding_window, kContext},
      {"num_experts", f.experts, kExperts},
      {"num_experts_per_tok", f.experts_per_token, kExperts},
      {"n_shared_experts", f.shared_experts, kExperts},
      {"image_size", f.image_size, kImage},
      {"patch_size", f.patch_size, kImage},
  };
  for (const auto& [p, t] : {std::pair<std::string, const Tower*>{"vision_config.", &f.vision},
                             std::pair<std::string, const Tower*>{"audio_config.", &f.audio}}) {
    bounds.push_back({p + "hidden_size", t->hidden, kWidth});
    bounds.push_back({p + "num_hidden_layers", t->layers, kLayers});
    bounds.push_back({p + "num_attention_heads", t->heads, kHeads});
    bounds.push_back({p + "intermediate_size", t->intermediate, kWidth});
    bounds.push_back({p + "image_size", t->image_size, kImage});
    bounds.push_back({p + "patch_size", t->patch_size, kImage});
    bounds.push_back({p + "num_mel_bins", t->mel_bins, kWidth});
  }
  for (const int64_t w : f.conv_widths) bounds.push_back({"hidden_sizes (or conv_dim)", w, kWidth});
  for (const auto& b : bounds) {
    if (b.value > b.max) {
      return Status::InvalidArgument(b.field + " is " + std::to_string(b.value) + ", beyond the " +
                                     std::to_string(b.max) + " of any buildable model (Note [Dimension bounds])");
    }
  }
  return Status::Ok();
}

Result<Features> ExtractFeatures(const nlohmann::json& config, const FamilyDefaults& defaults) {
  if (!config.is_object()) {
    return Status::InvalidArgument(std::string("config is not a JSON object (it is ") + config.type_name() + ")");
  }
  try {
    Features f;
    Context ctx{defaults, &f.defaulted};

    // --- family
    std::string written_type = AsText(Member(&config, "model_type")).value_or("");
    if (const json* archs = Member(&config, "architectures");
        archs != nullptr && archs->is_array() && !archs->empty()) {
      f.architecture = AsText(&archs->front()).value_or("");
    }
    const Family* family = FindFamily(defaults, written_type);
    f.model_type = written_type;
    if (written_type.empty() && !f.architecture.empty()) {
      family = FamilyFromArchitecture(defaults, f.architecture);
      if (family != nullptr) f.model_type = family->model_type;
    }
    if (!f.architecture.empty()) f.head = HeadOf(f.architecture, family);

    Reader top(Scope{&config, nullptr, family, ""}, &f.defaulted);

    // --- the main stack: a nested language model, else the config itself
    const json empty = json::object();
    const json* text = nullptr;
    std::string text_key;
    for (std::string_view key : kTextConfigKeys) {
      if (const json* sub = Object(&config, key)) {
        text = sub;
        text_key = key;
        break;
      }
    }
    if (text == nullptr && family != nullptr) {
      // A composite family whose config leaves its language model to the
      // defaults (the sub-config class's defaults).
      for (std::string_view key : kTextConfigKeys) {
        auto it = family->sub_config_classes.find(std::string(key));
        if (it != family->sub_config_classes.end() && defaults.FindByConfigClass(it->second) != nullptr &&
            Member(&config, key) == nullptr) {
          text = &empty;
          text_key = key;
          break;
        }
      }
    }
    Reader main = text != nullptr ? SubReader(ctx, text, &config, family, text_key) : top;
    // The generic EncoderDecoderModel: `encoder` and `decoder` configs.
    const json* decoder_sub = Object(&config, "decoder");
    const json* encoder_sub = Object(&config, "encoder");
    const bool composite_seq2seq = text == nullptr && decoder_sub != nullptr && encoder_sub != nullptr;
    if (composite_seq2seq) main = SubReader(ctx, decoder_sub, nullptr, nullptr, "decoder");
    // The main stack's family name, for the tables above.
    const std::string main_family = main.family() != nullptr
                                        ? main.family_name()
                                        : Lower(AsText(Member(main.config(), "model_type")).value_or(written_type));

    // --- structure
    const LayerMix mix = LayerMixOf(main);
    const bool enc_dec = composite_seq2seq || main.Bool("is_encoder_decoder").value_or(false) ||
                         top.Bool("is_encoder_decoder").value_or(false);
    const json* vision_sub = Object(&config, "vision_config");
    const json* audio_sub = Object(&config, "audio_config");
    const bool family_has_vision = family != nullptr && family->sub_config_classes.count("vision_config") > 0;
    const bool family_has_audio = family != nullptr && family->sub_config_classes.count("audio_config") > 0;
    const bool multimodal =
        (text != nullptr && (vision_sub != nullptr || audio_sub != nullptr || family_has_vision || family_has_audio)) ||
        ((vision_sub != nullptr || Object(&config, "img_processor") != nullptr ||
          AsText(Member(&config, "mm_vision_tower")).has_value()) &&
         main.Mentions("vocab_size"));
    const bool speech = InTable(Lower(f.model_type), kSpeechFamilies) ||
                        InTable(family != nullptr ? family->model_type : "", kSpeechFamilies) ||
                        main.Raw("num_mel_bins") != nullptr || main.Raw("feat_extract_norm") != nullptr ||
                        StartsWith(f.head, "ForCTC") || StartsWith(f.head, "ForAudio") ||
                        StartsWith(f.head, "ForSpeech") || StartsWith(f.head, "ForXVector");
    const std::string lower_type = Lower(f.model_type);
    const bool ssm = InTable(main_family, kSsmFamilies) || StartsWith(lower_type, "rwkv") ||
                     StartsWith(lower_type, "mamba") || main.Raw("ssm_cfg") != nullptr ||
                     (main.Mentions("state_size") && !main.Mentions("num_attention_heads") && !mix.attention);
    const bool hybrid = !ssm && ((mix.attention && mix.other) || InTable(main_family, kHybridFamilies));
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
    bool encoder = false, decoder = false;
    if (OneOf(f.head, {"ForCausalLM", "LMHeadModel", "CausalLM"}) || AsBool(main.Raw("is_decoder")).value_or(false) ||
        InTable(main_family, kDecoderFamilies) || InTable(main_family, kGatedFamilies)) {
      decoder = true;
    } else if (OneOf(f.head, {"ForMaskedLM", "ForPreTraining", "ForTokenClassification", "ForMultipleChoice",
                              "ForNextSentencePrediction"}) ||
               main.Mentions("type_vocab_size") || InTable(main_family, kEncoderFamilies)) {
      encoder = true;
    } else if (NamesRope(main) || main.Mentions("num_key_value_heads") || main.Mentions("rms_norm_eps") ||
               main.Raw("alibi") != nullptr || StartsWith(f.head, "For") ||
               (main.family() != nullptr && main.Mentions("vocab_size"))) {
      // A known family with a vocabulary and no encoder marker is a decoder
      // (GPT-2 configs whose architectures say just "gpt2").
      decoder = true;
    }

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
    } else if (encoder) {
      f.structure = "encoder";
    } else if (decoder) {
      f.structure = "decoder";
    }

    // --- mixture of experts (read early: the MLP width depends on it)
    f.experts = main.Count("num_experts", kExpertAliases).value_or(0);
    if (f.experts == 0) {
      // DBRX keeps its experts in ffn_config.
      f.experts = AsCount(Member(Object(main.config(), "ffn_config"), "moe_num_experts")).value_or(0);
    }
    if (f.experts > 0) {
      f.experts_per_token = main.Count("num_experts_per_tok", kTopKAliases).value_or(0);
      if (f.experts_per_token == 0) {
        f.experts_per_token = AsCount(Member(Object(main.config(), "ffn_config"), "moe_top_k")).value_or(0);
      }
      // `top_k` alone is also a generation setting (50 in old configs), so it
      // counts only next to experts and only from the config itself.
      if (f.experts_per_token == 0) f.experts_per_token = AsCount(main.Raw("top_k")).value_or(0);
      if (f.experts_per_token > f.experts) f.experts_per_token = 0;
      f.shared_experts = main.Count("n_shared_experts", {"num_shared_experts"}).value_or(0);
      if (f.shared_experts == 0) {
        for (std::string_view key : {"shared_expert_intermediate_size", "moe_shared_expert_intermediate_size",
                                     "shared_intermediate_size", "share_expert_dim"}) {
          if (main.Count(key).has_value()) {
            f.shared_experts = 1;
            break;
          }
        }
      }
    }

    // --- dimensions
    f.hidden = ReadHidden(main).value_or(0);
    const bool seq2seq_layout = enc_dec || main.Mentions("decoder_layers");
    if (seq2seq_layout) {
      f.layers = main.Count("decoder_layers", {"num_decoder_layers", "decoder_num_hidden_layers"}).value_or(0);
      f.encoder_layers =
          main.Count("encoder_layers", {"num_encoder_layers", "num_layers", "encoder_num_hidden_layers"}).value_or(0);
      f.heads = main.Count("decoder_attention_heads", {"decoder_num_attention_heads"}).value_or(0);
      f.intermediate = main.Count("decoder_ffn_dim").value_or(0);
    }
    if (composite_seq2seq) {
      Reader enc = SubReader(ctx, encoder_sub, nullptr, nullptr, "encoder");
      f.encoder_layers = enc.Count("num_hidden_layers", kLayerAliases).value_or(0);
    }
    if (f.layers == 0) f.layers = main.Count("num_hidden_layers", kLayerAliases).value_or(0);
    if (f.layers == 0) {
      // Nemotron-H derives num_hidden_layers from its layer pattern.
      for (std::string_view key : {"layers_block_type", "layer_types", "hybrid_override_pattern"}) {
        const json* v = main.Raw(key);
        const bool fits = v != nullptr && (v->is_string() ? v->get_ref<const std::string&>().size() <= kMaxList
                                                           : v->is_array() && v->size() <= kMaxList);
        if (fits && !v->empty()) {
          f.layers = static_cast<int64_t>(v->is_string() ? v->get_ref<const std::string&>().size() : v->size());
          break;
        }
      }
    }
    if (f.layers == 0) {
      // ConvNets: the sum of the stage depths.
      auto depths = AsCountList(main.Raw("depths"));
      int64_t total = 0;
      for (int64_t d : depths) total += d;
      if (total > 0 && total <= kMaxCount) f.layers = total;
    }
    if (!enc_dec) f.encoder_layers = 0;
    if (f.heads == 0) f.heads = main.Count("num_attention_heads", kHeadAliases).value_or(0);
    if (f.intermediate == 0) f.intermediate = ReadIntermediate(main, f.hidden, f.experts).value_or(0);
    f.vocab = main.Count("vocab_size", kVocabAliases).value_or(0);
    f.context = main.Count("max_position_embeddings", kContextAliases).value_or(0);
    if (f.structure == "vision" || f.structure == "conv") {
      Tower own = ReadTower(main);
      f.image_size = own.image_size;
      f.patch_size = own.patch_size;
    }
    f.conv_widths = AsCountList(main.Raw("conv_dim"));
    if (f.conv_widths.empty()) {
      bool from_defaults = false;
      f.conv_widths = AsCountList(main.Value("hidden_sizes", {}, &from_defaults));
      if (!f.conv_widths.empty() && from_defaults) main.NoteDefault("hidden_sizes");
    }
    if (f.conv_widths.empty() && f.structure == "speech") {
      bool from_defaults = false;
      f.conv_widths = AsCountList(main.Value("conv_dim", {}, &from_defaults));
      if (!f.conv_widths.empty() && from_defaults) main.NoteDefault("conv_dim");
    }

    // --- attention
    const bool no_attention = f.structure == "ssm" || f.structure == "conv";
    if (no_attention) {
      f.heads = 0;
      f.attention = rwkv ? "linear" : f.structure == "ssm" ? "none" : "";
    } else {
      const bool mla = main.Count("kv_lora_rank").has_value() || main.Count("q_lora_rank").has_value();
      std::optional<int64_t> kv;
      // Falcon: new_decoder_architecture uses num_kv_heads; otherwise
      // multi_query means one KV head.
      const bool new_arch = main.Bool("new_decoder_architecture").value_or(false);
      const bool multi_query = main.Bool("multi_query").value_or(false);
      if (multi_query && !new_arch) {
        kv = 1;
      } else {
        kv = main.Count("num_key_value_heads", kKvHeadAliases);
        if (!kv) {
          if (auto groups = AsCount(main.Raw("multi_query_group_num"));
              groups && main.Bool("multi_query_attention").value_or(false)) {
            kv = groups;
          }
        }
        if (!kv) kv = KvHeadsFromBlockConfigs(main, f.heads);
      }
      if (f.heads > 0) f.kv_heads = kv.value_or(f.heads);
      if (f.kv_heads > f.heads) f.kv_heads = 0;  // inconsistent: unknown

      if (mla) {
        auto nope = main.Count("qk_nope_head_dim");
        auto rope = main.Count("qk_rope_head_dim");
        if (auto qk = AsCount(main.Raw("qk_head_dim"))) {
          f.head_dim = *qk;
        } else if (nope && rope) {
          f.head_dim = *nope + *rope;
        }
      }
      if (f.head_dim == 0) f.head_dim = main.Count("head_dim", kHeadDimAliases).value_or(0);
      if (f.head_dim == 0 && f.hidden > 0 && f.heads > 0 && f.hidden % f.heads == 0) f.head_dim = f.hidden / f.heads;

      if (f.heads > 0) {
        if (mla) {
          f.attention = "mla";
        } else if (f.kv_heads == 1 && f.heads > 1) {
          f.attention = "mqa";
        } else if (f.kv_heads > 1 && f.kv_heads < f.heads) {
          f.attention = "gqa";
        } else if (f.kv_heads == f.heads) {
          f.attention = "mha";
        }
      }
      f.sliding_window = SlidingWindowOf(main);
    }
    if (no_attention) f.kv_heads = f.head_dim = f.sliding_window = 0;

    // --- position
    {
      const json* attn_config = Object(main.config(), "attn_config");
      std::optional<bool> alibi = AsBool(main.Raw("alibi"));
      if (!alibi) alibi = AsBool(Member(attn_config, "alibi"));
      if (!alibi && main.family() != nullptr && main.family()->sub_config_classes.count("attn_config") > 0) {
        // MPT: attn_config left out means MptAttentionConfig's defaults.
        if (const Family* ac = defaults.FindByConfigClass(main.family()->sub_config_classes.at("attn_config"))) {
          alibi = AsBool(Member(ac->defaults.get(), "alibi"));
        }
      }
      const std::string pet = AsToken(main.Raw("position_embedding_type"));
      const bool rel_buckets = main.Mentions("relative_attention_num_buckets");
      const bool deberta_relative =
          main.Bool("relative_attention").value_or(false) || main.Count("position_buckets").has_value();
      if (f.structure == "ssm" || f.structure == "conv") {
        f.position = "none";
      } else if (InTable(main_family, kAlibiFamilies) || (alibi && *alibi)) {
        f.position = "alibi";
      } else if (rel_buckets || deberta_relative || StartsWith(pet, "relative")) {
        f.position = "relative";
      } else if (pet == "rotary" || NamesRope(main)) {
        f.position = "rope";
      } else if (InTable(main_family, kSinusoidalFamilies) || main.Bool("static_position_embeddings").value_or(false) ||
                 main.Bool("sinusoidal_pos_embds").value_or(false)) {
        f.position = "sinusoidal";
      } else if (main.Mentions("num_conv_pos_embeddings")) {
        f.position = "conv";
      } else if (f.structure == "hybrid") {
        // Mamba layers carry order; Jamba and Nemotron-H attend without
        // position embeddings unless a rope key says otherwise.
        f.position = "none";
      } else if (pet == "absolute" || main.Bool("learned_pos_emb").value_or(false) || f.structure == "vision" ||
                 main.Mentions("n_positions") || (main.family() != nullptr && f.context > 0)) {
        // A table of positions with no rope, ALiBi or relative key. Only a
        // known family's missing rope key means "none", hence the family
        // condition on max_position_embeddings (Step-3.7 names no rope key).
        f.position = "learned";
      }
      if (f.position == "rope") {
        f.rope_scaling = RopeTypeOf(main.Raw("rope_scaling"));
        if (f.rope_scaling.empty()) f.rope_scaling = RopeTypeOf(main.Raw("rope_parameters"));
        if (f.rope_scaling.empty() && InTable(main_family, kMropeFamilies)) f.rope_scaling = "mrope";
      }
    }

    // --- norm
    {
      const std::string norm_type = AsToken(main.Raw("norm_type"));
      const std::string normalization = AsToken(main.Raw("normalization_type"));
      const std::string named = !norm_type.empty() ? norm_type : normalization;
      if (Contains(named, "rms")) {
        f.norm = "rmsnorm";
      } else if (Contains(named, "layer")) {
        f.norm = "layernorm";
      } else if (InTable(main_family, kRmsNormFamilies) || main.Mentions("rms_norm_eps") ||
                 main.Bool("rms_norm").value_or(false) || main.Bool("rmsnorm").value_or(false) ||
                 main.Bool("use_rms_norm").value_or(false)) {
        f.norm = "rmsnorm";
      } else if (InTable(main_family, kLayerNormFamilies) || main.Mentions("layer_norm_eps") ||
                 main.Mentions("layer_norm_epsilon") || main.Mentions("layernorm_epsilon")) {
        f.norm = "layernorm";
      }
      // Placement: an explicit key wins, then the family, then the kind of
      // stack. apply_residual_connection_post_layernorm (BLOOM, Falcon) does
      // not move the norm, only the residual's source, so it is not read.
      std::optional<bool> pre;
      for (std::string_view key : {"pre_norm", "prenorm", "use_pre_norm", "normalize_before", "do_layer_norm_before",
                                   "do_stable_layer_norm"}) {
        if (auto b = main.Bool(key)) {
          pre = b;
          break;
        }
      }
      if (!pre) {
        for (std::string_view key : {"post_norm", "postnorm", "use_post_norm"}) {
          if (auto b = main.Bool(key)) {
            pre = !*b;
            break;
          }
        }
      }
      if (pre) {
        f.norm_placement = *pre ? "pre" : "post";
      } else if (InTable(main_family, kPostNormFamilies)) {
        f.norm_placement = "post";
      } else if (f.structure == "encoder") {
        f.norm_placement = main.family() != nullptr && main.Mentions("type_vocab_size") ? "post" : "";
        if (OneOf(main_family, {"megatron-bert", "xlm-roberta-xl", "roberta-prelayernorm", "esm", "modernbert"})) {
          f.norm_placement = "pre";
        }
      } else if (!f.norm.empty()) {
        f.norm_placement = "pre";
      }
    }

    // --- activation and MLP
    {
      bool gated = false;
      std::string ffp = AsToken(main.Raw("feed_forward_proj"));
      bool ffp_from_defaults = false;
      if (ffp.empty()) {
        ffp = AsToken(main.Value("feed_forward_proj", {}, &ffp_from_defaults));
      }
      if (!ffp.empty()) {
        // T5: "gated-gelu" runs gelu_new (T5Config sets dense_act_fn to it),
        // "relu" a plain ReLU; dense_act_fn, where written, is the truth.
        const bool ffp_gated = StartsWith(ffp, "gated-");
        std::string act = ffp_gated ? ffp.substr(6) : ffp;
        if (act == "gelu" && ffp_gated) act = "gelu_new";
        if (auto dense = AsToken(main.Raw("dense_act_fn")); !dense.empty()) act = dense;
        f.activation = NormaliseActivation(act, &gated);
        gated = gated || ffp_gated;
        if (ffp_from_defaults && !f.activation.empty()) main.NoteDefault("feed_forward_proj");
      }
      if (f.activation.empty()) {
        for (std::string_view key : kActivationKeys) {
          bool from_defaults = false;
          const json* v = main.Value(key, {}, &from_defaults);
          if (v == nullptr || from_defaults) continue;
          f.activation = NormaliseActivation(AsToken(v), &gated);
          break;
        }
      }
      if (f.activation.empty()) {
        for (std::string_view key : kActivationKeys) {
          bool from_defaults = false;
          const json* v = main.Value(key, {}, &from_defaults);
          if (v == nullptr) continue;
          f.activation = NormaliseActivation(AsToken(v), &gated);
          if (!f.activation.empty() && from_defaults) main.NoteDefault(key);
          break;
        }
      }
      if (f.activation.empty()) {
        for (auto [fam, act] : kFixedActivations) {
          if (main_family == fam || (fam == "rwkv" && rwkv)) f.activation = act;
        }
      }
      if (auto is_gated = main.Bool("is_gated_act")) gated = gated || *is_gated;
      // Note [Gated MLP]
      if (InTable(main_family, kGatedFamilies) || (f.activation == "silu" && f.norm == "rmsnorm")) gated = true;
      if (f.structure == "ssm" || f.structure == "conv") gated = false;
      f.gated_mlp = gated;
    }

    // --- tied embeddings: the language model's setting, then the top
    // level's, then the families' defaults; transformers' default is true.
    {
      std::optional<bool> tied = AsBool(main.Raw("tie_word_embeddings"));
      if (!tied) tied = AsBool(Member(&config, "tie_word_embeddings"));
      if (!tied) tied = main.Bool("tie_word_embeddings");
      if (!tied && main.family() != family) tied = top.Bool("tie_word_embeddings");
      f.tied_embeddings = tied.value_or(true);
    }

    // --- towers
    if (vision_sub != nullptr ||
        (family_has_vision && Member(&config, "vision_config") == nullptr && f.structure == "multimodal")) {
      Reader vr = SubReader(ctx, vision_sub != nullptr ? vision_sub : &empty, nullptr, family, "vision_config");
      if (vr.family() != family || vision_sub != nullptr) f.vision = ReadTower(vr);
    }
    if (audio_sub != nullptr) {
      Reader ar = SubReader(ctx, audio_sub, nullptr, family, "audio_config");
      f.audio = ReadTower(ar);
    } else if (f.structure == "speech" && enc_dec) {
      // Whisper / Speech2Text: the encoder is the audio tower.
      f.audio.hidden = f.hidden;
      f.audio.layers = f.encoder_layers;
      f.audio.heads = main.Count("encoder_attention_heads").value_or(0);
      f.audio.intermediate = main.Count("encoder_ffn_dim").value_or(0);
      f.audio.mel_bins = main.Count("num_mel_bins", {"input_feat_per_channel"}).value_or(0);
    }

    // --- numerics: the top level's, else the language model's
    for (const json* where : {&config, main.config()}) {
      for (std::string_view key : {"dtype", "torch_dtype"}) {
        if (f.dtype.empty()) f.dtype = NormaliseDtype(AsToken(Member(where, key)));
      }
      if (f.quantization.empty()) {
        const json* q = Object(where, "quantization_config");
        std::string method = AsToken(Member(q, "quant_method"));
        if (method == "bitsandbytes") {
          if (AsBool(Member(q, "load_in_4bit")).value_or(false) || AsBool(Member(q, "_load_in_4bit")).value_or(false)) {
            method = "bnb-4bit";
          } else if (AsBool(Member(q, "load_in_8bit")).value_or(false) ||
                     AsBool(Member(q, "_load_in_8bit")).value_or(false)) {
            method = "bnb-8bit";
          }
        }
        f.quantization = method;
      }
    }

    // Derived values (4 x hidden, ratios, sums) can leave the range every
    // read value is held to; such a value is as unknown as a hostile one.
    for (int64_t* v : {&f.heads, &f.kv_heads, &f.head_dim, &f.sliding_window, &f.experts, &f.experts_per_token,
                       &f.shared_experts, &f.hidden, &f.layers, &f.encoder_layers, &f.intermediate, &f.vocab,
                       &f.context, &f.image_size, &f.patch_size, &f.vision.hidden, &f.vision.layers, &f.vision.heads,
                       &f.vision.intermediate, &f.vision.image_size, &f.vision.patch_size, &f.vision.mel_bins,
                       &f.audio.hidden, &f.audio.layers, &f.audio.heads, &f.audio.intermediate, &f.audio.image_size,
                       &f.audio.patch_size, &f.audio.mel_bins}) {
      if (*v < 0 || *v > kMaxCount) *v = 0;
    }
    for (int64_t& w : f.conv_widths) {
      if (w < 0 || w > kMaxCount) w = 0;
    }

    // --- understood
    {
      const bool needs_vocab = f.structure != "vision" && f.structure != "conv";
      const bool needs_heads = f.structure != "ssm" && f.structure != "conv";
      const bool dims = (f.structure == "conv" ? !f.conv_widths.empty() : f.hidden > 0) && f.layers > 0 &&
                        (!needs_heads || f.heads > 0) && (!needs_vocab || f.vocab > 0);
      f.understood = family != nullptr && dims;
    }

    if (f.model_type.empty() && f.architecture.empty() && f.hidden == 0 && f.layers == 0 && f.heads == 0 &&
        f.vocab == 0 && f.intermediate == 0 && f.context == 0 && f.conv_widths.empty() && TowerEmpty(f.vision) &&
        TowerEmpty(f.audio)) {
      return Status::InvalidArgument(
          "config names no model_type, no architectures and no dimension (hidden_size, num_hidden_layers, "
          "num_attention_heads, vocab_size or an alias of one)");
    }
    COV_RETURN_IF_ERROR(CheckDimensionBounds(f));
    return f;
  } catch (const std::exception& e) {
    // Note [Untrusted configs]: unreachable by design; a bug if it happens.
    return Status::Internal(std::string("feature extraction threw: ") + e.what());
  }
}

Result<Features> ExtractFeatures(std::string_view config_json, const FamilyDefaults& defaults) {
  auto parsed = ParseJsonCapped(config_json, {.python_literals = true});
  if (!parsed) return Status::InvalidArgument("config.json: " + parsed.error().message());
  return ExtractFeatures(*parsed, defaults);
}

// ---------------------------------------------------------------------------
// JSON form.

namespace {

json TowerToJson(const Tower& t) {
  return json{{"hidden", t.hidden},         {"layers", t.layers},
              {"heads", t.heads},           {"intermediate", t.intermediate},
              {"image_size", t.image_size}, {"patch_size", t.patch_size},
              {"mel_bins", t.mel_bins}};
}

class FieldReader {
 public:
  FieldReader(const json& j, std::string where) : j_(j), where_(std::move(where)) {}

  Status Text(const char* key, std::string* out) {
    const json* v = Member(&j_, key);
    if (v == nullptr || !v->is_string()) return Bad(key, "a string");
    *out = v->get<std::string>();
    return Status::Ok();
  }
  Status Int(const char* key, int64_t* out) {
    const json* v = Member(&j_, key);
    // Stored JSON reads back non-negative integers as unsigned: both kinds
    // are accepted over the whole non-negative int64 range.
    if (v == nullptr || !v->is_number_integer() ||
        (v->is_number_unsigned() ? v->get<uint64_t>() > uint64_t(INT64_MAX) : v->get<int64_t>() < 0)) {
      return Bad(key, "a non-negative integer");
    }
    *out = v->is_number_unsigned() ? static_cast<int64_t>(v->get<uint64_t>()) : v->get<int64_t>();
    return Status::Ok();
  }
  Status Bool(const char* key, bool* out) {
    const json* v = Member(&j_, key);
    if (v == nullptr || !v->is_boolean()) return Bad(key, "true or false");
    *out = v->get<bool>();
    return Status::Ok();
  }
  Status Ints(const char* key, std::vector<int64_t>* out) {
    const json* v = Member(&j_, key);
    if (v == nullptr || !v->is_array()) return Bad(key, "a list of non-negative integers");
    out->clear();
    for (const json& e : *v) {
      if (!e.is_number_integer() || e.get<int64_t>() < 0) return Bad(key, "a list of non-negative integers");
      out->push_back(e.get<int64_t>());
    }
    return Status::Ok();
  }
  Status Texts(const char* key, std::vector<std::string>* out) {
    const json* v = Member(&j_, key);
    if (v == nullptr || !v->is_array()) return Bad(key, "a list of strings");
    out->clear();
    for (const json& e : *v) {
      if (!e.is_string()) return Bad(key, "a list of strings");
      out->push_back(e.get<std::string>());
    }
    return Status::Ok();
  }
  Status Tower(const char* key, selection::Tower* out) {
    const json* v = Member(&j_, key);
    if (v == nullptr || !v->is_object()) return Bad(key, "an object");
    FieldReader r(*v, where_ + "." + key);
    COV_RETURN_IF_ERROR(r.Int("hidden", &out->hidden));
    COV_RETURN_IF_ERROR(r.Int("layers", &out->layers));
    COV_RETURN_IF_ERROR(r.Int("heads", &out->heads));
    COV_RETURN_IF_ERROR(r.Int("intermediate", &out->intermediate));
    COV_RETURN_IF_ERROR(r.Int("image_size", &out->image_size));
    COV_RETURN_IF_ERROR(r.Int("patch_size", &out->patch_size));
    COV_RETURN_IF_ERROR(r.Int("mel_bins", &out->mel_bins));
    return Status::Ok();
  }

 private:
  Status Bad(const char* key, const char* expected) const {
    return Status::Corruption(where_ + "." + key + ": expected " + expected);
  }
  const json& j_;
  std::string where_;
};

}  // namespace

nlohmann::json ToJson(const Features& f) {
  json j;
  j["model_type"] = f.model_type;
  j["architecture"] = f.architecture;
  j["head"] = f.head;
  j["structure"] = f.structure;
  j["attention"] = f.attention;
  j["heads"] = f.heads;
  j["kv_heads"] = f.kv_heads;
  j["head_dim"] = f.head_dim;
  j["sliding_window"] = f.sliding_window;
  j["position"] = f.position;
  j["rope_scaling"] = f.rope_scaling;
  j["norm"] = f.norm;
  j["norm_placement"] = f.norm_placement;
  j["activation"] = f.activation;
  j["gated_mlp"] = f.gated_mlp;
  j["experts"] = f.experts;
  j["experts_per_token"] = f.experts_per_token;
  j["shared_experts"] = f.shared_experts;
  j["tied_embeddings"] = f.tied_embeddings;
  j["hidden"] = f.hidden;
  j["layers"] = f.layers;
  j["encoder_layers"] = f.encoder_layers;
  j["intermediate"] = f.intermediate;
  j["vocab"] = f.vocab;
  j["context"] = f.context;
  j["image_size"] = f.image_size;
  j["patch_size"] = f.patch_size;
  j["conv_widths"] = f.conv_widths;
  j["vision"] = TowerToJson(f.vision);
  j["audio"] = TowerToJson(f.audio);
  j["dtype"] = f.dtype;
  j["quantization"] = f.quantization;
  j["defaulted"] = f.defaulted;
  j["understood"] = f.understood;
  return j;
}

Result<Features> FeaturesFromJson(const nlohmann::json& j) {
  if (!j.is_object()) return Status::Corruption(std::string("features: expected an object, got ") + j.type_name());
  Features f;
  FieldReader r(j, "features");
  COV_RETURN_IF_ERROR(r.Text("model_type", &f.model_type));
  COV_RETURN_IF_ERROR(r.Text("architecture", &f.architecture));
  COV_RETURN_IF_ERROR(r.Text("head", &f.head));
  COV_RETURN_IF_ERROR(r.Text("structure", &f.structure));
  COV_RETURN_IF_ERROR(r.Text("attention", &f.attention));
  COV_RETURN_IF_ERROR(r.Int("heads", &f.heads));
  COV_RETURN_IF_ERROR(r.Int("kv_heads", &f.kv_heads));
  COV_RETURN_IF_ERROR(r.Int("head_dim", &f.head_dim));
  COV_RETURN_IF_ERROR(r.Int("sliding_window", &f.sliding_window));
  COV_RETURN_IF_ERROR(r.Text("position", &f.position));
  COV_RETURN_IF_ERROR(r.Text("rope_scaling", &f.rope_scaling));
  COV_RETURN_IF_ERROR(r.Text("norm", &f.norm));
  COV_RETURN_IF_ERROR(r.Text("norm_placement", &f.norm_placement));
  COV_RETURN_IF_ERROR(r.Text("activation", &f.activation));
  COV_RETURN_IF_ERROR(r.Bool("gated_mlp", &f.gated_mlp));
  COV_RETURN_IF_ERROR(r.Int("experts", &f.experts));
  COV_RETURN_IF_ERROR(r.Int("experts_per_token", &f.experts_per_token));
  COV_RETURN_IF_ERROR(r.Int("shared_experts", &f.shared_experts));
  COV_RETURN_IF_ERROR(r.Bool("tied_embeddings", &f.tied_embeddings));
  COV_RETURN_IF_ERROR(r.Int("hidden", &f.hidden));
  COV_RETURN_IF_ERROR(r.Int("layers", &f.layers));
  COV_RETURN_IF_ERROR(r.Int("encoder_layers", &f.encoder_layers));
  COV_RETURN_IF_ERROR(r.Int("intermediate", &f.intermediate));
  COV_RETURN_IF_ERROR(r.Int("vocab", &f.vocab));
  COV_RETURN_IF_ERROR(r.Int("context", &f.context));
  COV_RETURN_IF_ERROR(r.Int("image_size", &f.image_size));
  COV_RETURN_IF_ERROR(r.Int("patch_size", &f.patch_size));
  COV_RETURN_IF_ERROR(r.Ints("conv_widths", &f.conv_widths));
  COV_RETURN_IF_ERROR(r.Tower("vision", &f.vision));
  COV_RETURN_IF_ERROR(r.Tower("audio", &f.audio));
  COV_RETURN_IF_ERROR(r.Text("dtype", &f.dtype));
  COV_RETURN_IF_ERROR(r.Text("quantization", &f.quantization));
  COV_RETURN_IF_ERROR(r.Texts("defaulted", &f.defaulted));
  COV_RETURN_IF_ERROR(r.Bool("understood", &f.understood));
  return f;
}

// ---------------------------------------------------------------------------
// FamilyDefaults.

struct FamilyDefaults::Impl {
  std::vector<Family> families;  // every line, in file order; never resized after Load
  std::unordered_map<std::string, size_t> by_type;
  std::unordered_map<std::string, size_t> by_class;
  // Lowercased architecture prefixes ("albert"), longest first.
  std::vector<std::pair<std::string, size_t>> prefixes;
};

FamilyDefaults::FamilyDefaults() : impl_(std::make_unique<Impl>()) {}
FamilyDefaults::~FamilyDefaults() = default;

std::shared_ptr<const FamilyDefaults> FamilyDefaults::Empty() {
  return std::shared_ptr<const FamilyDefaults>(new FamilyDefaults());
}

namespace {

Result<Family> ParseFamilyLine(const json& line) {
  if (!line.is_object()) return Status::InvalidArgument("expected a JSON object");
  Family family;
  const json* type = Member(&line, "model_type");
  if (type == nullptr || !(type->is_null() || type->is_string())) {
    return Status::InvalidArgument("model_type: expected a string or null");
  }
  if (type->is_string()) family.model_type = type->get<std::string>();
  const json* cls = Member(&line, "config_class");
  if (cls == nullptr || !cls->is_string() || cls->get_ref<const std::string&>().empty()) {
    return Status::InvalidArgument("config_class: expected a non-empty string");
  }
  family.config_class = cls->get<std::string>();
  const json* defaults = Member(&line, "defaults");
  if (defaults != nullptr && !defaults->is_null() && !defaults->is_object()) {
    return Status::InvalidArgument("defaults: expected an object or null");
  }
  family.defaults =
      std::make_shared<const json>(defaults != nullptr && defaults->is_object() ? *defaults : json::object());
  if (const json* map = Member(&line, "attribute_map"); map != nullptr && !map->is_null()) {
    if (!map->is_object()) return Status::InvalidArgument("attribute_map: expected an object or null");
    for (const auto& [alias, field] : map->items()) {
      if (!field.is_string()) return Status::InvalidArgument("attribute_map." + alias + ": expected a string");
      family.attribute_map[alias] = field.get<std::string>();
    }
  }
  if (const json* subs = Member(&line, "sub_configs"); subs != nullptr && !subs->is_null()) {
    if (!subs->is_array()) return Status::InvalidArgument("sub_configs: expected a list or null");
    for (const json& s : *subs) {
      if (!s.is_string()) return Status::InvalidArgument("sub_configs: expected a list of strings");
      family.sub_configs.push_back(s.get<std::string>());
    }
  }
  if (const json* classes = Member(&line, "sub_config_classes"); classes != nullptr && !classes->is_null()) {
    if (!classes->is_object()) return Status::InvalidArgument("sub_config_classes: expected an object or null");
    for (const auto& [key, value] : classes->items()) {
      // Values are source expressions; only a plain class name is usable.
      if (value.is_string()) family.sub_config_classes[key] = value.get<std::string>();
    }
  }
  return family;
}

}  // namespace

Result<std::shared_ptr<const FamilyDefaults>> FamilyDefaults::Load(const std::string& path) {
  std::ifstream in(path);
  if (!in) return Status::IoError(path + ": cannot open for reading");
  std::shared_ptr<FamilyDefaults> table(new FamilyDefaults());
  Impl& impl = *table->impl_;
  std::string text;
  for (int line_no = 1; std::getline(in, text); ++line_no) {
    if (text.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = path + ":" + std::to_string(line_no);
    auto parsed = ParseJsonCapped(text);
    if (!parsed) return Status::InvalidArgument(where + ": " + parsed.error().message());
    auto family = ParseFamilyLine(*parsed);
    if (!family) return Status::InvalidArgument(where + ": " + family.error().message());
    impl.families.push_back(std::move(*family));
  }
  if (in.bad()) return Status::IoError(path + ": read failed");
  for (size_t i = 0; i < impl.families.size(); ++i) {
    const Family& family = impl.families[i];
    if (!family.model_type.empty()) impl.by_type.emplace(family.model_type, i);
    impl.by_class.emplace(family.config_class, i);
    const std::string_view cls = family.config_class;
    if (!family.model_type.empty() && cls.size() > 6 && cls.substr(cls.size() - 6) == "Config") {
      impl.prefixes.emplace_back(Lower(cls.substr(0, cls.size() - 6)), i);
    }
  }
  std::stable_sort(impl.prefixes.begin(), impl.prefixes.end(),
                   [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });
  return std::shared_ptr<const FamilyDefaults>(std::move(table));
}

const FamilyDefaults::Family* FamilyDefaults::Find(std::string_view model_type) const {
  auto it = impl_->by_type.find(std::string(model_type));
  return it == impl_->by_type.end() ? nullptr : &impl_->families[it->second];
}

const FamilyDefaults::Family* FamilyDefaults::FindByConfigClass(std::string_view config_class) const {
  auto it = impl_->by_class.find(std::string(config_class));
  return it == impl_->by_class.end() ? nullptr : &impl_->families[it->second];
}

const FamilyDefaults::Family* FamilyDefaults::FindByArchitecture(std::string_view architecture) const {
  const std::string_view name = StripFramework(architecture);
  const std::string lower = Lower(name);
  for (const auto& [prefix, index] : impl_->prefixes) {
    if (lower.size() > prefix.size() && StartsWith(lower, prefix) && StartsWithHead(name.substr(prefix.size()))) {
      return &impl_->families[index];
    }
  }
  return nullptr;
}

size_t FamilyDefaults::size() const { return impl_->by_type.size(); }

}  // namespace coverage::selection
