// The decoder-only family of the model builder (model_builder.h).
#include <algorithm>
#include <cmath>

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include "runners/dtype_map.h"
#include "runners/model_builder_internal.h"

namespace coverage::runners::builder {
namespace {

struct Layer {
  Norm ln1, ln2;
  at::Tensor wq, wk, wv, wo, bq, bk, bv, bo, q_norm, k_norm;
  at::Tensor w_gate, w_up, w_down, b_up, b_down;  // dense MLP
  at::Tensor router;                              // [experts, hidden]
  std::vector<at::Tensor> e_gate, e_up, e_down;   // experts
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
  if (f.attention != "mha" && f.attention != "gqa" && f.attention != "mqa") {
    return refuse("attention kind '" + f.attention + "' is not built yet (MHA, GQA and MQA are)");
  }
  if (f.hidden <= 0 || f.layers <= 0 || f.heads <= 0 || f.vocab <= 0 || f.intermediate <= 0) {
    return refuse("hidden size, layers, heads, vocabulary or intermediate size unknown");
  }
  const int64_t kv = f.kv_heads > 0 ? f.kv_heads : f.heads;
  if (f.heads % kv != 0) return refuse("attention heads are not a multiple of the KV heads");
  const int64_t head_dim = f.head_dim > 0 ? f.head_dim : f.hidden / f.heads;
  if (head_dim <= 0 || head_dim % 2 != 0) return refuse("head dimension must be even and positive");
  if (f.position != "rope" && f.position != "alibi" && f.position != "learned" && f.position != "none") {
    return refuse("position scheme '" + f.position + "' is not built for decoders (rope, alibi, learned and none are)");
  }
  if (f.rope_scaling == "mrope") return refuse("multimodal rope (mrope) is not built yet");
  if (f.norm != "rmsnorm" && f.norm != "layernorm") return refuse("norm kind '" + f.norm + "' is not built");
  if (f.norm_placement == "post") return refuse("post-norm decoders are not built yet");
  if (!KnownActivation(f.activation)) return refuse("activation '" + f.activation + "' is not built");
  if (f.experts > 0 && (f.experts_per_token <= 0 || f.experts_per_token > f.experts)) {
    return refuse("mixture of experts without a valid number of experts per token");
  }
  if (!f.quantization.empty()) {
    return refuse("quantized weights (" + f.quantization + ") are not built: their kernels are the quantization library's");
  }
  if (f.position == "learned" && f.context <= 0) return refuse("learned positions without a context length");

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
  plan.expert_intermediate = ConfigInt(config, "moe_intermediate_size", f.intermediate);

  plan.layers_total = f.layers;
  plan.layers_built = std::min(f.layers, std::max<int64_t>(1, options.max_layers));
  const double eb = ElementBytes(profile.dtype);
  const double H = double(f.hidden), I = double(f.intermediate), hd = double(head_dim);
  const double attn = H * (double(f.heads) + 2.0 * double(kv)) * hd + double(f.heads) * hd * H;
  const double mlp_mats = f.gated_mlp ? 3.0 : 2.0;
  const double dense = mlp_mats * H * I;
  const double moe = f.experts > 0 ? double(f.experts) * 3.0 * H * double(plan.expert_intermediate) +
                                         double(f.experts) * H + (f.shared_experts > 0 ? 3.0 * H * I : 0.0)
                                   : dense;
  const double per_layer = attn + moe;
  const double embed = double(f.vocab) * H * (f.tied_embeddings ? 1.0 : 2.0) +
                       (f.position == "learned" ? double(f.context) * H : 0.0);
  plan.weight_bytes = eb * (embed + per_layer * double(plan.layers_built));
  const double B = double(profile.batch), S = double(std::max<int64_t>(1, profile.seq_len));
  const double T = double(profile.past_len) + S;
  const double kv_cache = 2.0 * B * double(kv) * double(profile.past_len) * hd * double(plan.layers_built);
  // Scores in fp32, a handful of [B, S, I] and [B, S, H] intermediates, logits.
  plan.activation_bytes = 4.0 * B * double(f.heads) * S * T + eb * (kv_cache + 6.0 * B * S * (H + I)) +
                          4.0 * B * double(f.vocab);
  // Matmuls dominate: 2 flops per weight per token (the LM head on one
  // token), plus the attention scores and their product with V.
  const double active_mlp = f.experts > 0 ? double(f.experts_per_token) * 3.0 * H * double(plan.expert_intermediate) +
                                                (f.shared_experts > 0 ? 3.0 * H * I : 0.0)
                                          : dense;
  plan.flops = 2.0 * B * S * (attn + active_mlp) * double(plan.layers_built) + 2.0 * B * H * double(f.vocab) +
               4.0 * B * double(f.heads) * S * T * hd * double(plan.layers_built);
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

Status RunDecoder(const selection::Features& f, const BuildPlan& plan, const CaptureProfile& profile, ModelSession& rec,
                uint64_t seed) {
  if (!plan.buildable) return Status::InvalidArgument("model is not buildable: " + plan.reason);
  try {
    at::manual_seed(seed);
    const at::ScalarType dt = ToScalarType(profile.dtype);
    const Weights W{dt, &rec};
    const int64_t H = f.hidden, heads = f.heads, kv = f.kv_heads > 0 ? f.kv_heads : f.heads;
    const int64_t hd = f.head_dim > 0 ? f.head_dim : H / heads, I = f.intermediate, rep = heads / kv;
    const int64_t B = profile.batch, S = std::max<int64_t>(1, profile.seq_len), P = profile.past_len, T = P + S;
    const bool rms = f.norm == "rmsnorm";
    const double eps = rms ? 1e-6 : 1e-5;
    const int64_t rot = std::max<int64_t>(2, static_cast<int64_t>(double(hd) * plan.rotary_fraction) / 2 * 2);
    // Gemma's RMSNorm scales by (1 + weight).
    auto apply_norm = [&](const at::Tensor& t, const Norm& n) {
      return plan.gemma ? ApplyNorm(t, Norm{n.weight + 1.0, {}}, true, eps) : ApplyNorm(t, n, rms, eps);
    };
    auto norm = [&](int64_t n) { return Norm{W.Ones({n}), rms ? at::Tensor() : W.Zeros({n})}; };
    auto bias = [&](int64_t n) { return plan.linear_bias ? W({n}) : at::Tensor(); };

    // Weights and inputs are made before recording starts.
    at::Tensor embed = W({f.vocab, H});
    at::Tensor lm_head = f.tied_embeddings ? embed : W({f.vocab, H});
    at::Tensor pos_embed = f.position == "learned" ? W({f.context, H}) : at::Tensor();
    Norm ln_f = norm(H);
    std::vector<Layer> layers(static_cast<size_t>(plan.layers_built));
    for (Layer& l : layers) {
      l.ln1 = norm(H);
      l.ln2 = norm(H);
      l.wq = W({heads * hd, H}), l.wk = W({kv * hd, H}), l.wv = W({kv * hd, H}), l.wo = W({H, heads * hd});
      l.bq = bias(heads * hd), l.bk = bias(kv * hd), l.bv = bias(kv * hd), l.bo = bias(H);
      if (plan.qk_norm) l.q_norm = W.Ones({hd}), l.k_norm = W.Ones({hd});
      if (f.experts > 0) {
        const int64_t EI = plan.expert_intermediate;
        l.router = W({f.experts, H});
        for (int64_t e = 0; e < f.experts; ++e) {
          l.e_gate.push_back(W({EI, H}));
          l.e_up.push_back(W({EI, H}));
          l.e_down.push_back(W({H, EI}));
        }
        if (f.shared_experts > 0) l.s_gate = W({I, H}), l.s_up = W({I, H}), l.s_down = W({H, I});
      } else {
        if (f.gated_mlp) l.w_gate = W({I, H});
        l.w_up = W({I, H}), l.w_down = W({H, I});
        l.b_up = bias(I), l.b_down = bias(H);
      }
      if (P > 0) l.past_k = W({B, kv, P, hd}), l.past_v = W({B, kv, P, hd});
    }
    at::Tensor ids = at::randint(0, f.vocab, {B, S}, at::kLong);
    at::Tensor inv_freq = 1.0 / at::pow(10000.0, at::arange(0, rot, 2, at::kFloat) / static_cast<double>(rot));
    at::Tensor slopes = f.position == "alibi" ? AlibiSlopes(heads) : at::Tensor();

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
    at::Tensor cos, sin;
    if (f.position == "rope") {
      ModuleScope s(&rec, "rotary_emb");
      at::Tensor pos = at::arange(P, T, at::kLong).unsqueeze(0).unsqueeze(1).to(at::kFloat);
      at::Tensor freqs = at::matmul(inv_freq.unsqueeze(0).unsqueeze(-1), pos).transpose(1, 2);
      at::Tensor emb = at::cat({freqs, freqs}, -1);
      cos = emb.cos().to(dt).unsqueeze(1);
      sin = emb.sin().to(dt).unsqueeze(1);
    }
    at::Tensor mask;
    if (S > 1 || f.position == "alibi") {
      ModuleScope s(&rec, "causal_mask");
      at::Tensor m = at::full({S, T}, Lowest(dt), at::TensorOptions().dtype(dt)).triu(P + 1);
      if (f.sliding_window > 0 && T > f.sliding_window) {
        // Keys further back than the window are masked too.
        m = m + at::full({S, T}, Lowest(dt), at::TensorOptions().dtype(dt)).tril(P - f.sliding_window);
        m = m.clamp_min(Lowest(dt));
      }
      mask = m.unsqueeze(0).unsqueeze(0);
      if (f.position == "alibi") {
        at::Tensor distance = at::arange(0, T, at::kFloat).unsqueeze(0);  // [1, T]
        mask = mask + (slopes.view({1, heads, 1, 1}) * distance.view({1, 1, 1, T})).to(dt);
      }
    }
    for (size_t li = 0; li < layers.size(); ++li) {
      Layer& l = layers[li];
      const std::string path = "layers." + std::to_string(li);
      at::Tensor residual = x;
      at::Tensor h;
      {
        ModuleScope s(&rec, path + ".input_layernorm");
        h = apply_norm(x, l.ln1);
      }
      at::Tensor attn_out;
      {
        ModuleScope s(&rec, path + ".self_attn");
        at::Tensor q = at::linear(h, l.wq, l.bq).view({B, S, heads, hd});
        at::Tensor k = at::linear(h, l.wk, l.bk).view({B, S, kv, hd});
        at::Tensor v = at::linear(h, l.wv, l.bv).view({B, S, kv, hd}).transpose(1, 2);
        if (plan.qk_norm) {
          q = plan.gemma ? apply_norm(q, Norm{l.q_norm, {}}) : ApplyNorm(q, Norm{l.q_norm, {}}, true, eps);
          k = plan.gemma ? apply_norm(k, Norm{l.k_norm, {}}) : ApplyNorm(k, Norm{l.k_norm, {}}, true, eps);
        }
        q = q.transpose(1, 2);
        k = k.transpose(1, 2);
        if (cos.defined()) {
          auto rope = [&](const at::Tensor& t) {
            if (rot == hd) return t * cos + RotateHalf(t) * sin;
            at::Tensor r = t.slice(-1, 0, rot), pass = t.slice(-1, rot);
            return at::cat({r * cos + RotateHalf(r) * sin, pass}, -1);
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
        if (mask.defined()) scores = scores + mask;
        at::Tensor probs = at::softmax(scores, -1, at::kFloat).to(dt);
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
      if (f.experts > 0) {
        ModuleScope s(&rec, path + ".mlp");
        at::Tensor flat = mlp_in.reshape({B * S, H});
        at::Tensor routing = at::softmax(at::linear(flat, l.router), -1, at::kFloat);
        auto [weights, chosen] = at::topk(routing, f.experts_per_token, -1);
        weights = (weights / weights.sum(-1, /*keepdim=*/true)).to(dt);
        at::Tensor out = at::zeros_like(flat);
        at::Tensor expert_mask = at::one_hot(chosen, f.experts).permute({2, 1, 0});  // [E, k, tokens]
        for (int64_t e = 0; e < f.experts; ++e) {
          at::Tensor where = at::nonzero(expert_mask[e]);  // [n, 2]: (slot, token)
          if (where.size(0) == 0) continue;
          at::Tensor slot = where.select(1, 0), token = where.select(1, 1);
          at::Tensor xs = flat.index_select(0, token);
          at::Tensor y = at::linear(Activate(at::linear(xs, l.e_gate[static_cast<size_t>(e)]), f.activation) *
                                        at::linear(xs, l.e_up[static_cast<size_t>(e)]),
                                    l.e_down[static_cast<size_t>(e)]);
          y = y * weights.index({token, slot}).unsqueeze(-1);
          out.index_add_(0, token, y);
        }
        if (l.s_gate.defined()) {
          out = out + at::linear(Activate(at::linear(flat, l.s_gate), f.activation) * at::linear(flat, l.s_up), l.s_down);
        }
        mlp_out = out.view({B, S, H});
      } else {
        ModuleScope s(&rec, path + ".mlp");
        at::Tensor up = at::linear(mlp_in, l.w_up, l.b_up);
        at::Tensor act = f.gated_mlp ? Activate(at::linear(mlp_in, l.w_gate), f.activation) * up
                                     : Activate(up, f.activation);
        mlp_out = at::linear(act, l.w_down, l.b_down);
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
