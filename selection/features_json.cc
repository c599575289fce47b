// The JSON form of Features (ToJson, FeaturesFromJson).
#include <cstdint>
#include <nlohmann/json.hpp>
#include <utility>

#include "selection/config_reader.h"
#include "selection/features.h"

namespace coverage::selection {
namespace {

using detail::json;
using detail::Member;

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

}  // namespace coverage::selection
