// Dimensions: width, depth, heads, MLP width, vocabulary, context, conv
// widths, towers' sizes, and the mixture of experts (which the MLP width
// depends on).
#include <cmath>
#include <nlohmann/json.hpp>

#include "selection/config_reader.h"
#include "selection/extract.h"
#include "selection/feature_tables.h"

namespace coverage::selection::detail {
namespace {

// Common aliases of canonical names, beyond each family's attribute_map.
// `hidden_dim` is the model width except next to `dim` (DistilBERT), where
// it is the MLP width; see ReadHidden / ReadIntermediate.
const Names kHiddenAliases = {"n_embd", "n_embed", "d_model", "dim", "embed_dim", "model_dim"};
const Names kLayerAliases = {"n_layer", "n_layers", "num_layers", "depth"};
const Names kHeadAliases = {"n_head", "n_heads", "num_heads", "attention_heads"};
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
    if (InTable(r.family_name(), Tables().four_times_hidden) || r.Mentions("n_inner")) return 4 * hidden;
  }
  return std::nullopt;
}


// The seq2seq layout: decoder and encoder depths, the decoder's heads and
// MLP width; an EncoderDecoderModel's encoder depth from its own config.
void ReadSeq2SeqDims(const Context& ctx, Stack& s, const Structure& st, Features* out) {
  Features& f = *out;
  Reader& main = s.main;
  const bool seq2seq_layout = st.enc_dec || main.Mentions("decoder_layers");
  if (seq2seq_layout) {
    f.layers = main.Count("decoder_layers", {"num_decoder_layers", "decoder_num_hidden_layers"}).value_or(0);
    f.encoder_layers =
        main.Count("encoder_layers", {"num_encoder_layers", "num_layers", "encoder_num_hidden_layers"}).value_or(0);
    f.heads = main.Count("decoder_attention_heads", {"decoder_num_attention_heads"}).value_or(0);
    f.intermediate = main.Count("decoder_ffn_dim").value_or(0);
  }
  if (s.composite_seq2seq) {
    Reader enc = SubReader(ctx, s.encoder_sub, nullptr, nullptr, "encoder");
    f.encoder_layers = enc.Count("num_hidden_layers", kLayerAliases).value_or(0);
  }
}

// Layers a config counts only in its layer pattern or its stage depths; 0
// if neither says.
int64_t LayersFromPattern(Reader& main) {
  // Nemotron-H derives num_hidden_layers from its layer pattern.
  for (std::string_view key : {"layers_block_type", "layer_types", "hybrid_override_pattern"}) {
    const json* v = main.Raw(key);
    const bool fits = v != nullptr && (v->is_string() ? v->get_ref<const std::string&>().size() <= kMaxList
                                                       : v->is_array() && v->size() <= kMaxList);
    if (fits && !v->empty()) {
      return static_cast<int64_t>(v->is_string() ? v->get_ref<const std::string&>().size() : v->size());
    }
  }
  // ConvNets: the sum of the stage depths.
  auto depths = AsCountList(main.Raw("depths"));
  int64_t total = 0;
  for (int64_t d : depths) total += d;
  if (total > 0 && total <= kMaxCount) return total;
  return 0;
}

// Conv feature extractor widths (speech), or conv stage widths.
std::vector<int64_t> ReadConvWidths(Reader& main, std::string_view structure) {
  std::vector<int64_t> widths = AsCountList(main.Raw("conv_dim"));
  if (widths.empty()) {
    bool from_defaults = false;
    widths = AsCountList(main.Value("hidden_sizes", {}, &from_defaults));
    if (!widths.empty() && from_defaults) main.NoteDefault("hidden_sizes");
  }
  if (widths.empty() && structure == "speech") {
    bool from_defaults = false;
    widths = AsCountList(main.Value("conv_dim", {}, &from_defaults));
    if (!widths.empty() && from_defaults) main.NoteDefault("conv_dim");
  }
  return widths;
}

}  // namespace

void ReadExperts(Reader& main, Features* out) {
  Features& f = *out;
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
}

void ReadDimensions(const Context& ctx, Stack& s, const Structure& st, Features* out) {
  Features& f = *out;
  Reader& main = s.main;
  f.hidden = ReadHidden(main).value_or(0);
  ReadSeq2SeqDims(ctx, s, st, &f);
  if (f.layers == 0) f.layers = main.Count("num_hidden_layers", kLayerAliases).value_or(0);
  if (f.layers == 0) f.layers = LayersFromPattern(main);
  if (!st.enc_dec) f.encoder_layers = 0;
  if (f.heads == 0) f.heads = main.Count("num_attention_heads", kHeadAliases).value_or(0);
  if (f.intermediate == 0) f.intermediate = ReadIntermediate(main, f.hidden, f.experts).value_or(0);
  f.vocab = main.Count("vocab_size", kVocabAliases).value_or(0);
  f.context = main.Count("max_position_embeddings", kContextAliases).value_or(0);
  if (f.structure == "vision" || f.structure == "conv") {
    Tower own = ReadTower(main);
    f.image_size = own.image_size;
    f.patch_size = own.patch_size;
  }
  f.conv_widths = ReadConvWidths(main, f.structure);
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

}  // namespace coverage::selection::detail
