// The hybrid and state-space families of the model builder (model_builder.h).
//
// Hybrid ("hybrid" structure): stacks whose layers are of different kinds,
// chosen per layer by the config:
//   - Nemotron-H (nemotron_h): each layer is one mixer after an RMSNorm, a
//     Mamba-2 mixer (M), attention without positions (*), a relu2 MLP (-) or
//     a sigmoid-routed MoE of non-gated experts (E), by
//     hybrid_override_pattern (or layers_block_type);
//   - Qwen3-Next and the Qwen3.5 text models (qwen3_next, qwen3_5_text,
//     qwen3_5_moe_text): Gated DeltaNet linear attention layers with gated
//     full attention every full_attention_interval layers (or by
//     layer_types), (1 + w) RMSNorms, MoE with a gated shared expert or a
//     dense SwiGLU MLP; Qwen3.5 uses interleaved multimodal rope on text
//     positions.
// State space ("ssm" structure): RWKV-5 (rwkv5): time mixing with the
// per-head linear attention of the WKV-5 recurrence, channel mixing.
//
// Each runs the ops of the transformers implementation's torch path (the one
// taken without the CUDA kernels of mamba-ssm, causal-conv1d and fla): the
// chunked SSD scan of Mamba-2 and the chunked gated delta rule for a prefill,
// their one-step recurrences for a decode step, whose conv and recurrent
// states are inputs of the shapes the cache holds.
//
// Only some layers are built; the plan chooses their indices so that every
// kind of layer the model has is built at least once (Note [Hybrid layers]).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <set>

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include "runners/dtype_map.h"
#include "runners/model_builder_internal.h"

namespace coverage::runners::builder {
namespace {

// Note [Hybrid layers]
// ~~~~~~~~~~~~~~~~~~~~
// A hybrid model's layers are not all alike, so "the first N layers" may
// miss a kind (Qwen3-Next's first full-attention layer is layer 3). The plan
// builds the first layer of each kind, then the lowest remaining indices up
// to max_layers, in model order; module paths keep the model's own layer
// indices ("layers.3.self_attn"), and plan.notes lists which were built.

// Reads a config value, falling back to `fallback` when absent or mistyped.
int64_t Int(const json& c, const char* key, int64_t fallback) { return ConfigInt(c, key, fallback); }

std::string Str(const json& c, const char* key, const std::string& fallback) {
  auto it = c.find(key);
  return it != c.end() && it->is_string() ? it->get<std::string>() : fallback;
}

// The activation names of ACT2FN, normalised like features.cc does.
std::string NormalizeActivation(const std::string& a) {
  if (a == "swish") return "silu";
  if (a == "gelu_pytorch_tanh" || a == "gelu_new" || a == "gelu_fast") return "gelu_tanh";
  return a;
}

// The model types each family builds.
bool IsNemotronH(const std::string& t) { return t == "nemotron_h"; }
bool IsQwenNext(const std::string& t) {
  return t == "qwen3_next" || t == "qwen3_5_text" || t == "qwen3_5_moe_text" || t == "qwen3_5" || t == "qwen3_5_moe";
}
bool IsQwen35(const std::string& t) { return t.rfind("qwen3_5", 0) == 0; }

// Per-layer kinds of the model: "mamba", "attention", "mlp", "moe" (Nemotron-H),
// "linear_attention", "full_attention" (Qwen). Empty with `why` set when unknown.
std::vector<std::string> LayerKinds(const std::string& type, const json& c, int64_t layers, std::string* why) {
  std::vector<std::string> kinds;
  if (IsNemotronH(type)) {
    if (auto it = c.find("layers_block_type"); it != c.end() && it->is_array()) {
      for (const json& e : *it) kinds.push_back(e.is_string() ? e.get<std::string>() : "");
    } else if (auto p = c.find("hybrid_override_pattern"); p != c.end() && p->is_string()) {
      for (char ch : p->get<std::string>()) {
        kinds.push_back(ch == 'M' ? "mamba" : ch == '*' ? "attention" : ch == '-' ? "mlp" : ch == 'E' ? "moe" : "");
      }
    }
    for (const std::string& k : kinds) {
      if (k != "mamba" && k != "attention" && k != "mlp" && k != "moe") {
        *why = "a Nemotron-H layer kind that is not mamba, attention, mlp or moe";
        return {};
      }
    }
  } else {
    if (auto it = c.find("layer_types"); it != c.end() && it->is_array()) {
      for (const json& e : *it) kinds.push_back(e.is_string() ? e.get<std::string>() : "");
    } else {
      const int64_t interval = Int(c, "full_attention_interval", 4);
      for (int64_t i = 0; i < layers; ++i) kinds.push_back((i + 1) % interval == 0 ? "full_attention" : "linear_attention");
    }
    for (const std::string& k : kinds) {
      if (k != "linear_attention" && k != "full_attention") {
        *why = "a layer type that is not linear_attention or full_attention";
        return {};
      }
    }
  }
  if (kinds.empty()) *why = "the layer pattern is missing";
  return kinds;
}

// Note [Hybrid layers]: the first of each kind, then the lowest indices.
std::vector<int64_t> ChooseLayers(const std::vector<std::string>& kinds, int64_t max_layers) {
  std::set<int64_t> chosen;
  std::set<std::string> seen;
  for (size_t i = 0; i < kinds.size(); ++i) {
    if (seen.insert(kinds[i]).second) chosen.insert(static_cast<int64_t>(i));
  }
  const int64_t want = std::min<int64_t>(static_cast<int64_t>(kinds.size()), std::max<int64_t>(1, max_layers));
  for (int64_t i = 0; i < static_cast<int64_t>(kinds.size()) && static_cast<int64_t>(chosen.size()) < want; ++i) {
    chosen.insert(i);
  }
  return {chosen.begin(), chosen.end()};
}

std::string Budget(double bytes, int64_t built, int64_t total, double max_bytes) {
  char buf[160];
  std::snprintf(buf, sizeof buf, "needs about %.3g GB for %lld of %lld layers, over the %.3g GB budget", bytes / 1e9,
                static_cast<long long>(built), static_cast<long long>(total), max_bytes / 1e9);
  return buf;
}

// ---------------------------------------------------------------------------
// Dimensions read from the config (hybrid).

struct HybridDims {
  int64_t H = 0, vocab = 0;
  bool tied = false;
  double eps = 1e-5;
  // attention
  int64_t heads = 0, kv = 0, hd = 0;
  // Nemotron-H Mamba-2 mixer
  int64_t m_heads = 0, m_hd = 0, m_inner = 0, groups = 0, state = 0, conv_k = 4, chunk = 128, conv_dim = 0;
  bool conv_bias = true, proj_bias = false;
  double dt_min = 0.001;
  std::string m_act = "silu";
  // dense MLP
  int64_t I = 0;
  std::string act = "silu";
  bool mlp_bias = false;
  // experts
  int64_t experts = 0, top_k = 0, expert_I = 0, shared_I = 0, n_group = 1, topk_group = 1, latent = 0;
  bool norm_topk = true;
  double routed_scale = 1.0;
  // Gated DeltaNet
  int64_t lk_heads = 0, lv_heads = 0, lk_dim = 0, lv_dim = 0, l_conv = 4;
  int64_t rotary = 0;  // rotary width (partial rotary)
  double rope_theta = 10000;
  std::vector<int64_t> mrope_section;  // Qwen3.5: interleaved multimodal rope
  std::vector<int64_t> mlp_only;       // Qwen3-Next: dense layers among MoE ones
  int64_t sparse_step = 1;
};

HybridDims ReadHybrid(const selection::Features& f, const json& c) {
  HybridDims d;
  const std::string& type = f.model_type;
  d.H = Int(c, "hidden_size", f.hidden);
  d.vocab = Int(c, "vocab_size", f.vocab);
  d.tied = ConfigBool(c, "tie_word_embeddings", f.tied_embeddings);
  d.heads = Int(c, "num_attention_heads", f.heads);
  d.kv = Int(c, "num_key_value_heads", f.kv_heads > 0 ? f.kv_heads : d.heads);
  d.hd = Int(c, "head_dim", Int(c, "attention_head_dim", f.head_dim > 0 ? f.head_dim : (d.heads > 0 ? d.H / d.heads : 0)));
  if (IsNemotronH(type)) {
    d.eps = ConfigNumber(c, "layer_norm_epsilon", ConfigNumber(c, "norm_eps", 1e-5));
    d.m_heads = Int(c, "mamba_num_heads", 128);
    d.m_hd = Int(c, "mamba_head_dim", 64);
    d.m_inner = d.m_heads * d.m_hd;
    d.groups = Int(c, "n_groups", 8);
    d.state = Int(c, "ssm_state_size", 128);
    d.conv_k = Int(c, "conv_kernel", 4);
    d.chunk = Int(c, "chunk_size", 128);
    d.conv_dim = d.m_inner + 2 * d.groups * d.state;
    d.conv_bias = ConfigBool(c, "use_conv_bias", true);
    d.proj_bias = ConfigBool(c, "use_bias", false);
    d.dt_min = ConfigNumber(c, "time_step_min", 0.001);
    d.m_act = NormalizeActivation(Str(c, "mamba_hidden_act", "silu"));
    d.I = Int(c, "intermediate_size", f.intermediate);
    d.act = NormalizeActivation(Str(c, "mlp_hidden_act", "relu2"));
    d.mlp_bias = ConfigBool(c, "mlp_bias", false);
    d.experts = Int(c, "n_routed_experts", f.experts);
    d.top_k = Int(c, "num_experts_per_tok", f.experts_per_token);
    d.expert_I = Int(c, "moe_intermediate_size", d.I);
    d.shared_I = Int(c, "moe_shared_expert_intermediate_size", d.I);
    d.n_group = Int(c, "n_group", 1);
    d.topk_group = Int(c, "topk_group", 1);
    d.latent = Int(c, "moe_latent_size", 0);
    d.norm_topk = ConfigBool(c, "norm_topk_prob", true);
    d.routed_scale = ConfigNumber(c, "routed_scaling_factor", 1.0);
  } else {
    d.eps = ConfigNumber(c, "rms_norm_eps", 1e-6);
    d.I = Int(c, "intermediate_size", f.intermediate);
    d.act = NormalizeActivation(Str(c, "hidden_act", "silu"));
    d.experts = Int(c, "num_experts", f.experts);
    d.top_k = Int(c, "num_experts_per_tok", f.experts_per_token);
    d.expert_I = Int(c, "moe_intermediate_size", d.I);
    d.shared_I = Int(c, "shared_expert_intermediate_size", d.expert_I);
    d.norm_topk = IsQwen35(type) || ConfigBool(c, "norm_topk_prob", true);
    d.sparse_step = Int(c, "decoder_sparse_step", 1);
    if (auto it = c.find("mlp_only_layers"); it != c.end() && it->is_array()) {
      for (const json& e : *it) {
        if (e.is_number_integer()) d.mlp_only.push_back(e.get<int64_t>());
      }
    }
    d.lk_heads = Int(c, "linear_num_key_heads", 16);
    d.lv_heads = Int(c, "linear_num_value_heads", 32);
    d.lk_dim = Int(c, "linear_key_head_dim", 128);
    d.lv_dim = Int(c, "linear_value_head_dim", 128);
    d.l_conv = Int(c, "linear_conv_kernel_dim", 4);
    const json* rope = nullptr;
    if (auto it = c.find("rope_parameters"); it != c.end() && it->is_object()) rope = &*it;
    if (auto it = c.find("rope_scaling"); rope == nullptr && it != c.end() && it->is_object()) rope = &*it;
    double partial = ConfigNumber(c, "partial_rotary_factor", 1.0);
    d.rope_theta = ConfigNumber(c, "rope_theta", 10000.0);
    if (rope) {
      partial = ConfigNumber(*rope, "partial_rotary_factor", partial);
      d.rope_theta = ConfigNumber(*rope, "rope_theta", d.rope_theta);
    }
    if (!(partial > 0 && partial <= 1)) partial = 1.0;
    d.rotary = static_cast<int64_t>(double(d.hd) * partial) / 2 * 2;
    if (IsQwen35(type)) {
      d.mrope_section = {11, 11, 10};  // Qwen3_5TextRotaryEmbedding's default
      if (rope) {
        if (auto it = rope->find("mrope_section"); it != rope->end() && it->is_array() && it->size() == 3) {
          d.mrope_section.clear();
          for (const json& e : *it) d.mrope_section.push_back(e.is_number_integer() ? e.get<int64_t>() : 0);
        }
      }
    }
  }
  return d;
}

// Parameters of one layer of each kind, for the byte and FLOP estimates.
struct KindCost {
  double params = 0;         // weights
  double active = 0;         // weights each token multiplies
  double seq_flops = 0;      // flops beyond the weight products, per sequence
  double act_bytes = 0;      // peak intermediate bytes
};

bool MoeLayer(const HybridDims& d, int64_t i) {
  if (d.experts <= 0) return false;
  if (std::find(d.mlp_only.begin(), d.mlp_only.end(), i) != d.mlp_only.end()) return false;
  return (i + 1) % std::max<int64_t>(1, d.sparse_step) == 0;
}

// ---------------------------------------------------------------------------
// Shared pieces.

// Hugging Face's eager attention over [B, heads, S, hd] queries and
// [B, kv, T, hd] keys and values, with GQA's repeat and an additive mask.
at::Tensor EagerAttention(const at::Tensor& q, at::Tensor k, at::Tensor v, const at::Tensor& mask, int64_t rep,
                          double scaling, at::ScalarType dt) {
  if (rep > 1) {
    const int64_t B = k.size(0), kv = k.size(1), T = k.size(2), hd = k.size(3);
    k = k.unsqueeze(2).expand({B, kv, rep, T, hd}).reshape({B, kv * rep, T, hd});
    v = v.unsqueeze(2).expand({B, kv, rep, T, v.size(3)}).reshape({B, kv * rep, T, v.size(3)});
  }
  at::Tensor scores = at::matmul(q, k.transpose(2, 3)) * scaling;
  if (mask.defined()) scores = scores + mask;
  at::Tensor probs = at::softmax(scores, -1, at::kFloat).to(dt);
  return at::matmul(probs, v).transpose(1, 2).contiguous();
}

// The causal mask of an S-token step over T = P + S positions, [1, 1, S, T].
at::Tensor CausalMask(int64_t S, int64_t P, at::ScalarType dt) {
  const int64_t T = P + S;
  return at::full({S, T}, Lowest(dt), at::TensorOptions().dtype(dt)).triu(P + 1).unsqueeze(0).unsqueeze(0);
}

// Top-k experts of routed tokens: the loop of transformers' *Experts modules
// over the experts that got tokens. `expert` maps (index, tokens) to outputs.
template <typename ExpertFn>
at::Tensor RunExperts(const at::Tensor& flat, const at::Tensor& top_idx, const at::Tensor& top_w, int64_t experts,
                      at::ScalarType out_dtype, ExpertFn expert) {
  at::Tensor out = at::zeros_like(flat, at::TensorOptions().dtype(out_dtype));
  at::Tensor expert_mask = at::one_hot(top_idx, experts).permute({2, 1, 0});  // [E, k, tokens]
  at::Tensor hit = at::greater(expert_mask.sum({-1, -2}), 0).nonzero();
  for (int64_t h = 0; h < hit.size(0); ++h) {
    const int64_t e = hit[h][0].item<int64_t>();
    std::vector<at::Tensor> where = at::where(expert_mask[e]);
    const at::Tensor& slot = where[0];
    const at::Tensor& token = where[1];
    at::Tensor y = expert(e, flat.index({token}));
    y = y * top_w.index({token, slot}).unsqueeze(-1);
    out.index_add_(0, token, y.to(out.scalar_type()));
  }
  return out;
}

// ---------------------------------------------------------------------------
// Nemotron-H.

struct NemotronLayer {
  std::string kind;
  int64_t index = 0;
  at::Tensor norm;
  // mamba
  Linear in_proj, out_proj;
  at::Tensor conv_w, conv_b, dt_bias, a_log, d, gnorm;
  at::Tensor conv_state, ssm_state;  // decode
  // attention
  at::Tensor wq, wk, wv, wo, past_k, past_v;
  // mlp
  Linear up, down;
  // moe
  at::Tensor router, e_bias, e_up, e_down;  // e_up [E, EI, in], e_down [E, in, EI]
  Linear s_up, s_down, latent_in, latent_out;
};

// segment_sum of the Mamba-2 reference: cumulative sums over the lower
// triangle, -inf above it. x: [..., C] -> [..., C, C].
at::Tensor SegmentSum(const at::Tensor& x) {
  const int64_t C = x.size(-1);
  std::vector<int64_t> sizes = x.sizes().vec();
  sizes.push_back(C);
  at::Tensor e = x.unsqueeze(-1).expand(sizes);
  at::Tensor ones = at::ones({C, C}, at::TensorOptions().dtype(at::kBool));
  e = e.masked_fill(at::tril(ones, -1).bitwise_not(), 0);
  at::Tensor s = at::cumsum(e, -2);
  return s.masked_fill(at::tril(at::ones({C, C}, at::TensorOptions().dtype(at::kBool)), 0).bitwise_not(),
                       -std::numeric_limits<double>::infinity());
}

// Pads dim 1 (the sequence) of a 3- or 4-d tensor by `pad` zeros at the end.
at::Tensor PadSeq(const at::Tensor& t, int64_t pad) {
  if (t.dim() == 4) return at::constant_pad_nd(t, {0, 0, 0, 0, 0, pad, 0, 0}, 0);
  return at::constant_pad_nd(t, {0, 0, 0, pad, 0, 0}, 0);
}

at::Tensor IntoChunks(const at::Tensor& t, int64_t pad, int64_t chunk) {
  at::Tensor p = PadSeq(t, pad);
  if (p.dim() == 3) return p.reshape({p.size(0), -1, chunk, p.size(2)});
  return p.reshape({p.size(0), -1, chunk, p.size(2), p.size(3)});
}

// The group-wise gated RMSNorm of Mamba-2 (Zamba2RMSNormGated): gate first.
at::Tensor GatedGroupNorm(const at::Tensor& x, const at::Tensor& gate, const at::Tensor& weight, int64_t groups,
                          double eps) {
  const at::ScalarType in_dtype = x.scalar_type();
  at::Tensor h = x.to(at::kFloat);
  h = h * at::silu(gate.to(at::kFloat));
  std::vector<int64_t> shape = h.sizes().vec();
  const int64_t last = shape.back();
  std::vector<int64_t> grouped(shape.begin(), shape.end() - 1);
  grouped.push_back(groups);
  grouped.push_back(last / groups);
  at::Tensor g = h.view(grouped);
  at::Tensor var = g.pow(2).mean({-1}, /*keepdim=*/true);
  g = g * at::rsqrt(var + eps);
  h = g.view(shape);
  return weight * h.to(in_dtype);
}

// NemotronHMamba2Mixer.torch_forward.
at::Tensor Mamba2Mixer(const at::Tensor& x, NemotronLayer& l, const HybridDims& d, bool decode, bool cache,
                       at::ScalarType dt) {
  const int64_t B = x.size(0), S = x.size(1), I = d.m_inner, GN = d.groups * d.state, nh = d.m_heads;
  at::Tensor proj = l.in_proj(x);
  const int64_t d_mlp = (proj.size(-1) - 2 * I - 2 * GN - nh) / 2;
  std::vector<at::Tensor> parts = proj.split_with_sizes({d_mlp, d_mlp, I, d.conv_dim, nh}, -1);
  at::Tensor gate = parts[2], hs = parts[3].transpose(1, 2), dtv = parts[4];
  if (decode) {
    // The cache's conv-state update: roll left, write the new column.
    at::Tensor conv_state = l.conv_state.roll({-1}, {-1});
    conv_state.select(2, -1).copy_(hs.select(2, 0));
    hs = at::sum(conv_state * l.conv_w.select(1, 0), {-1});
    if (d.conv_bias) hs.add_(l.conv_b);
    hs = Activate(hs, d.m_act).to(dt).unsqueeze(1);
  } else {
    if (cache) at::constant_pad_nd(hs, {d.conv_k - hs.size(-1), 0}, 0);  // the conv state kept for decode
    at::Tensor conv = at::conv1d(hs, l.conv_w, l.conv_b, {1}, {d.conv_k - 1}, {1}, d.conv_dim);
    hs = Activate(conv.slice(-1, 0, S).transpose(1, 2), d.m_act);
  }
  std::vector<at::Tensor> xbc = hs.split_with_sizes({I, GN, GN}, -1);
  at::Tensor h = xbc[0], Bm = xbc[1], Cm = xbc[2];
  at::Tensor A = -at::exp(l.a_log.to(at::kFloat));
  at::Tensor y;
  if (decode) {
    at::Tensor dts = dtv.dim() == 2 ? dtv.unsqueeze(1) : dtv.select(1, 0).unsqueeze(1);
    dts = dts.transpose(1, 2).expand({B, dts.size(-1), d.m_hd});
    at::Tensor dt_bias = l.dt_bias.unsqueeze(-1).expand({l.dt_bias.size(0), d.m_hd});
    dts = at::softplus(dts + dt_bias.to(dts.scalar_type()));
    dts = at::clamp(dts, d.dt_min);
    at::Tensor Ae = A.unsqueeze(-1).unsqueeze(-1).expand({nh, d.m_hd, d.state}).to(at::kFloat);
    at::Tensor dA = at::exp(dts.unsqueeze(-1) * Ae);
    at::Tensor Bh = Bm.reshape({B, d.groups, -1}).unsqueeze(-2);
    Bh = Bh.expand({B, d.groups, nh / d.groups, Bh.size(-1)}).contiguous().reshape({B, -1, Bh.size(-1)});
    at::Tensor dB = dts.unsqueeze(-1) * Bh.unsqueeze(-2);
    at::Tensor hh = h.reshape({B, -1, d.m_hd});
    at::Tensor dBx = dB * hh.unsqueeze(-1);
    at::Tensor states = l.ssm_state.clone();
    states = states * dA + dBx;
    at::Tensor Ch = Cm.reshape({B, d.groups, -1}).unsqueeze(-2);
    Ch = Ch.expand({B, d.groups, nh / d.groups, Ch.size(-1)}).contiguous().reshape({B, -1, Ch.size(-1)});
    states = states.to(Ch.scalar_type());
    at::Tensor yb = at::bmm(states.view({B * nh, d.m_hd, d.state}), Ch.view({B * nh, d.state, 1}));
    yb = yb.view({B, nh, d.m_hd});
    at::Tensor D = l.d.unsqueeze(-1).expand({l.d.size(0), d.m_hd});
    yb = (yb + hh * D).to(yb.scalar_type());
    y = yb.reshape({B, -1}).unsqueeze(1);
  } else {
    // The SSD "naive" chunked scan.
    at::Tensor dts = at::softplus(dtv + l.dt_bias);
    dts = at::clamp(dts, d.dt_min);
    at::Tensor hx = h.reshape({B, S, -1, d.m_hd}).to(at::kFloat);
    at::Tensor Bx = Bm.reshape({B, S, -1, d.state}).to(at::kFloat);
    at::Tensor Cx = Cm.reshape({B, S, -1, d.state}).to(at::kFloat);
    Bx = Bx.repeat_interleave(nh / d.groups, 2, nh);
    Cx = Cx.repeat_interleave(nh / d.groups, 2, nh);
    const int64_t C = d.chunk, pad = (C - S % C) % C;
    at::Tensor D_residual = l.d.unsqueeze(-1) * PadSeq(hx, pad);
    hx = hx * dts.unsqueeze(-1);
    at::Tensor Ad = A.to(hx.scalar_type()) * dts;
    hx = IntoChunks(hx, pad, C);
    Ad = IntoChunks(Ad, pad, C);
    Bx = IntoChunks(Bx, pad, C);
    Cx = IntoChunks(Cx, pad, C);
    Ad = Ad.permute({0, 3, 1, 2});
    at::Tensor A_cumsum = at::cumsum(Ad, -1);
    at::Tensor L = at::exp(SegmentSum(Ad));
    // Diagonal blocks: C·B "attention" within each chunk.
    at::Tensor G = (Cx.unsqueeze(3) * Bx.unsqueeze(2)).sum(-1);  // [b, c, l, s, h]
    at::Tensor M = (G.unsqueeze(-1) * L.permute({0, 2, 3, 4, 1}).unsqueeze(-1)).sum(-1);
    at::Tensor Y_diag = (M.unsqueeze(-1) * hx.unsqueeze(2)).sum(3);
    // States at the chunk ends, carried across chunks.
    at::Tensor decay_states = at::exp(A_cumsum.slice(-1, A_cumsum.size(-1) - 1) - A_cumsum);
    at::Tensor B_decay = Bx * decay_states.permute({0, 2, 3, 1}).unsqueeze(-1);
    at::Tensor states = (B_decay.permute({0, 1, 3, 2, 4}).unsqueeze(-1) * hx.permute({0, 1, 3, 2, 4}).unsqueeze(-2))
                            .sum(3)
                            .permute({0, 1, 2, 4, 3});
    at::Tensor previous = at::zeros_like(states.slice(1, 0, 1));
    states = at::cat({previous, states}, 1);
    at::Tensor decay_chunk = at::exp(SegmentSum(at::constant_pad_nd(A_cumsum.select(-1, -1), {1, 0}, 0)));
    at::Tensor states_p = states.permute({0, 2, 1, 3, 4});
    at::Tensor result = (decay_chunk.unsqueeze(-1).unsqueeze(-1) * states_p.unsqueeze(2)).sum(2);
    at::Tensor new_states = result.permute({0, 2, 1, 3, 4});
    states = new_states.slice(1, 0, new_states.size(1) - 1);
    // State -> output per chunk.
    at::Tensor state_decay_out = at::exp(A_cumsum);
    at::Tensor C_states = Cx.unsqueeze(-2) * states.unsqueeze(2);
    at::Tensor Y_off = C_states.sum(-1) * state_decay_out.permute({0, 2, 3, 1}).unsqueeze(-1);
    y = (Y_diag + Y_off).reshape({B, -1, nh, d.m_hd});
    y = y + D_residual;
    if (pad > 0) y = y.slice(1, 0, S);
    y = y.reshape({B, S, -1});
  }
  at::Tensor scan = GatedGroupNorm(y, gate, l.gnorm, d.groups, d.eps);
  return l.out_proj(scan.to(dt));
}

// NemotronHMoE: sigmoid scores with a correction bias, group-limited top-k,
// non-gated experts, a shared expert.
at::Tensor NemotronMoe(const at::Tensor& x, NemotronLayer& l, const HybridDims& d) {
  const int64_t H = d.H, E = d.experts;
  at::Tensor logits = at::linear(x.view({-1, H}).to(at::kFloat), l.router.to(at::kFloat));
  at::Tensor scores = logits.sigmoid();
  at::Tensor choice = scores + l.e_bias;
  at::Tensor group_scores = std::get<0>(choice.view({-1, d.n_group, E / d.n_group}).topk(2, -1)).sum(-1);
  at::Tensor group_idx = std::get<1>(at::topk(group_scores, d.topk_group, -1, true, /*sorted=*/false));
  at::Tensor group_mask = at::zeros_like(group_scores);
  group_mask.scatter_(1, group_idx, 1);
  at::Tensor score_mask =
      group_mask.unsqueeze(-1).expand({-1, d.n_group, E / d.n_group}).reshape({-1, E});
  at::Tensor masked = choice.masked_fill(score_mask.to(at::kBool).bitwise_not(), -std::numeric_limits<double>::infinity());
  at::Tensor top_idx = std::get<1>(at::topk(masked, d.top_k, -1, true, /*sorted=*/false));
  at::Tensor top_w = scores.gather(1, top_idx);
  if (d.norm_topk) top_w.div_(top_w.sum(-1, /*keepdim=*/true) + 1e-20);
  top_w = top_w * d.routed_scale;
  at::Tensor flat = x.view({-1, H});
  if (l.latent_in.w.defined()) flat = l.latent_in(flat);
  at::Tensor out = RunExperts(flat, top_idx, top_w, E, top_w.scalar_type(), [&](int64_t e, const at::Tensor& xs) {
    return at::linear(Activate(at::linear(xs, l.e_up.select(0, e)), d.act), l.e_down.select(0, e));
  });
  out = out.to(flat.scalar_type());
  if (l.latent_out.w.defined()) out = l.latent_out(out);
  out = out.view(x.sizes());
  return out + l.s_down(Activate(l.s_up(x), d.act));
}

// ---------------------------------------------------------------------------
// Qwen3-Next / Qwen3.5.

struct QwenLayer {
  std::string kind;
  int64_t index = 0;
  bool moe = false;
  at::Tensor ln1, ln2;  // (1 + w) RMSNorms
  // Gated DeltaNet
  Linear qkvz, ba, qkv, z, b, a, out_proj;
  at::Tensor conv_w, dt_bias, a_log, gnorm;
  at::Tensor conv_state, rec_state;  // decode
  // full attention
  at::Tensor wq, wk, wv, wo, q_norm, k_norm, past_k, past_v;
  // MLP / MoE
  Linear gate, up, down;
  at::Tensor router, e_gate_up, e_down;  // [E, 2 EI, H], [E, H, EI]
  Linear s_gate, s_up, s_down, s_expert_gate;
};

// Qwen3NextRMSNorm: fp32, scaled by (1 + weight), back to the input dtype.
at::Tensor OffsetRmsNorm(const at::Tensor& x, const at::Tensor& w, double eps) {
  at::Tensor h = x.to(at::kFloat);
  h = h * at::rsqrt(h.pow(2).mean({-1}, /*keepdim=*/true) + eps);
  h = h * (w.to(at::kFloat) + 1.0);
  return h.to(x.scalar_type());
}

at::Tensor L2Norm(const at::Tensor& x) { return x * at::rsqrt((x * x).sum({-1}, /*keepdim=*/true) + 1e-6); }

// torch_chunk_gated_delta_rule (chunk 64), q/k/v [B, S, Hv, d], g/beta [B, S, Hv].
at::Tensor ChunkGatedDeltaRule(at::Tensor q, at::Tensor k, at::Tensor v, at::Tensor g, at::Tensor beta) {
  const int64_t C = 64;
  const at::ScalarType initial = q.scalar_type();
  q = L2Norm(q);
  k = L2Norm(k);
  auto prep = [](const at::Tensor& t) { return t.transpose(1, 2).contiguous().to(at::kFloat); };
  q = prep(q), k = prep(k), v = prep(v), beta = prep(beta), g = prep(g);
  const int64_t B = k.size(0), Hh = k.size(1), L = k.size(2), dk = k.size(3), dv = v.size(3);
  const int64_t pad = (C - L % C) % C;
  q = at::constant_pad_nd(q, {0, 0, 0, pad}, 0);
  k = at::constant_pad_nd(k, {0, 0, 0, pad}, 0);
  v = at::constant_pad_nd(v, {0, 0, 0, pad}, 0);
  beta = at::constant_pad_nd(beta, {0, pad}, 0);
  g = at::constant_pad_nd(g, {0, pad}, 0);
  const int64_t total = L + pad;
  q = q * (1.0 / std::sqrt(static_cast<double>(dk)));
  at::Tensor v_beta = v * beta.unsqueeze(-1);
  at::Tensor k_beta = k * beta.unsqueeze(-1);
  auto chunks = [&](const at::Tensor& t) { return t.reshape({t.size(0), t.size(1), -1, C, t.size(-1)}); };
  q = chunks(q), k = chunks(k), v = chunks(v), k_beta = chunks(k_beta), v_beta = chunks(v_beta);
  g = g.reshape({g.size(0), g.size(1), -1, C});
  at::Tensor mask = at::triu(at::ones({C, C}, at::TensorOptions().dtype(at::kBool)), 0);
  g = g.cumsum(-1);
  at::Tensor decay_mask = (g.unsqueeze(-1) - g.unsqueeze(-2)).tril().exp().to(at::kFloat).tril();
  at::Tensor attn = -(at::matmul(k_beta, k.transpose(-1, -2)) * decay_mask).masked_fill(mask, 0);
  for (int64_t i = 1; i < C; ++i) {
    at::Tensor row = attn.select(-2, i).slice(-1, 0, i).clone();
    at::Tensor sub = attn.slice(-2, 0, i).slice(-1, 0, i).clone();
    attn.select(-2, i).slice(-1, 0, i).copy_(row + (row.unsqueeze(-1) * sub).sum(-2));
  }
  attn = attn + at::eye(C, at::TensorOptions().dtype(attn.scalar_type()));
  at::Tensor value = at::matmul(attn, v_beta);
  at::Tensor k_cumdecay = at::matmul(attn, k_beta * g.exp().unsqueeze(-1));
  at::Tensor state = at::zeros({B, Hh, dk, dv}).to(value);
  at::Tensor core = at::zeros_like(value);
  mask = at::triu(at::ones({C, C}, at::TensorOptions().dtype(at::kBool)), 1);
  for (int64_t i = 0; i < total / C; ++i) {
    at::Tensor q_i = q.select(2, i), k_i = k.select(2, i), v_i = value.select(2, i);
    at::Tensor a = (at::matmul(q_i, k_i.transpose(-1, -2)) * decay_mask.select(2, i)).masked_fill_(mask, 0);
    at::Tensor v_prime = at::matmul(k_cumdecay.select(2, i), state);
    at::Tensor v_new = v_i - v_prime;
    at::Tensor g_i = g.select(2, i);
    at::Tensor attn_inter = at::matmul(q_i * g_i.unsqueeze(-1).exp(), state);
    core.select(2, i).copy_(attn_inter + at::matmul(a, v_new));
    at::Tensor g_last = g_i.select(-1, -1);
    state = state * g_last.unsqueeze(-1).unsqueeze(-1).exp() +
            at::matmul((k_i * (g_last.unsqueeze(-1) - g_i).exp().unsqueeze(-1)).transpose(-1, -2), v_new);
  }
  core = core.reshape({core.size(0), core.size(1), -1, core.size(-1)}).slice(2, 0, L);
  return core.transpose(1, 2).contiguous().to(initial);
}

// torch_recurrent_gated_delta_rule from a cached state [B, Hv, dk, dv].
at::Tensor RecurrentGatedDeltaRule(at::Tensor q, at::Tensor k, at::Tensor v, at::Tensor g, at::Tensor beta,
                                   const at::Tensor& initial_state) {
  const at::ScalarType initial = q.scalar_type();
  q = L2Norm(q);
  k = L2Norm(k);
  auto prep = [](const at::Tensor& t) { return t.transpose(1, 2).contiguous().to(at::kFloat); };
  q = prep(q), k = prep(k), v = prep(v), beta = prep(beta), g = prep(g);
  const int64_t B = k.size(0), Hh = k.size(1), L = k.size(2), dk = k.size(3), dv = v.size(3);
  q = q * (1.0 / std::sqrt(static_cast<double>(dk)));
  at::Tensor core = at::zeros({B, Hh, L, dv}).to(v);
  at::Tensor state = initial_state.to(v);
  for (int64_t t = 0; t < L; ++t) {
    at::Tensor q_t = q.select(2, t), k_t = k.select(2, t), v_t = v.select(2, t);
    at::Tensor g_t = g.select(2, t).exp().unsqueeze(-1).unsqueeze(-1);
    at::Tensor beta_t = beta.select(2, t).unsqueeze(-1);
    state = state * g_t;
    at::Tensor kv_mem = (state * k_t.unsqueeze(-1)).sum(-2);
    at::Tensor delta = (v_t - kv_mem) * beta_t;
    state = state + k_t.unsqueeze(-1) * delta.unsqueeze(-2);
    core.select(2, t).copy_((state * q_t.unsqueeze(-1)).sum(-2));
  }
  return core.transpose(1, 2).contiguous().to(initial);
}

// Qwen3NextGatedDeltaNet / Qwen3_5GatedDeltaNet forward.
at::Tensor GatedDeltaNet(const at::Tensor& x, QwenLayer& l, const HybridDims& d, bool qwen35, bool decode, bool cache,
                         bool write_state) {
  const int64_t B = x.size(0), S = x.size(1);
  const int64_t key_dim = d.lk_heads * d.lk_dim, value_dim = d.lv_heads * d.lv_dim, r = d.lv_heads / d.lk_heads;
  const int64_t conv_dim = 2 * key_dim + value_dim;
  at::Tensor mixed, z, b, a;
  if (qwen35) {
    mixed = l.qkv(x).transpose(1, 2);
    z = l.z(x).reshape({B, S, -1, d.lv_dim});
    b = l.b(x);
    a = l.a(x);
  } else {
    at::Tensor qkvz = l.qkvz(x).view({B, S, d.lk_heads, 2 * d.lk_dim + 2 * d.lv_dim * r});
    at::Tensor ba = l.ba(x).view({B, S, d.lk_heads, 2 * r});
    std::vector<at::Tensor> p = qkvz.split_with_sizes({d.lk_dim, d.lk_dim, r * d.lv_dim, r * d.lv_dim}, 3);
    std::vector<at::Tensor> pb = ba.split_with_sizes({r, r}, 3);
    at::Tensor value = p[2].reshape({p[2].size(0), p[2].size(1), -1, d.lv_dim});
    z = p[3].reshape({p[3].size(0), p[3].size(1), -1, d.lv_dim});
    b = pb[0].reshape({B, S, d.lv_heads});
    a = pb[1].reshape({B, S, d.lv_heads});
    at::Tensor query = p[0].reshape({B, S, -1}), key = p[1].reshape({B, S, -1});
    mixed = at::cat({query, key, value.reshape({B, S, -1})}, -1).transpose(1, 2);
  }
  if (decode) {
    // torch_causal_conv1d_update: the state window plus the new column.
    at::Tensor w = l.conv_w.squeeze(1);
    const int64_t state_len = l.conv_state.size(-1);
    at::Tensor joined = at::cat({l.conv_state, mixed}, -1).to(w.scalar_type());
    if (write_state) l.conv_state.copy_(joined.slice(-1, joined.size(-1) - state_len));
    at::Tensor out = at::conv1d(joined, w.unsqueeze(1), at::Tensor(), {1}, at::IntArrayRef{0}, {1}, conv_dim);
    mixed = at::silu(out.slice(-1, out.size(-1) - S)).to(mixed.scalar_type());
  } else {
    if (cache) at::constant_pad_nd(mixed, {d.l_conv - mixed.size(-1), 0}, 0);  // the conv state kept for decode
    mixed = at::silu(at::conv1d(mixed, l.conv_w, at::Tensor(), {1}, at::IntArrayRef{d.l_conv - 1}, {1}, conv_dim).slice(-1, 0, S));
  }
  mixed = mixed.transpose(1, 2);
  std::vector<at::Tensor> qkv = mixed.split_with_sizes({key_dim, key_dim, value_dim}, -1);
  at::Tensor query = qkv[0].reshape({qkv[0].size(0), qkv[0].size(1), -1, d.lk_dim});
  at::Tensor key = qkv[1].reshape({qkv[1].size(0), qkv[1].size(1), -1, d.lk_dim});
  at::Tensor value = qkv[2].reshape({qkv[2].size(0), qkv[2].size(1), -1, d.lv_dim});
  at::Tensor beta = b.sigmoid();
  at::Tensor g = -l.a_log.to(at::kFloat).exp() * at::softplus(a.to(at::kFloat) + l.dt_bias);
  if (r > 1) {
    query = query.repeat_interleave(r, 2);
    key = key.repeat_interleave(r, 2);
  }
  at::Tensor core = decode ? RecurrentGatedDeltaRule(query, key, value, g, beta, l.rec_state)
                           : ChunkGatedDeltaRule(query, key, value, g, beta);
  // Qwen3NextRMSNormGated: normalise, scale, then gate.
  at::Tensor c2 = core.reshape({-1, core.size(-1)});
  at::Tensor z2 = z.reshape({-1, z.size(-1)});
  const at::ScalarType in_dtype = c2.scalar_type();
  at::Tensor h = c2.to(at::kFloat);
  h = h * at::rsqrt(h.pow(2).mean({-1}, /*keepdim=*/true) + d.eps);
  h = l.gnorm * h.to(in_dtype);
  h = (h * at::silu(z2.to(at::kFloat))).to(in_dtype);
  h = qwen35 ? h.reshape({B, S, -1}) : h.reshape(z.sizes()).reshape({B, S, -1});
  return l.out_proj(h);
}

// Qwen3NextAttention: a doubled q projection whose second half gates the output.
at::Tensor GatedAttention(const at::Tensor& x, QwenLayer& l, const HybridDims& d, const at::Tensor& cos,
                          const at::Tensor& sin, const at::Tensor& mask, at::ScalarType dt) {
  const int64_t B = x.size(0), S = x.size(1), hd = d.hd;
  std::vector<at::Tensor> qg = at::linear(x, l.wq).view({B, S, -1, hd * 2}).chunk(2, -1);
  at::Tensor gate = qg[1].reshape({B, S, -1});
  at::Tensor q = OffsetRmsNorm(qg[0].view({B, S, -1, hd}), l.q_norm, d.eps).transpose(1, 2);
  at::Tensor k = OffsetRmsNorm(at::linear(x, l.wk).view({B, S, -1, hd}), l.k_norm, d.eps).transpose(1, 2);
  at::Tensor v = at::linear(x, l.wv).view({B, S, -1, hd}).transpose(1, 2);
  at::Tensor c = cos.unsqueeze(1), s = sin.unsqueeze(1);
  const int64_t rd = c.size(-1);
  auto rope = [&](const at::Tensor& t) {
    at::Tensor rot = t.slice(-1, 0, rd), pass = t.slice(-1, rd);
    return at::cat({rot * c + RotateHalf(rot) * s, pass}, -1);
  };
  q = rope(q);
  k = rope(k);
  if (l.past_k.defined()) {
    k = at::cat({l.past_k, k}, -2);
    v = at::cat({l.past_v, v}, -2);
  }
  at::Tensor out = EagerAttention(q, k, v, mask, d.heads / d.kv, 1.0 / std::sqrt(static_cast<double>(hd)), dt);
  out = out.reshape({B, S, -1}).contiguous();
  out = out * at::sigmoid(gate);
  return at::linear(out, l.wo);
}

at::Tensor QwenMlp(const at::Tensor& x, const Linear& gate, const Linear& up, const Linear& down, const std::string& act) {
  return down(Activate(gate(x), act) * up(x));
}

// Qwen3NextSparseMoeBlock: softmax top-k, gate_up experts, a sigmoid-gated shared expert.
at::Tensor QwenMoe(const at::Tensor& x, QwenLayer& l, const HybridDims& d) {
  const int64_t H = d.H;
  at::Tensor flat = x.view({-1, H});
  at::Tensor shared = QwenMlp(flat, l.s_gate, l.s_up, l.s_down, d.act);
  at::Tensor logits = at::softmax(at::linear(flat, l.router), -1, at::kFloat);
  auto [top_w, top_idx] = at::topk(logits, d.top_k, -1);
  if (d.norm_topk) top_w.div_(top_w.sum(-1, /*keepdim=*/true));
  top_w = top_w.to(logits.scalar_type());
  at::Tensor out = RunExperts(flat, top_idx, top_w, d.experts, flat.scalar_type(), [&](int64_t e, const at::Tensor& xs) {
    std::vector<at::Tensor> gu = at::linear(xs, l.e_gate_up.select(0, e)).chunk(2, -1);
    return at::linear(Activate(gu[0], d.act) * gu[1], l.e_down.select(0, e));
  });
  shared = at::sigmoid(l.s_expert_gate(flat)) * shared;
  return (out + shared).reshape(x.sizes());
}

// ---------------------------------------------------------------------------
// RWKV-5.

struct RwkvDims {
  int64_t H = 0, vocab = 0, head_size = 64, heads = 0, I = 0, rescale_every = 0;
  bool tied = true;
  double eps = 1e-5;
};

RwkvDims ReadRwkv(const selection::Features& f, const json& c) {
  RwkvDims d;
  d.H = Int(c, "hidden_size", f.hidden);
  d.vocab = Int(c, "vocab_size", f.vocab);
  d.head_size = Int(c, "head_size", 64);
  d.heads = d.head_size > 0 ? d.H / d.head_size : 0;
  d.I = Int(c, "intermediate_size", static_cast<int64_t>(double(d.H) * 3.5) / 32 * 32);
  d.rescale_every = Int(c, "rescale_every", 0);
  d.tied = ConfigBool(c, "tie_word_embeddings", f.tied_embeddings);
  d.eps = ConfigNumber(c, "layer_norm_epsilon", 1e-5);
  return d;
}

struct RwkvLayer {
  Norm ln1, ln2;
  at::Tensor time_decay, time_faaaa, mix_gate, mix_key, mix_value, mix_receptance;
  at::Tensor key, value, receptance, gate, output;  // [out, in]
  Norm ln_x;
  at::Tensor f_mix_key, f_mix_receptance, f_key, f_receptance, f_value;
};

}  // namespace

// ---------------------------------------------------------------------------

BuildPlan PlanHybrid(const selection::Features& f, const json& config, const CaptureProfile& profile,
                     const BuildOptions& options) {
  BuildPlan plan;
  plan.family = "hybrid";
  auto refuse = [&](std::string why) {
    plan.buildable = false;
    plan.reason = std::move(why);
    return plan;
  };
  const std::string& type = f.model_type;
  if (!IsNemotronH(type) && !IsQwenNext(type)) {
    return refuse("hybrid model type '" + type +
                  "' is not built yet (Nemotron-H, Qwen3-Next and the Qwen3.5 text models are)");
  }
  if (!f.quantization.empty()) plan.notes.push_back(QuantizationNote(f.quantization, profile.dtype));
  const HybridDims d = ReadHybrid(f, config);
  if (d.H <= 0 || d.vocab <= 0 || f.layers <= 0) return refuse("hidden size, layers or vocabulary unknown");
  std::string why;
  std::vector<std::string> kinds = LayerKinds(type, config, f.layers, &why);
  if (kinds.empty()) return refuse(why);
  std::set<std::string> kind_set(kinds.begin(), kinds.end());
  const bool has_attention = kind_set.count("attention") || kind_set.count("full_attention");
  if (has_attention) {
    if (d.heads <= 0 || d.kv <= 0 || d.hd <= 0) return refuse("attention heads or head dimension unknown");
    if (d.heads % d.kv != 0) return refuse("attention heads are not a multiple of the KV heads");
  }
  if (IsNemotronH(type)) {
    if (!KnownActivation(d.act) || !KnownActivation(d.m_act)) return refuse("activation '" + d.act + "' is not built");
    if (kind_set.count("mamba")) {
      if (d.m_heads <= 0 || d.groups <= 0 || d.m_heads % d.groups != 0 || d.state <= 0 || d.chunk <= 0) {
        return refuse("Mamba-2 heads, groups, state size or chunk size invalid");
      }
    }
    if (kind_set.count("moe")) {
      if (d.experts <= 0 || d.top_k <= 0 || d.top_k > d.experts || d.n_group <= 0 || d.experts % d.n_group != 0 ||
          d.topk_group > d.n_group || d.experts / d.n_group < 2) {
        return refuse("mixture of experts without a valid number of experts, groups or experts per token");
      }
    }
    if (kind_set.count("mlp") && d.I <= 0) return refuse("intermediate size unknown");
  } else {
    if (!KnownActivation(d.act)) return refuse("activation '" + d.act + "' is not built");
    if (d.lk_heads <= 0 || d.lv_heads <= 0 || d.lv_heads % d.lk_heads != 0 || d.lk_dim <= 0 || d.lv_dim <= 0) {
      return refuse("linear attention heads invalid (value heads must be a multiple of key heads)");
    }
    if (d.rotary <= 0) return refuse("rotary width unknown");
    if (!d.mrope_section.empty()) {
      int64_t sum = 0;
      for (int64_t s : d.mrope_section) sum += s;
      if (sum * 2 > d.rotary) return refuse("mrope sections wider than the rotary width");
    }
    if (d.experts > 0 && (d.top_k <= 0 || d.top_k > d.experts || d.expert_I <= 0)) {
      return refuse("mixture of experts without a valid number of experts per token");
    }
    if (d.experts <= 0 && d.I <= 0) return refuse("intermediate size unknown");
  }

  plan.layers_total = static_cast<int64_t>(kinds.size());
  const std::vector<int64_t> built = ChooseLayers(kinds, options.max_layers);
  plan.layers_built = static_cast<int64_t>(built.size());
  std::string which = "built layers";
  for (size_t i = 0; i < built.size(); ++i) {
    which += (i ? ", " : " ") + std::to_string(built[i]) + " (" + kinds[static_cast<size_t>(built[i])] + ")";
  }
  plan.notes.push_back(which + ": the first layer of each kind, then the lowest indices");
  if (IsNemotronH(type)) {
    plan.notes.push_back("Mamba-2 mixers run the torch path of NemotronHMamba2Mixer (the SSD chunked scan, chunk " +
                         std::to_string(d.chunk) + "), not the mamba-ssm kernels");
  } else {
    plan.notes.push_back(
        "Gated DeltaNet runs transformers' torch_chunk_gated_delta_rule (chunk 64) for a prefill and "
        "torch_recurrent_gated_delta_rule for a decode step, not the fla kernels");
    if (IsQwen35(type)) {
      plan.notes.push_back("the convolution of the linear attention runs as in transformers 4.57 (conv1d, silu)");
      plan.notes.push_back("interleaved multimodal rope on text positions (all three sections read the same positions)");
    }
    if (Str(config, "output_gate_type", "sigmoid") != "sigmoid") {
      plan.notes.push_back("output_gate_type '" + Str(config, "output_gate_type", "") +
                           "' is not read by transformers: the attention output gate is a sigmoid");
    }
  }

  // Estimates.
  const double eb = ElementBytes(profile.dtype), H = double(d.H);
  const double B = double(profile.batch), S = double(std::max<int64_t>(1, profile.seq_len));
  const double P = double(profile.past_len), T = P + S;
  const bool decode = profile.past_len > 0 && profile.seq_len == 1;
  double weights = double(d.vocab) * H * (d.tied ? 1.0 : 2.0);
  double flops = 2.0 * B * H * double(d.vocab);
  double peak = 0;
  double state_bytes = 0;
  const double attn = H * double(d.heads + 2 * d.kv) * double(d.hd) + double(d.heads * d.hd) * H;
  for (int64_t i : built) {
    const std::string& k = kinds[static_cast<size_t>(i)];
    KindCost c;
    if (k == "mamba") {
      const double I = double(d.m_inner), cd = double(d.conv_dim), nh = double(d.m_heads), N = double(d.state);
      const double hdm = double(d.m_hd), Ch = double(d.chunk);
      c.params = H * (I + cd + nh) + cd * double(d.conv_k) + I * H + 3 * nh + I;
      c.active = c.params;
      if (decode) {
        c.seq_flops = 6.0 * B * nh * hdm * N;
        state_bytes += B * cd * double(d.conv_k) * eb + B * nh * hdm * N * 4.0;
      } else {
        const double chunks = std::ceil(S / Ch);
        c.seq_flops = 2.0 * B * chunks * Ch * Ch * nh * (N + 1 + hdm) + 6.0 * B * chunks * Ch * nh * hdm * N;
        c.act_bytes = 4.0 * B * chunks * Ch * Ch * nh * std::max(N, hdm);  // G_intermediate / Y_diag products
      }
    } else if (k == "attention" || k == "full_attention") {
      const double extra = k == "full_attention" ? double(d.heads * d.hd) * H : 0.0;  // the output gate half of q
      c.params = attn + extra;
      c.active = c.params;
      c.seq_flops = 4.0 * B * double(d.heads) * S * T * double(d.hd);
      c.act_bytes = 4.0 * B * double(d.heads) * S * T;
      state_bytes += 2.0 * B * double(d.kv) * P * double(d.hd) * eb;
    } else if (k == "linear_attention") {
      const double kd = double(d.lk_heads * d.lk_dim), vd = double(d.lv_heads * d.lv_dim), hv = double(d.lv_heads);
      const double cd = 2 * kd + vd;
      c.params = H * (cd + vd + 2 * hv) + cd * double(d.l_conv) + vd * H + 2 * hv + double(d.lv_dim);
      c.active = c.params;
      const double dk = double(d.lk_dim), dv = double(d.lv_dim);
      if (decode) {
        c.seq_flops = 8.0 * B * hv * dk * dv;
        state_bytes += B * cd * double(d.l_conv) * eb + B * hv * dk * dv * 4.0;
      } else {
        const double Lp = std::ceil(S / 64.0) * 64.0;
        c.seq_flops = 2.0 * B * hv * Lp * (64.0 * (2 * dk + 2 * dv) + 4 * dk * dv) + 64.0 * 64.0 * 64.0 * B * hv;
        c.act_bytes = 4.0 * B * hv * Lp * (4 * dk + 4 * dv + 2 * 64.0);
      }
    }
    if (k == "mlp") {
      c.params = 2.0 * H * double(d.I);
      c.active = c.params;
    } else if (k == "moe" || (IsQwenNext(type) && MoeLayer(d, i))) {
      const bool nem = k == "moe";
      const double in = nem && d.latent > 0 ? double(d.latent) : H;
      const double mats = nem ? 2.0 : 3.0;
      const double experts = double(d.experts) * mats * in * double(d.expert_I);
      const double shared = (nem ? 2.0 : 3.0) * H * double(d.shared_I) + (nem ? 0.0 : H);
      const double latent = nem && d.latent > 0 ? 2.0 * H * in : 0.0;
      c.params += experts + double(d.experts) * H + shared + latent;
      c.active += double(d.top_k) * mats * in * double(d.expert_I) + shared + latent + double(d.experts) * H;
    } else if (IsQwenNext(type)) {
      c.params += 3.0 * H * double(d.I);
      c.active += 3.0 * H * double(d.I);
    }
    weights += c.params;
    flops += 2.0 * B * S * c.active + c.seq_flops;
    peak = std::max(peak, c.act_bytes);
  }
  plan.weight_bytes = eb * weights + state_bytes;
  plan.activation_bytes = peak + eb * 8.0 * B * S * (H + double(std::max(d.I, d.m_inner))) + 4.0 * B * double(d.vocab);
  plan.flops = flops;
  if (plan.weight_bytes + plan.activation_bytes > options.max_bytes) {
    return refuse(Budget(plan.weight_bytes + plan.activation_bytes, plan.layers_built, plan.layers_total,
                         options.max_bytes));
  }
  plan.buildable = true;
  return plan;
}

Status RunHybrid(const selection::Features& f, const BuildPlan& plan, const CaptureProfile& profile, ModelSession& rec,
                 uint64_t seed) {
  if (!plan.buildable) return Status::InvalidArgument("model is not buildable: " + plan.reason);
  try {
    at::manual_seed(seed);
    const at::ScalarType dt = ToScalarType(profile.dtype);
    const Weights W{dt, &rec};
    const Weights W32{at::kFloat, &rec};
    const json& config = plan.config;
    const std::string& type = f.model_type;
    const HybridDims d = ReadHybrid(f, config);
    std::string why;
    const std::vector<std::string> kinds = LayerKinds(type, config, f.layers, &why);
    const std::vector<int64_t> built = ChooseLayers(kinds, plan.layers_built);
    const int64_t B = profile.batch, S = std::max<int64_t>(1, profile.seq_len), P = profile.past_len, T = P + S;
    const bool decode = P > 0;
    const bool cache = !rec.training;  // generation keeps a cache; training runs without one
    const int64_t H = d.H;

    at::Tensor embed = W({d.vocab, H});
    at::Tensor lm_head = d.tied ? embed : W({d.vocab, H});

    if (IsNemotronH(type)) {
      at::Tensor norm_f = W.Ones({H});
      std::vector<NemotronLayer> layers;
      for (int64_t i : built) {
        NemotronLayer l;
        l.kind = kinds[static_cast<size_t>(i)];
        l.index = i;
        l.norm = W.Ones({H});
        if (l.kind == "mamba") {
          const int64_t proj = d.m_inner + d.conv_dim + d.m_heads;
          l.in_proj = Linear{W({proj, H}), d.proj_bias ? W.Zeros({proj}) : at::Tensor()};
          l.conv_w = W({d.conv_dim, 1, d.conv_k});
          if (d.conv_bias) l.conv_b = W.Zeros({d.conv_dim});
          l.dt_bias = W({d.m_heads});
          l.a_log = W({d.m_heads});
          l.d = W.Ones({d.m_heads});
          l.gnorm = W.Ones({d.m_inner});
          l.out_proj = Linear{W({H, d.m_inner}), d.proj_bias ? W.Zeros({H}) : at::Tensor()};
          if (decode) {
            l.conv_state = W({B, d.conv_dim, d.conv_k});
            l.ssm_state = W({B, d.m_heads, d.m_hd, d.state});
          }
        } else if (l.kind == "attention") {
          l.wq = W({d.heads * d.hd, H}), l.wk = W({d.kv * d.hd, H}), l.wv = W({d.kv * d.hd, H});
          l.wo = W({H, d.heads * d.hd});
          if (decode) l.past_k = W({B, d.kv, P, d.hd}), l.past_v = W({B, d.kv, P, d.hd});
        } else if (l.kind == "mlp") {
          l.up = Linear{W({d.I, H}), d.mlp_bias ? W.Zeros({d.I}) : at::Tensor()};
          l.down = Linear{W({H, d.I}), d.mlp_bias ? W.Zeros({H}) : at::Tensor()};
        } else {
          const int64_t in = d.latent > 0 ? d.latent : H;
          l.router = W({d.experts, H});
          l.e_bias = W32.Zeros({d.experts});
          l.e_up = W({d.experts, d.expert_I, in});
          l.e_down = W({d.experts, in, d.expert_I});
          l.s_up = Linear{W({d.shared_I, H}), d.mlp_bias ? W.Zeros({d.shared_I}) : at::Tensor()};
          l.s_down = Linear{W({H, d.shared_I}), d.mlp_bias ? W.Zeros({H}) : at::Tensor()};
          if (d.latent > 0) {
            l.latent_in = Linear{W({d.latent, H}), d.mlp_bias ? W.Zeros({d.latent}) : at::Tensor()};
            l.latent_out = Linear{W({H, d.latent}), d.mlp_bias ? W.Zeros({H}) : at::Tensor()};
          }
        }
        layers.push_back(std::move(l));
      }
      at::Tensor ids = at::randint(0, d.vocab, {B, S}, at::kLong);

      c10::InferenceMode guard(!rec.training);
      rec.Start();
      at::Tensor x;
      {
        ModuleScope s(&rec, "embeddings");
        x = at::embedding(embed, ids);
      }
      at::Tensor mask;
      if (S > 1) {
        ModuleScope s(&rec, "causal_mask");
        mask = CausalMask(S, P, dt);
      }
      for (NemotronLayer& l : layers) {
        const std::string path = "layers." + std::to_string(l.index);
        at::Tensor residual = x, h;
        {
          ModuleScope s(&rec, path + ".norm");
          h = ApplyNorm(x.to(l.norm.scalar_type()), Norm{l.norm, {}}, /*rms=*/true, d.eps);
        }
        {
          ModuleScope s(&rec, path + ".mixer", l.kind == "mamba" ? "ssm" : l.kind == "attention" ? "attention" : "mlp");
          if (l.kind == "mamba") {
            h = Mamba2Mixer(h, l, d, decode, cache, dt);
          } else if (l.kind == "attention") {
            at::Tensor q = at::linear(h, l.wq).view({B, S, -1, d.hd}).transpose(1, 2);
            at::Tensor k = at::linear(h, l.wk).view({B, S, -1, d.hd}).transpose(1, 2);
            at::Tensor v = at::linear(h, l.wv).view({B, S, -1, d.hd}).transpose(1, 2);
            if (decode) {
              k = at::cat({l.past_k, k}, -2);
              v = at::cat({l.past_v, v}, -2);
            }
            at::Tensor o = EagerAttention(q, k, v, mask, d.heads / d.kv, 1.0 / std::sqrt(double(d.hd)), dt);
            h = at::linear(o.reshape({B, S, -1}).contiguous(), l.wo);
          } else if (l.kind == "mlp") {
            h = l.down(Activate(l.up(h), d.act));
          } else {
            h = NemotronMoe(h, l, d);
          }
        }
        x = residual + h;
      }
      {
        ModuleScope s(&rec, "norm_f");
        x = ApplyNorm(x, Norm{norm_f, {}}, /*rms=*/true, d.eps);
      }
      {
        ModuleScope s(&rec, "lm_head");
        x = at::linear(rec.training ? x : x.slice(1, S - 1, S), lm_head).to(at::kFloat);
      }
      rec.Stop(x);
      return Status::Ok();
    }

    // Qwen3-Next / Qwen3.5 text.
    const bool qwen35 = IsQwen35(type);
    at::Tensor norm_w = W.Zeros({H});
    std::vector<QwenLayer> layers;
    const int64_t key_dim = d.lk_heads * d.lk_dim, value_dim = d.lv_heads * d.lv_dim;
    const int64_t conv_dim = 2 * key_dim + value_dim;
    for (int64_t i : built) {
      QwenLayer l;
      l.kind = kinds[static_cast<size_t>(i)];
      l.index = i;
      l.moe = MoeLayer(d, i);
      l.ln1 = W.Zeros({H});
      l.ln2 = W.Zeros({H});
      if (l.kind == "linear_attention") {
        if (qwen35) {
          l.qkv = Linear{W({conv_dim, H}), {}};
          l.z = Linear{W({value_dim, H}), {}};
          l.b = Linear{W({d.lv_heads, H}), {}};
          l.a = Linear{W({d.lv_heads, H}), {}};
        } else {
          l.qkvz = Linear{W({2 * key_dim + 2 * value_dim, H}), {}};
          l.ba = Linear{W({2 * d.lv_heads, H}), {}};
        }
        l.conv_w = W({conv_dim, 1, d.l_conv});
        l.dt_bias = W.Ones({d.lv_heads});
        l.a_log = W({d.lv_heads});
        l.gnorm = W.Ones({d.lv_dim});
        l.out_proj = Linear{W({H, value_dim}), {}};
        if (decode) {
          l.conv_state = W({B, conv_dim, d.l_conv});
          l.rec_state = W32({B, d.lv_heads, d.lk_dim, d.lv_dim});
        }
      } else {
        l.wq = W({d.heads * d.hd * 2, H}), l.wk = W({d.kv * d.hd, H}), l.wv = W({d.kv * d.hd, H});
        l.wo = W({H, d.heads * d.hd});
        l.q_norm = W.Zeros({d.hd}), l.k_norm = W.Zeros({d.hd});
        if (decode) l.past_k = W({B, d.kv, P, d.hd}), l.past_v = W({B, d.kv, P, d.hd});
      }
      if (l.moe) {
        l.router = W({d.experts, H});
        l.e_gate_up = W({d.experts, 2 * d.expert_I, H});
        l.e_down = W({d.experts, H, d.expert_I});
        l.s_gate = Linear{W({d.shared_I, H}), {}};
        l.s_up = Linear{W({d.shared_I, H}), {}};
        l.s_down = Linear{W({H, d.shared_I}), {}};
        l.s_expert_gate = Linear{W({1, H}), {}};
      } else {
        l.gate = Linear{W({d.I, H}), {}};
        l.up = Linear{W({d.I, H}), {}};
        l.down = Linear{W({H, d.I}), {}};
      }
      layers.push_back(std::move(l));
    }
    at::Tensor ids = at::randint(0, d.vocab, {B, S}, at::kLong);
    at::Tensor inv_freq =
        1.0 / at::pow(d.rope_theta, at::arange(0, d.rotary, 2, at::kLong).to(at::kFloat) / static_cast<double>(d.rotary));

    c10::InferenceMode guard(!rec.training);
    rec.Start();
    at::Tensor x;
    {
      ModuleScope s(&rec, "embed_tokens");
      x = at::embedding(embed, ids);
    }
    at::Tensor mask;
    if (S > 1) {
      ModuleScope s(&rec, "causal_mask");
      mask = CausalMask(S, P, dt);
    }
    at::Tensor cos, sin;
    {
      ModuleScope s(&rec, "rotary_emb");
      at::Tensor pos = (at::arange(S, at::kLong) + P).unsqueeze(0);  // [1, S]
      if (qwen35) {
        // Qwen3VLTextRotaryEmbedding: positions for (t, h, w), frequencies
        // interleaved by section.
        at::Tensor pos3 = pos.view({1, 1, -1}).expand({4, B, S}).slice(0, 1);  // [3, B, S]
        at::Tensor inv = inv_freq.unsqueeze(0).unsqueeze(0).unsqueeze(-1).to(at::kFloat).expand({3, B, -1, 1});
        at::Tensor freqs = at::matmul(inv.to(at::kFloat), pos3.unsqueeze(2).to(at::kFloat)).transpose(2, 3);
        at::Tensor freqs_t = freqs.select(0, 0);
        for (int64_t dim = 1; dim <= 2; ++dim) {
          const int64_t length = d.mrope_section[static_cast<size_t>(dim)] * 3;
          freqs_t.slice(-1, dim, length, 3).copy_(freqs.select(0, dim).slice(-1, dim, length, 3));
        }
        at::Tensor emb = at::cat({freqs_t, freqs_t}, -1);
        cos = (emb.cos() * 1.0).to(dt);
        sin = (emb.sin() * 1.0).to(dt);
      } else {
        at::Tensor inv = inv_freq.unsqueeze(0).unsqueeze(-1).to(at::kFloat).expand({pos.size(0), -1, 1});
        at::Tensor freqs = at::matmul(inv.to(at::kFloat), pos.unsqueeze(1).to(at::kFloat)).transpose(1, 2);
        at::Tensor emb = at::cat({freqs, freqs}, -1);
        cos = (emb.cos() * 1.0).to(dt);
        sin = (emb.sin() * 1.0).to(dt);
      }
    }
    for (QwenLayer& l : layers) {
      const std::string path = "layers." + std::to_string(l.index);
      at::Tensor residual = x, h;
      {
        ModuleScope s(&rec, path + ".input_layernorm");
        h = OffsetRmsNorm(x, l.ln1, d.eps);
      }
      if (l.kind == "linear_attention") {
        ModuleScope s(&rec, path + ".linear_attn");
        h = GatedDeltaNet(h, l, d, qwen35, decode, cache, !rec.training);
      } else {
        ModuleScope s(&rec, path + ".self_attn");
        h = GatedAttention(h, l, d, cos, sin, mask, dt);
      }
      x = residual + h;
      residual = x;
      {
        ModuleScope s(&rec, path + ".post_attention_layernorm");
        h = OffsetRmsNorm(x, l.ln2, d.eps);
      }
      {
        ModuleScope s(&rec, path + ".mlp");
        h = l.moe ? QwenMoe(h, l, d) : QwenMlp(h, l.gate, l.up, l.down, d.act);
      }
      x = residual + h;
    }
    {
      ModuleScope s(&rec, "norm");
      x = OffsetRmsNorm(x, norm_w, d.eps);
    }
    {
      ModuleScope s(&rec, "lm_head");
      x = at::linear(rec.training ? x : x.slice(1, S - 1, S), lm_head);
    }
    (void)T;
    rec.Stop(x);
    return Status::Ok();
  } catch (const std::exception& e) {
    rec.Stop();
    return Status::Internal(std::string("building or running the model failed: ") + e.what());
  }
}

// ---------------------------------------------------------------------------

BuildPlan PlanSsm(const selection::Features& f, const json& config, const CaptureProfile& profile,
                  const BuildOptions& options) {
  BuildPlan plan;
  plan.family = "ssm";
  auto refuse = [&](std::string why) {
    plan.buildable = false;
    plan.reason = std::move(why);
    return plan;
  };
  const std::string& type = f.model_type;
  if (type != "rwkv5") return refuse("ssm model type '" + type + "' is not built yet (RWKV-5 is)");
  if (!f.quantization.empty()) plan.notes.push_back(QuantizationNote(f.quantization, profile.dtype));
  const RwkvDims d = ReadRwkv(f, config);
  if (d.H <= 0 || d.vocab <= 0 || f.layers <= 0 || d.I <= 0) return refuse("hidden size, layers or vocabulary unknown");
  if (d.head_size <= 0 || d.H % d.head_size != 0) return refuse("hidden size is not a multiple of the head size");
  if (Int(config, "attention_hidden_size", d.H) != d.H) {
    return refuse("an attention width other than the hidden size is not built (the WKV-5 heads split the hidden size)");
  }
  plan.layers_total = f.layers;
  plan.layers_built = std::min(f.layers, std::max<int64_t>(1, options.max_layers));
  plan.notes.push_back(
      "RWKV-5 runs the time loop of the Hub model's rwkv_linear_attention_v5 (one step per token), not its CUDA kernel");
  plan.notes.push_back("layer 0's pre_ln is folded into the embedding table on the first forward (the prefill), as the Hub "
                       "model does; the half-precision rescaling of output weights is not applied");

  const double eb = ElementBytes(profile.dtype), H = double(d.H), I = double(d.I), hs = double(d.head_size);
  const double B = double(profile.batch), S = double(std::max<int64_t>(1, profile.seq_len));
  const double per_layer = 5.0 * H * H + 2.0 * H * I + H * H + 12.0 * H;
  const double L = double(plan.layers_built);
  plan.weight_bytes = eb * (double(d.vocab) * H * (d.tied ? 1.0 : 2.0) + per_layer * L) +
                      B * (2.0 * H * eb + double(d.heads) * hs * hs * 4.0) * double(f.layers);
  plan.activation_bytes = (profile.past_len > 0 ? 0.0 : 4.0 * double(d.vocab) * H) + eb * 8.0 * B * S * (H + I) +
                          4.0 * B * S * double(d.vocab) + 4.0 * B * S * H * 4.0;
  plan.flops = 2.0 * B * S * per_layer * L + 2.0 * B * S * H * double(d.vocab) + 6.0 * B * S * H * hs * L;
  if (plan.weight_bytes + plan.activation_bytes > options.max_bytes) {
    return refuse(Budget(plan.weight_bytes + plan.activation_bytes, plan.layers_built, plan.layers_total,
                         options.max_bytes));
  }
  plan.buildable = true;
  return plan;
}

Status RunSsm(const selection::Features& f, const BuildPlan& plan, const CaptureProfile& profile, ModelSession& rec,
              uint64_t seed) {
  if (!plan.buildable) return Status::InvalidArgument("model is not buildable: " + plan.reason);
  try {
    at::manual_seed(seed);
    const at::ScalarType dt = ToScalarType(profile.dtype);
    const Weights W{dt, &rec};
    const Weights W32{at::kFloat, &rec};
    const RwkvDims d = ReadRwkv(f, plan.config);
    const int64_t B = profile.batch, S = std::max<int64_t>(1, profile.seq_len), H = d.H, nh = d.heads, hs = d.head_size;
    const int64_t Lt = f.layers;  // the state holds every layer
    const bool decode = profile.past_len > 0;

    at::Tensor embed = W({d.vocab, H});
    Norm pre_ln = MakeLayerNorm(W, H);
    std::vector<RwkvLayer> layers(static_cast<size_t>(plan.layers_built));
    for (RwkvLayer& l : layers) {
      l.ln1 = MakeLayerNorm(W, H);
      l.ln2 = MakeLayerNorm(W, H);
      l.time_decay = W32({nh, hs});  // kept in fp32 (_keep_in_fp32_modules)
      l.time_faaaa = W({nh, hs});
      l.mix_gate = W({1, 1, H}), l.mix_key = W({1, 1, H}), l.mix_value = W({1, 1, H}), l.mix_receptance = W({1, 1, H});
      l.key = W({H, H}), l.value = W({H, H}), l.receptance = W({H, H}), l.gate = W({H, H}), l.output = W({H, H});
      l.ln_x = MakeLayerNorm(W, H);
      l.f_mix_key = W({1, 1, H}), l.f_mix_receptance = W({1, 1, H});
      l.f_key = W({d.I, H}), l.f_receptance = W({H, H}), l.f_value = W({H, d.I});
    }
    Norm ln_out = MakeLayerNorm(W, H);
    at::Tensor head = d.tied ? embed : W({d.vocab, H});
    // The recurrent state of a decode step: [B, H, layers] shift states and
    // [B, heads, hs, hs, layers] WKV states in fp32, as the model keeps them.
    at::Tensor state0, state1, state2;
    if (decode) {
      state0 = W({B, H, Lt});
      state1 = W32({B, nh, hs, hs, Lt});
      state2 = W({B, H, Lt});
    }
    at::Tensor ids = at::randint(0, d.vocab, {B, S}, at::kLong);

    c10::InferenceMode guard(!rec.training);
    rec.Start();
    at::Tensor x;
    {
      ModuleScope s(&rec, "embeddings");
      at::Tensor table = embed;
      if (!decode) table = at::layer_norm(embed, {H}, pre_ln.weight, pre_ln.bias);  // the first forward folds pre_ln
      x = at::embedding(table, ids);
    }
    if (!decode) {
      ModuleScope s(&rec, "state");
      state0 = at::zeros({B, H, Lt}, at::TensorOptions().dtype(dt)).contiguous();
      state1 = at::zeros({B, nh, hs, hs, Lt}, at::TensorOptions().dtype(at::kFloat)).contiguous();
      state2 = at::zeros({B, H, Lt}, at::TensorOptions().dtype(dt)).contiguous();
    }
    // Decode writes into the caller's state; training never reaches here with one.
    const bool write = !decode || !rec.training;
    // time_shift (ZeroPad2d((0, 0, 1, -1))): the previous token, the state's for the first.
    auto shift = [&](const at::Tensor& hidden, const at::Tensor& st, int64_t li) {
      at::Tensor shifted;
      if (hidden.size(1) == 1) {
        shifted = st.select(2, li);
      } else {
        shifted = at::constant_pad_nd(hidden, {0, 0, 1, -1}, 0);
        shifted.select(1, 0).copy_(st.select(2, li));
      }
      if (shifted.dim() == 2) shifted = shifted.unsqueeze(1);
      return shifted;
    };
    auto mix = [](const at::Tensor& hidden, const at::Tensor& shifted, const at::Tensor& m) {
      return hidden * m + shifted * (1 - m);
    };
    for (size_t li = 0; li < layers.size(); ++li) {
      RwkvLayer& l = layers[li];
      const int64_t idx = static_cast<int64_t>(li);
      const std::string path = "blocks." + std::to_string(li);
      at::Tensor h;
      {
        ModuleScope s(&rec, path + ".ln1");
        h = at::layer_norm(x, {H}, l.ln1.weight, l.ln1.bias, d.eps);
      }
      at::Tensor attention;
      {
        ModuleScope s(&rec, path + ".attention");
        const int64_t Tn = h.size(1);
        at::Tensor shifted = shift(h, state0, idx);
        at::Tensor key = mix(h, shifted, l.mix_key), value = mix(h, shifted, l.mix_value);
        at::Tensor receptance = mix(h, shifted, l.mix_receptance), gate = mix(h, shifted, l.mix_gate);
        key = at::linear(key, l.key).to(at::kFloat).view({B, Tn, nh, hs}).transpose(1, 2).transpose(-2, -1);
        value = at::linear(value, l.value).to(at::kFloat).view({B, Tn, nh, hs}).transpose(1, 2);
        receptance = at::linear(receptance, l.receptance).to(at::kFloat).view({B, Tn, nh, hs}).transpose(1, 2);
        gate = at::silu(at::linear(gate, l.gate));
        if (write) state0.select(2, idx).copy_(h.select(1, Tn - 1));
        at::Tensor state = state1.select(4, idx);
        // rwkv_linear_attention_v5
        at::Tensor decay = at::exp(-at::exp(l.time_decay.to(at::kFloat))).reshape({-1, 1, 1}).reshape({nh, -1, 1});
        at::Tensor first = l.time_faaaa.to(at::kFloat).reshape({-1, 1, 1}).reshape({nh, -1, 1});
        at::Tensor lxw = l.ln_x.weight.to(at::kFloat), lxb = l.ln_x.bias.to(at::kFloat);
        at::Tensor out = at::empty({B, Tn, nh, hs}, at::TensorOptions().dtype(receptance.scalar_type()));
        for (int64_t t = 0; t < Tn; ++t) {
          at::Tensor rt = receptance.slice(2, t, t + 1);
          at::Tensor kt = key.slice(3, t, t + 1);
          at::Tensor vt = value.slice(2, t, t + 1);
          at::Tensor at_ = at::matmul(kt, vt);
          out.select(1, t).copy_(at::matmul(rt, first * at_ + state).squeeze(2));
          state = at_ + decay * state;
        }
        out = out.reshape({B * Tn, nh * hs});
        out = at::group_norm(out, nh, lxw, lxb).reshape({B, Tn, nh * hs});
        out = out.to(h.scalar_type()) * gate;
        attention = at::matmul(out, l.output.t());
        if (write) state1.select(4, idx).copy_(state);
      }
      x = x + attention;
      {
        ModuleScope s(&rec, path + ".ln2");
        h = at::layer_norm(x, {H}, l.ln2.weight, l.ln2.bias, d.eps);
      }
      at::Tensor ff;
      {
        ModuleScope s(&rec, path + ".feed_forward");
        at::Tensor shifted = shift(h, state2, idx);
        at::Tensor key = mix(h, shifted, l.f_mix_key), receptance = mix(h, shifted, l.f_mix_receptance);
        key = at::square(at::relu(at::linear(key, l.f_key)));
        at::Tensor value = at::linear(key, l.f_value);
        receptance = at::sigmoid(at::linear(receptance, l.f_receptance));
        if (write) state2.select(2, idx).copy_(h.select(1, h.size(1) - 1));
        ff = receptance * value;
      }
      x = x + ff;
      // Half-precision inference halves the hidden state every rescale_every layers.
      if (dt != at::kFloat && dt != at::kDouble && d.rescale_every > 0 && (idx + 1) % d.rescale_every == 0) x = x / 2;
    }
    {
      ModuleScope s(&rec, "ln_out");
      x = at::layer_norm(x, {H}, ln_out.weight, ln_out.bias);
    }
    {
      ModuleScope s(&rec, "head");
      x = at::linear(x, head);
    }
    rec.Stop(x);
    return Status::Ok();
  } catch (const std::exception& e) {
    rec.Stop();
    return Status::Internal(std::string("building or running the model failed: ") + e.what());
  }
}

}  // namespace coverage::runners::builder
