// The multimodal family of the model builder (model_builder.h): a vision
// tower, the projector (merger) into the language model's width, and the
// language model (the text tower), which is planned and run by whichever
// family builds its structure (PlanModel / RunFamily), so a text tower starts
// building here as soon as its own family does; its refusal is the model's
// ("text tower: ...").
//
// Vision towers built:
//   - Qwen3-VL / Qwen3.5: Conv3d patches over temporal_patch_size frames, the
//     position table bilinearly interpolated to the patch grid, 2-D rotary
//     attention per image, the patch merger and deepstack mergers;
//   - Llama 4: unfolded patches and a linear, class token, complex 2-D rotary,
//     pixel-shuffle adapter, multi_modal_projector;
//   - Gemma 4: patch linear with one-hot position lookup, 2-D rotary with
//     q/k/v norms, sandwich norms, pooling to soft tokens, embed_vision;
//   - Phi-3-vision: the vision family's CLIP (RunFamily) on the image's crops,
//     the HD transform and img_projection.
// Profiles: prefill runs the tower on one image per sequence, merges its
// features into the embeddings of the image placeholders and runs the text
// tower over text + image tokens; decode runs the text tower only; an image
// profile (seq_len 0) runs the tower and projector only.
#include <algorithm>
#include <cmath>
#include <memory>
#include <set>

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include "runners/dtype_map.h"
#include "runners/model_builder_internal.h"

namespace coverage::runners::builder {
namespace {

// Note [Multimodal text tower]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// ExtractFeatures already reads a multimodal config's language model (its
// text_config, with the top level as fallback and the family's defaults)
// into the features; only the structure says "multimodal". The text tower's
// features are those with the structure the text config has on its own
// (re-extracted without defaults, which the structure does not need) and
// the text config's model type. Its config is the top level with the text
// config's keys over it. Multimodal rope (mrope) rotates text-only
// positions exactly as 1-D rope does, so the tower is planned as 1-D rope
// and the notes say what differs with image tokens in the sequence.
const std::set<std::string>& QwenVlTypes() {
  static const std::set<std::string> types = {"qwen3_vl", "qwen3_vl_moe", "qwen3_5", "qwen3_5_moe"};
  return types;
}

// Text models whose attention has per-head q/k RMSNorm though their config
// does not say so (Qwen3VLTextAttention, Qwen3_5Attention: q_norm, k_norm).
const std::set<std::string>& QkNormTextTypes() {
  static const std::set<std::string> types = {"qwen3_vl_text", "qwen3_vl_moe_text", "qwen3_5_text", "qwen3_5_moe_text"};
  return types;
}

const json* TextConfigOf(const json& config) {
  for (const char* key : {"text_config", "language_config", "llm_config", "text_model"}) {
    auto it = config.find(key);
    if (it != config.end() && it->is_object()) return &*it;
  }
  return nullptr;
}

struct TextTower {
  selection::Features features;
  json config;
  std::vector<std::string> notes;
};

TextTower TextTowerOf(const selection::Features& f, const json& config) {
  TextTower t;
  t.config = json::object();
  for (auto it = config.begin(); it != config.end(); ++it) {
    const std::string& k = it.key();
    if (k == "vision_config" || k == "audio_config" || k == "text_config" || k == "language_config" ||
        k == "llm_config" || k == "text_model") {
      continue;
    }
    t.config[k] = it.value();
  }
  if (const json* text = TextConfigOf(config)) {
    for (auto it = text->begin(); it != text->end(); ++it) t.config[it.key()] = it.value();
  }
  t.features = f;
  if (auto it = t.config.find("model_type"); it != t.config.end() && it->is_string()) {
    t.features.model_type = it->get<std::string>();
  }
  // The structure of the text config on its own (Note [Multimodal text tower]).
  auto alone = selection::ExtractFeatures(t.config, *selection::FamilyDefaults::Empty());
  const std::string structure = alone ? alone->structure : std::string();
  t.features.structure = structure.empty() || structure == "multimodal" ? "decoder" : structure;
  if (QkNormTextTypes().count(t.features.model_type) && !t.config.contains("use_qk_norm")) {
    t.config["use_qk_norm"] = true;
  }
  if (t.features.rope_scaling == "mrope") {
    t.features.rope_scaling.clear();
    t.notes.push_back(
        "text tower: multimodal rope (mrope) runs as 1-D rope: positions are arange over the sequence; "
        "transformers computes 3-D (t, h, w) positions for the image tokens (get_rope_index) and interleaves "
        "the mrope sections in rotary_emb (extra index copies there; the attention ops are the same)");
  }
  return t;
}

enum class Stage { kImage, kPrefill, kDecode };

Stage StageOf(const CaptureProfile& profile) {
  if (profile.past_len > 0) return Stage::kDecode;
  return profile.seq_len > 0 ? Stage::kPrefill : Stage::kImage;
}

// The text tower's profile: a prefill carries each image's tokens besides
// the profile's text tokens.
CaptureProfile TextProfile(const CaptureProfile& profile, int64_t image_tokens) {
  CaptureProfile p = profile;
  if (StageOf(profile) == Stage::kPrefill) p.seq_len = profile.seq_len + image_tokens;
  return p;
}

std::string Gb(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g", bytes / 1e9);
  return buf;
}

std::string NormaliseAct(std::string a) {
  if (a == "gelu_pytorch_tanh" || a == "gelu_new" || a == "gelu_fast") return "gelu_tanh";
  return a;
}

// ---------------------------------------------------------------------------
// Vision towers. Each reads its spec from the config (refusal set when it
// cannot be built), estimates itself, and, in RunMultimodal, makes its
// weights and inputs (TowerRun's constructor, before recording) and runs
// (Forward, while recording) to the features the text tower takes:
// [images * tokens, text hidden].

struct TowerSpec;

struct TowerRun {
  virtual ~TowerRun() = default;
  // Runs before the forward bracket, after the tower's weights are made
  // (a tower that is another family's plan runs it here).
  virtual Status RunFirst(ModelSession& /*rec*/, uint64_t /*seed*/) { return Status::Ok(); }
  virtual at::Tensor Forward(ModelSession& rec) = 0;
  // Embeds `ids` and puts the image features in place of the placeholders:
  // by default transformers' masked_scatter over ids == image_token.
  virtual at::Tensor Merge(ModelSession& rec, const at::Tensor& features, const at::Tensor& embed, at::Tensor ids,
                           int64_t image_token, const TowerSpec& spec);
  // The placeholder id the processor writes (0: the config's image token).
  virtual int64_t PlaceholderId() const { return 0; }
  double embed_scale = 1.0;  // Gemma: sqrt(hidden)
};

struct TowerSpec {
  std::string refusal;
  std::string name;  // for notes
  int64_t depth = 0, built = 0;
  int64_t tokens = 0;                      // per image, in the text sequence
  int64_t out_hidden = 0;                  // the features' width
  double weights = 0;                      // elements
  double activation_bytes = 0, flops = 0;  // for `batch` images
  std::vector<std::string> notes;
  std::string embed_path, merge_path;  // where transformers embeds the ids and merges the features
};

at::Tensor TowerRun::Merge(ModelSession& rec, const at::Tensor& features, const at::Tensor& embed, at::Tensor ids,
                           int64_t image_token, const TowerSpec& spec) {
  at::Tensor inputs;
  {
    ModuleScope s(&rec, spec.embed_path);
    inputs = at::embedding(embed, ids);
    if (embed_scale != 1.0) inputs = inputs * embed_scale;
  }
  ModuleScope s(&rec, spec.merge_path);
  at::Tensor image_mask = (ids == image_token).unsqueeze(-1).expand_as(inputs);
  return inputs.masked_scatter(image_mask, features.to(inputs.scalar_type()));
}

// --- Qwen3-VL / Qwen3.5 (Qwen3VLVisionModel), from vision_config with the
// defaults of Qwen3VLVisionConfig.
struct QwenVision {
  int64_t hidden = 1152, depth = 27, heads = 16, intermediate = 4304, channels = 3, patch = 16;
  int64_t temporal = 2, merge = 2, out_hidden = 3584, positions = 2304;
  std::vector<int64_t> deepstack;
  std::string act = "gelu_tanh";
  int64_t side = 0;     // the position table's grid side
  int64_t grid = 0;     // patches per side of the image
  int64_t patches = 0;  // per image
  int64_t tokens = 0;   // merged tokens per image
  int64_t built = 0;
};

// Which deepstack mergers run after which built block: those whose block is
// built; with none built, the first merger after the last built block (its
// ops are the same at any depth).
std::vector<std::pair<int64_t, size_t>> DeepstackRuns(const QwenVision& v) {
  std::vector<std::pair<int64_t, size_t>> runs;
  for (size_t i = 0; i < v.deepstack.size(); ++i) {
    if (v.deepstack[i] < v.built) runs.emplace_back(v.deepstack[i], i);
  }
  if (runs.empty() && !v.deepstack.empty()) runs.emplace_back(v.built - 1, 0);
  return runs;
}

QwenVision ReadQwenVision(const selection::Features& f, const json& c, int64_t max_layers, std::string* refusal) {
  QwenVision v;
  if (f.model_type == "qwen3_vl" || f.model_type == "qwen3_vl_moe") v.deepstack = {8, 16, 24};
  v.hidden = ConfigInt(c, "hidden_size", v.hidden);
  v.depth = ConfigInt(c, "depth", v.depth);
  v.heads = ConfigInt(c, "num_heads", v.heads);
  v.intermediate = ConfigInt(c, "intermediate_size", v.intermediate);
  v.channels = ConfigInt(c, "in_channels", v.channels);
  v.patch = ConfigInt(c, "patch_size", v.patch);
  v.temporal = ConfigInt(c, "temporal_patch_size", v.temporal);
  v.merge = ConfigInt(c, "spatial_merge_size", v.merge);
  v.out_hidden = ConfigInt(c, "out_hidden_size", v.out_hidden);
  v.positions = ConfigInt(c, "num_position_embeddings", v.positions);
  if (auto d = c.find("deepstack_visual_indexes"); d != c.end() && d->is_array()) {
    v.deepstack.clear();
    for (const json& i : *d) {
      if (i.is_number_integer() && i.get<int64_t>() >= 0) v.deepstack.push_back(i.get<int64_t>());
    }
  }
  if (auto a = c.find("hidden_act"); a != c.end() && a->is_string()) v.act = NormaliseAct(a->get<std::string>());
  v.built = std::min(v.depth, std::max<int64_t>(1, max_layers));
  if (!KnownActivation(v.act)) {
    *refusal = "activation '" + v.act + "' is not built";
  } else if (v.hidden % v.heads != 0 || (v.hidden / v.heads) % 4 != 0) {
    *refusal = "hidden size over heads is not a multiple of 4 (2-D rotary halves)";
  } else {
    v.side = static_cast<int64_t>(std::llround(std::sqrt(static_cast<double>(v.positions))));
    // The image grid must split into merge x merge blocks.
    v.grid = v.side / v.merge * v.merge;
    if (v.side * v.side != v.positions) *refusal = "num_position_embeddings is not a square grid";
    if (v.grid <= 0) *refusal = "the position grid is smaller than the merge size";
  }
  v.patches = v.grid * v.grid;
  v.tokens = v.patches / (v.merge * v.merge);
  return v;
}

TowerSpec PlanQwen(const QwenVision& v, double eb, int64_t batch) {
  TowerSpec t;
  t.name = "Qwen3-VL";
  t.depth = v.depth, t.built = v.built, t.tokens = v.tokens, t.out_hidden = v.out_hidden;
  t.embed_path = "model.language_model.embed_tokens", t.merge_path = "model";
  const double H = double(v.hidden), I = double(v.intermediate), M = H * double(v.merge * v.merge);
  const double N = double(v.patches), B = double(batch), K = double(v.channels * v.temporal * v.patch * v.patch);
  const double merger = M * M + M * double(v.out_hidden);
  t.weights = K * H + double(v.positions) * H + (4.0 * H * H + 2.0 * H * I) * double(v.built) +
              merger * double(1 + v.deepstack.size());
  t.activation_bytes = 4.0 * double(v.heads) * N * N + eb * B * N * (6.0 * H + 2.0 * I + K);
  const double runs = double(1 + DeepstackRuns(v).size());
  t.flops = B * (2.0 * N * (4.0 * H * H + 2.0 * H * I) * double(v.built) + 4.0 * N * N * H * double(v.built) +
                 2.0 * N * K * H + runs * 2.0 * double(v.tokens) * merger);
  t.notes.push_back("image: " + std::to_string(v.grid * v.patch) + "x" + std::to_string(v.grid * v.patch) +
                    " pixels, one frame repeated over temporal_patch_size " + std::to_string(v.temporal) +
                    " (the position table's " + std::to_string(v.grid) + "x" + std::to_string(v.grid) +
                    " grid; the processor resizes images dynamically)");
  if (!v.deepstack.empty()) {
    const auto runs_list = DeepstackRuns(v);
    if (runs_list.front().first != v.deepstack.front()) {
      t.notes.push_back("deepstack merger of block " + std::to_string(v.deepstack.front()) +
                        " runs after the last built block");
    }
  }
  return t;
}

struct Block {
  Norm norm1, norm2;
  Linear qkv, proj, fc1, fc2;  // Qwen: packed qkv
  Linear q, k, v, o;           // Llama 4: separate projections
};

Linear MakeLinear(const Weights& W, int64_t in, int64_t out, bool bias = true) {
  return Linear{W({out, in}), bias ? W({out}) : at::Tensor()};
}

// Eager attention of one sequence [1, heads, T, hd] each, no mask.
at::Tensor EagerAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t hd,
                          at::ScalarType dt) {
  at::Tensor scores = at::matmul(q, k.transpose(2, 3)) * (1.0 / std::sqrt(double(hd)));
  at::Tensor probs = at::softmax(scores, -1, at::kFloat).to(dt);
  return at::matmul(probs, v).transpose(1, 2).contiguous();
}

class QwenRun : public TowerRun {
 public:
  QwenRun(const QwenVision& v, const Weights& W, int64_t images) : v_(v), B_(images), dt_(W.dtype) {
    const int64_t H = v.hidden, M = H * v.merge * v.merge;
    auto merger = [&](bool postshuffle) {
      return Merger{MakeLayerNorm(W, postshuffle ? M : H), MakeLinear(W, M, M), MakeLinear(W, M, v.out_hidden)};
    };
    patch_w_ = W({H, v.channels, v.temporal, v.patch, v.patch}), patch_b_ = W({H});
    pos_table_ = W({v.positions, H});
    blocks_.resize(static_cast<size_t>(v.built));
    for (Block& b : blocks_) {
      b.norm1 = MakeLayerNorm(W, H);
      b.norm2 = MakeLayerNorm(W, H);
      b.qkv = MakeLinear(W, H, 3 * H);
      b.proj = MakeLinear(W, H, H);
      b.fc1 = MakeLinear(W, H, v.intermediate);
      b.fc2 = MakeLinear(W, v.intermediate, H);
    }
    merger_ = merger(false);
    for (size_t i = 0; i < v.deepstack.size(); ++i) deepstack_.push_back(merger(true));
    // The processor's flattened patches [images * N, C * T * P * P].
    pixels_ = at::randn({B_ * v.patches, v.channels * v.temporal * v.patch * v.patch}).to(dt_);
    // The bilinear interpolation's indices and weights (transformers builds
    // them from Python lists).
    const int64_t side = v.side, G = v.grid;
    at::Tensor lin = at::linspace(0, static_cast<double>(side - 1), G, at::kFloat);
    at::Tensor lo = lin.to(at::kInt).to(at::kLong), hi = (lo + 1).clamp_max(side - 1);
    at::Tensor d = lin - lo.to(at::kFloat);
    auto grid_of = [](const at::Tensor& rows, const at::Tensor& cols) {
      return (rows.unsqueeze(1) * cols.unsqueeze(0)).flatten();
    };
    auto index_of = [&](const at::Tensor& rows, const at::Tensor& cols) {
      return (rows.unsqueeze(1) * side + cols.unsqueeze(0)).flatten();
    };
    interp_idx_ = at::stack({index_of(lo, lo), index_of(lo, hi), index_of(hi, lo), index_of(hi, hi)}).repeat({1, B_});
    interp_w_ =
        at::stack({grid_of(1 - d, 1 - d), grid_of(1 - d, d), grid_of(d, 1 - d), grid_of(d, d)}).repeat({1, B_}).to(dt_);
    const int64_t hd = H / v.heads;
    inv_freq_ = 1.0 / at::pow(10000.0, at::arange(0, hd / 2, 2, at::kFloat) / static_cast<double>(hd / 2));
  }

  at::Tensor Forward(ModelSession& rec) override {
    const QwenVision& v = v_;
    const int64_t H = v.hidden, heads = v.heads, hd = H / heads, N = v.patches, G = v.grid, m = v.merge;
    const int64_t M = H * m * m;
    const double eps = 1e-6;
    at::Tensor x;
    {
      ModuleScope s(&rec, "model.visual.patch_embed");
      x = at::conv3d(pixels_.view({-1, v.channels, v.temporal, v.patch, v.patch}), patch_w_, patch_b_,
                     {v.temporal, v.patch, v.patch})
              .view({-1, H});
    }
    {
      ModuleScope s(&rec, "model.visual.pos_embed");
      at::Tensor pe = at::embedding(pos_table_, interp_idx_) * interp_w_.unsqueeze(-1);
      pe = pe[0] + pe[1] + pe[2] + pe[3];
      std::vector<at::Tensor> per_image;
      for (const at::Tensor& p : pe.split(N)) {
        per_image.push_back(
            p.repeat({1, 1}).view({1, G / m, m, G / m, m, -1}).permute({0, 1, 3, 2, 4, 5}).flatten(0, 4));
      }
      x = x + at::cat(per_image);
    }
    at::Tensor cos, sin;
    {
      ModuleScope s(&rec, "model.visual.rotary_pos_emb");
      at::Tensor table = at::outer(at::arange(G, at::kFloat), inv_freq_);
      at::Tensor block = at::arange(G / m, at::kLong), intra = at::arange(m, at::kLong);
      at::Tensor rows =
          (block.view({-1, 1, 1, 1}) * m + intra.view({1, 1, -1, 1})).expand({G / m, G / m, m, m}).reshape(-1);
      at::Tensor cols =
          (block.view({1, -1, 1, 1}) * m + intra.view({1, 1, 1, -1})).expand({G / m, G / m, m, m}).reshape(-1);
      at::Tensor pos_ids = at::stack({rows, cols}, -1).repeat({B_, 1});
      at::Tensor rot = table.index({pos_ids}).flatten(1);
      at::Tensor emb = at::cat({rot, rot}, -1);
      cos = emb.cos();
      sin = emb.sin();
    }
    auto rope = [&](const at::Tensor& t) {
      at::Tensor tf = t.to(at::kFloat);
      return (tf * cos.unsqueeze(-2) + RotateHalf(tf) * sin.unsqueeze(-2)).to(t.scalar_type());
    };
    auto run_merger = [&](const Merger& mg, const at::Tensor& h, bool postshuffle) {
      at::Tensor y = postshuffle ? LayerNorm(h.view({-1, M}), mg.norm, eps) : LayerNorm(h, mg.norm, eps).view({-1, M});
      return mg.fc2(at::gelu(mg.fc1(y)));
    };
    const auto deepstack_runs = DeepstackRuns(v);
    for (size_t bi = 0; bi < blocks_.size(); ++bi) {
      const Block& b = blocks_[bi];
      const std::string path = "model.visual.blocks." + std::to_string(bi);
      at::Tensor h;
      {
        ModuleScope s(&rec, path + ".norm1");
        h = LayerNorm(x, b.norm1, eps);
      }
      {
        ModuleScope s(&rec, path + ".attn");
        auto qkv = b.qkv(h).reshape({B_ * N, 3, heads, hd}).permute({1, 0, 2, 3}).unbind(0);
        at::Tensor q = rope(qkv[0]).transpose(0, 1).unsqueeze(0);
        at::Tensor k = rope(qkv[1]).transpose(0, 1).unsqueeze(0);
        at::Tensor val = qkv[2].transpose(0, 1).unsqueeze(0);
        // One attention per image (cu_seqlens), no mask, not causal.
        auto qs = q.split(N, 2), ks = k.split(N, 2), vs = val.split(N, 2);
        std::vector<at::Tensor> outs;
        for (size_t i = 0; i < qs.size(); ++i) outs.push_back(EagerAttention(qs[i], ks[i], vs[i], hd, dt_));
        h = b.proj(at::cat(outs, 1).reshape({B_ * N, -1}).contiguous());
      }
      {
        ModuleScope s(&rec, path);
        x = x + h;
      }
      {
        ModuleScope s(&rec, path + ".norm2");
        h = LayerNorm(x, b.norm2, eps);
      }
      {
        ModuleScope s(&rec, path + ".mlp");
        h = b.fc2(Activate(b.fc1(h), v.act));
      }
      {
        ModuleScope s(&rec, path);
        x = x + h;
      }
      for (const auto& [after, which] : deepstack_runs) {
        if (after != static_cast<int64_t>(bi)) continue;
        ModuleScope s(&rec, "model.visual.deepstack_merger_list." + std::to_string(which));
        run_merger(deepstack_[which], x, /*postshuffle=*/true);
      }
    }
    ModuleScope s(&rec, "model.visual.merger");
    return run_merger(merger_, x, /*postshuffle=*/false);
  }

 private:
  struct Merger {
    Norm norm;
    Linear fc1, fc2;
  };
  QwenVision v_;
  int64_t B_;
  at::ScalarType dt_;
  at::Tensor patch_w_, patch_b_, pos_table_, pixels_, interp_idx_, interp_w_, inv_freq_;
  std::vector<Block> blocks_;
  Merger merger_;
  std::vector<Merger> deepstack_;
};

// --- Llama 4 (Llama4VisionModel and the multi_modal_projector).
struct Llama4Vision {
  int64_t hidden = 0, layers = 0, heads = 0, intermediate = 0, image = 0, patch = 0, channels = 3;
  int64_t projector_in = 0, projector_out = 0, vision_out = 0, text_hidden = 0;
  double ratio = 0.5, eps = 1e-5, theta = 10000;
  bool projector_bias = false;
  std::string act = "gelu";
  int64_t grid = 0, patches = 0, tokens = 0, built = 0;
};

Llama4Vision ReadLlama4Vision(const json& c, int64_t text_hidden, int64_t max_layers, std::string* refusal) {
  Llama4Vision v;
  v.hidden = ConfigInt(c, "hidden_size", 768);
  v.layers = ConfigInt(c, "num_hidden_layers", 34);
  v.heads = ConfigInt(c, "num_attention_heads", 16);
  v.intermediate = ConfigInt(c, "intermediate_size", 5632);
  v.image = ConfigInt(c, "image_size", 448);
  v.patch = ConfigInt(c, "patch_size", 14);
  v.channels = ConfigInt(c, "num_channels", 3);
  v.projector_in = ConfigInt(c, "projector_input_dim", 4096);
  v.projector_out = ConfigInt(c, "projector_output_dim", 4096);
  v.vision_out = ConfigInt(c, "vision_output_dim", 7680);
  v.ratio = ConfigNumber(c, "pixel_shuffle_ratio", 0.5);
  v.eps = ConfigNumber(c, "norm_eps", 1e-5);
  v.theta = ConfigNumber(c, "rope_theta", 10000);
  v.projector_bias = ConfigBool(c, "multi_modal_projector_bias", false);
  if (auto a = c.find("hidden_act"); a != c.end() && a->is_string()) v.act = NormaliseAct(a->get<std::string>());
  v.text_hidden = text_hidden;
  v.built = std::min(v.layers, std::max<int64_t>(1, max_layers));
  const int64_t hd = v.hidden / std::max<int64_t>(1, v.heads);
  v.grid = v.patch > 0 ? v.image / v.patch : 0;
  v.patches = v.grid * v.grid;
  const double shuffled = double(v.grid) * v.ratio;
  v.tokens = static_cast<int64_t>(shuffled) * static_cast<int64_t>(shuffled);
  if (!KnownActivation(v.act)) {
    *refusal = "activation '" + v.act + "' is not built";
  } else if (v.hidden % v.heads != 0 || hd % 4 != 0) {
    *refusal = "head dimension is not a multiple of 4 (2-D complex rotary)";
  } else if (v.grid <= 0 || v.image % v.patch != 0) {
    *refusal = "image_size is not a multiple of patch_size";
  } else if (!(v.ratio > 0 && v.ratio <= 1) || shuffled != std::floor(shuffled) ||
             std::fabs(double(v.hidden) / (v.ratio * v.ratio) - double(v.intermediate)) > 0.5) {
    *refusal =
        "the pixel shuffle does not fit: grid * pixel_shuffle_ratio must be whole and hidden_size / ratio^2 "
        "must be intermediate_size (the adapter's input)";
  } else if (v.projector_out != v.vision_out) {
    *refusal = "projector_output_dim differs from vision_output_dim";
  }
  return v;
}

TowerSpec PlanLlama4(const Llama4Vision& v, double eb, int64_t batch) {
  TowerSpec t;
  t.name = "Llama 4";
  t.depth = v.layers, t.built = v.built, t.tokens = v.tokens, t.out_hidden = v.text_hidden;
  t.embed_path = "language_model.model.embed_tokens", t.merge_path = "";
  const double H = double(v.hidden), I = double(v.intermediate), T = double(v.patches + 1), B = double(batch);
  const double K = double(v.channels * v.patch * v.patch);
  const double adapter = I * double(v.projector_in) + double(v.projector_in * v.projector_out);
  const double projector = double(v.vision_out) * double(v.text_hidden);
  t.weights = K * H + H + T * H + 4.0 * H + (4.0 * H * H + 2.0 * H * I) * double(v.built) + adapter + projector;
  t.activation_bytes = 4.0 * B * double(v.heads) * T * T + eb * B * T * (6.0 * H + 2.0 * I + K);
  t.flops = B * (2.0 * T * (4.0 * H * H + 2.0 * H * I) * double(v.built) + 4.0 * T * T * H * double(v.built) +
                 2.0 * double(v.patches) * K * H + 2.0 * double(v.tokens) * (adapter + projector));
  t.notes.push_back("image: one " + std::to_string(v.image) + "x" + std::to_string(v.image) +
                    " tile (the config's image_size; larger images add tiles and a global tile)");
  t.notes.push_back("vision attention's rotary runs as transformers' complex multiply (view_as_complex)");
  return t;
}

class Llama4Run : public TowerRun {
 public:
  Llama4Run(const Llama4Vision& v, const Weights& W, int64_t images) : v_(v), B_(images), dt_(W.dtype) {
    const int64_t H = v.hidden, hd = H / v.heads;
    patch_ = MakeLinear(W, v.channels * v.patch * v.patch, H, /*bias=*/false);
    cls_ = W({H});
    pos_ = W({v.patches + 1, H});
    pre_ = MakeLayerNorm(W, H);
    post_ = MakeLayerNorm(W, H);
    blocks_.resize(static_cast<size_t>(v.built));
    for (Block& b : blocks_) {
      b.norm1 = MakeLayerNorm(W, H);
      b.norm2 = MakeLayerNorm(W, H);
      b.q = MakeLinear(W, H, H), b.k = MakeLinear(W, H, H), b.v = MakeLinear(W, H, H), b.o = MakeLinear(W, H, H);
      b.fc1 = MakeLinear(W, H, v.intermediate);
      b.fc2 = MakeLinear(W, v.intermediate, H);
    }
    adapter_fc1_ = MakeLinear(W, v.intermediate, v.projector_in, /*bias=*/false);
    adapter_fc2_ = MakeLinear(W, v.projector_in, v.projector_out, /*bias=*/false);
    projector_ = MakeLinear(W, v.vision_out, v.text_hidden, v.projector_bias);
    pixels_ = at::randn({B_, v.channels, v.image, v.image}).to(dt_);
    // Llama4VisionRotaryEmbedding's table, built when the module is made:
    // x and y patch coordinates (the class token last, at 0 frequency).
    const int64_t n = v.patches, freq_dim = hd / 2;
    at::Tensor idx = at::cat({at::arange(n, at::kLong), at::full({1}, -2, at::kLong)}).view({-1, 1});
    at::Tensor fx = at::remainder(idx, v.grid), fy = at::floor_divide(idx, v.grid);
    at::Tensor freq =
        1.0 / at::pow(v.theta, at::arange(0, freq_dim, 2, at::kLong).slice(0, 0, freq_dim / 2).to(at::kFloat) /
                                   double(freq_dim));
    at::Tensor freqs_x = ((fx + 1).unsqueeze(-1) * freq.view({1, 1, -1})).repeat_interleave(2, -1);
    at::Tensor freqs_y = ((fy + 1).unsqueeze(-1) * freq.view({1, 1, -1})).repeat_interleave(2, -1);
    at::Tensor freqs = at::cat({freqs_x, freqs_y}, -1).to(at::kFloat).contiguous().slice(-1, 0, std::nullopt, 2);
    freqs = freqs.masked_fill(idx.view({-1, 1, 1}) < 0, 0);
    freqs_ci_ = at::view_as_complex(at::stack({at::cos(freqs), at::sin(freqs)}, -1).contiguous());
  }

  at::Tensor Forward(ModelSession& rec) override {
    const Llama4Vision& v = v_;
    const int64_t H = v.hidden, heads = v.heads, hd = H / heads, T = v.patches + 1;
    at::Tensor x;
    {
      ModuleScope s(&rec, "vision_model.patch_embedding");
      x = patch_(at::im2col(pixels_, {v.patch, v.patch}, {1, 1}, {0, 0}, {v.patch, v.patch}).permute({0, 2, 1}));
    }
    {
      ModuleScope s(&rec, "vision_model");
      x = at::cat({x, cls_.expand({B_, 1, H})}, 1);
      x = x.reshape({B_, 1, T, H}) + pos_.to(dt_);
    }
    {
      ModuleScope s(&rec, "vision_model.layernorm_pre");
      x = LayerNorm(x, pre_, v.eps);
    }
    x = x.view({B_, -1, H});
    // reshape_for_broadcast: [1, T, 1, hd / 2].
    const at::Tensor freqs = freqs_ci_.view({1, T, 1, hd / 2});
    auto rope = [&](const at::Tensor& t) {
      at::Tensor c = at::view_as_complex(t.to(at::kFloat).reshape({B_, T, heads, hd / 2, 2}));
      return at::view_as_real(c * freqs).flatten(3).to(t.scalar_type());
    };
    for (size_t li = 0; li < blocks_.size(); ++li) {
      const Block& b = blocks_[li];
      const std::string path = "vision_model.model.layers." + std::to_string(li);
      at::Tensor h;
      {
        ModuleScope s(&rec, path + ".input_layernorm");
        h = LayerNorm(x, b.norm1, v.eps);
      }
      {
        ModuleScope s(&rec, path + ".self_attn");
        at::Tensor q = b.q(h).view({B_, T, heads, hd});
        at::Tensor k = b.k(h).view({B_, T, heads, hd});
        at::Tensor val = b.v(h).view({B_, T, heads, hd}).transpose(1, 2);
        q = rope(q).transpose(1, 2);
        k = rope(k).transpose(1, 2);
        h = b.o(EagerAttention(q, k, val, hd, dt_).reshape({B_, T, -1}).contiguous());
      }
      {
        ModuleScope s(&rec, path);
        x = x + h;
      }
      {
        ModuleScope s(&rec, path + ".post_attention_layernorm");
        h = LayerNorm(x, b.norm2, v.eps);
      }
      {
        ModuleScope s(&rec, path + ".mlp");
        h = b.fc2(Activate(b.fc1(h), v.act));
      }
      ModuleScope s(&rec, path);
      x = x + h;
    }
    {
      ModuleScope s(&rec, "vision_model.layernorm_post");
      x = LayerNorm(x, post_, v.eps);
    }
    {
      ModuleScope s(&rec, "vision_model");
      x = x.slice(1, 0, T - 1);
    }
    {
      // pixel_shuffle, then Llama4VisionMLP2 (GELU after both linears).
      ModuleScope s(&rec, "vision_model.vision_adapter");
      const int64_t g = v.grid, c = x.size(-1);
      const int64_t gs = static_cast<int64_t>(double(g) * v.ratio);
      at::Tensor y = x.view({B_, g, g, -1});
      y = y.view({B_, g, gs, static_cast<int64_t>(double(c) / v.ratio)}).permute({0, 2, 1, 3}).contiguous();
      y = y.view({B_, gs, gs, static_cast<int64_t>(double(c) / (v.ratio * v.ratio))})
              .permute({0, 2, 1, 3})
              .contiguous();
      y = y.view({B_, -1, y.size(-1)});
      x = at::gelu(adapter_fc2_(at::gelu(adapter_fc1_(y))));
    }
    ModuleScope s(&rec, "multi_modal_projector");
    return projector_(x.view({-1, x.size(-1)}));
  }

 private:
  Llama4Vision v_;
  int64_t B_;
  at::ScalarType dt_;
  Linear patch_, adapter_fc1_, adapter_fc2_, projector_;
  at::Tensor cls_, pos_, pixels_, freqs_ci_;
  Norm pre_, post_;
  std::vector<Block> blocks_;
};

// --- Gemma 4 (Gemma4VisionModel and embed_vision).
struct Gemma4Vision {
  int64_t hidden = 1152, layers = 27, heads = 16, kv_heads = 16, head_dim = 72, intermediate = 4304, patch = 16;
  int64_t pool = 3, position_table = 10240, soft_tokens = 280, text_hidden = 0;
  double eps = 1e-6, theta = 100;
  bool standardize = false, clipped = false;
  std::string act = "gelu_tanh";
  int64_t side = 0, max_patches = 0, patches = 0, tokens = 0, built = 0;
};

Gemma4Vision ReadGemma4Vision(const json& config, const json& c, int64_t text_hidden, int64_t max_layers,
                              std::string* refusal) {
  Gemma4Vision v;
  v.hidden = ConfigInt(c, "hidden_size", v.hidden);
  v.layers = ConfigInt(c, "num_hidden_layers", v.layers);
  v.heads = ConfigInt(c, "num_attention_heads", v.heads);
  v.kv_heads = ConfigInt(c, "num_key_value_heads", v.heads);
  v.head_dim = ConfigInt(c, "head_dim", v.hidden / std::max<int64_t>(1, v.heads));
  v.intermediate = ConfigInt(c, "intermediate_size", v.intermediate);
  v.patch = ConfigInt(c, "patch_size", v.patch);
  v.pool = ConfigInt(c, "pooling_kernel_size", v.pool);
  v.position_table = ConfigInt(c, "position_embedding_size", v.position_table);
  v.soft_tokens = ConfigInt(config, "vision_soft_tokens_per_image", ConfigInt(c, "default_output_length", 280));
  v.eps = ConfigNumber(c, "rms_norm_eps", v.eps);
  if (auto r = c.find("rope_parameters"); r != c.end() && r->is_object())
    v.theta = ConfigNumber(*r, "rope_theta", v.theta);
  v.standardize = ConfigBool(c, "standardize", false);
  v.clipped = ConfigBool(c, "use_clipped_linears", false);
  for (const char* key : {"hidden_activation", "hidden_act"}) {
    if (auto a = c.find(key); a != c.end() && a->is_string()) {
      v.act = NormaliseAct(a->get<std::string>());
      break;
    }
  }
  v.text_hidden = text_hidden;
  v.built = std::min(v.layers, std::max<int64_t>(1, max_layers));
  // The processor: a square image of the largest grid (a multiple of the
  // pooling kernel) within soft_tokens * k^2 patches, padded to that many.
  v.max_patches = v.soft_tokens * v.pool * v.pool;
  v.side = static_cast<int64_t>(std::sqrt(static_cast<double>(v.max_patches))) / v.pool * v.pool;
  v.patches = v.side * v.side;
  v.tokens = (v.side / std::max<int64_t>(1, v.pool)) * (v.side / std::max<int64_t>(1, v.pool));
  if (!KnownActivation(v.act)) {
    *refusal = "activation '" + v.act + "' is not built";
  } else if (v.heads % v.kv_heads != 0 || v.head_dim % 4 != 0) {
    *refusal = "heads not a multiple of the KV heads, or head_dim not a multiple of 4 (2-D rotary halves)";
  } else if (v.side <= 0 || v.side > v.position_table) {
    *refusal = "the patch grid does not fit the position table";
  }
  return v;
}

TowerSpec PlanGemma4(const Gemma4Vision& v, double eb, int64_t batch) {
  TowerSpec t;
  t.name = "Gemma 4";
  t.depth = v.layers, t.built = v.built, t.tokens = v.tokens, t.out_hidden = v.text_hidden;
  t.embed_path = "model.language_model.embed_tokens", t.merge_path = "model";
  const double H = double(v.hidden), I = double(v.intermediate), T = double(v.max_patches), B = double(batch);
  const double K = 3.0 * double(v.patch * v.patch), hd = double(v.head_dim);
  const double attn = H * hd * double(2 * v.heads + 2 * v.kv_heads);
  t.weights = K * H + 2.0 * double(v.position_table) * H + (attn + 3.0 * H * I + 5.0 * H) * double(v.built) + 2.0 * H +
              H * double(v.text_hidden);
  // The position lookup is a one-hot matmul: [B, 2, T, table] in the model dtype.
  t.activation_bytes = eb * B * 2.0 * T * double(v.position_table) + 4.0 * B * double(v.heads) * T * T +
                       eb * B * T * (8.0 * H + 3.0 * I + K);
  t.flops = B * (2.0 * T * K * H + 4.0 * T * double(v.position_table) * H +
                 2.0 * T * (attn + 3.0 * H * I) * double(v.built) + 4.0 * T * T * hd * double(v.heads * v.built) +
                 2.0 * T * double(v.soft_tokens) * H + 2.0 * double(v.tokens) * H * double(v.text_hidden));
  t.notes.push_back("image: " + std::to_string(v.side * v.patch) + "x" + std::to_string(v.side * v.patch) +
                    " pixels, " + std::to_string(v.patches) + " patches padded to " + std::to_string(v.max_patches) +
                    " (vision_soft_tokens_per_image x pooling_kernel_size^2), pooled to " + std::to_string(v.tokens) +
                    " soft tokens");
  t.notes.push_back(
      "the encoder's bidirectional padding mask is built as an additive mask (where over the key padding)");
  return t;
}

class Gemma4Run : public TowerRun {
 public:
  Gemma4Run(const Gemma4Vision& v, const Weights& W, int64_t images) : v_(v), B_(images), dt_(W.dtype) {
    const int64_t H = v.hidden, hd = v.head_dim;
    input_proj_ = W({H, 3 * v.patch * v.patch});
    table_ = W({2, v.position_table, H});
    blocks_.resize(static_cast<size_t>(v.built));
    for (G4Block& b : blocks_) {
      for (at::Tensor* n : {&b.ln_in, &b.ln_post_attn, &b.ln_pre_ff, &b.ln_post_ff}) *n = W.Ones({H});
      b.q = W({v.heads * hd, H}), b.k = W({v.kv_heads * hd, H}), b.v = W({v.kv_heads * hd, H});
      b.o = W({H, v.heads * hd});
      b.q_norm = W.Ones({hd}), b.k_norm = W.Ones({hd});
      b.gate = W({v.intermediate, H}), b.up = W({v.intermediate, H}), b.down = W({H, v.intermediate});
    }
    if (v.standardize) std_bias_ = W.Zeros({H}), std_scale_ = W.Ones({H});
    projection_ = W({v.text_hidden, H});
    // The processor's patches in [0, 1] and their (x, y) positions; padding
    // patches sit at (-1, -1).
    pixels_ = at::rand({B_, v.max_patches, 3 * v.patch * v.patch}).to(dt_);
    at::Tensor grid = at::arange(v.side, at::kLong);
    at::Tensor xy = at::stack({grid.repeat({v.side}), grid.repeat_interleave(v.side)}, -1);
    at::Tensor pad = at::full({v.max_patches - v.patches, 2}, -1, at::kLong);
    positions_ = at::cat({xy, pad}).unsqueeze(0).repeat({B_, 1, 1});
    const int64_t spatial = hd / 2;
    inv_freq_ = 1.0 / at::pow(v.theta, at::arange(0, spatial, 2, at::kLong).to(at::kFloat) / double(spatial));
  }

  at::Tensor Forward(ModelSession& rec) override {
    const Gemma4Vision& v = v_;
    const int64_t H = v.hidden, hd = v.head_dim, T = v.max_patches, rep = v.heads / v.kv_heads, k = v.pool;
    // Gemma4RMSNorm: fp32, pow(-0.5), optional scale, back to the input dtype.
    auto rms = [&](const at::Tensor& x, const at::Tensor& w) {
      at::Tensor h = x.to(at::kFloat);
      h = h * at::pow(h.pow(2).mean({-1}, /*keepdim=*/true) + v.eps, -0.5);
      if (w.defined()) h = h * w.to(at::kFloat);
      return h.to(x.scalar_type());
    };
    auto linear = [&](const at::Tensor& x, const at::Tensor& w) {
      // Gemma4ClippableLinear: clamps to buffers of +-inf when clipped.
      if (!v.clipped) return at::linear(x, w);
      const double inf = std::numeric_limits<double>::infinity();
      return at::clamp(at::linear(at::clamp(x, -inf, inf), w), -inf, inf);
    };
    at::Tensor padding, x;
    {
      ModuleScope s(&rec, "model.vision_tower");
      padding = (positions_ == -1).all(-1);
    }
    {
      ModuleScope s(&rec, "model.vision_tower.patch_embedder");
      at::Tensor h = at::linear((pixels_ - 0.5) * 2, input_proj_);
      at::Tensor one_hot = at::one_hot(positions_.clamp_min(0), v.position_table).permute({0, 2, 1, 3}).to(dt_);
      at::Tensor pe = at::matmul(one_hot, table_).sum(1);
      pe = at::where(padding.unsqueeze(-1), at::zeros({}, pe.options()), pe);
      x = h + pe;
    }
    at::Tensor mask, cos, sin;
    {
      ModuleScope s(&rec, "model.vision_tower.encoder");
      mask =
          at::where((~padding).view({B_, 1, 1, T}), at::zeros({}, x.options()), at::full({}, Lowest(dt_), x.options()))
              .expand({B_, 1, T, T});
    }
    {
      ModuleScope s(&rec, "model.vision_tower.encoder.rotary_emb");
      at::Tensor inv = inv_freq_.view({1, -1, 1}).expand({B_, -1, 1});
      std::vector<at::Tensor> coss, sins;
      for (int64_t d = 0; d < 2; ++d) {
        at::Tensor p = positions_.select(2, d).unsqueeze(1).to(at::kFloat);
        at::Tensor freqs = at::matmul(inv, p).transpose(1, 2);
        at::Tensor emb = at::cat({freqs, freqs}, -1);
        coss.push_back(emb.cos() * 1.0);
        sins.push_back(emb.sin() * 1.0);
      }
      cos = at::cat(coss, -1).to(dt_);
      sin = at::cat(sins, -1).to(dt_);
    }
    // apply_multidimensional_rope: x and y halves, each rotated by its own half of cos / sin.
    auto rope = [&](const at::Tensor& t) {
      auto parts = t.split(hd / 2, -1);
      auto c = cos.split(hd / 2, -1), sn = sin.split(hd / 2, -1);
      std::vector<at::Tensor> out;
      for (size_t i = 0; i < 2; ++i) {
        out.push_back(parts[i] * c[i].unsqueeze(2) + RotateHalf(parts[i]) * sn[i].unsqueeze(2));
      }
      return at::cat(out, -1);
    };
    for (size_t li = 0; li < blocks_.size(); ++li) {
      const G4Block& b = blocks_[li];
      const std::string path = "model.vision_tower.encoder.layers." + std::to_string(li);
      at::Tensor h;
      {
        ModuleScope s(&rec, path + ".input_layernorm");
        h = rms(x, b.ln_in);
      }
      {
        ModuleScope s(&rec, path + ".self_attn");
        at::Tensor q = rope(rms(linear(h, b.q).view({B_, T, -1, hd}), b.q_norm)).transpose(1, 2);
        at::Tensor kk = rope(rms(linear(h, b.k).view({B_, T, -1, hd}), b.k_norm)).transpose(1, 2);
        at::Tensor val = rms(linear(h, b.v).view({B_, T, -1, hd}), at::Tensor()).transpose(1, 2);
        if (rep > 1) {
          kk = kk.unsqueeze(2).expand({B_, v.kv_heads, rep, T, hd}).reshape({B_, v.heads, T, hd});
          val = val.unsqueeze(2).expand({B_, v.kv_heads, rep, T, hd}).reshape({B_, v.heads, T, hd});
        }
        at::Tensor scores = at::matmul(q, kk.transpose(2, 3)) * 1.0 + mask;
        at::Tensor probs = at::softmax(scores, -1, at::kFloat).to(dt_);
        h = linear(at::matmul(probs, val).transpose(1, 2).contiguous().reshape({B_, T, -1}).contiguous(), b.o);
      }
      {
        ModuleScope s(&rec, path + ".post_attention_layernorm");
        h = rms(h, b.ln_post_attn);
      }
      {
        ModuleScope s(&rec, path);
        x = x + h;
      }
      {
        ModuleScope s(&rec, path + ".pre_feedforward_layernorm");
        h = rms(x, b.ln_pre_ff);
      }
      {
        ModuleScope s(&rec, path + ".mlp");
        h = linear(Activate(linear(h, b.gate), v.act) * linear(h, b.up), b.down);
      }
      {
        ModuleScope s(&rec, path + ".post_feedforward_layernorm");
        h = rms(h, b.ln_post_ff);
      }
      ModuleScope s(&rec, path);
      x = x + h;
    }
    at::Tensor valid;
    {
      // Average over k x k patches by position (a one-hot matmul), scale by sqrt(hidden).
      ModuleScope s(&rec, "model.vision_tower.pooler");
      x = x.masked_fill(padding.unsqueeze(-1), 0.0);
      at::Tensor clamped = positions_.clamp_min(0);
      at::Tensor max_x = std::get<0>(clamped.select(-1, 0).max(-1, /*keepdim=*/true)) + 1;
      at::Tensor kernel = at::div(clamped, k, "floor");
      kernel = kernel.select(-1, 0) + at::floor_divide(max_x, k) * kernel.select(-1, 1);
      at::Tensor weights = at::one_hot(kernel.to(at::kLong), v.soft_tokens).to(at::kFloat) / double(k * k);
      at::Tensor pooled = at::matmul(weights.transpose(1, 2), x.to(at::kFloat));
      valid = at::logical_not((weights == 0).all(1));
      x = pooled.to(dt_) * std::sqrt(double(H));
    }
    {
      ModuleScope s(&rec, "model.vision_tower");
      x = x.index({valid});
      if (v.standardize) x = (x - std_bias_) * std_scale_;
    }
    ModuleScope s(&rec, "model.embed_vision");
    return at::linear(rms(x, at::Tensor()), projection_);
  }

 private:
  struct G4Block {
    at::Tensor ln_in, ln_post_attn, ln_pre_ff, ln_post_ff, q, k, v, o, q_norm, k_norm, gate, up, down;
  };
  Gemma4Vision v_;
  int64_t B_;
  at::ScalarType dt_;
  at::Tensor input_proj_, table_, std_bias_, std_scale_, projection_, pixels_, positions_, inv_freq_;
  std::vector<G4Block> blocks_;
};

// --- Phi-3-vision (remote code: Phi3ImageEmbedding). The CLIP ViT-L/14-336
// tower is the vision family's (model_vision.cc, through RunFamily); the HD
// transform, its separators and img_projection are here.
struct Phi3Vision {
  int64_t image_dim = 1024, crops_h = 2, crops_w = 2, text_hidden = 0, side = 24;
  bool sub_glb = true;  // hd_transform_order
  int64_t crops = 0, tokens = 0;
  selection::Features clip;
  json clip_config;
};

Phi3Vision ReadPhi3Vision(const json& config, int64_t text_hidden, std::string* refusal) {
  Phi3Vision v;
  const json ip = config.value("img_processor", json::object());
  const json embd = config.value("embd_layer", json::object());
  if (!ip.is_object() || ip.value("model_name", std::string()) != "openai/clip-vit-large-patch14-336") {
    *refusal = "img_processor other than openai/clip-vit-large-patch14-336 (the only one Phi3ImageEmbedding builds)";
    return v;
  }
  if (!embd.is_object() || !ConfigBool(embd, "use_hd_transform", false) ||
      !ConfigBool(embd, "with_learnable_separator", false) || embd.value("projection_cls", std::string()) != "mlp") {
    *refusal = "Phi-3-vision without the HD transform and its MLP projection is not built";
    return v;
  }
  v.image_dim = ConfigInt(ip, "image_dim_out", 1024);
  v.sub_glb = embd.value("hd_transform_order", std::string("glb_sub")) == "sub_glb";
  v.text_hidden = text_hidden;
  // A square image the processor splits into 2 x 2 crops of 336 (num_crops 4),
  // plus the global crop: (h * w + 1) * 144 + 1 + (h + 1) * 12 tokens.
  v.crops = v.crops_h * v.crops_w + 1;
  v.tokens = v.crops * 144 + 1 + (v.crops_h + 1) * 12;
  // CLIP_VIT_LARGE_PATCH14_336_CONFIG of the remote code.
  v.clip.model_type = "clip_vision_model";
  v.clip.architecture = "CLIPVisionModel";
  v.clip.head = "Model";
  v.clip.structure = "vision";
  v.clip.vision = selection::Tower{1024, 24, 16, 4096, 336, 14, 0};
  v.clip_config = {{"vision_config",
                    {{"model_type", "clip_vision_model"},
                     {"hidden_act", "quick_gelu"},
                     {"layer_norm_eps", 1e-5},
                     {"image_size", 336},
                     {"patch_size", 14},
                     {"num_channels", 3},
                     {"projection_dim", 768}}}};
  return v;
}

CaptureProfile ClipProfile(const CaptureProfile& profile, const Phi3Vision& v) {
  CaptureProfile p = profile;
  p.name = "image";
  p.batch = profile.batch * v.crops;
  p.seq_len = 0;
  p.past_len = 0;
  return p;
}

TowerSpec PlanPhi3(const Phi3Vision& v, const CaptureProfile& profile, int64_t max_layers) {
  TowerSpec t;
  t.name = "Phi-3-vision";
  const BuildPlan clip = PlanModel(v.clip, v.clip_config, ClipProfile(profile, v), BuildOptions{max_layers, 1e300});
  if (!clip.buildable) {
    t.refusal = "its CLIP tower: " + clip.reason;
    return t;
  }
  const double eb = ElementBytes(profile.dtype), C4 = 4.0 * double(v.image_dim), D = double(v.text_hidden);
  t.depth = clip.layers_total, t.built = clip.layers_built, t.tokens = v.tokens, t.out_hidden = v.text_hidden;
  t.embed_path = "model.embed_tokens", t.merge_path = "model.vision_embed_tokens";
  t.weights = clip.weight_bytes / eb + 2.0 * C4 + C4 * D + D * D;
  t.activation_bytes = clip.activation_bytes + eb * double(profile.batch) * double(v.tokens) * (C4 + 2.0 * D);
  t.flops = clip.flops + 2.0 * double(profile.batch) * double(v.tokens) * (C4 * D + D * D);
  t.notes.push_back(
      "the CLIP ViT-L/14-336 tower is the vision family's (its module paths, e.g. encoder.layers.N, "
      "without model.vision_embed_tokens.img_processor.vision_model.) on " +
      std::to_string(v.crops) + " crops per image (2 x 2 crops of 336 and the global one)");
  t.notes.push_back(
      "the HD transform reads a stand-in for the tower's hidden_states[-2] of the same shape (the vision "
      "family returns the pooled output), so the projected features do not depend on the tower");
  for (const std::string& n : clip.notes) t.notes.push_back("CLIP: " + n);
  return t;
}

class Phi3Run : public TowerRun {
 public:
  Phi3Run(const Phi3Vision& v, const CaptureProfile& profile, int64_t max_layers, const Weights& W)
      : v_(v), profile_(profile), max_layers_(max_layers), B_(profile.batch), dt_(W.dtype) {
    const int64_t C4 = 4 * v.image_dim, D = v.text_hidden;
    glb_gn_ = W.Zeros({1, 1, C4});
    sub_gn_ = W.Zeros({1, 1, 1, C4});
    fc1_ = MakeLinear(W, C4, D);
    fc2_ = MakeLinear(W, D, D);
  }

  Status RunFirst(ModelSession& rec, uint64_t seed) override {
    const CaptureProfile p = ClipProfile(profile_, v_);
    const BuildPlan clip = PlanModel(v_.clip, v_.clip_config, p, BuildOptions{max_layers_, 1e300});
    Status s = RunFamily(v_.clip, clip, p, rec, seed);
    // The stand-in for hidden_states[-2]: [crops, 1 + 576, 1024].
    hidden_ = at::randn({B_ * v_.crops, 1 + v_.side * v_.side, v_.image_dim}).to(dt_);
    return s;
  }

  at::Tensor Forward(ModelSession& rec) override {
    const Phi3Vision& v = v_;
    const int64_t C = v.image_dim, H = v.side, h = v.crops_h, w = v.crops_w, n = h * w;
    std::vector<at::Tensor> images;
    ModuleScope scope(&rec, "model.vision_embed_tokens");
    at::Tensor feats = hidden_.slice(1, 1).view({B_, -1, H * H, C});  // type_feature "patch"
    for (int64_t b = 0; b < B_; ++b) {
      at::Tensor glb = feats[b].slice(0, 0, 1).reshape({1, H, H, C}).reshape({1, H / 2, 2, H / 2, 2, C}).contiguous();
      glb = glb.permute({0, 1, 3, 2, 4, 5}).reshape({1, H / 2, H / 2, 4 * C}).contiguous();
      glb = at::cat({glb, sub_gn_.repeat({1, H / 2, 1, 1})}, 2).reshape({1, -1, 4 * C});
      at::Tensor sub = feats[b].slice(0, 1).slice(0, 0, n);
      sub = sub.reshape({n, H, H, C}).reshape({n, H / 2, 2, H / 2, 2, C}).contiguous();
      sub = sub.permute({0, 1, 3, 2, 4, 5}).reshape({n, -1, 4 * C}).contiguous();
      sub = sub.reshape({1, h, w, H / 2, H / 2, -1})
                .permute({0, 1, 3, 2, 4, 5})
                .reshape({1, h * (H / 2), w * (H / 2), 4 * C});
      sub = at::cat({sub, sub_gn_.repeat({1, h * (H / 2), 1, 1})}, 2).reshape({1, -1, 4 * C});
      images.push_back(v.sub_glb ? at::cat({sub, glb_gn_, glb}, 1) : at::cat({glb, glb_gn_, sub}, 1));
    }
    std::vector<at::Tensor> projected;
    for (const at::Tensor& img : images) {
      ModuleScope s(&rec, "model.vision_embed_tokens.img_projection");
      projected.push_back(fc2_(at::gelu(fc1_(img))));
    }
    return at::cat(projected, 0);  // [B, tokens, D]
  }

  at::Tensor Merge(ModelSession& rec, const at::Tensor& features, const at::Tensor& embed, at::Tensor ids,
                   int64_t /*image_token*/, const TowerSpec& spec) override {
    // Image placeholders are negative ids; the embedding reads them clamped,
    // then each image's features are written over its span.
    ModuleScope scope(&rec, spec.merge_path);
    // transformers finds the spans with nonzero and reads them on the host.
    [[maybe_unused]] at::Tensor positions = at::nonzero((ids < 0) & (ids > -1000000000));
    ids = ids.clamp_min(0).clamp_max(embed.size(0));
    at::Tensor hidden;
    {
      ModuleScope s(&rec, spec.embed_path);
      hidden = at::embedding(embed, ids);
    }
    if (!rec.training) {
      for (int64_t b = 0; b < B_; ++b)
        hidden[b].slice(0, 1, 1 + spec.tokens).copy_(features[b].to(hidden.scalar_type()));
    } else {
      // Out of place for autograd: the same spans via index_put.
      at::Tensor rows = at::arange(1, 1 + spec.tokens, at::kLong);
      for (int64_t b = 0; b < B_; ++b) {
        hidden = hidden.index_put({at::full({spec.tokens}, b, at::kLong), rows}, features[b].to(hidden.scalar_type()));
      }
    }
    return hidden;
  }

  int64_t PlaceholderId() const override { return -1; }

 private:
  Phi3Vision v_;
  CaptureProfile profile_;
  int64_t max_layers_, B_;
  at::ScalarType dt_;
  at::Tensor glb_gn_, sub_gn_, hidden_;
  Linear fc1_, fc2_;
};

const json& VisionConfigOf(const json& config) {
  static const json empty = json::object();
  auto it = config.find("vision_config");
  return it != config.end() && it->is_object() ? *it : empty;
}

std::string VisionTypeOf(const json& config) {
  const json& vc = VisionConfigOf(config);
  auto it = vc.find("model_type");
  return it != vc.end() && it->is_string() ? it->get<std::string>() : std::string();
}

bool IsQwenVl(const selection::Features& f) { return QwenVlTypes().count(f.model_type) > 0; }
bool IsLlama4(const selection::Features& f, const json& config) {
  return f.model_type == "llama4" || VisionTypeOf(config) == "llama4_vision_model";
}
bool IsPhi3V(const selection::Features& f, const json& config) {
  return f.model_type == "phi3_v" && config.contains("img_processor");
}
bool IsGemma4(const selection::Features& f, const json& config) {
  return f.model_type == "gemma4" || VisionTypeOf(config) == "gemma4_vision";
}

// The tower's spec for `batch` images, or a refusal.
TowerSpec PlanTower(const selection::Features& f, const json& config, int64_t text_hidden, int64_t max_layers,
                    const CaptureProfile& profile) {
  const double eb = ElementBytes(profile.dtype);
  const int64_t batch = profile.batch;
  std::string refusal;
  TowerSpec t;
  if (IsQwenVl(f)) {
    const QwenVision v = ReadQwenVision(f, VisionConfigOf(config), max_layers, &refusal);
    if (refusal.empty()) t = PlanQwen(v, eb, batch);
  } else if (IsLlama4(f, config)) {
    const Llama4Vision v = ReadLlama4Vision(VisionConfigOf(config), text_hidden, max_layers, &refusal);
    if (refusal.empty()) t = PlanLlama4(v, eb, batch);
  } else if (IsGemma4(f, config)) {
    const Gemma4Vision v = ReadGemma4Vision(config, VisionConfigOf(config), text_hidden, max_layers, &refusal);
    if (refusal.empty()) t = PlanGemma4(v, eb, batch);
  } else if (IsPhi3V(f, config)) {
    const Phi3Vision v = ReadPhi3Vision(config, text_hidden, &refusal);
    if (refusal.empty()) t = PlanPhi3(v, profile, max_layers);
    if (refusal.empty()) refusal = t.refusal;
  } else {
    std::string type = VisionTypeOf(config);
    if (type.empty() && config.contains("img_processor")) type = "img_processor (Phi-3-vision's CLIP)";
    if (type.empty()) type = f.model_type + "'s";
    refusal = "the " + type +
              " vision tower and its projector are not built yet (Qwen3-VL, Qwen3.5, Llama 4, "
              "Gemma 4 and Phi-3-vision towers are)";
  }
  t.refusal = refusal;
  return t;
}

std::unique_ptr<TowerRun> MakeTower(const selection::Features& f, const json& config, int64_t text_hidden,
                                    int64_t max_layers, const Weights& W, const CaptureProfile& profile) {
  const int64_t images = profile.batch;
  std::string refusal;
  if (IsQwenVl(f)) {
    const QwenVision v = ReadQwenVision(f, VisionConfigOf(config), max_layers, &refusal);
    if (refusal.empty()) return std::make_unique<QwenRun>(v, W, images);
  } else if (IsLlama4(f, config)) {
    const Llama4Vision v = ReadLlama4Vision(VisionConfigOf(config), text_hidden, max_layers, &refusal);
    if (refusal.empty()) return std::make_unique<Llama4Run>(v, W, images);
  } else if (IsGemma4(f, config)) {
    const Gemma4Vision v = ReadGemma4Vision(config, VisionConfigOf(config), text_hidden, max_layers, &refusal);
    if (refusal.empty()) return std::make_unique<Gemma4Run>(v, W, images);
  } else if (IsPhi3V(f, config)) {
    const Phi3Vision v = ReadPhi3Vision(config, text_hidden, &refusal);
    if (refusal.empty()) return std::make_unique<Phi3Run>(v, profile, max_layers, W);
  }
  return nullptr;
}

}  // namespace

BuildPlan PlanMultimodal(const selection::Features& f, const json& config, const CaptureProfile& profile,
                         const BuildOptions& options) {
  BuildPlan plan;
  plan.family = "multimodal";
  auto refuse = [&plan](std::string why) {
    plan.buildable = false;
    plan.reason = std::move(why);
    return plan;
  };
  const Stage stage = StageOf(profile);
  const double eb = ElementBytes(profile.dtype);
  TextTower text = TextTowerOf(f, config);
  const TowerSpec tower = PlanTower(f, config, text.features.hidden, options.max_layers, profile);

  // The text tower first: its reason is the model's when both are missing.
  if (stage != Stage::kImage) {
    const BuildPlan text_plan = PlanModel(text.features, text.config,
                                          TextProfile(profile, stage == Stage::kPrefill ? tower.tokens : 0), options);
    if (!text_plan.buildable) return refuse("text tower: " + text_plan.reason);
    plan.layers_total = text_plan.layers_total;
    plan.layers_built = text_plan.layers_built;
    plan.weight_bytes = text_plan.weight_bytes;
    plan.activation_bytes = text_plan.activation_bytes;
    plan.flops = text_plan.flops;
    plan.notes = text.notes;
    for (const std::string& n : text_plan.notes) {
      // PlanModel notes the layers built of the multimodal plan (the text tower's) itself.
      if (n.find("layers built (layers repeat)") != std::string::npos) continue;
      plan.notes.push_back("text tower (" + text_plan.family + "): " + n);
    }
  }
  if (stage == Stage::kDecode) {
    plan.notes.push_back("decode: the text tower only (the image's tokens are already in the KV cache)");
    plan.buildable = true;
    return plan;
  }
  if (!tower.refusal.empty()) return refuse("vision tower: " + tower.refusal);
  if (!f.quantization.empty()) plan.notes.push_back(QuantizationNote(f.quantization, profile.dtype));
  if (stage == Stage::kPrefill && tower.out_hidden != text.features.hidden) {
    return refuse("vision tower: its features' width " + std::to_string(tower.out_hidden) +
                  " is not the text tower's hidden size " + std::to_string(text.features.hidden));
  }
  plan.weight_bytes += eb * tower.weights;
  plan.activation_bytes = std::max(plan.activation_bytes, tower.activation_bytes);
  plan.flops += tower.flops;
  if (stage == Stage::kImage) {
    plan.layers_total = tower.depth;
    plan.layers_built = tower.built;
    plan.notes.push_back("image: the vision tower and its projector only, on " + std::to_string(profile.batch) +
                         " image(s)");
  } else {
    // The merge's own embedding table (the text tower makes its own).
    plan.weight_bytes += eb * double(text.features.vocab) * double(text.features.hidden);
    plan.notes.push_back("vision tower: " + std::to_string(tower.built) + " of " + std::to_string(tower.depth) +
                         " blocks built (blocks repeat)");
    plan.notes.push_back("prefill: " + std::to_string(profile.batch) + " sequence(s) of " +
                         std::to_string(profile.seq_len) + " text tokens and one image's " +
                         std::to_string(tower.tokens) + " tokens each");
    plan.notes.push_back(
        "image features are merged (masked_scatter) before the text tower; the text tower embeds the token ids "
        "itself, so its embedding repeats the merge's and the merged embeddings do not reach it (nor, in training, "
        "its gradients the vision tower)");
    plan.notes.push_back("text tower module paths are its family's (layers.N...), without transformers' prefix (" +
                         tower.embed_path.substr(0, tower.embed_path.rfind("embed_tokens")) + ")");
    if (IsQwenVl(f) && VisionConfigOf(config).value("deepstack_visual_indexes", json::array()).size() > 0) {
      plan.notes.push_back(
          "deepstack: the deepstack mergers run; adding their features to the image tokens' hidden states after "
          "the first text layers (an index_put per layer) is not done");
    }
  }
  for (const std::string& n : tower.notes) plan.notes.push_back("vision tower (" + tower.name + "): " + n);
  if (plan.weight_bytes + plan.activation_bytes > options.max_bytes) {
    return refuse("needs about " + Gb(plan.weight_bytes + plan.activation_bytes) +
                  " GB with the vision tower, over the " + Gb(options.max_bytes) + " GB budget");
  }
  plan.buildable = true;
  return plan;
}

Status RunMultimodal(const selection::Features& f, const BuildPlan& plan, const CaptureProfile& profile,
                     ModelSession& rec, uint64_t seed) {
  if (!plan.buildable) return Status::InvalidArgument("model is not buildable: " + plan.reason);
  const Stage stage = StageOf(profile);
  TextTower text = TextTowerOf(f, plan.config);
  // The vision tower builds as many blocks as the text tower (or, for an
  // image profile, the plan's).
  const TowerSpec tower = PlanTower(f, plan.config, text.features.hidden, plan.layers_built, profile);
  BuildPlan text_plan;
  const CaptureProfile text_profile = TextProfile(profile, tower.tokens);
  if (stage != Stage::kImage) {
    text_plan = PlanModel(text.features, text.config, text_profile, BuildOptions{plan.layers_built, 1e300});
    if (!text_plan.buildable) return Status::InvalidArgument("text tower is not buildable: " + text_plan.reason);
  }
  if (stage == Stage::kDecode) return RunFamily(text.features, text_plan, text_profile, rec, seed);
  if (!tower.refusal.empty()) return Status::InvalidArgument("vision tower is not buildable: " + tower.refusal);

  try {
    at::manual_seed(seed);
    const at::ScalarType dt = ToScalarType(profile.dtype);
    const Weights W{dt, &rec};
    const int64_t B = profile.batch;
    std::unique_ptr<TowerRun> run = MakeTower(f, plan.config, text.features.hidden, plan.layers_built, W, profile);
    if (!run) return Status::Internal("no vision tower for " + f.model_type);
    if (Status first = run->RunFirst(rec, seed); !first.ok() || rec.stopped()) return first;
    const int64_t S = text_profile.seq_len, vocab = text.features.vocab;
    at::Tensor embed, ids;
    int64_t image_token = 0;
    if (stage == Stage::kPrefill) {
      embed = W({vocab, text.features.hidden});
      image_token = ConfigInt(plan.config, "image_token_id", ConfigInt(plan.config, "image_token_index", vocab - 1));
      if (image_token >= vocab) image_token = vocab - 1;
      // Text tokens (never the image token), each image's tokens after the first one.
      const int64_t other = image_token == vocab - 1 ? 0 : vocab - 1;
      ids = at::randint(0, vocab, {B, S}, at::kLong);
      ids = at::where(ids == image_token, at::full_like(ids, other), ids);
      const int64_t placeholder = run->PlaceholderId() != 0 ? run->PlaceholderId() : image_token;
      ids.slice(1, 1, 1 + tower.tokens).fill_(placeholder);
      // Gemma's embeddings are scaled by sqrt(hidden).
      if (text.features.model_type.rfind("gemma", 0) == 0) {
        run->embed_scale = std::sqrt(static_cast<double>(text.features.hidden));
      }
    }

    at::Tensor features;
    {
      c10::InferenceMode guard(!rec.training);
      rec.Start();
      features = run->Forward(rec);
      if (stage == Stage::kPrefill) features = run->Merge(rec, features, embed, ids, image_token, tower);
      rec.Stop(features);
    }
    if (rec.stopped() || stage == Stage::kImage) return Status::Ok();
  } catch (const std::exception& e) {
    rec.Stop();
    return Status::Internal(std::string("building or running the vision tower failed: ") + e.what());
  }
  // The text tower records in the same session (its own Start / Stop).
  return RunFamily(text.features, text_plan, text_profile, rec, seed);
}

}  // namespace coverage::runners::builder
