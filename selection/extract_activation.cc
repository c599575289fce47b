// The activation and whether the MLP is gated (SwiGLU / GeGLU).
#include <nlohmann/json.hpp>

#include "selection/config_reader.h"
#include "selection/extract.h"
#include "selection/feature_tables.h"

namespace coverage::selection::detail {
namespace {

// Keys that name the activation, in the order they are tried.
const Names kActivationKeys = {"hidden_activation", "hidden_act", "activation_function", "activation",
                               "mlp_hidden_act",    "act_fn",     "hidden_act_fn"};

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

// T5's feed_forward_proj ("gated-gelu", "relu"); "" when it names none.
std::string ActivationFromFeedForwardProj(Reader& main, bool* gated) {
  std::string ffp = AsToken(main.Raw("feed_forward_proj"));
  bool ffp_from_defaults = false;
  if (ffp.empty()) {
    ffp = AsToken(main.Value("feed_forward_proj", {}, &ffp_from_defaults));
  }
  if (ffp.empty()) return "";
  // T5: "gated-gelu" runs gelu_new (T5Config sets dense_act_fn to it),
  // "relu" a plain ReLU; dense_act_fn, where written, is the truth.
  const bool ffp_gated = StartsWith(ffp, "gated-");
  std::string act = ffp_gated ? ffp.substr(6) : ffp;
  if (act == "gelu" && ffp_gated) act = "gelu_new";
  if (auto dense = AsToken(main.Raw("dense_act_fn")); !dense.empty()) act = dense;
  std::string activation = NormaliseActivation(act, gated);
  *gated = *gated || ffp_gated;
  if (ffp_from_defaults && !activation.empty()) main.NoteDefault("feed_forward_proj");
  return activation;
}

// The first activation key named (as written, or also from the defaults).
std::string ActivationFromKeys(Reader& main, bool with_defaults, bool* gated) {
  for (std::string_view key : kActivationKeys) {
    bool from_defaults = false;
    const json* v = main.Value(key, {}, &from_defaults);
    if (v == nullptr || (from_defaults && !with_defaults)) continue;
    std::string activation = NormaliseActivation(AsToken(v), gated);
    if (!activation.empty() && from_defaults) main.NoteDefault(key);
    return activation;
  }
  return "";
}

}  // namespace

// The activation: T5's feed_forward_proj, then a key the config writes, then
// one its defaults give, then the one the modeling code hard-codes.
void ReadActivation(Stack& s, const Structure& st, Features* out) {
  Features& f = *out;
  Reader& main = s.main;
  const std::string& main_family = s.main_family;
  const FeatureTables& tables = Tables();
  bool gated = false;
  f.activation = ActivationFromFeedForwardProj(main, &gated);
  if (f.activation.empty()) f.activation = ActivationFromKeys(main, /*with_defaults=*/false, &gated);
  if (f.activation.empty()) f.activation = ActivationFromKeys(main, /*with_defaults=*/true, &gated);
  if (f.activation.empty()) {
    for (const auto& [family, activation] : tables.fixed_activations) {
      if (main_family == family || (family == "rwkv" && st.rwkv)) f.activation = activation;
    }
  }
  if (auto is_gated = main.Bool("is_gated_act")) gated = gated || *is_gated;
  // Note [Gated MLP]
  // The families of tables.gated_mlp multiply a gate projection into an up
  // projection (SwiGLU / GeGLU: gate_proj, up_proj, down_proj or a fused
  // gate_up_proj). A family outside the table counts as gated when its
  // activation is SiLU and its norm RMSNorm: every such decoder in
  // transformers uses the Llama MLP.
  if (InTable(main_family, tables.gated_mlp) || (f.activation == "silu" && f.norm == "rmsnorm")) gated = true;
  if (f.structure == "ssm" || f.structure == "conv") gated = false;
  f.gated_mlp = gated;
}

}  // namespace coverage::selection::detail
