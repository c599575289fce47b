// The decoder-only family of the model builder (model_builder.h).
//
// Besides the common decoder (MHA / GQA / MQA with the variants listed in
// model_builder.h) it builds:
//   - multi-head latent attention (DeepSeek-V2/V3, Kimi-K2, GLM-4.7-Flash),
//     as transformers runs it: low-rank q (q_a_proj -> RMSNorm -> q_b_proj),
//     a compressed KV latent expanded by kv_b_proj, rotary on the rope part
//     only, and the expanded K/V in the cache;
//   - DeepSeek sparse attention (DeepSeek-V3.2, GLM-5): the lightning
//     indexer's scores pick the top-k keys of each query;
//   - DeepSeek routing (sigmoid or softmax scores, correction bias,
//     group-limited top-k, normalised and scaled weights, shared experts,
//     dense first layers), gpt-oss (attention sinks, alternating sliding
//     window, clamped SwiGLU experts with biases) and MiniMax-M2 (q/k norms
//     over all heads, sigmoid routing with a correction bias).
// Quantized checkpoints are built dense in the profile's dtype; the plan's
// notes say so.
#include <algorithm>
#include <cmath>
#include <set>

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include "runners/dtype_map.h"
#include "runners/model_builder_internal.h"

namespace coverage::runners::builder {
namespace {

// How the rotary embedding is applied.
enum class RopeStyle {
  kHalf,         // rotate_half on the two halves (Llama)
  kInterleaved,  // DeepSeek-V3: de-interleave (view, transpose, reshape), then rotate_half
  kSlices,       // DeepSeek-V3.2: even / odd slices rotated directly
  kComplex,      // DeepSeek-V2: complex multiplication (view_as_complex)
  kGptOss,       // gpt-oss: chunk in two halves, cos / sin of half width
};

// How an MoE layer routes tokens.
enum class Routing {
  kSoftmaxTopk,   // softmax, top-k, renormalised (Mixtral, Qwen-MoE)
  kDeepseekV2,    // softmax, greedy or group-limited top-k, scaled
  kDeepseekV3,    // sigmoid + correction bias, group-limited top-k, normalised, scaled
  kSigmoidBias,   // MiniMax-M2: sigmoid + correction bias, top-k, normalised
  kGptOss,        // top-k of the logits, softmax over the k
};

// What the config says beyond the features, read the same way by Plan and
// Run.
struct Arch {
  std::string refusal;  // non-empty: not built, and why
  std::vector<std::string> notes;
  // Multi-head latent attention.
  bool mla = false;
  int64_t q_lora = 0, kv_lora = 0, nope = 0, rope = 0, v_dim = 0, qk = 0;
  RopeStyle rope_style = RopeStyle::kHalf;
  double scaling = 0;            // softmax scale
  double rope_attention = 1.0;   // transformers' attention_scaling on cos / sin
  // DeepSeek sparse attention (lightning indexer).
  int64_t index_topk = 0, index_heads = 0, index_dim = 0;
  bool glm_indexer = false;  // GLM-5's variant (einsum scoring, -inf index mask)
  // Routing.
  Routing routing = Routing::kSoftmaxTopk;
  bool grouped = false;  // DeepSeek's n_group / topk_group selection
  bool greedy = true;    // DeepSeek-V2 topk_method "greedy"
  int64_t n_group = 1, topk_group = 1;
  bool norm_topk = true;
  double routed_scale = 1.0;
  bool mask_neg_inf = false;   // unselected groups masked with -inf (not 0)
  bool fused_experts = false;  // experts as transformers' 3D gate_up / down loop
  int64_t expert_intermediate = 0, shared_intermediate = 0;
  // gpt-oss.
  bool gpt_oss = false;
  double swiglu_limit = 7.0;
  // MiniMax-M2: q/k RMSNorm over all heads at once.
  bool qk_norm_full = false;
  // Built layers: the real index of each, whether its MLP is routed and
  // whether its attention slides.
  std::vector<int64_t> index;
  std::vector<bool> moe, sliding;
  std::vector<bool> shared_index;  // reuses the previous layer's top-k (indexer_types "shared")
};

const json* RopeConfig(const json& c) {
  for (const char* key : {"rope_scaling", "rope_parameters"}) {
    auto it = c.find(key);
    if (it != c.end() && it->is_object()) return &*it;
  }
  return nullptr;
}

std::string RopeType(const json* r) {
  if (r == nullptr) return "";
  for (const char* key : {"rope_type", "type"}) {
    auto it = r->find(key);
    if (it != r->end() && it->is_string()) return it->get<std::string>();
  }
  return "";
}

double YarnMscale(double scale, double mscale) { return scale <= 1 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0; }


// Model types transformers does not know whose architecture class is
// DeepSeek-V3's (Kimi-K2): RMSNorm and SiLU, as that class has.
bool DeepseekV3Class(const selection::Features& f) { return f.architecture == "DeepseekV3ForCausalLM"; }

bool Has(const json& c, const char* key) { return c.contains(key) && !c[key].is_null(); }

Arch ReadArch(const selection::Features& f, const json& c, int64_t layers_built) {
  Arch a;
  const std::string& type = f.model_type;
  // Multi-head latent attention.
  if (f.attention == "mla") {
    if (Has(c, "hc_mult") || Has(c, "compress_ratios") || Has(c, "o_lora_rank")) {
      a.refusal =
          "DeepSeek-V4 attention is not built: hyper-connections (hc_mult), compressed sparse attention "
          "(compress_ratios) and the grouped low-rank output (o_lora_rank)";
      return a;
    }
    if (Has(c, "linear_attn_config")) {
      a.refusal = "Kimi linear attention (KDA layers with MLA layers) is not built";
      return a;
    }
    a.mla = true;
    a.q_lora = ConfigInt(c, "q_lora_rank", 0);
    a.kv_lora = ConfigInt(c, "kv_lora_rank", 0);
    a.nope = ConfigInt(c, "qk_nope_head_dim", 0);
    a.rope = ConfigInt(c, "qk_rope_head_dim", 0);
    a.v_dim = ConfigInt(c, "v_head_dim", 0);
    a.qk = a.nope + a.rope;
    if (a.kv_lora <= 0 || a.nope <= 0 || a.rope <= 0 || a.rope % 2 != 0 || a.v_dim <= 0) {
      a.refusal = "multi-head latent attention without kv_lora_rank, qk_nope_head_dim, an even qk_rope_head_dim "
                  "and v_head_dim";
      return a;
    }
    if (f.kv_heads > 0 && f.kv_heads != f.heads) {
      a.refusal = "multi-head latent attention with fewer KV heads than heads is not built";
      return a;
    }
    a.scaling = 1.0 / std::sqrt(double(a.qk));
    const json* r = RopeConfig(c);
    if (r != nullptr && !RopeType(r).empty() && RopeType(r) != "default") {
      const double factor = ConfigNumber(*r, "factor", 1.0);
      const double all_dim = ConfigNumber(*r, "mscale_all_dim", 0.0);
      if (all_dim != 0) a.scaling *= YarnMscale(factor, all_dim) * YarnMscale(factor, all_dim);
    }
    if (type == "deepseek_v2") {
      a.rope_style = RopeStyle::kComplex;
    } else if (type == "deepseek_v32") {
      a.rope_style = RopeStyle::kSlices;
    } else if (type == "glm_moe_dsa") {
      // transformers' GLM-5 rotates the halves despite rope_interleave.
      a.rope_style = RopeStyle::kHalf;
    } else {
      a.rope_style = ConfigBool(c, "rope_interleave", true) ? RopeStyle::kInterleaved : RopeStyle::kHalf;
    }
    a.index_topk = ConfigInt(c, "index_topk", 0);
    a.index_heads = ConfigInt(c, "index_n_heads", 0);
    a.index_dim = ConfigInt(c, "index_head_dim", 0);
    if (a.index_topk > 0 || a.index_heads > 0) {
      if (a.index_topk <= 0 || a.index_heads <= 0 || a.index_dim <= a.rope || a.q_lora <= 0) {
        a.refusal = "sparse attention indexer without index_topk, index_n_heads, index_head_dim > qk_rope_head_dim "
                    "and a q_lora_rank";
        return a;
      }
      a.glm_indexer = type == "glm_moe_dsa";
      a.notes.push_back("sparse attention: the indexer picks " + std::to_string(a.index_topk) +
                        " keys per query (all of them when the sequence is no longer)");
    }
  }
  // Rotary scaling of cos / sin (yarn's attention factor; 1 otherwise).
  if (const json* r = RopeConfig(c); r != nullptr && (RopeType(r) == "yarn")) {
    const double factor = ConfigNumber(*r, "factor", 1.0);
    if (r->contains("attention_factor") && (*r)["attention_factor"].is_number()) {
      a.rope_attention = (*r)["attention_factor"].get<double>();
    } else {
      const double ms = ConfigNumber(*r, "mscale", 0.0), all = ConfigNumber(*r, "mscale_all_dim", 0.0);
      a.rope_attention = ms != 0 && all != 0 ? YarnMscale(factor, ms) / YarnMscale(factor, all) : YarnMscale(factor, 1.0);
    }
  }

  // Mixture of experts.
  a.expert_intermediate = ConfigInt(c, "moe_intermediate_size", f.intermediate);
  a.shared_intermediate = ConfigInt(c, "shared_expert_intermediate_size", f.intermediate);
  const std::string scoring = c.contains("scoring_func") && c["scoring_func"].is_string()
                                  ? c["scoring_func"].get<std::string>()
                                  : "";
  const bool deepseek_moe = a.mla || type.rfind("deepseek", 0) == 0 || type == "kimi_k2";
  if (type == "gpt_oss") {
    a.gpt_oss = true;
    a.routing = Routing::kGptOss;
    a.swiglu_limit = ConfigNumber(c, "swiglu_limit", 7.0);
    a.fused_experts = true;
  } else if (type == "minimax_m2") {
    a.routing = Routing::kSigmoidBias;
    a.qk_norm_full = ConfigBool(c, "use_qk_norm", true);
    a.fused_experts = true;
    if (scoring != "" && scoring != "sigmoid") a.refusal = "MiniMax-M2 routing '" + scoring + "' is not built";
  } else if (deepseek_moe && f.experts > 0) {
    a.fused_experts = true;
    a.n_group = ConfigInt(c, "n_group", 1);
    a.topk_group = ConfigInt(c, "topk_group", 1);
    a.norm_topk = ConfigBool(c, "norm_topk_prob", type != "deepseek_v2");
    a.routed_scale = ConfigNumber(c, "routed_scaling_factor", 1.0);
    if (f.shared_experts > 0) a.shared_intermediate = a.expert_intermediate * f.shared_experts;
    const std::string method = c.contains("topk_method") && c["topk_method"].is_string()
                                   ? c["topk_method"].get<std::string>()
                                   : "";
    if (type == "deepseek_v2") {
      a.routing = Routing::kDeepseekV2;
      a.greedy = method != "group_limited_greedy";
      a.grouped = !a.greedy;
      if (scoring != "" && scoring != "softmax") a.refusal = "DeepSeek-V2 routing '" + scoring + "' is not built";
    } else {
      // DeepSeek-V3 and its descendants route with sigmoid scores (transformers
      // has no other scoring for them).
      a.routing = Routing::kDeepseekV3;
      a.grouped = true;
      a.mask_neg_inf = type == "deepseek_v32" || type == "glm_moe_dsa";
      if (scoring != "" && scoring != "sigmoid") {
        a.refusal = "DeepSeek routing with scoring_func '" + scoring + "' is not built (sigmoid is)";
      }
    }
    if (a.grouped && (a.n_group <= 0 || f.experts % a.n_group != 0 || f.experts / a.n_group < 2 ||
                      a.topk_group > a.n_group)) {
      a.refusal = "group-limited routing with n_group not dividing the experts into groups of two or more";
    }
  }
  if (!a.refusal.empty()) return a;

  // Which layers are routed and which slide, for every real layer.
  const int64_t L = f.layers;
  std::vector<bool> moe(size_t(L), f.experts > 0), sliding(size_t(L), f.sliding_window > 0), shared(size_t(L), false);
  if (a.index_topk > 0 && c.contains("indexer_types") && c["indexer_types"].is_array() &&
      int64_t(c["indexer_types"].size()) == L) {
    for (int64_t i = 1; i < L; ++i) {
      const json& t = c["indexer_types"][size_t(i)];
      shared[size_t(i)] = t.is_string() && t.get<std::string>() == "shared";
    }
  }
  if (f.experts > 0) {
    if (c.contains("mlp_layer_types") && c["mlp_layer_types"].is_array() &&
        int64_t(c["mlp_layer_types"].size()) == L) {
      for (int64_t i = 0; i < L; ++i) {
        const json& t = c["mlp_layer_types"][size_t(i)];
        moe[size_t(i)] = t.is_string() && t.get<std::string>() == "sparse";
      }
    } else if (c.contains("moe_layer_freq") && c["moe_layer_freq"].is_array() &&
               int64_t(c["moe_layer_freq"].size()) == L) {
      for (int64_t i = 0; i < L; ++i) {
        const json& t = c["moe_layer_freq"][size_t(i)];
        moe[size_t(i)] = t.is_number() && t.get<double>() != 0;
      }
    } else if (deepseek_moe || Has(c, "first_k_dense_replace")) {
      const int64_t first_dense = c.contains("first_k_dense_replace") && c["first_k_dense_replace"].is_number_integer()
                                      ? std::max<int64_t>(0, c["first_k_dense_replace"].get<int64_t>())
                                      : 0;
      const int64_t freq = ConfigInt(c, "moe_layer_freq", 1);
      for (int64_t i = 0; i < L; ++i) moe[size_t(i)] = i >= first_dense && i % freq == 0;
    }
  }
  if (f.sliding_window > 0 && c.contains("layer_types") && c["layer_types"].is_array() &&
      int64_t(c["layer_types"].size()) == L) {
    for (int64_t i = 0; i < L; ++i) {
      const json& t = c["layer_types"][size_t(i)];
      sliding[size_t(i)] = t.is_string() && t.get<std::string>() == "sliding_attention";
    }
  }
  // The first layers, unless they miss a kind of layer the model has: then
  // the first layer of each kind, in order.
  auto kind = [&](int64_t i) { return int(moe[size_t(i)]) * 4 + int(sliding[size_t(i)]) * 2 + int(shared[size_t(i)]); };
  std::set<int> kinds_all, kinds_first;
  for (int64_t i = 0; i < L; ++i) kinds_all.insert(kind(i));
  for (int64_t i = 0; i < layers_built; ++i) kinds_first.insert(kind(i));
  std::vector<int64_t> chosen;
  if (kinds_first.size() < kinds_all.size() && layers_built > 1) {
    std::set<int> seen;
    for (int64_t i = 0; i < L && int64_t(chosen.size()) < layers_built; ++i) {
      if (seen.insert(kind(i)).second) chosen.push_back(i);
    }
    for (int64_t i = 0; i < L && int64_t(chosen.size()) < layers_built; ++i) {
      if (std::find(chosen.begin(), chosen.end(), i) == chosen.end()) chosen.push_back(i);
    }
    std::sort(chosen.begin(), chosen.end());
    std::string which;
    for (int64_t i : chosen) {
      which += (which.empty() ? "" : ", ") + std::to_string(i) + " (" + (moe[size_t(i)] ? "MoE" : "dense MLP") +
               (f.sliding_window > 0 ? (sliding[size_t(i)] ? ", sliding window" : ", full attention") : "") +
               (shared[size_t(i)] ? ", shared indexer" : "") + ")";
    }
    a.notes.push_back("layers built: " + which + ", one of each kind of layer the model has");
  } else {
    for (int64_t i = 0; i < layers_built; ++i) chosen.push_back(i);
  }
  for (int64_t i : chosen) {
    a.index.push_back(i);
    a.moe.push_back(moe[size_t(i)]);
    a.sliding.push_back(sliding[size_t(i)]);
    a.shared_index.push_back(shared[size_t(i)] && a.index.size() > 1);
  }
  for (size_t i = 0; i < a.index.size(); ++i) {
    if (a.shared_index[i]) {
      a.notes.push_back("layer " + std::to_string(a.index[i]) +
                        " reuses the indexer top-k of the layer built before it (in the model, of layer " +
                        std::to_string(a.index[i] - 1) + ")");
    }
  }
  return a;
}

struct Layer {
  int64_t index = 0;
  bool moe = false, sliding = false;
  Norm ln1, ln2;
  at::Tensor wq, wk, wv, wo, bq, bk, bv, bo, q_norm, k_norm;
  at::Tensor sinks;                                   // gpt-oss: one logit per head
  // Multi-head latent attention.
  at::Tensor q_a, q_a_b, q_a_norm, q_b, kv_a, kv_a_b, kv_a_norm, kv_b;
  // Lightning indexer.
  at::Tensor ix_wq_b, ix_wk, ix_weights;
  Norm ix_k_norm;
  at::Tensor past_ix_k;
  at::Tensor w_gate, w_up, w_down, b_up, b_down;  // dense MLP
  at::Tensor router, router_b, score_bias;        // [experts, hidden], gpt-oss bias, correction bias
  std::vector<at::Tensor> e_gate, e_up, e_down;   // experts (e_up: gate_up when fused)
  std::vector<at::Tensor> e_gate_up_b, e_down_b;  // gpt-oss expert biases
  at::Tensor s_gate, s_up, s_down;                // shared experts, as one MLP
  at::Tensor past_k, past_v;
};

}  // namespace

BuildPlan PlanDecoder(const selection::Features& f, const json& config, const CaptureProfile& profile,
                    const BuildOptions& options) {
  BuildPlan plan;
  plan.family = "decoder";
  auto refuse = [&](std::string why) {
    plan.buildable = false;
    plan.reason = std::move(why);
    return plan;
  };
  if (f.structure != "decoder") {
    return refuse("the " + (f.structure.empty() ? std::string("unknown") : f.structure) +
                  " structure is not built yet (decoder-only models are)");
  }
  if (f.attention != "mha" && f.attention != "gqa" && f.attention != "mqa" && f.attention != "mla") {
    return refuse("attention kind '" + f.attention + "' is not built yet (MHA, GQA, MQA and MLA are)");
  }
  if (config.contains("block_configs") && config["block_configs"].is_array()) {
    return refuse("per-block dimensions (block_configs: each layer's FFN width, KV-head grouping, no-op or linear "
                  "attention) are not built");
  }
  if (f.hidden <= 0 || f.layers <= 0 || f.heads <= 0 || f.vocab <= 0 || f.intermediate <= 0) {
    return refuse("hidden size, layers, heads, vocabulary or intermediate size unknown");
  }
  if (config.contains("num_attention_heads_per_layer") && config["num_attention_heads_per_layer"].is_array()) {
    return refuse("per-layer head counts (num_attention_heads_per_layer), per-layer-type rope parameters and the "
                  "attention output gate are not built");
  }
  if (config.contains("hybrid_layer_pattern") || config.contains("swa_num_key_value_heads")) {
    return refuse("per-layer attention shapes (hybrid_layer_pattern: sliding-window layers with their own heads, "
                  "KV heads, rope base and sink bias; v_head_dim != head_dim) are not built");
  }
  const int64_t kv = f.kv_heads > 0 ? f.kv_heads : f.heads;
  if (f.heads % kv != 0) return refuse("attention heads are not a multiple of the KV heads");
  const int64_t head_dim = f.head_dim > 0 ? f.head_dim : f.hidden / f.heads;
  if (head_dim <= 0 || head_dim % 2 != 0) return refuse("head dimension must be even and positive");
  if (f.position != "rope" && f.position != "alibi" && f.position != "learned" && f.position != "none") {
    if (f.position.empty()) {
      return refuse("the config names no position scheme (no rope, ALiBi or position table key) and " +
                    (f.model_type.empty() ? std::string("its model type") : "model type '" + f.model_type + "'") +
                    " is not in transformers, so its modeling code cannot say");
    }
    return refuse("position scheme '" + f.position + "' is not built for decoders (rope, alibi, learned and none are)");
  }
  if (f.rope_scaling == "mrope") return refuse("multimodal rope (mrope) is not built yet");
  if (Has(config, "hc_mult") || Has(config, "compress_ratios")) {
    return refuse("DeepSeek-V4 attention is not built: hyper-connections (hc_mult), compressed sparse attention "
                  "(compress_ratios) and the grouped low-rank output (o_lora_rank)");
  }
  const bool v3_class = DeepseekV3Class(f) && f.norm.empty();
  if (v3_class) {
    plan.notes.push_back("RMSNorm and " + (f.activation.empty() ? std::string("SiLU") : f.activation) +
                         " as DeepseekV3ForCausalLM has (the config names no norm" +
                         (f.activation.empty() ? " or activation)" : ")"));
  }
  if (f.norm != "rmsnorm" && f.norm != "layernorm" && !v3_class) {
    return refuse("norm kind '" + f.norm + "' is not built");
  }
  if (f.norm_placement == "post") return refuse("post-norm decoders are not built yet");
  if (!KnownActivation(f.activation) && !(v3_class && f.activation.empty())) {
    return refuse("activation '" + f.activation + "' is not built");
  }
  if (f.experts > 0 && (f.experts_per_token <= 0 || f.experts_per_token > f.experts)) {
    return refuse("mixture of experts without a valid number of experts per token");
  }
  if (f.position == "learned" && f.context <= 0) return refuse("learned positions without a context length");
  if (f.attention == "mla" && f.position != "rope") return refuse("multi-head latent attention without rotary positions");

  plan.layers_total = f.layers;
  plan.layers_built = std::min(f.layers, std::max<int64_t>(1, options.max_layers));
  Arch arch = ReadArch(f, config, plan.layers_built);
  if (!arch.refusal.empty()) return refuse(arch.refusal);
  if (arch.gpt_oss && f.experts <= 0) return refuse("gpt-oss without experts");
  if (!f.quantization.empty()) plan.notes.push_back(QuantizationNote(f.quantization, profile.dtype));
  for (std::string& n : arch.notes) plan.notes.push_back(std::move(n));

  const std::string type = f.model_type;
  plan.gemma = type.rfind("gemma", 0) == 0;
  plan.attn_softcap = ConfigNumber(config, "attn_logit_softcapping", 0.0);
  plan.final_softcap = ConfigNumber(config, "final_logit_softcapping", 0.0);
  plan.separate_parallel_norms = ConfigBool(config, "new_decoder_architecture", false);
  plan.parallel_residual = plan.separate_parallel_norms || ConfigBool(config, "use_parallel_residual", false) ||
                           ConfigBool(config, "parallel_attn", false) ||
                           type == "phi" || type == "phi-msft" || type == "gptj";
  plan.qk_norm = ConfigBool(config, "qk_norm", false) || ConfigBool(config, "use_qk_norm", false) || type == "qwen3" ||
                 type == "qwen3_moe" || type == "olmo2" || type == "gemma3_text";
  // Biases: what the config says, else the classic LayerNorm families have them.
  plan.linear_bias = f.norm == "layernorm";
  for (const char* key : {"bias", "use_bias", "add_bias_linear", "enable_bias", "attention_bias"}) {
    if (config.contains(key) && config[key].is_boolean()) plan.linear_bias = config[key].get<bool>();
  }
  plan.rotary_fraction = ConfigNumber(config, "partial_rotary_factor", ConfigNumber(config, "rotary_pct", 1.0));
  if (const int64_t rd = ConfigInt(config, "rotary_dim", 0); rd > 0) plan.rotary_fraction = double(rd) / double(head_dim);
  if (!(plan.rotary_fraction > 0 && plan.rotary_fraction <= 1)) plan.rotary_fraction = 1.0;
  plan.expert_intermediate = arch.expert_intermediate;

  const double eb = ElementBytes(profile.dtype);
  const double H = double(f.hidden), I = double(f.intermediate), hd = double(head_dim), NH = double(f.heads);
  double attn = H * (NH + 2.0 * double(kv)) * hd + NH * hd * H;
  double kv_width = 2.0 * double(kv) * hd;  // cached values per token and layer
  double qk_width = hd, v_width = hd;
  if (arch.mla) {
    const double qk = double(arch.qk), v = double(arch.v_dim), ql = double(arch.q_lora), kl = double(arch.kv_lora);
    attn = (arch.q_lora > 0 ? H * ql + ql * NH * qk : H * NH * qk) + H * (kl + double(arch.rope)) +
           kl * NH * (double(arch.nope) + v) + NH * v * H;
    if (arch.index_topk > 0) {
      attn += ql * double(arch.index_heads * arch.index_dim) + H * double(arch.index_dim) + H * double(arch.index_heads);
    }
    kv_width = NH * (qk + v) + double(arch.index_dim);
    qk_width = qk, v_width = v;
  }
  const double EI = double(arch.expert_intermediate), SI = double(arch.shared_intermediate);
  const double dense = (f.gated_mlp || arch.mla ? 3.0 : 2.0) * H * I;
  const double moe = double(f.experts) * 3.0 * H * EI + double(f.experts) * H + (f.shared_experts > 0 ? 3.0 * H * SI : 0.0);
  const double active_moe = double(f.experts_per_token) * 3.0 * H * EI + (f.shared_experts > 0 ? 3.0 * H * SI : 0.0);
  double layer_weights = 0, layer_active = 0;
  for (size_t i = 0; i < arch.moe.size(); ++i) {
    layer_weights += attn + (arch.moe[i] ? moe : dense);
    layer_active += attn + (arch.moe[i] ? active_moe : dense);
  }
  const double embed = double(f.vocab) * H * (f.tied_embeddings ? 1.0 : 2.0) +
                       (f.position == "learned" ? double(f.context) * H : 0.0);
  plan.weight_bytes = eb * (embed + layer_weights);
  const double B = double(profile.batch), S = double(std::max<int64_t>(1, profile.seq_len));
  const double T = double(profile.past_len) + S;
  const double LB = double(plan.layers_built);
  const double kv_cache = B * double(profile.past_len) * kv_width * LB;
  // Scores in fp32 (the indexer's too), a handful of [B, S, I] and [B, S, H]
  // intermediates, logits.
  plan.activation_bytes = 4.0 * B * (NH + double(arch.index_heads)) * S * T + eb * (kv_cache + 6.0 * B * S * (H + I)) +
                          4.0 * B * double(f.vocab);
  // Matmuls dominate: 2 flops per weight per token (the LM head on one
  // token), plus the attention scores and their product with V.
  plan.flops = 2.0 * B * S * layer_active + 2.0 * B * H * double(f.vocab) +
               2.0 * B * (NH * (qk_width + v_width) + double(arch.index_heads * arch.index_dim)) * S * T * LB;
  if (plan.weight_bytes + plan.activation_bytes > options.max_bytes) {
    char buf[160];
    std::snprintf(buf, sizeof buf, "needs about %.3g GB for %lld of %lld layers, over the %.3g GB budget",
                  (plan.weight_bytes + plan.activation_bytes) / 1e9, static_cast<long long>(plan.layers_built),
                  static_cast<long long>(plan.layers_total), options.max_bytes / 1e9);
    return refuse(buf);
  }
  plan.buildable = true;
  return plan;
}

namespace {

// Rotary embedding of `x` ([B, heads, S, d] or, with `dim` 2, [B, S, heads,
// d]) by `cos` / `sin` ([1, S, d], or [1, S, d / 2] for gpt-oss), as the
// model's transformers code applies it.
at::Tensor ApplyRope(const at::Tensor& x, const at::Tensor& cos3, const at::Tensor& sin3, RopeStyle style,
                     int64_t dim = 1) {
  switch (style) {
    case RopeStyle::kHalf: {
      at::Tensor c = cos3.unsqueeze(dim), s = sin3.unsqueeze(dim);
      return x * c + RotateHalf(x) * s;
    }
    case RopeStyle::kInterleaved: {
      at::Tensor c = cos3.unsqueeze(dim), s = sin3.unsqueeze(dim);
      const int64_t b = x.size(0), h = x.size(1), n = x.size(2), d = x.size(3);
      at::Tensor t = x.view({b, h, n, d / 2, 2}).transpose(4, 3).reshape({b, h, n, d});
      return t * c + RotateHalf(t) * s;
    }
    case RopeStyle::kSlices: {
      const int64_t half = cos3.size(-1) / 2;
      at::Tensor c = cos3.slice(-1, 0, half).unsqueeze(dim), s = sin3.slice(-1, 0, half).unsqueeze(dim);
      at::Tensor x1 = x.slice(-1, 0, std::nullopt, 2), x2 = x.slice(-1, 1, std::nullopt, 2);
      return at::cat({x1 * c - x2 * s, x2 * c + x1 * s}, -1);
    }
    case RopeStyle::kGptOss: {
      at::Tensor c = cos3.unsqueeze(dim), s = sin3.unsqueeze(dim);
      std::vector<at::Tensor> halves = at::chunk(x, 2, -1);
      return at::cat({halves[0] * c - halves[1] * s, halves[1] * c + halves[0] * s}, -1);
    }
    case RopeStyle::kComplex:
      break;
  }
  TORCH_INTERNAL_ASSERT(false, "complex rope goes through ApplyComplexRope");
}

// DeepSeek-V2: x viewed as complex pairs times freqs_cis ([1, S, d / 2],
// complex).
at::Tensor ApplyComplexRope(const at::Tensor& x, const at::Tensor& freqs_cis) {
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end() - 1);
  shape.push_back(-1);
  shape.push_back(2);
  at::Tensor xc = at::view_as_complex(x.to(at::kFloat).reshape(shape));
  return at::view_as_real(xc * freqs_cis.unsqueeze(1)).flatten(3).type_as(x);
}

}  // namespace

Status RunDecoder(const selection::Features& f, const BuildPlan& plan, const CaptureProfile& profile, ModelSession& rec,
                uint64_t seed) {
  if (!plan.buildable) return Status::InvalidArgument("model is not buildable: " + plan.reason);
  try {
    at::manual_seed(seed);
    const at::ScalarType dt = ToScalarType(profile.dtype);
    const Weights W{dt, &rec};
    const json& config = plan.config;
    const Arch arch = ReadArch(f, config, plan.layers_built);
    if (!arch.refusal.empty()) return Status::InvalidArgument("model is not buildable: " + arch.refusal);
    const int64_t H = f.hidden, heads = f.heads, kv = f.kv_heads > 0 ? f.kv_heads : f.heads;
    const int64_t hd = f.head_dim > 0 ? f.head_dim : H / heads, I = f.intermediate, rep = heads / kv;
    const int64_t B = profile.batch, S = std::max<int64_t>(1, profile.seq_len), P = profile.past_len, T = P + S;
    const bool rms = f.norm == "rmsnorm" || (f.norm.empty() && DeepseekV3Class(f));
    const double eps = rms ? 1e-6 : 1e-5;
    const std::string act = f.activation.empty() && DeepseekV3Class(f) ? "silu" : f.activation;
    const int64_t rot = arch.mla ? arch.rope
                                 : std::max<int64_t>(2, static_cast<int64_t>(double(hd) * plan.rotary_fraction) / 2 * 2);
    const bool dsa = arch.index_topk > 0;
    const int64_t E = f.experts, EI = arch.expert_intermediate, SI = arch.shared_intermediate;
    // Gemma's RMSNorm scales by (1 + weight).
    auto apply_norm = [&](const at::Tensor& t, const Norm& n) {
      return plan.gemma ? ApplyNorm(t, Norm{n.weight + 1.0, {}}, true, eps) : ApplyNorm(t, n, rms, eps);
    };
    auto rms_norm = [&](const at::Tensor& t, const at::Tensor& w) { return ApplyNorm(t, Norm{w, {}}, true, eps); };
    auto norm = [&](int64_t n) { return Norm{W.Ones({n}), rms ? at::Tensor() : W.Zeros({n})}; };
    auto bias = [&](int64_t n) { return plan.linear_bias ? W({n}) : at::Tensor(); };

    // Weights and inputs are made before recording starts.
    at::Tensor embed = W({f.vocab, H});
    at::Tensor lm_head = f.tied_embeddings ? embed : W({f.vocab, H});
    at::Tensor pos_embed = f.position == "learned" ? W({f.context, H}) : at::Tensor();
    Norm ln_f = norm(H);
    std::vector<Layer> layers(static_cast<size_t>(plan.layers_built));
    for (size_t li = 0; li < layers.size(); ++li) {
      Layer& l = layers[li];
      l.index = arch.index[li];
      l.moe = arch.moe[li];
      l.sliding = arch.sliding[li];
      l.ln1 = norm(H);
      l.ln2 = norm(H);
      if (arch.mla) {
        const int64_t qk = arch.qk, v = arch.v_dim;
        if (arch.q_lora > 0) {
          l.q_a = W({arch.q_lora, H}), l.q_a_b = bias(arch.q_lora), l.q_a_norm = W.Ones({arch.q_lora});
          l.q_b = W({heads * qk, arch.q_lora});
        } else {
          l.wq = W({heads * qk, H});
        }
        l.kv_a = W({arch.kv_lora + arch.rope, H}), l.kv_a_b = bias(arch.kv_lora + arch.rope);
        l.kv_a_norm = W.Ones({arch.kv_lora});
        l.kv_b = W({heads * (arch.nope + v), arch.kv_lora});
        l.wo = W({H, heads * v}), l.bo = bias(H);
        if (dsa) {
          l.ix_wq_b = W({arch.index_heads * arch.index_dim, arch.q_lora});
          l.ix_wk = W({arch.index_dim, H});
          l.ix_k_norm = MakeLayerNorm(W, arch.index_dim);
          l.ix_weights = W({arch.index_heads, H});
          if (P > 0) l.past_ix_k = W({B, P, arch.index_dim});
        }
        if (P > 0) l.past_k = W({B, heads, P, qk}), l.past_v = W({B, heads, P, v});
      } else {
        l.wq = W({heads * hd, H}), l.wk = W({kv * hd, H}), l.wv = W({kv * hd, H}), l.wo = W({H, heads * hd});
        l.bq = bias(heads * hd), l.bk = bias(kv * hd), l.bv = bias(kv * hd), l.bo = bias(H);
        if (plan.qk_norm) {
          if (arch.qk_norm_full) {
            l.q_norm = W.Ones({heads * hd}), l.k_norm = W.Ones({kv * hd});
          } else {
            l.q_norm = W.Ones({hd}), l.k_norm = W.Ones({hd});
          }
        }
        if (arch.gpt_oss) l.sinks = W({heads});
        if (P > 0) l.past_k = W({B, kv, P, hd}), l.past_v = W({B, kv, P, hd});
      }
      if (l.moe) {
        l.router = W({E, H});
        if (arch.gpt_oss) l.router_b = W({E});
        if (arch.routing == Routing::kDeepseekV3 || arch.routing == Routing::kSigmoidBias) {
          l.score_bias = W.Zeros({E});  // e_score_correction_bias, kept in fp32
        }
        for (int64_t e = 0; e < E; ++e) {
          if (arch.gpt_oss) {
            l.e_up.push_back(W({H, 2 * EI}));
            l.e_gate_up_b.push_back(W({2 * EI}));
            l.e_down.push_back(W({EI, H}));
            l.e_down_b.push_back(W({H}));
          } else if (arch.fused_experts) {
            l.e_up.push_back(W({2 * EI, H}));
            l.e_down.push_back(W({H, EI}));
          } else {
            l.e_gate.push_back(W({EI, H}));
            l.e_up.push_back(W({EI, H}));
            l.e_down.push_back(W({H, EI}));
          }
        }
        if (f.shared_experts > 0) l.s_gate = W({SI, H}), l.s_up = W({SI, H}), l.s_down = W({H, SI});
      } else {
        if (f.gated_mlp || arch.mla) l.w_gate = W({I, H});
        l.w_up = W({I, H}), l.w_down = W({H, I});
        if (!arch.mla) l.b_up = bias(I), l.b_down = bias(H);
      }
    }
    at::Tensor ids = at::randint(0, f.vocab, {B, S}, at::kLong);
    at::Tensor inv_freq = 1.0 / at::pow(10000.0, at::arange(0, rot, 2, at::kFloat) / static_cast<double>(rot));
    at::Tensor slopes = f.position == "alibi" ? AlibiSlopes(heads) : at::Tensor();
    for (Layer& l : layers) {
      if (l.score_bias.defined()) l.score_bias = l.score_bias.to(at::kFloat);
    }

    c10::InferenceMode guard(!rec.training);
    rec.Start();
    at::Tensor x;
    {
      ModuleScope s(&rec, "embed_tokens");
      x = at::embedding(embed, ids);
      if (plan.gemma) x = x * std::sqrt(static_cast<double>(H));
    }
    if (f.position == "learned") {
      ModuleScope s(&rec, "embed_positions");
      at::Tensor positions = at::arange(P, T, at::kLong).clamp_max(f.context - 1).unsqueeze(0);
      x = x + at::embedding(pos_embed, positions);
    }
    at::Tensor cos, sin, freqs_cis;  // [1, S, rot] (gpt-oss: rot / 2); freqs_cis: DeepSeek-V2
    if (f.position == "rope") {
      ModuleScope s(&rec, "rotary_emb");
      at::Tensor pos = at::arange(P, T, at::kLong).unsqueeze(0).unsqueeze(1).to(at::kFloat);
      at::Tensor freqs = at::matmul(inv_freq.unsqueeze(0).unsqueeze(-1), pos).transpose(1, 2);
      if (arch.rope_style == RopeStyle::kComplex) {
        freqs_cis = at::polar(at::ones_like(freqs), freqs) * arch.rope_attention;
      } else {
        at::Tensor emb = arch.gpt_oss ? freqs : at::cat({freqs, freqs}, -1);
        cos = (emb.cos() * arch.rope_attention).to(dt);
        sin = (emb.sin() * arch.rope_attention).to(dt);
      }
    }
    // Causal masks [1, 1, S, T]: full attention and, where layers slide, the
    // sliding window's. The sparse attention indexer reads the mask even for
    // one token.
    at::Tensor mask, sliding_mask;
    if (S > 1 || f.position == "alibi" || dsa) {
      ModuleScope s(&rec, "causal_mask");
      at::Tensor m = at::full({S, T}, Lowest(dt), at::TensorOptions().dtype(dt)).triu(P + 1);
      mask = m.unsqueeze(0).unsqueeze(0);
      const bool any_sliding = std::find(arch.sliding.begin(), arch.sliding.end(), true) != arch.sliding.end();
      if (any_sliding && f.sliding_window > 0 && T > f.sliding_window) {
        // Keys further back than the window are masked too.
        at::Tensor w = m + at::full({S, T}, Lowest(dt), at::TensorOptions().dtype(dt)).tril(P - f.sliding_window);
        sliding_mask = w.clamp_min(Lowest(dt)).unsqueeze(0).unsqueeze(0);
      }
      if (f.position == "alibi") {
        at::Tensor distance = at::arange(0, T, at::kFloat).unsqueeze(0);  // [1, T]
        mask = mask + (slopes.view({1, heads, 1, 1}) * distance.view({1, 1, 1, T})).to(dt);
      }
    }
    at::Tensor last_topk;  // the sparse attention indexer's last selection
    for (size_t li = 0; li < layers.size(); ++li) {
      Layer& l = layers[li];
      const std::string path = "layers." + std::to_string(l.index);
      const at::Tensor& layer_mask = l.sliding && sliding_mask.defined() ? sliding_mask : mask;
      at::Tensor residual = x;
      at::Tensor h;
      {
        ModuleScope s(&rec, path + ".input_layernorm");
        h = apply_norm(x, l.ln1);
      }
      at::Tensor attn_out;
      if (arch.mla) {
        ModuleScope s(&rec, path + ".self_attn");
        const int64_t qk = arch.qk, v = arch.v_dim, nope = arch.nope, r = arch.rope;
        at::Tensor q_resid, q;
        if (arch.q_lora > 0) {
          q_resid = rms_norm(at::linear(h, l.q_a, l.q_a_b), l.q_a_norm);
          q = at::linear(q_resid, l.q_b);
        } else {
          q = at::linear(h, l.wq);
        }
        q = q.view({B, S, -1, qk}).transpose(1, 2);
        std::vector<at::Tensor> q_parts = q.split_with_sizes({nope, r}, -1);
        at::Tensor compressed = at::linear(h, l.kv_a, l.kv_a_b);
        std::vector<at::Tensor> kv_parts = compressed.split_with_sizes({arch.kv_lora, r}, -1);
        at::Tensor kv_up = at::linear(rms_norm(kv_parts[0], l.kv_a_norm), l.kv_b).view({B, S, -1, nope + v});
        at::Tensor k_pass, value;
        if (arch.glm_indexer) {
          std::vector<at::Tensor> parts = kv_up.split_with_sizes({nope, v}, -1);
          k_pass = parts[0].transpose(1, 2), value = parts[1].transpose(1, 2);
        } else {
          std::vector<at::Tensor> parts = kv_up.transpose(1, 2).split_with_sizes({nope, v}, -1);
          k_pass = parts[0], value = parts[1];
        }
        at::Tensor k_rot = kv_parts[1].view({B, 1, S, r});
        at::Tensor q_rot = q_parts[1];
        if (arch.rope_style == RopeStyle::kComplex) {
          q_rot = ApplyComplexRope(q_rot, freqs_cis);
          k_rot = ApplyComplexRope(k_rot, freqs_cis);
        } else {
          q_rot = ApplyRope(q_rot, cos, sin, arch.rope_style);
          k_rot = ApplyRope(k_rot, cos, sin, arch.rope_style);
        }
        k_rot = k_rot.expand({B, heads, S, r});
        at::Tensor query = at::cat({q_parts[0], q_rot}, -1);
        at::Tensor key = at::cat({k_pass, k_rot}, -1);
        if (P > 0) {
          // The cache holds the expanded keys and values, as transformers' does.
          key = at::cat({l.past_k, key}, -2);
          value = at::cat({l.past_v, value}, -2);
        }
        at::Tensor attn_mask = layer_mask;
        if (dsa && arch.shared_index[li] && last_topk.defined()) {
          // indexer_types "shared": the previous layer's selection, no indexer.
          attn_mask = arch.glm_indexer ? at::full({B, S, T}, -std::numeric_limits<double>::infinity(),
                                                  at::TensorOptions().dtype(dt))
                                                 .scatter_(-1, last_topk, 0.0)
                                                 .unsqueeze(1) +
                                             layer_mask
                                       : layer_mask.masked_fill(at::ones({B, S, T}, at::TensorOptions().dtype(at::kBool))
                                                                    .scatter(-1, last_topk.to(at::kLong), false)
                                                                    .unsqueeze(1),
                                                                Lowest(dt));
        } else if (dsa) {
          // The lightning indexer scores every key for each query and keeps
          // the index_topk best; when T <= index_topk the selection keeps
          // every key, but its ops run all the same.
          ModuleScope ix(&rec, path + ".self_attn.indexer");
          const int64_t ih = arch.index_heads, id = arch.index_dim;
          const double softmax_scale = 1.0 / std::sqrt(double(id));
          at::Tensor iq = at::linear(q_resid, l.ix_wq_b).view({B, S, ih, id});
          at::Tensor mask3 = layer_mask.select(1, 0);  // [1, S, T]
          at::Tensor index_scores;
          if (arch.glm_indexer) {
            std::vector<at::Tensor> qp = iq.split_with_sizes({r, id - r}, -1);
            iq = at::cat({ApplyRope(qp[0], cos, sin, RopeStyle::kHalf, 2), qp[1]}, -1);
            at::Tensor ik = at::layer_norm(at::linear(h, l.ix_wk), {id}, l.ix_k_norm.weight, l.ix_k_norm.bias, 1e-6);
            std::vector<at::Tensor> kp = ik.split_with_sizes({r, id - r}, -1);
            at::Tensor ik_rot = ApplyRope(kp[0].unsqueeze(2), cos, sin, RopeStyle::kHalf, 2).squeeze(2);
            ik = at::cat({ik_rot, kp[1]}, -1);
            if (P > 0) ik = at::cat({l.past_ix_k, ik}, 1);
            at::Tensor weights = at::linear(h, l.ix_weights).to(at::kFloat) * std::pow(double(ih), -0.5);
            at::Tensor sc = at::einsum("bshd,btd->bsht", {iq.to(at::kFloat), ik.to(at::kFloat)}) * softmax_scale;
            sc = at::relu(sc);
            index_scores = at::einsum("bsht,bsh->bst", {sc, weights}) + mask3;
          } else {
            std::vector<at::Tensor> qp = iq.split_with_sizes({r, id - r}, -1);
            at::Tensor ik = at::layer_norm(at::linear(h, l.ix_wk), {id}, l.ix_k_norm.weight, l.ix_k_norm.bias, 1e-6)
                                .unsqueeze(2);
            std::vector<at::Tensor> kp = ik.split_with_sizes({r, id - r}, -1);
            iq = at::cat({ApplyRope(qp[0], cos, sin, RopeStyle::kHalf, 2), qp[1]}, -1);
            ik = at::cat({ApplyRope(kp[0], cos, sin, RopeStyle::kHalf, 2), kp[1]}, -1).squeeze(2);
            if (P > 0) ik = at::cat({l.past_ix_k, ik}, 1);
            at::Tensor sc = at::matmul(iq.to(at::kFloat), ik.transpose(-1, -2).to(at::kFloat).unsqueeze(1)) * softmax_scale;
            sc = at::relu(sc);
            at::Tensor weights = at::linear(h.to(l.ix_weights.scalar_type()), l.ix_weights).to(at::kFloat) *
                                 std::pow(double(ih), -0.5);
            index_scores = at::matmul(weights.unsqueeze(-2), sc).squeeze(-2) + mask3;
          }
          const int64_t k = std::min<int64_t>(arch.index_topk, index_scores.size(-1));
          at::Tensor chosen = std::get<1>(index_scores.topk(k, -1));
          last_topk = chosen;
          if (arch.glm_indexer) {
            at::Tensor index_mask = at::full({B, S, T}, -std::numeric_limits<double>::infinity(),
                                             at::TensorOptions().dtype(dt));
            index_mask.scatter_(-1, chosen, 0.0);
            attn_mask = index_mask.unsqueeze(1) + layer_mask;
          } else {
            chosen = chosen.to(at::kInt);
            at::Tensor unselected =
                at::ones({B, S, T}, at::TensorOptions().dtype(at::kBool)).scatter(-1, chosen.to(at::kLong), false);
            attn_mask = layer_mask.masked_fill(unselected.unsqueeze(1), Lowest(dt));
          }
        }
        at::Tensor scores = at::matmul(query, key.transpose(2, 3)) * arch.scaling;
        if (attn_mask.defined()) scores = scores + attn_mask;
        at::Tensor probs = at::softmax(scores, -1, at::kFloat).to(dt);
        at::Tensor out = at::matmul(probs, value).transpose(1, 2).contiguous();
        attn_out = at::linear(out.reshape({B, S, heads * v}).contiguous(), l.wo, l.bo);
      } else {
        ModuleScope s(&rec, path + ".self_attn");
        at::Tensor q = at::linear(h, l.wq, l.bq);
        at::Tensor k = at::linear(h, l.wk, l.bk);
        if (plan.qk_norm && arch.qk_norm_full) {
          q = rms_norm(q, l.q_norm);
          k = rms_norm(k, l.k_norm);
        }
        q = q.view({B, S, heads, hd});
        k = k.view({B, S, kv, hd});
        at::Tensor v = at::linear(h, l.wv, l.bv).view({B, S, kv, hd}).transpose(1, 2);
        if (plan.qk_norm && !arch.qk_norm_full) {
          q = plan.gemma ? apply_norm(q, Norm{l.q_norm, {}}) : ApplyNorm(q, Norm{l.q_norm, {}}, true, eps);
          k = plan.gemma ? apply_norm(k, Norm{l.k_norm, {}}) : ApplyNorm(k, Norm{l.k_norm, {}}, true, eps);
        }
        q = q.transpose(1, 2);
        k = k.transpose(1, 2);
        if (cos.defined()) {
          const RopeStyle style = arch.gpt_oss ? RopeStyle::kGptOss : RopeStyle::kHalf;
          auto rope = [&](const at::Tensor& t) {
            if (rot == hd) return ApplyRope(t, cos, sin, style);
            at::Tensor r = t.slice(-1, 0, rot), pass = t.slice(-1, rot);
            return at::cat({ApplyRope(r, cos, sin, style), pass}, -1);
          };
          q = rope(q);
          k = rope(k);
        }
        if (P > 0) {
          k = at::cat({l.past_k, k}, -2);
          v = at::cat({l.past_v, v}, -2);
        }
        if (rep > 1) {
          k = k.unsqueeze(2).expand({B, kv, rep, T, hd}).reshape({B, heads, T, hd});
          v = v.unsqueeze(2).expand({B, kv, rep, T, hd}).reshape({B, heads, T, hd});
        }
        at::Tensor scores = at::matmul(q, k.transpose(2, 3)) * (1.0 / std::sqrt(static_cast<double>(hd)));
        if (plan.attn_softcap > 0) scores = at::tanh(scores / plan.attn_softcap) * plan.attn_softcap;
        if (layer_mask.defined()) scores = scores + layer_mask;
        at::Tensor probs;
        if (arch.gpt_oss) {
          // Attention sinks: one extra logit per head joins the softmax and
          // is dropped after it.
          at::Tensor sinks = l.sinks.reshape({1, -1, 1, 1}).expand({B, -1, S, -1});
          at::Tensor logits = at::cat({scores, sinks}, -1);
          logits = logits - std::get<0>(logits.max(-1, /*keepdim=*/true));
          probs = at::softmax(logits, -1, logits.scalar_type()).slice(-1, 0, -1);
        } else {
          probs = at::softmax(scores, -1, at::kFloat).to(dt);
        }
        attn_out = at::linear(at::matmul(probs, v).transpose(1, 2).contiguous().reshape({B, S, heads * hd}), l.wo, l.bo);
      }
      at::Tensor mlp_in;
      if (plan.parallel_residual) {
        if (plan.separate_parallel_norms) {
          ModuleScope s(&rec, path + ".ln_mlp");
          mlp_in = apply_norm(residual, l.ln2);
        } else {
          mlp_in = h;  // attention and MLP read the same normalised input
        }
      } else {
        x = residual + attn_out;
        residual = x;
        ModuleScope s(&rec, path + ".post_attention_layernorm");
        mlp_in = apply_norm(x, l.ln2);
      }
      at::Tensor mlp_out;
      if (l.moe && arch.routing == Routing::kGptOss) {
        ModuleScope s(&rec, path + ".mlp");
        at::Tensor flat = mlp_in.reshape({-1, H});
        at::Tensor logits = at::linear(flat, l.router, l.router_b);
        auto [top_value, top_index] = at::topk(logits, f.experts_per_token, -1);
        top_value = at::softmax(top_value, 1, top_value.scalar_type());
        at::Tensor routing = at::zeros_like(logits).scatter_(1, top_index, top_value);
        at::Tensor out = at::zeros_like(flat);
        at::Tensor expert_mask = at::one_hot(top_index, E).permute({2, 1, 0});  // [E, k, tokens]
        at::Tensor hit = at::greater(expert_mask.sum({-1, -2}), 0).nonzero();
        const double alpha = 1.702, limit = arch.swiglu_limit;
        for (int64_t i = 0; i < hit.size(0); ++i) {
          const int64_t e = hit[i][0].item<int64_t>();
          const size_t ue = static_cast<size_t>(e);
          at::Tensor token = at::where(expert_mask[e])[1];
          at::Tensor xs = flat.index({token});
          at::Tensor gate_up = at::matmul(xs, l.e_up[ue]) + l.e_gate_up_b[ue];
          at::Tensor gate = gate_up.slice(-1, 0, std::nullopt, 2), up = gate_up.slice(-1, 1, std::nullopt, 2);
          gate = gate.clamp(std::nullopt, limit);
          up = up.clamp(-limit, limit);
          at::Tensor glu = gate * at::sigmoid(gate * alpha);
          at::Tensor y = at::matmul((up + 1) * glu, l.e_down[ue]) + l.e_down_b[ue];
          y = y * routing.index({token, e, at::indexing::None});
          out.index_add_(0, token, y.to(out.scalar_type()));
        }
        mlp_out = out.view({B, -1, H});
      } else if (l.moe && arch.fused_experts) {
        // DeepSeek-style routing, then transformers' expert loop over the
        // experts hit (gate and up fused in one weight).
        ModuleScope s(&rec, path + ".mlp");
        at::Tensor flat = mlp_in.view({-1, H});
        at::Tensor top_index, top_weights;
        if (arch.routing == Routing::kDeepseekV2) {
          at::Tensor scores = at::softmax(at::linear(flat, l.router), -1, at::kFloat);
          at::Tensor pick = scores;
          if (arch.grouped) {
            at::Tensor group_scores = std::get<0>(scores.view({-1, arch.n_group, E / arch.n_group}).max(-1));
            at::Tensor group_idx = std::get<1>(at::topk(group_scores, arch.topk_group, -1, true, false));
            at::Tensor group_mask = at::zeros_like(group_scores);
            group_mask.scatter_(1, group_idx, 1);
            at::Tensor score_mask =
                group_mask.unsqueeze(-1).expand({-1, arch.n_group, E / arch.n_group}).reshape({-1, E});
            pick = scores.masked_fill(score_mask.to(at::kBool).logical_not(), 0.0);
          }
          std::tie(top_weights, top_index) = at::topk(pick, f.experts_per_token, -1, true, false);
          if (arch.norm_topk) top_weights = top_weights / (top_weights.sum(-1, true) + 1e-20);
          top_weights = top_weights * arch.routed_scale;
        } else {
          // Router logits in fp32.
          at::Tensor logits = at::linear(flat.to(at::kFloat), l.router.to(at::kFloat));
          at::Tensor scores = logits.sigmoid();
          at::Tensor for_choice = scores + l.score_bias;
          if (arch.grouped) {
            at::Tensor group_scores =
                std::get<0>(for_choice.view({-1, arch.n_group, E / arch.n_group}).topk(2, -1)).sum(-1);
            at::Tensor group_idx = std::get<1>(at::topk(group_scores, arch.topk_group, -1, true, false));
            at::Tensor group_mask = at::zeros_like(group_scores);
            group_mask.scatter_(1, group_idx, 1);
            at::Tensor score_mask =
                group_mask.unsqueeze(-1).expand({-1, arch.n_group, E / arch.n_group}).reshape({-1, E});
            for_choice = for_choice.masked_fill(score_mask.to(at::kBool).logical_not(),
                                                arch.mask_neg_inf ? -std::numeric_limits<double>::infinity() : 0.0);
          }
          top_index = std::get<1>(at::topk(for_choice, f.experts_per_token, -1, true, false));
          top_weights = scores.gather(1, top_index);
          if (arch.routing == Routing::kSigmoidBias) {
            top_weights = (top_weights / top_weights.sum(-1, true)).to(dt);
          } else {
            if (arch.norm_topk) top_weights = top_weights / (top_weights.sum(-1, true) + 1e-20);
            top_weights = top_weights * arch.routed_scale;
          }
        }
        at::Tensor out = at::zeros_like(flat);
        at::Tensor expert_mask = at::one_hot(top_index, E).permute({2, 1, 0});  // [E, k, tokens]
        at::Tensor hit = at::greater(expert_mask.sum({-1, -2}), 0).nonzero();
        for (int64_t i = 0; i < hit.size(0); ++i) {
          const int64_t e = hit[i][0].item<int64_t>();
          const size_t ue = static_cast<size_t>(e);
          std::vector<at::Tensor> where = at::where(expert_mask[e]);  // (slot, token)
          at::Tensor xs = flat.index({where[1]});
          std::vector<at::Tensor> gate_up = at::linear(xs, l.e_up[ue]).chunk(2, -1);
          at::Tensor y = at::linear(Activate(gate_up[0], act) * gate_up[1], l.e_down[ue]);
          y = y * top_weights.index({where[1], where[0], at::indexing::None});
          out.index_add_(0, where[1], y.to(out.scalar_type()));
        }
        out = out.view({B, S, H});
        if (l.s_gate.defined()) {
          out = out + at::linear(Activate(at::linear(mlp_in, l.s_gate), act) * at::linear(mlp_in, l.s_up),
                                 l.s_down);
        }
        mlp_out = out;
      } else if (l.moe) {
        ModuleScope s(&rec, path + ".mlp");
        at::Tensor flat = mlp_in.reshape({B * S, H});
        at::Tensor routing = at::softmax(at::linear(flat, l.router), -1, at::kFloat);
        auto [weights, chosen] = at::topk(routing, f.experts_per_token, -1);
        weights = (weights / weights.sum(-1, /*keepdim=*/true)).to(dt);
        at::Tensor out = at::zeros_like(flat);
        at::Tensor expert_mask = at::one_hot(chosen, E).permute({2, 1, 0});  // [E, k, tokens]
        for (int64_t e = 0; e < E; ++e) {
          at::Tensor where = at::nonzero(expert_mask[e]);  // [n, 2]: (slot, token)
          if (where.size(0) == 0) continue;
          at::Tensor slot = where.select(1, 0), token = where.select(1, 1);
          at::Tensor xs = flat.index_select(0, token);
          at::Tensor y = at::linear(Activate(at::linear(xs, l.e_gate[static_cast<size_t>(e)]), act) *
                                        at::linear(xs, l.e_up[static_cast<size_t>(e)]),
                                    l.e_down[static_cast<size_t>(e)]);
          y = y * weights.index({token, slot}).unsqueeze(-1);
          out.index_add_(0, token, y);
        }
        if (l.s_gate.defined()) {
          out = out + at::linear(Activate(at::linear(flat, l.s_gate), act) * at::linear(flat, l.s_up), l.s_down);
        }
        mlp_out = out.view({B, S, H});
      } else {
        ModuleScope s(&rec, path + ".mlp");
        at::Tensor up = at::linear(mlp_in, l.w_up, l.b_up);
        at::Tensor inner = l.w_gate.defined() ? Activate(at::linear(mlp_in, l.w_gate), act) * up
                                              : Activate(up, act);
        mlp_out = at::linear(inner, l.w_down, l.b_down);
      }
      x = plan.parallel_residual ? residual + attn_out + mlp_out : residual + mlp_out;
    }
    {
      ModuleScope s(&rec, "norm");
      x = apply_norm(x, ln_f);
    }
    {
      // Generation computes logits for the last position only, training for all.
      ModuleScope s(&rec, "lm_head");
      x = at::linear(rec.training ? x : x.slice(1, S - 1, S), lm_head);
      if (plan.final_softcap > 0) x = at::tanh(x / plan.final_softcap) * plan.final_softcap;
    }
    rec.Stop(x);
    return Status::Ok();
  } catch (const std::exception& e) {
    rec.Stop();
    return Status::Internal(std::string("building or running the model failed: ") + e.what());
  }
}

}  // namespace coverage::runners::builder
