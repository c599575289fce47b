#include "runners/blocks.h"

#include <cmath>
#include <limits>

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include "runners/dtype_map.h"

namespace coverage::runners {
namespace {

using nlohmann::json;

// Reads an integer config field, trying aliases in order (GPT-2 style
// configs say n_embd where Llama says hidden_size).
// Every dimension read this way must be positive.
Result<int64_t> Int(const BlockModel& m, std::initializer_list<const char*> names, std::optional<int64_t> fallback = {}) {
  for (const char* n : names) {
    if (m.config.contains(n) && m.config[n].is_number_integer()) {
      const int64_t v = m.config[n].get<int64_t>();
      if (v <= 0) return Status::InvalidArgument(m.id + ": config.json '" + n + "' is " + std::to_string(v) + "; it must be positive");
      return v;
    }
  }
  if (fallback) return *fallback;
  std::string list;
  for (const char* n : names) list += (list.empty() ? "" : " / ") + std::string(n);
  return Status::InvalidArgument(m.id + ": config.json has no integer '" + list + "'");
}

double Double(const BlockModel& m, const char* name, double fallback) {
  if (m.config.contains(name) && m.config[name].is_number()) return m.config[name].get<double>();
  return fallback;
}

bool Bool(const BlockModel& m, const char* name, bool fallback) {
  if (m.config.contains(name) && m.config[name].is_boolean()) return m.config[name].get<bool>();
  return fallback;
}

// Weights: small random values, made before recording starts.
struct WeightMaker {
  at::ScalarType dtype;
  at::Tensor operator()(at::IntArrayRef shape) const { return (at::randn(shape) * 0.02).to(dtype); }
  at::Tensor Ones(at::IntArrayRef shape) const { return at::ones(shape, at::TensorOptions().dtype(dtype)); }
  at::Tensor Zeros(at::IntArrayRef shape) const { return at::zeros(shape, at::TensorOptions().dtype(dtype)); }
};

// Hugging Face LlamaRMSNorm: computes in fp32, scales in the model dtype.
at::Tensor RmsNorm(const at::Tensor& x, const at::Tensor& w, double eps) {
  at::Tensor h = x.to(at::kFloat);
  at::Tensor var = h.pow(2).mean({-1}, /*keepdim=*/true);
  h = h * at::rsqrt(var + eps);
  return w * h.to(x.scalar_type());
}

at::Tensor RotateHalf(const at::Tensor& x) {
  const int64_t half = x.size(-1) / 2;
  at::Tensor x1 = x.slice(-1, 0, half);
  at::Tensor x2 = x.slice(-1, half);
  return at::cat({x2.neg(), x1}, -1);
}

// Hugging Face's causal additive mask: lowest value above the diagonal.
at::Tensor CausalMask(int64_t batch, int64_t q, int64_t kv, int64_t past, at::ScalarType dtype) {
  const double lowest = dtype == at::kBFloat16 ? -3.3895313892515355e38
                        : dtype == at::kHalf  ? -65504.0
                                              : static_cast<double>(std::numeric_limits<float>::lowest());
  at::Tensor mask = at::full({q, kv}, lowest, at::TensorOptions().dtype(dtype)).triu(past + 1);
  return mask.unsqueeze(0).unsqueeze(0).expand({batch, 1, q, kv});
}

Status RunDecoder(const BlockModel& m, const CaptureProfile& p, OpRecorder& rec) {
  COV_ASSIGN_OR_RETURN(int64_t hidden, Int(m, {"hidden_size", "n_embd", "d_model"}));
  COV_ASSIGN_OR_RETURN(int64_t heads, Int(m, {"num_attention_heads", "n_head"}));
  COV_ASSIGN_OR_RETURN(int64_t kv_heads, Int(m, {"num_key_value_heads"}, heads));
  COV_ASSIGN_OR_RETURN(int64_t head_dim, Int(m, {"head_dim"}, hidden / heads));
  COV_ASSIGN_OR_RETURN(int64_t inter, Int(m, {"intermediate_size"}));
  COV_ASSIGN_OR_RETURN(int64_t vocab, Int(m, {"vocab_size"}));
  if (heads % kv_heads != 0) return Status::InvalidArgument(m.id + ": num_attention_heads is not a multiple of num_key_value_heads");
  const double eps = Double(m, "rms_norm_eps", 1e-6);
  const double theta = Double(m, "rope_theta", 10000.0);
  const bool bias = Bool(m, "attention_bias", false);
  const bool qk_norm = m.config.contains("model_type") && m.config["model_type"] == "qwen3";
  const bool tied = Bool(m, "tie_word_embeddings", false);
  const at::ScalarType dt = ToScalarType(p.dtype);
  const int64_t B = p.batch, S = p.seq_len, P = p.past_len, T = P + S, rep = heads / kv_heads;
  WeightMaker W{dt};

  at::Tensor embed = W({vocab, hidden});
  at::Tensor lm_head = tied ? embed : W({vocab, hidden});
  at::Tensor wq = W({heads * head_dim, hidden}), wk = W({kv_heads * head_dim, hidden}), wv = W({kv_heads * head_dim, hidden});
  at::Tensor wo = W({hidden, heads * head_dim});
  at::Tensor bq, bk, bv;
  if (bias) bq = W({heads * head_dim}), bk = W({kv_heads * head_dim}), bv = W({kv_heads * head_dim});
  at::Tensor q_norm = W.Ones({head_dim}), k_norm = W.Ones({head_dim});
  at::Tensor ln1 = W.Ones({hidden}), ln2 = W.Ones({hidden}), ln_f = W.Ones({hidden});
  at::Tensor w_gate = W({inter, hidden}), w_up = W({inter, hidden}), w_down = W({hidden, inter});
  at::Tensor inv_freq = 1.0 / at::pow(theta, at::arange(0, head_dim, 2, at::kFloat) / static_cast<double>(head_dim));
  at::Tensor ids = at::randint(0, vocab, {B, S}, at::kLong);
  at::Tensor past_k, past_v;
  if (P > 0) past_k = W({B, kv_heads, P, head_dim}), past_v = W({B, kv_heads, P, head_dim});

  c10::InferenceMode guard;
  rec.Start();
  at::Tensor x;
  {
    ModuleScope s(&rec, "embed_tokens");
    x = at::embedding(embed, ids);
  }
  at::Tensor cos, sin;
  {
    ModuleScope s(&rec, "rotary_emb");
    at::Tensor position_ids = at::arange(P, T, at::kLong).unsqueeze(0);
    at::Tensor f = inv_freq.unsqueeze(0).unsqueeze(-1).to(at::kFloat).expand({1, -1, 1});
    at::Tensor pos = position_ids.unsqueeze(1).to(at::kFloat);
    at::Tensor freqs = at::matmul(f, pos).transpose(1, 2);
    at::Tensor emb = at::cat({freqs, freqs}, -1);
    cos = emb.cos().to(dt);
    sin = emb.sin().to(dt);
  }
  at::Tensor mask;
  if (S > 1) mask = CausalMask(B, S, T, P, dt);
  {
    at::Tensor residual = x;
    {
      ModuleScope s(&rec, "layers.0.input_layernorm");
      x = RmsNorm(x, ln1, eps);
    }
    {
      ModuleScope s(&rec, "layers.0.self_attn");
      at::Tensor q = at::linear(x, wq, bq).view({B, S, heads, head_dim});
      at::Tensor k = at::linear(x, wk, bk).view({B, S, kv_heads, head_dim});
      at::Tensor v = at::linear(x, wv, bv).view({B, S, kv_heads, head_dim}).transpose(1, 2);
      if (qk_norm) {
        q = RmsNorm(q, q_norm, eps);
        k = RmsNorm(k, k_norm, eps);
      }
      q = q.transpose(1, 2);
      k = k.transpose(1, 2);
      at::Tensor c = cos.unsqueeze(1), sn = sin.unsqueeze(1);
      q = q * c + RotateHalf(q) * sn;
      k = k * c + RotateHalf(k) * sn;
      if (P > 0) {
        k = at::cat({past_k, k}, -2);
        v = at::cat({past_v, v}, -2);
      }
      if (rep > 1) {
        k = k.unsqueeze(2).expand({B, kv_heads, rep, T, head_dim}).reshape({B, heads, T, head_dim});
        v = v.unsqueeze(2).expand({B, kv_heads, rep, T, head_dim}).reshape({B, heads, T, head_dim});
      }
      at::Tensor attn = at::matmul(q, k.transpose(2, 3)) * (1.0 / std::sqrt(static_cast<double>(head_dim)));
      if (mask.defined()) attn = attn + mask;
      attn = at::softmax(attn, -1, at::kFloat).to(dt);
      at::Tensor out = at::matmul(attn, v).transpose(1, 2).contiguous().reshape({B, S, heads * head_dim});
      x = at::linear(out, wo);
    }
    x = residual + x;
    residual = x;
    {
      ModuleScope s(&rec, "layers.0.post_attention_layernorm");
      x = RmsNorm(x, ln2, eps);
    }
    {
      ModuleScope s(&rec, "layers.0.mlp");
      x = at::linear(at::silu(at::linear(x, w_gate)) * at::linear(x, w_up), w_down);
    }
    x = residual + x;
  }
  {
    ModuleScope s(&rec, "norm");
    x = RmsNorm(x, ln_f, eps);
  }
  {
    // Generation computes logits for the last position only.
    ModuleScope s(&rec, "lm_head");
    x = at::linear(x.slice(1, S - 1, S), lm_head);
  }
  rec.Stop();
  return Status::Ok();
}

// Eager BERT/ViT self-attention: [B, S, H] -> [B, S, H].
at::Tensor EncoderAttention(const at::Tensor& x, const at::Tensor& wq, const at::Tensor& bq, const at::Tensor& wk,
                            const at::Tensor& bk, const at::Tensor& wv, const at::Tensor& bv, int64_t heads,
                            const at::Tensor& mask) {
  const int64_t B = x.size(0), S = x.size(1), H = x.size(2), hd = H / heads;
  auto split = [&](const at::Tensor& t) { return t.view({B, S, heads, hd}).permute({0, 2, 1, 3}); };
  at::Tensor q = split(at::linear(x, wq, bq));
  at::Tensor k = split(at::linear(x, wk, bk));
  at::Tensor v = split(at::linear(x, wv, bv));
  at::Tensor scores = at::matmul(q, k.transpose(-1, -2)) / std::sqrt(static_cast<double>(hd));
  if (mask.defined()) scores = scores + mask;
  at::Tensor probs = at::softmax(scores, -1);
  return at::matmul(probs, v).permute({0, 2, 1, 3}).contiguous().view({B, S, H});
}

Status RunEncoder(const BlockModel& m, const CaptureProfile& p, OpRecorder& rec) {
  COV_ASSIGN_OR_RETURN(int64_t hidden, Int(m, {"hidden_size", "dim"}));
  COV_ASSIGN_OR_RETURN(int64_t heads, Int(m, {"num_attention_heads", "n_heads"}));
  COV_ASSIGN_OR_RETURN(int64_t inter, Int(m, {"intermediate_size", "hidden_dim"}));
  COV_ASSIGN_OR_RETURN(int64_t vocab, Int(m, {"vocab_size"}));
  COV_ASSIGN_OR_RETURN(int64_t max_pos, Int(m, {"max_position_embeddings"}, 512));
  COV_ASSIGN_OR_RETURN(int64_t type_vocab, Int(m, {"type_vocab_size"}, 2));
  const double eps = Double(m, "layer_norm_eps", 1e-12);
  const at::ScalarType dt = ToScalarType(p.dtype);
  const int64_t B = p.batch, S = std::min(p.seq_len, max_pos);
  WeightMaker W{dt};
  at::Tensor word = W({vocab, hidden}), pos = W({max_pos, hidden}), types = W({type_vocab, hidden});
  at::Tensor ln_e_w = W.Ones({hidden}), ln_e_b = W.Zeros({hidden});
  at::Tensor wq = W({hidden, hidden}), wk = W({hidden, hidden}), wv = W({hidden, hidden}), wo = W({hidden, hidden});
  at::Tensor bq = W({hidden}), bk = W({hidden}), bv = W({hidden}), bo = W({hidden});
  at::Tensor ln1_w = W.Ones({hidden}), ln1_b = W.Zeros({hidden}), ln2_w = W.Ones({hidden}), ln2_b = W.Zeros({hidden});
  at::Tensor wi = W({inter, hidden}), bi = W({inter}), wo2 = W({hidden, inter}), bo2 = W({hidden});
  at::Tensor wp = W({hidden, hidden}), bp = W({hidden});
  at::Tensor ids = at::randint(0, vocab, {B, S}, at::kLong);
  at::Tensor token_types = at::zeros({B, S}, at::kLong);
  at::Tensor position_buffer = at::arange(max_pos, at::kLong).expand({1, -1});
  at::Tensor attention_mask = at::ones({B, S}, at::kLong);

  c10::InferenceMode guard;
  rec.Start();
  at::Tensor x;
  {
    ModuleScope s(&rec, "embeddings");
    at::Tensor position_ids = position_buffer.slice(1, 0, S);
    x = at::embedding(word, ids) + at::embedding(types, token_types);
    x = x + at::embedding(pos, position_ids);
    x = at::layer_norm(x, {hidden}, ln_e_w, ln_e_b, eps);
  }
  at::Tensor ext;
  {
    ModuleScope s(&rec, "get_extended_attention_mask");
    ext = attention_mask.unsqueeze(1).unsqueeze(2).to(dt);
    ext = (1.0 - ext) * static_cast<double>(std::numeric_limits<float>::lowest());
  }
  {
    ModuleScope s(&rec, "encoder.layer.0.attention");
    at::Tensor a = EncoderAttention(x, wq, bq, wk, bk, wv, bv, heads, ext);
    x = at::layer_norm(at::linear(a, wo, bo) + x, {hidden}, ln1_w, ln1_b, eps);
  }
  {
    ModuleScope s(&rec, "encoder.layer.0.intermediate");
    at::Tensor h = at::gelu(at::linear(x, wi, bi));
    x = at::layer_norm(at::linear(h, wo2, bo2) + x, {hidden}, ln2_w, ln2_b, eps);
  }
  {
    ModuleScope s(&rec, "pooler");
    x = at::tanh(at::linear(x.select(1, 0), wp, bp));
  }
  rec.Stop();
  return Status::Ok();
}

Status RunVit(const BlockModel& m, const CaptureProfile& p, OpRecorder& rec) {
  COV_ASSIGN_OR_RETURN(int64_t hidden, Int(m, {"hidden_size"}));
  COV_ASSIGN_OR_RETURN(int64_t heads, Int(m, {"num_attention_heads"}));
  COV_ASSIGN_OR_RETURN(int64_t inter, Int(m, {"intermediate_size"}));
  COV_ASSIGN_OR_RETURN(int64_t image, Int(m, {"image_size"}, 224));
  COV_ASSIGN_OR_RETURN(int64_t patch, Int(m, {"patch_size"}, 16));
  COV_ASSIGN_OR_RETURN(int64_t channels, Int(m, {"num_channels"}, 3));
  const double eps = Double(m, "layer_norm_eps", 1e-12);
  const bool qkv_bias = Bool(m, "qkv_bias", true);
  if (image % patch != 0) return Status::InvalidArgument(m.id + ": image_size is not a multiple of patch_size");
  const int64_t n = (image / patch) * (image / patch);
  const at::ScalarType dt = ToScalarType(p.dtype);
  const int64_t B = p.batch;
  const int64_t labels = 1000;
  WeightMaker W{dt};
  at::Tensor conv_w = W({hidden, channels, patch, patch}), conv_b = W({hidden});
  at::Tensor cls = W({1, 1, hidden}), pos = W({1, n + 1, hidden});
  at::Tensor wq = W({hidden, hidden}), wk = W({hidden, hidden}), wv = W({hidden, hidden}), wo = W({hidden, hidden});
  at::Tensor bq, bk, bv;
  if (qkv_bias) bq = W({hidden}), bk = W({hidden}), bv = W({hidden});
  at::Tensor bo = W({hidden});
  at::Tensor ln1_w = W.Ones({hidden}), ln1_b = W.Zeros({hidden}), ln2_w = W.Ones({hidden}), ln2_b = W.Zeros({hidden});
  at::Tensor lnf_w = W.Ones({hidden}), lnf_b = W.Zeros({hidden});
  at::Tensor wi = W({inter, hidden}), bi = W({inter}), wo2 = W({hidden, inter}), bo2 = W({hidden});
  at::Tensor head_w = W({labels, hidden}), head_b = W({labels});
  at::Tensor pixels = at::randn({B, channels, image, image}).to(dt);

  c10::InferenceMode guard;
  rec.Start();
  at::Tensor x;
  {
    ModuleScope s(&rec, "embeddings.patch_embeddings");
    x = at::conv2d(pixels, conv_w, conv_b, {patch, patch}).flatten(2).transpose(1, 2);
  }
  {
    ModuleScope s(&rec, "embeddings");
    x = at::cat({cls.expand({B, -1, -1}), x}, 1) + pos;
  }
  {
    ModuleScope s(&rec, "encoder.layer.0");
    at::Tensor h = at::layer_norm(x, {hidden}, ln1_w, ln1_b, eps);
    h = EncoderAttention(h, wq, bq, wk, bk, wv, bv, heads, at::Tensor());
    x = at::linear(h, wo, bo) + x;
    h = at::layer_norm(x, {hidden}, ln2_w, ln2_b, eps);
    x = at::linear(at::gelu(at::linear(h, wi, bi)), wo2, bo2) + x;
  }
  {
    ModuleScope s(&rec, "classifier");
    x = at::layer_norm(x, {hidden}, lnf_w, lnf_b, eps);
    x = at::linear(x.select(1, 0), head_w, head_b);
  }
  rec.Stop();
  return Status::Ok();
}

Status RunConvnet(const BlockModel& m, const CaptureProfile& p, OpRecorder& rec) {
  COV_ASSIGN_OR_RETURN(int64_t stem, Int(m, {"embedding_size"}, 64));
  COV_ASSIGN_OR_RETURN(int64_t channels, Int(m, {"num_channels"}, 3));
  COV_ASSIGN_OR_RETURN(int64_t image, Int(m, {"image_size"}, 224));
  int64_t out = 256;
  if (m.config.contains("hidden_sizes") && m.config["hidden_sizes"].is_array() && !m.config["hidden_sizes"].empty()) {
    const auto& first = m.config["hidden_sizes"][0];
    if (!first.is_number_integer() || first.get<int64_t>() < 4) {
      return Status::InvalidArgument(m.id + ": config.json 'hidden_sizes' must start with an integer >= 4");
    }
    out = first.get<int64_t>();
  }
  const int64_t reduction = 4, mid = out / reduction;
  const at::ScalarType dt = ToScalarType(p.dtype);
  const int64_t B = p.batch;
  WeightMaker W{dt};
  struct Bn {
    at::Tensor w, b, mean, var;
  };
  auto bn = [&](int64_t c) { return Bn{W.Ones({c}), W.Zeros({c}), W({c}), (W.Ones({c}) + at::rand({c}).to(dt))}; };
  auto apply_bn = [](const at::Tensor& x, const Bn& b) {
    return at::batch_norm(x, b.w, b.b, b.mean, b.var, /*training=*/false, 0.1, 1e-5, /*cudnn_enabled=*/true);
  };
  at::Tensor w_stem = W({stem, channels, 7, 7});
  Bn bn_stem = bn(stem);
  at::Tensor w_short = W({out, stem, 1, 1}), w1 = W({mid, stem, 1, 1}), w2 = W({mid, mid, 3, 3}), w3 = W({out, mid, 1, 1});
  Bn bn_short = bn(out), bn1 = bn(mid), bn2 = bn(mid), bn3 = bn(out);
  at::Tensor pixels = at::randn({B, channels, image, image}).to(dt);

  c10::InferenceMode guard;
  rec.Start();
  at::Tensor x;
  {
    ModuleScope s(&rec, "embedder");
    x = at::conv2d(pixels, w_stem, {}, {2, 2}, {3, 3});
    x = at::relu(apply_bn(x, bn_stem));
    x = at::max_pool2d(x, {3, 3}, {2, 2}, {1, 1});
  }
  {
    ModuleScope s(&rec, "encoder.stages.0.layers.0");
    at::Tensor shortcut = apply_bn(at::conv2d(x, w_short), bn_short);
    at::Tensor h = at::relu(apply_bn(at::conv2d(x, w1), bn1));
    h = at::relu(apply_bn(at::conv2d(h, w2, {}, {1, 1}, {1, 1}), bn2));
    h = apply_bn(at::conv2d(h, w3), bn3);
    x = at::relu(h + shortcut);
  }
  {
    ModuleScope s(&rec, "pooler");
    x = at::adaptive_avg_pool2d(x, {1, 1}).flatten(1);
  }
  rec.Stop();
  return Status::Ok();
}

}  // namespace

Result<BlockModel> ParseBlockModel(const json& line) {
  if (!line.is_object()) return Status::InvalidArgument("expected a JSON object");
  BlockModel m;
  if (!line.contains("id") || !line["id"].is_string()) return Status::InvalidArgument("missing string field 'id'");
  m.id = line["id"].get<std::string>();
  if (!line.contains("family") || !line["family"].is_string()) {
    return Status::InvalidArgument(m.id + ": missing string field 'family'");
  }
  m.family = line["family"].get<std::string>();
  if (m.family != "decoder" && m.family != "encoder" && m.family != "vit" && m.family != "convnet") {
    return Status::InvalidArgument(m.id + ": unknown family '" + m.family + "' (decoder, encoder, vit, convnet)");
  }
  if (!line.contains("config") || !line["config"].is_object()) {
    return Status::InvalidArgument(m.id + ": missing object field 'config'");
  }
  m.config = line["config"];
  m.source = line.contains("source") && line["source"].is_string() ? line["source"].get<std::string>() : "";
  return m;
}

Result<std::vector<CaptureProfile>> ParseCaptureProfiles(const json& doc) {
  if (!doc.is_object() || !doc.contains("profiles") || !doc["profiles"].is_array()) {
    return Status::InvalidArgument("expected {\"profiles\": [...]}");
  }
  std::vector<CaptureProfile> out;
  for (size_t i = 0; i < doc["profiles"].size(); ++i) {
    const json& j = doc["profiles"][i];
    const std::string where = "profiles[" + std::to_string(i) + "]";
    CaptureProfile p;
    if (!j.is_object() || !j.contains("name") || !j["name"].is_string()) return Status::InvalidArgument(where + ": missing 'name'");
    p.name = j["name"].get<std::string>();
    if (!j.contains("families") || !j["families"].is_array()) return Status::InvalidArgument(where + " (" + p.name + "): missing 'families'");
    for (const auto& f : j["families"]) {
      if (!f.is_string()) return Status::InvalidArgument(where + " (" + p.name + "): 'families' must hold strings");
      p.families.push_back(f.get<std::string>());
    }
    for (const char* field : {"batch", "seq_len", "past_len"}) {
      if (j.contains(field) && (!j[field].is_number_integer() || j[field].get<int64_t>() < 0)) {
        return Status::InvalidArgument(where + " (" + p.name + "): '" + field + "' must be a non-negative integer");
      }
    }
    p.batch = j.value("batch", int64_t{1});
    p.seq_len = j.value("seq_len", int64_t{0});
    p.past_len = j.value("past_len", int64_t{0});
    if (p.batch < 1) return Status::InvalidArgument(where + " (" + p.name + "): 'batch' must be >= 1");
    if (j.contains("dtype") && !j["dtype"].is_string()) {
      return Status::InvalidArgument(where + " (" + p.name + "): 'dtype' must be a string such as \"f32\"");
    }
    auto dt = DTypeFromName(j.value("dtype", std::string("f32")));
    if (!dt || !IsFloatingDType(*dt)) return Status::InvalidArgument(where + " (" + p.name + "): 'dtype' must be f32, f64, f16 or bf16");
    p.dtype = *dt;
    if (j.contains("training") && !j["training"].is_boolean()) {
      return Status::InvalidArgument(where + " (" + p.name + "): 'training' must be true or false");
    }
    p.training = j.value("training", false);
    if (p.training && p.past_len > 0) {
      return Status::InvalidArgument(where + " (" + p.name + "): a training profile has no KV cache ('past_len' must be 0)");
    }
    out.push_back(std::move(p));
  }
  return out;
}

double EstimateBlockBytes(const BlockModel& m, const CaptureProfile& p) {
  auto get = [&](std::initializer_list<const char*> names, int64_t fallback) {
    auto r = Int(m, names, fallback);
    return static_cast<double>(r ? *r : fallback);
  };
  const double bytes = static_cast<double>(DTypeSize(p.dtype));
  const double hidden = get({"hidden_size", "n_embd", "d_model", "dim"}, 768);
  const double inter = get({"intermediate_size", "hidden_dim"}, 4 * static_cast<int64_t>(hidden));
  const double vocab = get({"vocab_size"}, 0);
  const double tokens = static_cast<double>(p.batch) * std::max<double>(1, p.seq_len + p.past_len);
  const double heads = get({"num_attention_heads", "n_head"}, 12);
  const double weights = 2 * vocab * hidden + 4 * hidden * hidden + 3 * hidden * inter;
  const double activations = tokens * (4 * hidden + 2 * inter) + heads * tokens * std::max<double>(1, p.seq_len) * 2;
  return (weights + activations) * bytes * 1.5;
}

Status RunBlocks(const BlockModel& model, const CaptureProfile& profile, OpRecorder& recorder) {
  try {
    at::manual_seed(0);
    if (model.family == "decoder") return RunDecoder(model, profile, recorder);
    if (model.family == "encoder") return RunEncoder(model, profile, recorder);
    if (model.family == "vit") return RunVit(model, profile, recorder);
    if (model.family == "convnet") return RunConvnet(model, profile, recorder);
    return Status::InvalidArgument(model.id + ": unknown family '" + model.family + "'");
  } catch (const c10::Error& e) {
    recorder.Stop();
    return Status::InvalidArgument(model.id + " (" + profile.name + "): " + e.what_without_backtrace());
  } catch (const std::exception& e) {
    recorder.Stop();
    return Status::InvalidArgument(model.id + " (" + profile.name + "): " + e.what());
  }
}

}  // namespace coverage::runners
