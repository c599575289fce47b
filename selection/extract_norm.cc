// Norms: the kind (LayerNorm or RMSNorm) and the placement (before or after
// the residual add).
#include <nlohmann/json.hpp>

#include "selection/config_reader.h"
#include "selection/extract.h"
#include "selection/feature_tables.h"

namespace coverage::selection::detail {
namespace {

// A named norm type, then the family, then the name of the eps field.
std::string NormKindOf(Reader& main, std::string_view main_family) {
  const FeatureTables& tables = Tables();
  const std::string norm_type = AsToken(main.Raw("norm_type"));
  const std::string normalization = AsToken(main.Raw("normalization_type"));
  const std::string named = !norm_type.empty() ? norm_type : normalization;
  if (Contains(named, "rms")) return "rmsnorm";
  if (Contains(named, "layer")) return "layernorm";
  if (InTable(main_family, tables.rms_norm) || main.Mentions("rms_norm_eps") ||
      main.Bool("rms_norm").value_or(false) || main.Bool("rmsnorm").value_or(false) ||
      main.Bool("use_rms_norm").value_or(false)) {
    return "rmsnorm";
  }
  if (InTable(main_family, tables.layer_norm) || main.Mentions("layer_norm_eps") ||
      main.Mentions("layer_norm_epsilon") || main.Mentions("layernorm_epsilon")) {
    return "layernorm";
  }
  return "";
}

// An explicit placement key: true for pre-norm, false for post-norm.
std::optional<bool> PreNormKey(Reader& main) {
  for (std::string_view key : {"pre_norm", "prenorm", "use_pre_norm", "normalize_before", "do_layer_norm_before",
                               "do_stable_layer_norm"}) {
    if (auto b = main.Bool(key)) return b;
  }
  for (std::string_view key : {"post_norm", "postnorm", "use_post_norm"}) {
    if (auto b = main.Bool(key)) return !*b;
  }
  return std::nullopt;
}

}  // namespace

// Placement: an explicit key wins, then the family, then the kind of stack.
// apply_residual_connection_post_layernorm (BLOOM, Falcon) does not move the
// norm, only the residual's source, so it is not read.
void ReadNorm(Stack& s, Features* out) {
  Features& f = *out;
  Reader& main = s.main;
  const std::string& main_family = s.main_family;
  const FeatureTables& tables = Tables();
  f.norm = NormKindOf(main, main_family);
  if (const std::optional<bool> pre = PreNormKey(main)) {
    f.norm_placement = *pre ? "pre" : "post";
  } else if (InTable(main_family, tables.post_norm)) {
    f.norm_placement = "post";
  } else if (f.structure == "encoder") {
    f.norm_placement = main.family() != nullptr && main.Mentions("type_vocab_size") ? "post" : "";
    if (InTable(main_family, tables.pre_norm_encoders)) f.norm_placement = "pre";
  } else if (!f.norm.empty()) {
    f.norm_placement = "pre";
  }
}

}  // namespace coverage::selection::detail
