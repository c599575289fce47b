// Attention (kind, KV heads, head width, sliding window) and positions
// (scheme and rope scaling).
#include <algorithm>
#include <nlohmann/json.hpp>

#include "selection/config_reader.h"
#include "selection/extract.h"
#include "selection/feature_tables.h"

namespace coverage::selection::detail {
namespace {

// Common aliases of canonical names, beyond each family's attribute_map
// (the others are in extract_dims.cc).
const Names kKvHeadAliases = {"num_kv_heads", "n_head_kv", "n_kv_heads"};
const Names kHeadDimAliases = {"d_kv", "kv_channels", "attention_head_dim", "attention_head_size", "dim_head"};

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

// The widest sliding window; 0 when attention is full everywhere.
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

// The KV heads, where the config names them (Falcon, ChatGLM and NAS-derived
// models have their own ways); nullopt means as many as the query heads.
std::optional<int64_t> ReadKvHeads(Reader& main, int64_t heads) {
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
    if (!kv) kv = KvHeadsFromBlockConfigs(main, heads);
  }
  return kv;
}

// The per-head query/key width; for MLA the width attention runs at.
int64_t ReadHeadDim(Reader& main, bool mla, int64_t hidden, int64_t heads) {
  int64_t head_dim = 0;
  if (mla) {
    auto nope = main.Count("qk_nope_head_dim");
    auto rope = main.Count("qk_rope_head_dim");
    if (auto qk = AsCount(main.Raw("qk_head_dim"))) {
      head_dim = *qk;
    } else if (nope && rope) {
      head_dim = *nope + *rope;
    }
  }
  if (head_dim == 0) head_dim = main.Count("head_dim", kHeadDimAliases).value_or(0);
  if (head_dim == 0 && hidden > 0 && heads > 0 && hidden % heads == 0) head_dim = hidden / heads;
  return head_dim;
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

// ALiBi as a config says it: a top-level `alibi`, MPT's attn_config, or the
// defaults of the attn_config class the family names.
std::optional<bool> AlibiFlag(const FamilyDefaults& defaults, Reader& main) {
  const json* attn_config = Object(main.config(), "attn_config");
  std::optional<bool> alibi = AsBool(main.Raw("alibi"));
  if (!alibi) alibi = AsBool(Member(attn_config, "alibi"));
  if (!alibi && main.family() != nullptr && main.family()->sub_config_classes.count("attn_config") > 0) {
    // MPT: attn_config left out means MptAttentionConfig's defaults.
    if (const Family* ac = defaults.FindByConfigClass(main.family()->sub_config_classes.at("attn_config"))) {
      alibi = AsBool(Member(ac->defaults.get(), "alibi"));
    }
  }
  return alibi;
}

}  // namespace

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

void ReadAttention(Reader& main, const Structure& st, Features* out) {
  Features& f = *out;
  const bool no_attention = f.structure == "ssm" || f.structure == "conv";
  if (no_attention) {
    f.heads = 0;
    f.attention = st.rwkv ? "linear" : f.structure == "ssm" ? "none" : "";
  } else {
    const bool mla = main.Count("kv_lora_rank").has_value() || main.Count("q_lora_rank").has_value();
    const std::optional<int64_t> kv = ReadKvHeads(main, f.heads);
    if (f.heads > 0) f.kv_heads = kv.value_or(f.heads);
    if (f.kv_heads > f.heads) f.kv_heads = 0;  // inconsistent: unknown
    f.head_dim = ReadHeadDim(main, mla, f.hidden, f.heads);

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
}

void ReadPosition(const FamilyDefaults& defaults, Stack& s, Features* out) {
  Features& f = *out;
  Reader& main = s.main;
  const std::string& main_family = s.main_family;
  const FeatureTables& tables = Tables();
  const std::optional<bool> alibi = AlibiFlag(defaults, main);
  const std::string pet = AsToken(main.Raw("position_embedding_type"));
  const bool rel_buckets = main.Mentions("relative_attention_num_buckets");
  const bool deberta_relative =
      main.Bool("relative_attention").value_or(false) || main.Count("position_buckets").has_value();
  if (f.structure == "ssm" || f.structure == "conv") {
    f.position = "none";
  } else if (InTable(main_family, tables.alibi) || (alibi && *alibi)) {
    f.position = "alibi";
  } else if (rel_buckets || deberta_relative || StartsWith(pet, "relative")) {
    f.position = "relative";
  } else if (pet == "rotary" || NamesRope(main)) {
    f.position = "rope";
  } else if (InTable(main_family, tables.sinusoidal) || main.Bool("static_position_embeddings").value_or(false) ||
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
    if (f.rope_scaling.empty() && InTable(main_family, tables.mrope)) f.rope_scaling = "mrope";
  }
}

}  // namespace coverage::selection::detail
