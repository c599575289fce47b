// The multimodal family of the model builder (model_builder.h): a vision
// tower, the projector (merger) into the language model's width, and the
// language model (the text tower), which is built by whichever family builds
// its structure (PlanModel / RunFamily), so a text tower starts building here
// as soon as its own family does.
//
// Vision towers built: Qwen3-VL's (also Qwen3.5's): Conv3d patch embedding
// over temporal_patch_size frames, the learned position table bilinearly
// interpolated to the image's patch grid, 2-D rotary attention per image,
// the patch merger over spatial_merge_size^2 patches and deepstack mergers.
#include <algorithm>
#include <cmath>
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
  static const std::set<std::string> types = {"qwen3_vl_text", "qwen3_vl_moe_text", "qwen3_5_text",
                                              "qwen3_5_moe_text"};
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

// Qwen3-VL's vision tower, from vision_config (defaults of Qwen3VLVisionConfig).
struct QwenVision {
  std::string refusal;
  int64_t hidden = 1152, depth = 27, heads = 16, intermediate = 4304, channels = 3, patch = 16;
  int64_t temporal = 2, merge = 2, out_hidden = 3584, positions = 2304;
  std::vector<int64_t> deepstack;
  std::string act = "gelu_tanh";
  int64_t grid = 0;     // patches per side of the image (the position table's grid)
  int64_t patches = 0;  // per image
  int64_t tokens = 0;   // merged tokens per image (what the text tower sees)
  int64_t built = 0;    // blocks built
};

QwenVision ReadQwenVision(const selection::Features& f, const json& config, int64_t max_layers) {
  QwenVision v;
  const bool qwen3_vl = f.model_type == "qwen3_vl" || f.model_type == "qwen3_vl_moe";
  if (qwen3_vl) v.deepstack = {8, 16, 24};
  auto it = config.find("vision_config");
  const json c = it != config.end() && it->is_object() ? *it : json::object();
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
  if (auto a = c.find("hidden_act"); a != c.end() && a->is_string()) v.act = a->get<std::string>();
  if (v.act == "gelu_pytorch_tanh" || v.act == "gelu_new" || v.act == "gelu_fast") v.act = "gelu_tanh";
  if (!KnownActivation(v.act)) {
    v.refusal = "activation '" + v.act + "' is not built";
    return v;
  }
  if (v.hidden % v.heads != 0 || (v.hidden / v.heads) % 4 != 0) {
    v.refusal = "hidden size over heads is not a multiple of 4 (2-D rotary halves)";
    return v;
  }
  v.grid = static_cast<int64_t>(std::llround(std::sqrt(static_cast<double>(v.positions))));
  if (v.grid * v.grid != v.positions) {
    v.refusal = "num_position_embeddings is not a square grid";
    return v;
  }
  // The image grid must split into merge x merge blocks.
  v.grid = v.grid / v.merge * v.merge;
  if (v.grid <= 0) {
    v.refusal = "the position grid is smaller than the merge size";
    return v;
  }
  v.patches = v.grid * v.grid;
  v.tokens = v.patches / (v.merge * v.merge);
  v.built = std::min(v.depth, std::max<int64_t>(1, max_layers));
  return v;
}

double QwenVisionWeights(const QwenVision& v) {
  const double H = double(v.hidden), I = double(v.intermediate), M = H * double(v.merge * v.merge);
  const double merger = M * M + M * double(v.out_hidden);
  return double(v.channels * v.temporal * v.patch * v.patch) * H + double(v.positions) * H +
         (4.0 * H * H + 2.0 * H * I) * double(v.built) + merger * double(1 + v.deepstack.size());
}

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
  const bool qwen_vl = QwenVlTypes().count(f.model_type) > 0;
  QwenVision v;
  if (qwen_vl) v = ReadQwenVision(f, config, options.max_layers);

  // The text tower first: its reason is the model's when both are missing.
  TextTower text = TextTowerOf(f, config);
  BuildPlan text_plan;
  if (stage != Stage::kImage) {
    text_plan = PlanModel(text.features, text.config, TextProfile(profile, qwen_vl ? v.tokens : 0), options);
    if (!text_plan.buildable) return refuse("text tower: " + text_plan.reason);
    plan.layers_total = text_plan.layers_total;
    plan.layers_built = text_plan.layers_built;
    plan.weight_bytes = text_plan.weight_bytes;
    plan.activation_bytes = text_plan.activation_bytes;
    plan.flops = text_plan.flops;
    plan.notes = text.notes;
    for (const std::string& n : text_plan.notes) plan.notes.push_back("text tower (" + text_plan.family + "): " + n);
  }
  if (stage == Stage::kDecode) {
    plan.notes.push_back("decode: the text tower only (the image's tokens are already in the KV cache)");
    plan.buildable = true;
    return plan;
  }

  const json* vc = config.contains("vision_config") && config["vision_config"].is_object() ? &config["vision_config"]
                                                                                          : nullptr;
  if (!qwen_vl) {
    std::string type = vc && vc->contains("model_type") && (*vc)["model_type"].is_string()
                           ? (*vc)["model_type"].get<std::string>()
                           : std::string();
    if (type.empty() && config.contains("img_processor")) type = "img_processor (Phi-3-vision's CLIP)";
    if (type.empty()) type = f.model_type + "'s";
    return refuse("vision tower: the " + type +
                  " vision tower and its projector are not built yet (Qwen3-VL and Qwen3.5 towers are)");
  }
  if (!v.refusal.empty()) return refuse("vision tower: " + v.refusal);
  if (stage == Stage::kPrefill && v.out_hidden != text.features.hidden) {
    return refuse("vision tower: the merger's out_hidden_size " + std::to_string(v.out_hidden) +
                  " is not the text tower's hidden size " + std::to_string(text.features.hidden));
  }
  if (!f.quantization.empty()) {
    return refuse("quantized weights (" + f.quantization + ") are not built: their kernels are the quantization library's");
  }
  const double eb = ElementBytes(profile.dtype);
  const double B = double(profile.batch), N = double(v.patches), H = double(v.hidden), I = double(v.intermediate);
  const double M = H * double(v.merge * v.merge);
  plan.weight_bytes += eb * QwenVisionWeights(v);
  // The merge's own embedding table (Note [Multimodal text tower] in RunMultimodal).
  if (stage == Stage::kPrefill) plan.weight_bytes += eb * double(text.features.vocab) * double(text.features.hidden);
  // Scores in fp32 per image, a few [N, H] / [N, I] intermediates.
  plan.activation_bytes = std::max(plan.activation_bytes, 4.0 * double(v.heads) * N * N +
                                                              eb * B * N * (6.0 * H + 2.0 * I +
                                                                            double(v.channels * v.temporal * v.patch * v.patch)));
  const double runs = double(1 + DeepstackRuns(v).size());
  plan.flops += B * (2.0 * N * (4.0 * H * H + 2.0 * H * I) * double(v.built) + 4.0 * N * N * H * double(v.built) +
                     2.0 * N * double(v.channels * v.temporal * v.patch * v.patch) * H +
                     runs * 2.0 * double(v.tokens) * (M * M + M * double(v.out_hidden)));
  if (stage == Stage::kImage) {
    plan.layers_total = v.depth;
    plan.layers_built = v.built;
    plan.notes.push_back("image: the vision tower and its merger only, on " + std::to_string(profile.batch) +
                         " image(s)");
  } else {
    plan.notes.push_back("vision tower: " + std::to_string(v.built) + " of " + std::to_string(v.depth) +
                         " blocks built (blocks repeat)");
    plan.notes.push_back("prefill: " + std::to_string(profile.batch) + " sequence(s) of " +
                         std::to_string(profile.seq_len) + " text tokens and one image's " + std::to_string(v.tokens) +
                         " tokens each");
    plan.notes.push_back(
        "image features are merged (masked_scatter) before the text tower; the text tower embeds the token ids "
        "itself, so its embedding repeats the merge's and the merged embeddings do not reach it (nor, in training, "
        "its gradients the vision tower)");
    plan.notes.push_back("text tower module paths are its family's (layers.N...), without transformers' "
                         "model.language_model. prefix");
    if (!v.deepstack.empty()) {
      plan.notes.push_back(
          "deepstack: the deepstack mergers run; adding their features to the image tokens' hidden states after "
          "the first text layers (an index_put per layer) is not done");
    }
  }
  plan.notes.push_back("image: " + std::to_string(v.grid * v.patch) + "x" + std::to_string(v.grid * v.patch) +
                       " pixels, one frame repeated over temporal_patch_size " + std::to_string(v.temporal) +
                       " (the position table's " + std::to_string(v.grid) + "x" + std::to_string(v.grid) +
                       " grid; the processor resizes images dynamically)");
  if (!v.deepstack.empty() && DeepstackRuns(v).front().first != v.deepstack.front()) {
    plan.notes.push_back("deepstack merger of block " + std::to_string(v.deepstack.front()) +
                         " runs after the last built block");
  }
  if (plan.weight_bytes + plan.activation_bytes > options.max_bytes) {
    return refuse("needs about " + Gb(plan.weight_bytes + plan.activation_bytes) + " GB with the vision tower, over the " +
                  Gb(options.max_bytes) + " GB budget");
  }
  plan.buildable = true;
  return plan;
}

Status RunMultimodal(const selection::Features& f, const BuildPlan& plan, const CaptureProfile& profile,
                     ModelSession& rec, uint64_t seed) {
  if (!plan.buildable) return Status::InvalidArgument("model is not buildable: " + plan.reason);
  const Stage stage = StageOf(profile);
  const bool qwen_vl = QwenVlTypes().count(f.model_type) > 0;
  QwenVision v;
  if (qwen_vl) v = ReadQwenVision(f, plan.config, plan.layers_built);
  if (stage != Stage::kImage && qwen_vl) {
    // The vision tower builds as many blocks as the text tower.
    v.built = std::min(v.depth, plan.layers_built);
  }
  TextTower text = TextTowerOf(f, plan.config);
  BuildPlan text_plan;
  const CaptureProfile text_profile = TextProfile(profile, qwen_vl ? v.tokens : 0);
  if (stage != Stage::kImage) {
    text_plan = PlanModel(text.features, text.config, text_profile, BuildOptions{plan.layers_built, 1e300});
    if (!text_plan.buildable) return Status::InvalidArgument("text tower is not buildable: " + text_plan.reason);
  }
  if (stage == Stage::kDecode) return RunFamily(text.features, text_plan, text_profile, rec, seed);
  if (!qwen_vl || !v.refusal.empty()) return Status::InvalidArgument("vision tower is not buildable");

  try {
    at::manual_seed(seed);
    const at::ScalarType dt = ToScalarType(profile.dtype);
    const Weights W{dt, &rec};
    const int64_t B = profile.batch, H = v.hidden, heads = v.heads, hd = H / heads, N = v.patches;
    const int64_t M = H * v.merge * v.merge, C = v.channels, T = v.temporal, P = v.patch, G = v.grid, m = v.merge;
    const double eps = 1e-6;
    struct Block {
      Norm norm1, norm2;
      Linear qkv, proj, fc1, fc2;
    };
    struct Merger {
      Norm norm;
      Linear fc1, fc2;
    };
    auto linear = [&](int64_t in, int64_t out) { return Linear{W({out, in}), W({out})}; };
    auto merger = [&](bool postshuffle) {
      return Merger{MakeLayerNorm(W, postshuffle ? M : H), linear(M, M), linear(M, v.out_hidden)};
    };
    at::Tensor patch_w = W({H, C, T, P, P}), patch_b = W({H});
    at::Tensor pos_table = W({v.positions, H});
    std::vector<Block> blocks(static_cast<size_t>(v.built));
    for (Block& b : blocks) {
      b.norm1 = MakeLayerNorm(W, H);
      b.norm2 = MakeLayerNorm(W, H);
      b.qkv = linear(H, 3 * H);
      b.proj = linear(H, H);
      b.fc1 = linear(H, v.intermediate);
      b.fc2 = linear(v.intermediate, H);
    }
    Merger main_merger = merger(false);
    std::vector<Merger> deepstack;
    for (size_t i = 0; i < v.deepstack.size(); ++i) deepstack.push_back(merger(true));
    // Inputs: the processor's flattened patches [images * N, C * T * P * P].
    at::Tensor pixels = at::randn({B * N, C * T * P * P}).to(dt);
    // The bilinear interpolation's indices and weights (transformers builds
    // them as Python lists, then tensors): the grid equals the table's.
    const int64_t side = static_cast<int64_t>(std::llround(std::sqrt(static_cast<double>(v.positions))));
    at::Tensor lin = at::linspace(0, static_cast<double>(side - 1), G, at::kFloat);
    at::Tensor floor_i = lin.to(at::kInt).to(at::kLong), ceil_i = (floor_i + 1).clamp_max(side - 1);
    at::Tensor d = lin - floor_i.to(at::kFloat);
    at::Tensor idx = at::stack({(floor_i.unsqueeze(1) * side + floor_i.unsqueeze(0)).flatten(),
                                (floor_i.unsqueeze(1) * side + ceil_i.unsqueeze(0)).flatten(),
                                (ceil_i.unsqueeze(1) * side + floor_i.unsqueeze(0)).flatten(),
                                (ceil_i.unsqueeze(1) * side + ceil_i.unsqueeze(0)).flatten()})
                         .repeat({1, B});
    at::Tensor wts = at::stack({((1 - d).unsqueeze(1) * (1 - d).unsqueeze(0)).flatten(),
                                ((1 - d).unsqueeze(1) * d.unsqueeze(0)).flatten(),
                                (d.unsqueeze(1) * (1 - d).unsqueeze(0)).flatten(), (d.unsqueeze(1) * d.unsqueeze(0)).flatten()})
                         .repeat({1, B})
                         .to(dt);
    at::Tensor inv_freq = 1.0 / at::pow(10000.0, at::arange(0, hd / 2, 2, at::kFloat) / static_cast<double>(hd / 2));
    const int64_t S = text_profile.seq_len, vocab = text.features.vocab;
    int64_t image_token = ConfigInt(plan.config, "image_token_id", vocab - 1);
    if (image_token >= vocab) image_token = vocab - 1;
    at::Tensor ids;
    if (stage == Stage::kPrefill) {
      // Text tokens (never the image token), then each image's tokens after the first one.
      ids = at::randint(0, std::max<int64_t>(1, vocab - 1), {B, S}, at::kLong);
      ids = at::where(ids == image_token, at::full_like(ids, vocab - 1 == image_token ? 0 : vocab - 1), ids);
      ids.slice(1, 1, 1 + v.tokens).fill_(image_token);
    }
    at::Tensor embed = stage == Stage::kPrefill ? W({vocab, text.features.hidden}) : at::Tensor();

    at::Tensor features;
    {
      c10::InferenceMode guard(!rec.training);
      rec.Start();
      at::Tensor x;
      {
        ModuleScope s(&rec, "model.visual.patch_embed");
        x = at::conv3d(pixels.view({-1, C, T, P, P}), patch_w, patch_b, {T, P, P}).view({-1, H});
      }
      {
        ModuleScope s(&rec, "model.visual.pos_embed");
        at::Tensor pe = at::embedding(pos_table, idx) * wts.unsqueeze(-1);
        pe = pe[0] + pe[1] + pe[2] + pe[3];
        std::vector<at::Tensor> per_image;
        for (const at::Tensor& p : pe.split(N)) {
          per_image.push_back(p.repeat({1, 1}).view({1, G / m, m, G / m, m, -1}).permute({0, 1, 3, 2, 4, 5}).flatten(0, 4));
        }
        x = x + at::cat(per_image);
      }
      at::Tensor cos, sin;
      {
        ModuleScope s(&rec, "model.visual.rotary_pos_emb");
        at::Tensor table = at::outer(at::arange(G, at::kFloat), inv_freq);
        at::Tensor rows = (at::arange(G / m, at::kLong).view({-1, 1, 1, 1}) * m + at::arange(m, at::kLong).view({1, 1, -1, 1}))
                              .expand({G / m, G / m, m, m})
                              .reshape(-1);
        at::Tensor cols = (at::arange(G / m, at::kLong).view({1, -1, 1, 1}) * m + at::arange(m, at::kLong).view({1, 1, 1, -1}))
                              .expand({G / m, G / m, m, m})
                              .reshape(-1);
        at::Tensor pos_ids = at::stack({rows, cols}, -1).repeat({B, 1});
        at::Tensor rot = table.index({pos_ids}).flatten(1);
        at::Tensor emb = at::cat({rot, rot}, -1);
        cos = emb.cos();
        sin = emb.sin();
      }
      auto vision_rope = [&](const at::Tensor& t) {
        at::Tensor tf = t.to(at::kFloat);
        return (tf * cos.unsqueeze(-2) + RotateHalf(tf) * sin.unsqueeze(-2)).to(t.scalar_type());
      };
      const std::vector<std::pair<int64_t, size_t>> deepstack_runs = DeepstackRuns(v);
      auto run_merger = [&](const Merger& mg, const at::Tensor& h, bool postshuffle) {
        at::Tensor y = postshuffle ? LayerNorm(h.view({-1, M}), mg.norm, eps) : LayerNorm(h, mg.norm, eps).view({-1, M});
        return mg.fc2(at::gelu(mg.fc1(y)));
      };
      for (size_t bi = 0; bi < blocks.size(); ++bi) {
        const Block& b = blocks[bi];
        const std::string path = "model.visual.blocks." + std::to_string(bi);
        at::Tensor h;
        {
          ModuleScope s(&rec, path + ".norm1");
          h = LayerNorm(x, b.norm1, eps);
        }
        {
          ModuleScope s(&rec, path + ".attn");
          auto qkv = b.qkv(h).reshape({B * N, 3, heads, hd}).permute({1, 0, 2, 3}).unbind(0);
          at::Tensor q = vision_rope(qkv[0]).transpose(0, 1).unsqueeze(0);
          at::Tensor k = vision_rope(qkv[1]).transpose(0, 1).unsqueeze(0);
          at::Tensor val = qkv[2].transpose(0, 1).unsqueeze(0);
          // Eager attention per image (cu_seqlens): no mask, not causal.
          auto qs = q.split(N, 2), ks = k.split(N, 2), vs = val.split(N, 2);
          std::vector<at::Tensor> outs;
          for (size_t i = 0; i < qs.size(); ++i) {
            at::Tensor scores = at::matmul(qs[i], ks[i].transpose(2, 3)) * (1.0 / std::sqrt(double(hd)));
            at::Tensor probs = at::softmax(scores, -1, at::kFloat).to(dt);
            outs.push_back(at::matmul(probs, vs[i]).transpose(1, 2).contiguous());
          }
          h = b.proj(at::cat(outs, 1).reshape({B * N, -1}).contiguous());
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
          run_merger(deepstack[which], x, /*postshuffle=*/true);
        }
      }
      {
        ModuleScope s(&rec, "model.visual.merger");
        features = run_merger(main_merger, x, /*postshuffle=*/false);
      }
      if (stage == Stage::kPrefill) {
        at::Tensor inputs;
        {
          ModuleScope s(&rec, "model.language_model.embed_tokens");
          inputs = at::embedding(embed, ids);
        }
        ModuleScope s(&rec, "model");
        at::Tensor image_mask = (ids == image_token).unsqueeze(-1).expand_as(inputs);
        inputs = inputs.masked_scatter(image_mask, features.to(inputs.scalar_type()));
        features = inputs;
      }
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
