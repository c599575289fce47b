#include "selection/features.h"

#include <exception>
#include <nlohmann/json.hpp>
#include <utility>

#include "core/json_capped.h"
#include "selection/config_reader.h"
#include "selection/extract.h"

namespace coverage::selection {
namespace detail {

const json& EmptyObject() {
  static const json empty = json::object();
  return empty;
}

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

namespace {

// Keys that name a nested language model, in the order they are tried.
const Names kTextConfigKeys = {"text_config", "language_config", "llm_config", "text_model"};

// The family: the written model_type, else the one the architecture names.
// Fills model_type, architecture and head; returns the written model_type.
std::string ReadFamily(const json& config, const FamilyDefaults& defaults, Features* f, const Family** family) {
  std::string written_type = AsText(Member(&config, "model_type")).value_or("");
  if (const json* archs = Member(&config, "architectures"); archs != nullptr && archs->is_array() && !archs->empty()) {
    f->architecture = AsText(&archs->front()).value_or("");
  }
  *family = FindFamily(defaults, written_type);
  f->model_type = written_type;
  if (written_type.empty() && !f->architecture.empty()) {
    *family = FamilyFromArchitecture(defaults, f->architecture);
    if (*family != nullptr) f->model_type = (*family)->model_type;
  }
  if (!f->architecture.empty()) f->head = HeadOf(f->architecture, *family);
  return written_type;
}

// The main stack: a nested language model, else the config itself.
Stack ReadStack(const Context& ctx, const json& config, const Family* family, const std::string& written_type) {
  Reader top(Scope{&config, nullptr, family, ""}, ctx.defaulted);
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
      if (it != family->sub_config_classes.end() && ctx.defaults.FindByConfigClass(it->second) != nullptr &&
          Member(&config, key) == nullptr) {
        text = &EmptyObject();
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
  std::string main_family = main.family() != nullptr
                                ? main.family_name()
                                : Lower(AsText(Member(main.config(), "model_type")).value_or(written_type));
  return Stack{&config, family, std::move(top), std::move(main), std::move(main_family), text, encoder_sub,
               composite_seq2seq};
}

// Derived values (4 x hidden, ratios, sums) can leave the range every read
// value is held to; such a value is as unknown as a hostile one.
void ClampDerived(Features* f) {
  for (int64_t* v : {&f->heads, &f->kv_heads, &f->head_dim, &f->sliding_window, &f->experts, &f->experts_per_token,
                     &f->shared_experts, &f->hidden, &f->layers, &f->encoder_layers, &f->intermediate, &f->vocab,
                     &f->context, &f->image_size, &f->patch_size, &f->vision.hidden, &f->vision.layers,
                     &f->vision.heads, &f->vision.intermediate, &f->vision.image_size, &f->vision.patch_size,
                     &f->vision.mel_bins, &f->audio.hidden, &f->audio.layers, &f->audio.heads, &f->audio.intermediate,
                     &f->audio.image_size, &f->audio.patch_size, &f->audio.mel_bins}) {
    if (*v < 0 || *v > kMaxCount) *v = 0;
  }
  for (int64_t& w : f->conv_widths) {
    if (w < 0 || w > kMaxCount) w = 0;
  }
}

bool Understood(const Features& f, const Family* family) {
  const bool needs_vocab = f.structure != "vision" && f.structure != "conv";
  const bool needs_heads = f.structure != "ssm" && f.structure != "conv";
  const bool dims = (f.structure == "conv" ? !f.conv_widths.empty() : f.hidden > 0) && f.layers > 0 &&
                    (!needs_heads || f.heads > 0) && (!needs_vocab || f.vocab > 0);
  return family != nullptr && dims;
}

bool TowerEmpty(const Tower& t) { return t == Tower{}; }

bool NamesNothing(const Features& f) {
  return f.model_type.empty() && f.architecture.empty() && f.hidden == 0 && f.layers == 0 && f.heads == 0 &&
         f.vocab == 0 && f.intermediate == 0 && f.context == 0 && f.conv_widths.empty() && TowerEmpty(f.vision) &&
         TowerEmpty(f.audio);
}

// The steps in order (extract.h), on a config that is an object.
Result<Features> Extract(const json& config, const FamilyDefaults& defaults) {
  Features f;
  const Context ctx{defaults, &f.defaulted};
  const Family* family = nullptr;
  const std::string written_type = ReadFamily(config, defaults, &f, &family);
  Stack stack = ReadStack(ctx, config, family, written_type);
  const Structure structure = ReadStructure(stack, &f);
  // Experts first: the MLP width depends on them.
  ReadExperts(stack.main, &f);
  ReadDimensions(ctx, stack, structure, &f);
  ReadAttention(stack.main, structure, &f);
  ReadPosition(defaults, stack, &f);
  ReadNorm(stack, &f);
  ReadActivation(stack, structure, &f);
  ReadTiedEmbeddings(stack, &f);
  ReadTowers(ctx, stack, structure, &f);
  ReadNumerics(stack, &f);
  ClampDerived(&f);
  f.understood = Understood(f, family);

  if (NamesNothing(f)) {
    return Status::InvalidArgument(
        "config names no model_type, no architectures and no dimension (hidden_size, num_hidden_layers, "
        "num_attention_heads, vocab_size or an alias of one)");
  }
  COV_RETURN_IF_ERROR(CheckDimensionBounds(f));
  return f;
}

}  // namespace
}  // namespace detail

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
    return detail::Extract(config, defaults);
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

}  // namespace coverage::selection
