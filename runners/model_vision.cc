// The vision, conv-net and speech families of the model builder (model_builder.h).
//
// Each family reads a Spec from the features and the config.json (Read*Spec:
// the one place that decides what is built, shared by Plan and Run, so a
// plan and its run never disagree) and builds the transformers modules of
// that spec in eager ATen, with transformers' module names as paths:
//
//   vision  ViT-style towers: vit, deit, vit_msn, dinov2,
//           dinov2_with_registers, beit / data2vec-vision (absolute
//           positions only), CLIP vision towers (clip, chinese_clip, altclip,
//           metaclip_2), SigLIP vision towers (siglip). Input: `batch` images
//           of the config's image_size (refused when unknown).
//   conv    ResNet (basic and bottleneck blocks), ConvNeXt and ConvNeXt V2.
//           `max_layers` blocks of every stage, all stages. Input: the
//           config's image_size, else 224.
//   speech  wav2vec2 and HuBERT (conv feature encoder, conv positions, post-
//           or pre-norm encoder; input: profile.seq_len raw 16 kHz samples),
//           Whisper (the encoder on its fixed 3000 mel frames, the decoder
//           on the 4-token start-of-transcript prompt, cross-attending).
//
// What a build does differently from the real model, or takes from the
// config class's defaults, is in the plan's notes; anything else is refused
// with the reason.
//
// Attention runs as transformers' eager attention (matmul, softmax in fp32,
// matmul), as the decoder family's does: libtorch 1.13 has no fused
// scaled_dot_product_attention.
#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <set>

#include "runners/dtype_map.h"
#include "runners/model_builder_internal.h"

namespace coverage::runners::builder {
namespace {

// ---------------------------------------------------------------------------
// Shared pieces.

std::string ConfigString(const json& c, const char* key, const std::string& fallback) {
  auto it = c.find(key);
  return it != c.end() && it->is_string() ? it->get<std::string>() : fallback;
}

// A list of positive integers; empty when absent or when any entry is not one.
std::vector<int64_t> ConfigInts(const json& c, const char* key) {
  std::vector<int64_t> out;
  auto it = c.find(key);
  if (it == c.end() || !it->is_array() || it->size() > 4096) return {};
  for (const json& v : *it) {
    if (!v.is_number_integer() || v.get<int64_t>() <= 0 || v.get<int64_t>() > (int64_t{1} << 40)) return {};
    out.push_back(v.get<int64_t>());
  }
  return out;
}

// transformers' num_labels: the size of id2label when the config has one,
// else num_labels, else PretrainedConfig's default of 2.
int64_t NumLabels(const json& c) {
  auto it = c.find("id2label");
  if (it != c.end() && it->is_object() && !it->empty()) return static_cast<int64_t>(it->size());
  return ConfigInt(c, "num_labels", 2);
}

// hidden_act spellings transformers' ACT2FN accepts, as the names Activate knows.
std::string NormaliseAct(const std::string& a) {
  if (a == "gelu_new" || a == "gelu_pytorch_tanh" || a == "gelu_fast") return "gelu_tanh";
  if (a == "swish") return "silu";
  return a;
}

std::string Join(const std::vector<int64_t>& v) {
  std::string s;
  for (int64_t x : v) s += (s.empty() ? "" : ",") + std::to_string(x);
  return s;
}

// Refuses when the estimate is over the budget; true when it did.
bool OverBudget(BuildPlan& plan, const BuildOptions& options) {
  const double total = plan.weight_bytes + plan.activation_bytes;
  if (total <= options.max_bytes) return false;
  char buf[200];
  std::snprintf(buf, sizeof buf, "needs about %.3g GB for %lld of %lld layers, over the %.3g GB budget", total / 1e9,
                static_cast<long long>(plan.layers_built), static_cast<long long>(plan.layers_total),
                options.max_bytes / 1e9);
  plan.buildable = false;
  plan.reason = buf;
  return true;
}

// The plan keeps only the total of the blocks it built, sum(min(count, m))
// over `counts` for m = max_layers. That sum and each of its terms grow with
// m, so the smallest m reaching the total gives back every term exactly.
int64_t MaxLayersOf(const std::vector<int64_t>& counts, int64_t layers_built) {
  auto built = [&](int64_t m) {
    int64_t sum = 0;
    for (int64_t c : counts) sum += std::min(c, m);
    return sum;
  };
  const int64_t top = counts.empty() ? 1 : *std::max_element(counts.begin(), counts.end());
  int64_t m = 1;
  while (m < top && built(m) < layers_built) ++m;
  return m;
}

Linear MakeLinear(const Weights& W, int64_t in, int64_t out, bool bias = true) {
  return Linear{W({out, in}), bias ? W({out}) : at::Tensor()};
}


struct Attn {
  Linear q, k, v, o;
};

Attn MakeAttn(const Weights& W, int64_t hidden, bool q_bias, bool k_bias, bool v_bias, bool o_bias = true) {
  return Attn{MakeLinear(W, hidden, hidden, q_bias), MakeLinear(W, hidden, hidden, k_bias),
              MakeLinear(W, hidden, hidden, v_bias), MakeLinear(W, hidden, hidden, o_bias)};
}

// transformers' eager_attention_forward: scores in the model dtype, softmax
// in fp32. `kv` is `x` for self-attention; `mask` is additive or undefined.
at::Tensor Attend(const at::Tensor& x, const at::Tensor& kv, const Attn& a, int64_t heads, const at::Tensor& mask) {
  const int64_t B = x.size(0), Sq = x.size(1), Sk = kv.size(1), H = a.q.w.size(0), hd = H / heads;
  at::Tensor q = a.q(x).view({B, Sq, heads, hd}).transpose(1, 2);
  at::Tensor k = a.k(kv).view({B, Sk, heads, hd}).transpose(1, 2);
  at::Tensor v = a.v(kv).view({B, Sk, heads, hd}).transpose(1, 2);
  at::Tensor scores = at::matmul(q, k.transpose(2, 3)) * (1.0 / std::sqrt(static_cast<double>(hd)));
  if (mask.defined()) scores = scores + mask;
  at::Tensor probs = at::softmax(scores, -1, at::kFloat).to(x.scalar_type());
  return a.o(at::matmul(probs, v).transpose(1, 2).contiguous().reshape({B, Sq, H}));
}

// Note [Flops estimate]: BuildPlan::flops counts the matmuls and
// convolutions, which dominate: 2 flops per weight per position it is
// applied at, plus 4 * T_q * T_k * width for the attention scores and their
// product with V. Norms, activations and adds are left out.

// Bytes of one transformer layer's activations: a handful of [B, S, H] and
// [B, S, I] intermediates in the model dtype, fp32 scores.
double LayerActivationBytes(double eb, double B, double S, double H, double I, double heads, double T) {
  return eb * 6.0 * B * S * (H + I) + 4.0 * 2.0 * B * heads * S * T;
}

// ---------------------------------------------------------------------------
// Vision: ViT-style towers.

enum class VisionKind { kVit, kDeit, kDinov2, kBeit, kClip, kSiglip };

struct VisionSpec {
  std::string refusal;
  std::vector<std::string> notes;
  VisionKind kind = VisionKind::kVit;
  std::string head;  // "Model", "ModelWithProjection", "ForImageClassification", "ForImageClassificationWithTeacher"
  int64_t hidden = 0, layers = 0, heads = 0, intermediate = 0, image = 0, patch = 0, channels = 3;
  int64_t grid = 0, patches = 0, tokens = 0;  // tokens: the sequence the layers see
  int64_t registers = 0;                      // DINOv2 register tokens
  bool cls = true, distillation = false;
  bool patch_bias = true, q_bias = true, k_bias = true, v_bias = true;
  bool position_lookup = false;  // CLIP / SigLIP: an nn.Embedding looked up with position ids
  bool absolute_positions = true;
  bool pre_layernorm = false;  // CLIP
  bool layer_scale = false;    // DINOv2 always; BEiT when layer_scale_init_value > 0
  double layer_scale_value = 1.0;
  bool swiglu = false;        // DINOv2 use_swiglu_ffn
  bool mean_pooling = false;  // BEiT use_mean_pooling
  bool pooler = false;        // ViTModel / DeiTModel / BeitModel pooler
  int64_t pooler_size = 0;
  bool map_head = false;  // SigLIP's attention-pooling head
  int64_t labels = 0, projection = 0;
  std::string act;
  double eps = 1e-12;
};

struct VisionFamily {
  VisionKind kind;
  const char* class_prefix;  // transformers' class names: prefix + head
  double eps;                // layer_norm_eps default (data/transformers_defaults.jsonl)
  const char* act;           // hidden_act default, for a tower nested in vision_config
  // The image-classification class's prefix where it differs (CLIPForImageClassification
  // wraps a CLIPVisionTransformer); "" where the family has none of its own.
  const char* classification_prefix;
};

const std::map<std::string, VisionFamily>& VisionFamilies() {
  static const std::map<std::string, VisionFamily> families = {
      {"vit", {VisionKind::kVit, "ViT", 1e-12, "gelu", "ViT"}},
      {"vit_msn", {VisionKind::kVit, "ViTMSN", 1e-12, "gelu", "ViTMSN"}},
      {"deit", {VisionKind::kDeit, "DeiT", 1e-12, "gelu", "DeiT"}},
      {"dinov2", {VisionKind::kDinov2, "Dinov2", 1e-6, "gelu", "Dinov2"}},
      {"dinov2_with_registers", {VisionKind::kDinov2, "Dinov2WithRegisters", 1e-6, "gelu", "Dinov2WithRegisters"}},
      {"beit", {VisionKind::kBeit, "Beit", 1e-12, "gelu", "Beit"}},
      {"data2vec-vision", {VisionKind::kBeit, "Data2VecVision", 1e-12, "gelu", "Data2VecVision"}},
      {"clip", {VisionKind::kClip, "CLIPVision", 1e-5, "quick_gelu", "CLIP"}},
      {"clip_vision_model", {VisionKind::kClip, "CLIPVision", 1e-5, "quick_gelu", "CLIP"}},
      {"chinese_clip_vision_model", {VisionKind::kClip, "ChineseCLIPVision", 1e-5, "quick_gelu", ""}},
      {"altclip_vision_model", {VisionKind::kClip, "AltCLIPVision", 1e-5, "quick_gelu", ""}},
      {"metaclip_2_vision_model", {VisionKind::kClip, "MetaClip2Vision", 1e-5, "quick_gelu", ""}},
      {"siglip", {VisionKind::kSiglip, "SiglipVision", 1e-6, "gelu_tanh", "Siglip"}},
      {"siglip_vision_model", {VisionKind::kSiglip, "SiglipVision", 1e-6, "gelu_tanh", "Siglip"}},
  };
  return families;
}

// The heads each kind has in transformers.
bool KnownVisionHead(VisionKind kind, const std::string& head) {
  switch (kind) {
    case VisionKind::kVit:
    case VisionKind::kDinov2:
    case VisionKind::kBeit:
    case VisionKind::kSiglip:
      return head == "Model" || head == "ForImageClassification";
    case VisionKind::kDeit:
      return head == "Model" || head == "ForImageClassification" || head == "ForImageClassificationWithTeacher";
    case VisionKind::kClip:
      return head == "Model" || head == "ModelWithProjection" || head == "ForImageClassification";
  }
  return false;
}

VisionSpec ReadVisionSpec(const selection::Features& f, const json& config) {
  VisionSpec s;
  auto refuse = [&s](std::string why) {
    s.refusal = std::move(why);
    return s;
  };
  auto family_it = VisionFamilies().find(f.model_type);
  if (family_it == VisionFamilies().end()) {
    return refuse("vision model type '" + f.model_type +
                  "' is not built yet (ViT-style towers are: vit, vit_msn, deit, dinov2, dinov2_with_registers, beit, "
                  "data2vec-vision, CLIP and SigLIP vision models)");
  }
  const VisionFamily& fam = family_it->second;
  s.kind = fam.kind;
  // A composite config (clip, siglip) may hold the tower in vision_config.
  const bool nested = config.contains("vision_config") && config["vision_config"].is_object();
  const json& c = nested ? config["vision_config"] : config;
  const bool tower = f.hidden == 0 && f.vision.hidden > 0;
  s.hidden = tower ? f.vision.hidden : f.hidden;
  s.layers = tower ? f.vision.layers : f.layers;
  s.heads = tower ? f.vision.heads : f.heads;
  s.intermediate = tower ? f.vision.intermediate : f.intermediate;
  s.image = tower ? f.vision.image_size : f.image_size;
  s.patch = tower ? f.vision.patch_size : f.patch_size;
  if (s.image == 0) s.image = ConfigInt(c, "image_size", ConfigInt(c, "img_size", 0));
  if (s.patch == 0) s.patch = ConfigInt(c, "patch_size", 0);
  s.channels = ConfigInt(c, "num_channels", ConfigInt(c, "in_chans", 3));
  s.act = NormaliseAct(nested ? ConfigString(c, "hidden_act", fam.act) : f.activation);
  s.eps = ConfigNumber(c, "layer_norm_eps", fam.eps);

  // The head: transformers' class is prefix + head; another class of a known
  // model type is custom code, built as the family's bare model.
  const std::string prefix = fam.class_prefix, classification_prefix = fam.classification_prefix;
  std::string head = f.head;
  const std::string& arch = f.architecture;
  if (arch.empty()) {
    head = "Model";
    s.notes.push_back("config names no architecture: built as " + prefix + "Model");
  } else if (arch.rfind(prefix, 0) == 0 && KnownVisionHead(s.kind, arch.substr(prefix.size()))) {
    head = arch.substr(prefix.size());
  } else if (!classification_prefix.empty() && arch == classification_prefix + "ForImageClassification") {
    head = "ForImageClassification";
  } else if (arch.rfind(prefix, 0) == 0 ||
             (!classification_prefix.empty() && arch.rfind(classification_prefix, 0) == 0)) {
    return refuse("head " + arch + " is not built (" + prefix + "Model and its image-classification heads are)");
  } else {
    head = "Model";
    s.notes.push_back("architecture " + arch + " is not a transformers class (custom code" +
                      std::string(config.contains("auto_map") ? ", auto_map" : "") + "): built as " + prefix +
                      "Model of the same config");
  }
  s.head = head;

  if (s.hidden <= 0 || s.layers <= 0 || s.heads <= 0) return refuse("hidden size, layers or heads unknown");
  if (s.hidden % s.heads != 0) return refuse("hidden size is not a multiple of the attention heads");
  if (s.image <= 0) {
    return refuse("image size unknown (the config has no image_size): the patch grid and position table depend on it");
  }
  if (s.patch <= 0) return refuse("patch size unknown");
  if (s.image % s.patch != 0) return refuse("image_size is not a multiple of patch_size");
  if (!KnownActivation(s.act)) return refuse("activation '" + s.act + "' is not built");
  if (!f.quantization.empty()) return refuse("quantized weights (" + f.quantization + ") are not built");
  s.grid = s.image / s.patch;
  s.patches = s.grid * s.grid;
  s.labels = NumLabels(config);

  switch (s.kind) {
    case VisionKind::kVit:
    case VisionKind::kDeit: {
      s.distillation = s.kind == VisionKind::kDeit;
      s.q_bias = s.k_bias = s.v_bias = ConfigBool(c, "qkv_bias", true);
      // ViTModel and DeiTModel add their pooler by default; ViTMSNModel has none.
      s.pooler = s.head == "Model" && f.model_type != "vit_msn";
      s.pooler_size = ConfigInt(c, "pooler_output_size", s.hidden);
      const std::string pooler_act = ConfigString(c, "pooler_act", "tanh");
      if (s.pooler && pooler_act != "tanh") return refuse("pooler activation '" + pooler_act + "' is not built");
      break;
    }
    case VisionKind::kDinov2: {
      s.q_bias = s.k_bias = s.v_bias = ConfigBool(c, "qkv_bias", true);
      s.layer_scale = true;  // Dinov2LayerScale is always there (layerscale_value, default 1.0)
      s.layer_scale_value = ConfigNumber(c, "layerscale_value", 1.0);
      s.swiglu = ConfigBool(c, "use_swiglu_ffn", false);
      const double ratio = ConfigNumber(c, "mlp_ratio", 4.0);
      s.intermediate = static_cast<int64_t>(static_cast<double>(s.hidden) * ratio);
      // Dinov2SwiGLUFFN: two thirds of the width, rounded up to a multiple of 8.
      if (s.swiglu)
        s.intermediate = (static_cast<int64_t>(static_cast<double>(s.intermediate) * 2.0 / 3.0) + 7) / 8 * 8;
      if (f.model_type == "dinov2_with_registers") s.registers = ConfigInt(c, "num_register_tokens", 4);
      break;
    }
    case VisionKind::kBeit: {
      if (ConfigBool(c, "use_relative_position_bias", false) ||
          ConfigBool(c, "use_shared_relative_position_bias", false)) {
        return refuse("BEiT relative position bias is not built yet (absolute positions are)");
      }
      s.absolute_positions = ConfigBool(c, "use_absolute_position_embeddings", false);
      s.k_bias = false;  // BeitSelfAttention: the key projection has no bias
      s.layer_scale_value = ConfigNumber(c, "layer_scale_init_value", 0.1);
      s.layer_scale = s.layer_scale_value > 0;
      s.mean_pooling = ConfigBool(c, "use_mean_pooling", true);
      s.pooler = true;  // BeitModel's pooler runs for both heads
      break;
    }
    case VisionKind::kClip: {
      s.patch_bias = false;
      s.position_lookup = true;
      s.pre_layernorm = true;
      if (s.head == "ModelWithProjection") s.projection = ConfigInt(c, "projection_dim", 512);
      break;
    }
    case VisionKind::kSiglip: {
      s.cls = false;
      s.position_lookup = true;
      s.map_head = ConfigBool(c, "vision_use_head", true);
      break;
    }
  }
  if (s.intermediate <= 0) return refuse("intermediate size unknown");
  s.tokens = s.patches + (s.cls ? 1 : 0) + (s.distillation ? 1 : 0) + s.registers;
  return s;
}

}  // namespace

BuildPlan PlanVision(const selection::Features& f, const json& config, const CaptureProfile& profile,
                     const BuildOptions& options) {
  BuildPlan plan;
  plan.family = "vision";
  auto refuse = [&plan](std::string why) {
    plan.reason = std::move(why);
    return plan;
  };
  const VisionSpec s = ReadVisionSpec(f, config);
  if (!s.refusal.empty()) return refuse(s.refusal);
  if (profile.past_len > 0) return refuse("a decode profile (KV cache) does not apply to vision models");
  plan.notes = s.notes;
  plan.notes.push_back("input: " + std::to_string(profile.batch) + " image(s) of " + std::to_string(s.channels) + "x" +
                       std::to_string(s.image) + "x" + std::to_string(s.image) +
                       " (the config's image_size; the profile's seq_len is not used)");
  if (s.kind == VisionKind::kSiglip && s.map_head) {
    plan.notes.push_back(
        "the attention-pooling head's nn.MultiheadAttention runs as its eager composition "
        "(linear, bmm, softmax, bmm)");
  }
  plan.layers_total = s.layers;
  plan.layers_built = std::min(s.layers, std::max<int64_t>(1, options.max_layers));
  const double eb = ElementBytes(profile.dtype);
  const double H = double(s.hidden), I = double(s.intermediate), T = double(s.tokens), B = double(profile.batch);
  const double mlp = s.swiglu ? 3.0 * H * I : 2.0 * H * I;
  const double per_layer = 4.0 * H * H + mlp;
  const double embed = double(s.channels) * double(s.patch * s.patch) * H + T * H;
  const double head = 4.0 * H * H + H * double(std::max(s.labels, s.projection)) * 2.0;
  plan.weight_bytes = eb * (embed + per_layer * double(plan.layers_built) + head);
  plan.activation_bytes = eb * B * double(s.channels) * double(s.image * s.image) +
                          LayerActivationBytes(eb, B, T, H, I, double(s.heads), T);
  // See Note [Flops estimate].
  const double L = double(plan.layers_built);
  plan.flops = 2.0 * B * T * per_layer * L + 4.0 * B * T * T * H * L +
               2.0 * B * double(s.patches) * double(s.channels * s.patch * s.patch) * H +
               2.0 * B * H * double(std::max({s.labels, s.projection, s.hidden}));
  if (OverBudget(plan, options)) return plan;
  plan.buildable = true;
  return plan;
}

Status RunVision(const selection::Features& f, const BuildPlan& plan, const CaptureProfile& profile, ModelSession& rec,
                 uint64_t seed) {
  if (!plan.buildable) return Status::InvalidArgument("model is not buildable: " + plan.reason);
  const VisionSpec s = ReadVisionSpec(f, plan.config);
  if (!s.refusal.empty()) return Status::InvalidArgument("model is not buildable: " + s.refusal);
  try {
    at::manual_seed(seed);
    const at::ScalarType dt = ToScalarType(profile.dtype);
    const Weights W{dt, &rec};
    const int64_t B = profile.batch, H = s.hidden, I = s.intermediate, C = s.channels;
    const int64_t prefix_tokens = s.tokens - s.patches - s.registers;  // class and distillation tokens
    const bool dino = s.kind == VisionKind::kDinov2, clip = s.kind == VisionKind::kClip;
    const bool siglip = s.kind == VisionKind::kSiglip, beit = s.kind == VisionKind::kBeit;

    struct Layer {
      Norm ln1, ln2;
      Attn attn;
      Linear fc1, fc2;
      at::Tensor lambda1, lambda2;
    };
    // Weights and inputs are made before recording starts.
    at::Tensor patch_w = W({H, C, s.patch, s.patch}), patch_b = s.patch_bias ? W({H}) : at::Tensor();
    at::Tensor cls = s.cls ? (clip ? W({H}) : W({1, 1, H})) : at::Tensor();
    at::Tensor dist = s.distillation ? W({1, 1, H}) : at::Tensor();
    at::Tensor registers = s.registers > 0 ? W({1, s.registers, H}) : at::Tensor();
    const int64_t positioned = s.patches + prefix_tokens;  // registers have no position
    at::Tensor pos =
        s.absolute_positions ? (s.position_lookup ? W({positioned, H}) : W({1, positioned, H})) : at::Tensor();
    at::Tensor position_ids = at::arange(positioned, at::kLong).unsqueeze(0);
    Norm pre_ln = MakeLayerNorm(W, H), final_ln = MakeLayerNorm(W, H);
    std::vector<Layer> layers(static_cast<size_t>(plan.layers_built));
    for (Layer& l : layers) {
      l.ln1 = MakeLayerNorm(W, H);
      l.ln2 = MakeLayerNorm(W, H);
      l.attn = MakeAttn(W, H, s.q_bias, s.k_bias, s.v_bias);
      l.fc1 = MakeLinear(W, H, s.swiglu ? 2 * I : I);
      l.fc2 = MakeLinear(W, I, H);
      if (s.layer_scale) l.lambda1 = W.Ones({H}) * s.layer_scale_value, l.lambda2 = W.Ones({H}) * s.layer_scale_value;
    }
    Linear pooler, mha_in, mha_out, head_fc1, head_fc2, classifier, distillation_classifier, projection;
    at::Tensor probe;
    Norm head_ln;
    if (s.pooler && !beit) pooler = MakeLinear(W, H, s.pooler_size);
    if (s.map_head) {
      // SigLIP's head: a probe token attends over the sequence through
      // nn.MultiheadAttention (one packed in-projection of 3H).
      probe = W({1, 1, H});
      mha_in = MakeLinear(W, H, 3 * H);
      mha_out = MakeLinear(W, H, H);
      head_ln = MakeLayerNorm(W, H);
      head_fc1 = MakeLinear(W, H, I);
      head_fc2 = MakeLinear(W, I, H);
    }
    if (s.head == "ForImageClassification" || s.head == "ForImageClassificationWithTeacher") {
      classifier = MakeLinear(W, dino ? 2 * H : H, s.labels);  // DINOv2: class token and mean patch token
      if (s.distillation) distillation_classifier = MakeLinear(W, H, s.labels);
    }
    if (s.projection > 0) projection = MakeLinear(W, H, s.projection, /*bias=*/false);
    at::Tensor pixels = at::randn({B, C, s.image, s.image}).to(dt);

    c10::InferenceMode guard(!rec.training);
    rec.Start();
    const std::string layer_path = clip || siglip ? "encoder.layers." : "encoder.layer.";
    at::Tensor x;
    {
      ModuleScope scope(&rec, "embeddings.patch_embeddings");
      x = at::conv2d(pixels, patch_w, patch_b, {s.patch, s.patch}).flatten(2).transpose(1, 2);
    }
    {
      ModuleScope scope(&rec, "embeddings");
      std::vector<at::Tensor> parts;
      if (s.cls) parts.push_back(clip ? cls.expand({B, 1, -1}) : cls.expand({B, -1, -1}));
      if (s.distillation) parts.push_back(dist.expand({B, -1, -1}));
      if (!parts.empty()) {
        parts.push_back(x);
        x = at::cat(parts, 1);
      }
      if (s.absolute_positions) x = s.position_lookup ? x + at::embedding(pos, position_ids) : x + pos;
      if (s.registers > 0) {
        // Dinov2WithRegisters: registers go between the class token and the patches, after positions.
        x = at::cat({x.slice(1, 0, 1), registers.expand({B, -1, -1}), x.slice(1, 1)}, 1);
      }
    }
    if (s.pre_layernorm) {
      ModuleScope scope(&rec, "pre_layrnorm");  // transformers' spelling
      x = LayerNorm(x, pre_ln, s.eps);
    }
    for (size_t li = 0; li < layers.size(); ++li) {
      const Layer& l = layers[li];
      const std::string path = layer_path + std::to_string(li);
      const bool split_mlp = !(dino || clip || siglip);  // ViT / DeiT / BEiT: intermediate + output modules
      at::Tensor h;
      {
        ModuleScope scope(&rec, path + (dino ? ".norm1" : clip || siglip ? ".layer_norm1" : ".layernorm_before"));
        h = LayerNorm(x, l.ln1, s.eps);
      }
      {
        ModuleScope scope(&rec, path + (clip || siglip ? ".self_attn" : ".attention"));
        h = Attend(h, h, l.attn, s.heads, at::Tensor());
      }
      if (s.layer_scale) {
        ModuleScope scope(&rec, dino ? path + ".layer_scale1" : path);  // BEiT: the layer's lambda_1
        h = h * l.lambda1;
      }
      {
        ModuleScope scope(&rec, path);
        x = x + h;
      }
      {
        ModuleScope scope(&rec, path + (dino ? ".norm2" : clip || siglip ? ".layer_norm2" : ".layernorm_after"));
        h = LayerNorm(x, l.ln2, s.eps);
      }
      if (split_mlp) {
        {
          ModuleScope scope(&rec, path + ".intermediate");
          h = Activate(l.fc1(h), s.act);
        }
        ModuleScope scope(&rec, path + ".output");
        h = l.fc2(h);
      } else {
        ModuleScope scope(&rec, path + ".mlp");
        if (s.swiglu) {
          auto halves = l.fc1(h).chunk(2, -1);
          h = l.fc2(at::silu(halves[0]) * halves[1]);
        } else {
          h = l.fc2(Activate(l.fc1(h), s.act));
        }
      }
      if (s.layer_scale) {
        ModuleScope scope(&rec, dino ? path + ".layer_scale2" : path);  // BEiT: the layer's lambda_2
        h = h * l.lambda2;
      }
      ModuleScope scope(&rec, path);
      x = x + h;
    }
    // Final norm and head, per family.
    if (clip) {
      at::Tensor pooled;
      {
        ModuleScope scope(&rec, "post_layernorm");  // on the class token only
        pooled = LayerNorm(x.select(1, 0), final_ln, s.eps);
      }
      if (s.projection > 0) {
        ModuleScope scope(&rec, "visual_projection");
        pooled = projection(pooled);
      }
      if (s.head == "ForImageClassification") {
        // CLIPForImageClassification: the mean of the patch tokens, before post_layernorm.
        ModuleScope scope(&rec, "classifier");
        x = classifier(x.slice(1, 1).mean(1));
      }
    } else if (siglip) {
      {
        ModuleScope scope(&rec, "post_layernorm");
        x = LayerNorm(x, final_ln, s.eps);
      }
      if (s.map_head) {
        // torch.nn.functional.multi_head_attention_forward with need_weights
        // (the default): key is value, query is not, so the in-projection is
        // split into q and packed kv; bmm attention; head-averaged weights.
        ModuleScope scope(&rec, "head");
        const int64_t hd = H / s.heads, T = x.size(1);
        at::Tensor q_in = probe.repeat({B, 1, 1}).transpose(0, 1);  // [1, B, H]
        at::Tensor kv_in = x.transpose(0, 1);                       // [T, B, H]
        auto w = mha_in.w.split_with_sizes({H, 2 * H});
        auto b = mha_in.b.split_with_sizes({H, 2 * H});
        at::Tensor q = at::linear(q_in, w[0], b[0]);
        at::Tensor kv =
            at::linear(kv_in, w[1], b[1]).unflatten(-1, {2, H}).unsqueeze(0).transpose(0, -2).squeeze(-2).contiguous();
        at::Tensor k = kv[0], v = kv[1];
        q = q.view({1, B * s.heads, hd}).transpose(0, 1);
        k = k.view({T, B * s.heads, hd}).transpose(0, 1);
        v = v.view({T, B * s.heads, hd}).transpose(0, 1);
        at::Tensor weights = at::softmax(at::bmm(q * std::sqrt(1.0 / double(hd)), k.transpose(-2, -1)), -1);
        at::Tensor out = at::bmm(weights, v).transpose(0, 1).contiguous().view({B, H});  // tgt_len 1
        out = mha_out(out).view({1, B, H}).transpose(1, 0);                              // batch_first
        weights = weights.view({B, s.heads, 1, T}).mean(1);                              // average_attn_weights
        at::Tensor residual = out;
        out = residual + head_fc2(Activate(head_fc1(LayerNorm(out, head_ln, s.eps)), s.act));
        out = out.select(1, 0);
      }
      if (s.head == "ForImageClassification") {
        ModuleScope scope(&rec, "classifier");
        x = classifier(x.mean(1));
      }
    } else {
      if (!s.mean_pooling) {
        ModuleScope scope(&rec, "layernorm");
        x = LayerNorm(x, final_ln, s.eps);
      }
      at::Tensor pooled;
      if (beit) {
        ModuleScope scope(&rec, "pooler");
        pooled = s.mean_pooling ? LayerNorm(x.slice(1, 1).mean(1), final_ln, s.eps) : x.select(1, 0);
      } else if (s.pooler) {
        ModuleScope scope(&rec, "pooler");
        pooled = at::tanh(pooler(x.select(1, 0)));
      }
      if (s.head == "ForImageClassification") {
        ModuleScope scope(&rec, "classifier");
        if (dino) {
          at::Tensor patch_tokens = x.slice(1, 1 + s.registers);
          x = classifier(at::cat({x.select(1, 0), patch_tokens.mean(1)}, 1));
        } else {
          x = classifier(beit ? pooled : x.select(1, 0));
        }
      } else if (s.head == "ForImageClassificationWithTeacher") {
        at::Tensor a, b;
        {
          ModuleScope scope(&rec, "cls_classifier");
          a = classifier(x.select(1, 0));
        }
        {
          ModuleScope scope(&rec, "distillation_classifier");
          b = distillation_classifier(x.select(1, 1));
        }
        x = (a + b) / 2;
      }
    }
    rec.Stop();
    return Status::Ok();
  } catch (const std::exception& e) {
    rec.Stop();
    return Status::Internal(std::string("building or running the model failed: ") + e.what());
  }
}

// ---------------------------------------------------------------------------
// Conv: ResNet and ConvNeXt.

namespace {

enum class ConvKind { kResNet, kConvNext, kConvNextV2 };

struct ConvSpec {
  std::string refusal;
  std::vector<std::string> notes;
  ConvKind kind = ConvKind::kResNet;
  std::string head;  // "Model" or "ForImageClassification"
  int64_t channels = 3, image = 224, stem = 64, patch = 4;
  bool image_from_config = true;
  std::vector<int64_t> depths, widths, built;
  bool bottleneck = true, downsample_first = false, downsample_in_bottleneck = false;
  std::string act;
  double eps = 1e-12, layer_scale = 1e-6;
  int64_t labels = 0;
};

// Default stage layouts of the config classes (data/transformers_defaults.jsonl),
// for configs that leave them out as transformers allows.
struct ConvFamily {
  ConvKind kind;
  const char* class_prefix;
  std::vector<int64_t> depths, widths;
};

const std::map<std::string, ConvFamily>& ConvFamilies() {
  static const std::map<std::string, ConvFamily> families = {
      {"resnet", {ConvKind::kResNet, "ResNet", {3, 4, 6, 3}, {256, 512, 1024, 2048}}},
      {"convnext", {ConvKind::kConvNext, "ConvNext", {3, 3, 9, 3}, {96, 192, 384, 768}}},
      {"convnextv2", {ConvKind::kConvNextV2, "ConvNextV2", {3, 3, 9, 3}, {96, 192, 384, 768}}},
  };
  return families;
}

ConvSpec ReadConvSpec(const selection::Features& f, const json& c, int64_t max_layers) {
  ConvSpec s;
  auto refuse = [&s](std::string why) {
    s.refusal = std::move(why);
    return s;
  };
  auto it = ConvFamilies().find(f.model_type);
  if (it == ConvFamilies().end()) {
    return refuse("conv model type '" + f.model_type + "' is not built yet (resnet, convnext and convnextv2 are)");
  }
  const ConvFamily& fam = it->second;
  s.kind = fam.kind;
  const std::string prefix = fam.class_prefix;
  if (f.architecture.empty()) {
    s.head = "Model";
    s.notes.push_back("config names no architecture: built as " + prefix + "Model");
  } else if (f.architecture == prefix + "Model" || f.architecture == prefix + "ForImageClassification") {
    s.head = f.architecture.substr(prefix.size());
  } else {
    return refuse("head " + f.architecture + " is not built (" + prefix + "Model and " + prefix +
                  "ForImageClassification are)");
  }
  s.depths = ConfigInts(c, "depths");
  if (s.depths.empty()) {
    s.depths = fam.depths;
    s.notes.push_back("depths from the " + prefix + "Config defaults (" + Join(s.depths) + ")");
  }
  s.widths = f.conv_widths.empty() ? fam.widths : f.conv_widths;
  if (s.widths.size() != s.depths.size()) {
    return refuse("hidden_sizes and depths have different lengths (" + std::to_string(s.widths.size()) + " and " +
                  std::to_string(s.depths.size()) + ")");
  }
  if (s.depths.size() > 16) return refuse("more than 16 stages");
  for (int64_t d : s.depths) s.built.push_back(std::min(d, std::max<int64_t>(1, max_layers)));
  s.channels = ConfigInt(c, "num_channels", 3);
  s.act = NormaliseAct(ConfigString(c, "hidden_act", f.activation.empty() ? "relu" : f.activation));
  if (!KnownActivation(s.act)) return refuse("activation '" + s.act + "' is not built");
  if (const int64_t image = ConfigInt(c, "image_size", 0); image > 0) {
    s.image = image;
  } else {
    // 224: the ImageNet resolution these families are defined and trained at.
    s.image = 224;
    s.image_from_config = false;
  }
  s.labels = NumLabels(c);
  if (s.kind == ConvKind::kResNet) {
    const std::string layer_type = ConfigString(c, "layer_type", "bottleneck");
    if (layer_type != "bottleneck" && layer_type != "basic") {
      return refuse("ResNet layer_type '" + layer_type + "' is not built (basic and bottleneck are)");
    }
    s.bottleneck = layer_type == "bottleneck";
    s.stem = ConfigInt(c, "embedding_size", 64);
    s.downsample_first = ConfigBool(c, "downsample_in_first_stage", false);
    s.downsample_in_bottleneck = ConfigBool(c, "downsample_in_bottleneck", false);
    for (int64_t w : s.widths) {
      if (s.bottleneck && w < 4) return refuse("bottleneck widths must be at least 4 (reduction 4)");
    }
    if (s.image < 32) return refuse("image_size below 32 leaves nothing after the stem and stage strides");
  } else {
    s.patch = ConfigInt(c, "patch_size", 4);
    s.eps = ConfigNumber(c, "layer_norm_eps", 1e-12);
    s.layer_scale = s.kind == ConvKind::kConvNext ? ConfigNumber(c, "layer_scale_init_value", 1e-6) : 0.0;
    int64_t size = s.image / s.patch;
    for (size_t i = 1; i < s.depths.size(); ++i) size /= 2;
    if (size < 1) return refuse("image_size too small for the patch and stage strides");
  }
  return s;
}

struct BatchNorm {
  at::Tensor w, b, mean, var;
};

BatchNorm MakeBatchNorm(const Weights& W, int64_t c) {
  // Running variance near one and positive; every tensor from the session (meta-safe).
  return BatchNorm{W.Ones({c}), W.Zeros({c}), W({c}), W.Ones({c}) + W({c}).square()};
}

at::Tensor ApplyBatchNorm(const at::Tensor& x, const BatchNorm& n) {
  return at::batch_norm(x, n.w, n.b, n.mean, n.var, /*training=*/false, 0.1, 1e-5, /*cudnn_enabled=*/true);
}

// transformers' ResNetConvLayer: conv (no bias, same padding), batch norm, activation.
struct ConvBn {
  at::Tensor w;
  BatchNorm bn;
  int64_t stride = 1;
  bool act = true;
};

ConvBn MakeConvBn(const Weights& W, int64_t in, int64_t out, int64_t k, int64_t stride, bool act = true) {
  return ConvBn{W({out, in, k, k}), MakeBatchNorm(W, out), stride, act};
}

at::Tensor ApplyConvBn(const at::Tensor& x, const ConvBn& l, const std::string& act) {
  const int64_t k = l.w.size(-1);
  at::Tensor y = ApplyBatchNorm(at::conv2d(x, l.w, {}, {l.stride, l.stride}, {k / 2, k / 2}), l.bn);
  return l.act ? Activate(y, act) : y;
}

}  // namespace

BuildPlan PlanConv(const selection::Features& f, const json& config, const CaptureProfile& profile,
                   const BuildOptions& options) {
  BuildPlan plan;
  plan.family = "conv";
  auto refuse = [&plan](std::string why) {
    plan.reason = std::move(why);
    return plan;
  };
  const ConvSpec s = ReadConvSpec(f, config, options.max_layers);
  if (!s.refusal.empty()) return refuse(s.refusal);
  if (profile.past_len > 0) return refuse("a decode profile (KV cache) does not apply to conv nets");
  plan.notes = s.notes;
  plan.notes.push_back("input: " + std::to_string(profile.batch) + " image(s) of " + std::to_string(s.channels) + "x" +
                       std::to_string(s.image) + "x" + std::to_string(s.image) +
                       (s.image_from_config ? std::string(" (the config's image_size")
                                            : std::string(" (224: the config names no image_size; it is the "
                                                          "ImageNet size the family is defined at")) +
                       "; the profile's seq_len is not used)");
  plan.notes.push_back("blocks built per stage: " + Join(s.built) + " of " + Join(s.depths) +
                       " (a stage's blocks after its first all have one shape)");
  for (int64_t d : s.depths) plan.layers_total += d;
  for (int64_t d : s.built) plan.layers_built += d;
  // Weights of the built blocks; activations: a few copies of the largest feature map.
  const double eb = ElementBytes(profile.dtype), B = double(profile.batch);
  double weights = 0, largest = 0, flops = 0;  // See Note [Flops estimate].
  auto feature_map = [&](double ch, double side) { largest = std::max(largest, B * ch * side * side); };
  double side = double(s.image);
  if (s.kind == ConvKind::kResNet) {
    weights += double(s.channels * s.stem * 49);
    side /= 2;
    flops += 2.0 * B * side * side * double(s.channels * s.stem * 49);
    feature_map(double(s.stem), side);
    side /= 2;
    int64_t in = s.stem;
    for (size_t i = 0; i < s.depths.size(); ++i) {
      const double w = double(s.widths[i]), mid = s.bottleneck ? w / 4 : w;
      if (i > 0 || s.downsample_first) side = std::ceil(side / 2);
      for (int64_t b = 0; b < s.built[i]; ++b) {
        const double cin = b == 0 ? double(in) : w;
        double block = s.bottleneck ? cin * mid + 9 * mid * mid + mid * w : 9 * cin * w + 9 * w * w;
        if (b == 0) block += cin * w;  // shortcut
        weights += block;
        flops += 2.0 * B * side * side * block;  // at the stage's output size
      }
      feature_map(w, side);
      in = s.widths[i];
    }
  } else {
    side = std::floor(side / double(s.patch));
    weights += double(s.channels * s.patch * s.patch * s.widths[0]);
    flops += 2.0 * B * side * side * double(s.channels * s.patch * s.patch * s.widths[0]);
    for (size_t i = 0; i < s.depths.size(); ++i) {
      const double w = double(s.widths[i]);
      if (i > 0) {
        side = std::floor(side / 2);
        weights += 4 * double(s.widths[i - 1]) * w;
        flops += 2.0 * B * side * side * 4 * double(s.widths[i - 1]) * w;
      }
      weights += double(s.built[i]) * (49 * w + 8 * w * w);
      flops += 2.0 * B * side * side * double(s.built[i]) * (49 * w + 8 * w * w);
      feature_map(4 * w, side);  // the MLP's expanded width
    }
  }
  weights += double(s.widths.back()) * double(s.labels);
  flops += 2.0 * B * double(s.widths.back()) * double(s.labels);
  plan.weight_bytes = eb * weights;
  plan.flops = flops;
  plan.activation_bytes = eb * (B * double(s.channels) * double(s.image * s.image) + 4.0 * largest);
  if (OverBudget(plan, options)) return plan;
  plan.buildable = true;
  return plan;
}

Status RunConv(const selection::Features& f, const BuildPlan& plan, const CaptureProfile& profile, ModelSession& rec,
               uint64_t seed) {
  if (!plan.buildable) return Status::InvalidArgument("model is not buildable: " + plan.reason);
  const int64_t per_stage = MaxLayersOf(ReadConvSpec(f, plan.config, 1).depths, plan.layers_built);
  const ConvSpec s = ReadConvSpec(f, plan.config, per_stage);
  if (!s.refusal.empty()) return Status::InvalidArgument("model is not buildable: " + s.refusal);
  try {
    at::manual_seed(seed);
    const at::ScalarType dt = ToScalarType(profile.dtype);
    const Weights W{dt, &rec};
    const int64_t B = profile.batch;
    at::Tensor pixels = at::randn({B, s.channels, s.image, s.image}).to(dt);
    Linear classifier = MakeLinear(W, s.widths.back(), s.labels);

    if (s.kind == ConvKind::kResNet) {
      struct Block {
        ConvBn shortcut, a, b, c;
        bool has_shortcut = false;
      };
      ConvBn stem = MakeConvBn(W, s.channels, s.stem, 7, 2);
      std::vector<std::vector<Block>> stages(s.depths.size());
      int64_t in = s.stem;
      for (size_t i = 0; i < stages.size(); ++i) {
        const int64_t out = s.widths[i];
        const int64_t stage_stride = i == 0 && !s.downsample_first ? 1 : 2;
        for (int64_t bi = 0; bi < s.built[i]; ++bi) {
          const int64_t cin = bi == 0 ? in : out, stride = bi == 0 ? stage_stride : 1;
          Block b;
          b.has_shortcut = cin != out || stride != 1;
          if (b.has_shortcut) b.shortcut = MakeConvBn(W, cin, out, 1, stride, /*act=*/false);
          if (s.bottleneck) {
            const int64_t mid = out / 4;
            b.a = MakeConvBn(W, cin, mid, 1, s.downsample_in_bottleneck ? stride : 1);
            b.b = MakeConvBn(W, mid, mid, 3, s.downsample_in_bottleneck ? 1 : stride);
            b.c = MakeConvBn(W, mid, out, 1, 1, /*act=*/false);
          } else {
            b.a = MakeConvBn(W, cin, out, 3, stride);
            b.b = MakeConvBn(W, out, out, 3, 1, /*act=*/false);
          }
          stages[i].push_back(std::move(b));
        }
        in = out;
      }

      c10::InferenceMode guard(!rec.training);
      rec.Start();
      at::Tensor x;
      {
        ModuleScope scope(&rec, "embedder");
        x = ApplyConvBn(pixels, stem, s.act);
        x = at::max_pool2d(x, {3, 3}, {2, 2}, {1, 1});
      }
      for (size_t i = 0; i < stages.size(); ++i) {
        for (size_t bi = 0; bi < stages[i].size(); ++bi) {
          const Block& b = stages[i][bi];
          ModuleScope scope(&rec, "encoder.stages." + std::to_string(i) + ".layers." + std::to_string(bi));
          // As transformers' layers: the main path, then the shortcut, added in place.
          at::Tensor h = ApplyConvBn(ApplyConvBn(x, b.a, s.act), b.b, s.act);
          if (s.bottleneck) h = ApplyConvBn(h, b.c, s.act);
          h.add_(b.has_shortcut ? ApplyConvBn(x, b.shortcut, s.act) : x);
          x = Activate(h, s.act);
        }
      }
      {
        ModuleScope scope(&rec, "pooler");
        x = at::adaptive_avg_pool2d(x, {1, 1});
      }
      if (s.head == "ForImageClassification") {
        ModuleScope scope(&rec, "classifier");
        x = classifier(x.flatten(1));
      }
      rec.Stop();
      return Status::Ok();
    }

    // ConvNeXt (V2).
    struct Block {
      at::Tensor dw_w, dw_b, gamma, grn_w, grn_b;
      Norm ln;
      Linear pw1, pw2;
    };
    struct Stage {
      Norm down_ln;
      at::Tensor down_w, down_b;
      std::vector<Block> blocks;
    };
    const bool v2 = s.kind == ConvKind::kConvNextV2;
    at::Tensor patch_w = W({s.widths[0], s.channels, s.patch, s.patch}), patch_b = W({s.widths[0]});
    Norm embed_ln = MakeLayerNorm(W, s.widths[0]), final_ln = MakeLayerNorm(W, s.widths.back());
    std::vector<Stage> stages(s.depths.size());
    for (size_t i = 0; i < stages.size(); ++i) {
      const int64_t in = i == 0 ? s.widths[0] : s.widths[i - 1], out = s.widths[i];
      if (i > 0) {
        stages[i].down_ln = MakeLayerNorm(W, in);
        stages[i].down_w = W({out, in, 2, 2});
        stages[i].down_b = W({out});
      }
      for (int64_t bi = 0; bi < s.built[i]; ++bi) {
        Block b;
        b.dw_w = W({out, 1, 7, 7});
        b.dw_b = W({out});
        b.ln = MakeLayerNorm(W, out);
        b.pw1 = MakeLinear(W, out, 4 * out);
        b.pw2 = MakeLinear(W, 4 * out, out);
        if (s.layer_scale > 0) b.gamma = W.Ones({out}) * s.layer_scale;
        if (v2) b.grn_w = W({1, 1, 1, 4 * out}), b.grn_b = W({1, 1, 1, 4 * out});
        stages[i].blocks.push_back(std::move(b));
      }
    }
    // transformers' ConvNextLayerNorm for channels_first: the mean and
    // variance over the channel dimension, written out.
    auto channels_first_norm = [](const at::Tensor& x, const Norm& n) {
      at::Tensor u = x.mean({1}, /*keepdim=*/true);
      at::Tensor v = (x - u).pow(2).mean({1}, /*keepdim=*/true);
      at::Tensor y = (x - u) / at::sqrt(v + 1e-6);
      return n.weight.unsqueeze(-1).unsqueeze(-1) * y + n.bias.unsqueeze(-1).unsqueeze(-1);
    };

    c10::InferenceMode guard(!rec.training);
    rec.Start();
    at::Tensor x;
    {
      ModuleScope scope(&rec, "embeddings");
      x = at::conv2d(pixels, patch_w, patch_b, {s.patch, s.patch});
      x = channels_first_norm(x, embed_ln);
    }
    for (size_t i = 0; i < stages.size(); ++i) {
      const Stage& st = stages[i];
      const std::string path = "encoder.stages." + std::to_string(i);
      if (i > 0) {
        ModuleScope scope(&rec, path + ".downsampling_layer");
        x = at::conv2d(channels_first_norm(x, st.down_ln), st.down_w, st.down_b, {2, 2});
      }
      for (size_t bi = 0; bi < st.blocks.size(); ++bi) {
        const Block& b = st.blocks[bi];
        ModuleScope scope(&rec, path + ".layers." + std::to_string(bi));
        const int64_t ch = x.size(1);
        at::Tensor h = at::conv2d(x, b.dw_w, b.dw_b, {1, 1}, {3, 3}, {1, 1}, ch).permute({0, 2, 3, 1});
        h = Activate(b.pw1(at::layer_norm(h, {ch}, b.ln.weight, b.ln.bias, 1e-6)), s.act);
        if (v2) {
          // ConvNextV2GRN: global response normalisation over the spatial dims.
          at::Tensor g = at::linalg_vector_norm(h, 2, at::IntArrayRef{1, 2}, /*keepdim=*/true);
          at::Tensor n = g / (g.mean({-1}, /*keepdim=*/true) + 1e-6);
          h = b.grn_w * (h * n) + b.grn_b + h;
        }
        h = b.pw2(h);
        if (b.gamma.defined()) h = b.gamma * h;
        x = x + h.permute({0, 3, 1, 2});
      }
    }
    {
      ModuleScope scope(&rec, "layernorm");
      x = at::layer_norm(x.mean({-2, -1}), {x.size(1)}, final_ln.weight, final_ln.bias, s.eps);
    }
    if (s.head == "ForImageClassification") {
      ModuleScope scope(&rec, "classifier");
      x = classifier(x);
    }
    rec.Stop();
    return Status::Ok();
  } catch (const std::exception& e) {
    rec.Stop();
    return Status::Internal(std::string("building or running the model failed: ") + e.what());
  }
}

// ---------------------------------------------------------------------------
// Speech: wav2vec2 / HuBERT and Whisper.

namespace {

enum class SpeechKind { kWav2Vec2, kWhisper };

// Whisper's decoder prompt: <|startoftranscript|> <|lang|> <|transcribe|> <|notimestamps|>.
constexpr int64_t kWhisperPromptTokens = 4;

struct SpeechSpec {
  std::string refusal;
  std::vector<std::string> notes;
  SpeechKind kind = SpeechKind::kWav2Vec2;
  std::string head;
  int64_t hidden = 0, heads = 0, intermediate = 0, layers = 0, vocab = 0, labels = 0, classifier_proj = 256;
  std::string act;
  double eps = 1e-5;
  // wav2vec2 / HuBERT
  std::vector<int64_t> conv_dim, conv_kernel, conv_stride;
  bool conv_bias = false, group_norm = true, stable = false, proj_norm = true, pos_batch_norm = false;
  std::string feat_act;
  int64_t pos_kernel = 128, pos_groups = 16, samples = 0, frames = 0, largest_conv = 0;
  // Whisper
  int64_t mel_bins = 80, source_positions = 1500, target_positions = 448, mel_frames = 3000;
  int64_t enc_layers = 0, enc_heads = 0, enc_ffn = 0, dec_tokens = 0;
};

SpeechSpec ReadSpeechSpec(const selection::Features& f, const json& c, const CaptureProfile& profile) {
  SpeechSpec s;
  auto refuse = [&s](std::string why) {
    s.refusal = std::move(why);
    return s;
  };
  const std::string& type = f.model_type;
  std::string prefix;
  std::set<std::string> heads;
  if (type == "wav2vec2" || type == "hubert") {
    s.kind = SpeechKind::kWav2Vec2;
    prefix = type == "wav2vec2" ? "Wav2Vec2" : "Hubert";
    heads = {"Model", "ForCTC", "ForSequenceClassification"};
  } else if (type == "whisper") {
    s.kind = SpeechKind::kWhisper;
    prefix = "Whisper";
    heads = {"Model", "ForConditionalGeneration", "ForAudioClassification"};
  } else {
    return refuse("speech model type '" + type + "' is not built yet (wav2vec2, hubert and whisper are)");
  }
  if (f.architecture.empty()) {
    s.head = "Model";
    s.notes.push_back("config names no architecture: built as " + prefix + "Model");
  } else if (f.architecture.rfind(prefix, 0) == 0 && heads.count(f.architecture.substr(prefix.size()))) {
    s.head = f.architecture.substr(prefix.size());
  } else {
    std::string list;
    for (const auto& h : heads) list += (list.empty() ? "" : ", ") + prefix + h;
    return refuse("head " + f.architecture + " is not built (" + list + " are)");
  }
  if (!f.quantization.empty()) return refuse("quantized weights (" + f.quantization + ") are not built");
  if (profile.past_len > 0) return refuse("decode profiles (a KV cache) are not built for speech models");
  s.act = NormaliseAct(f.activation);
  if (!KnownActivation(s.act)) return refuse("activation '" + s.act + "' is not built");
  s.labels = NumLabels(c);
  s.classifier_proj = ConfigInt(c, "classifier_proj_size", 256);
  s.vocab = f.vocab;
  if ((s.head == "ForSequenceClassification" || s.head == "ForAudioClassification") &&
      ConfigBool(c, "use_weighted_layer_sum", false)) {
    return refuse("use_weighted_layer_sum (a weighted sum of every layer's output) is not built");
  }

  if (s.kind == SpeechKind::kWav2Vec2) {
    s.hidden = f.hidden, s.heads = f.heads, s.intermediate = f.intermediate, s.layers = f.layers;
    if (s.hidden <= 0 || s.heads <= 0 || s.layers <= 0 || s.intermediate <= 0) {
      return refuse("hidden size, layers, heads or intermediate size unknown");
    }
    if (s.hidden % s.heads != 0) return refuse("hidden size is not a multiple of the attention heads");
    if (ConfigBool(c, "add_adapter", false)) return refuse("the adapter after the encoder (add_adapter) is not built");
    // Missing lists take Wav2Vec2Config's / HubertConfig's defaults, as transformers does.
    s.conv_dim = f.conv_widths;
    s.conv_kernel = ConfigInts(c, "conv_kernel");
    s.conv_stride = ConfigInts(c, "conv_stride");
    if (s.conv_dim.empty()) s.conv_dim = {512, 512, 512, 512, 512, 512, 512};
    if (s.conv_kernel.empty()) s.conv_kernel = {10, 3, 3, 3, 3, 2, 2};
    if (s.conv_stride.empty()) s.conv_stride = {5, 2, 2, 2, 2, 2, 2};
    if (s.conv_dim.size() != s.conv_kernel.size() || s.conv_dim.size() != s.conv_stride.size()) {
      return refuse("conv_dim, conv_kernel and conv_stride have different lengths");
    }
    if (s.conv_dim.size() > 32) return refuse("more than 32 feature-encoder conv layers");
    s.conv_bias = ConfigBool(c, "conv_bias", false);
    const std::string norm = ConfigString(c, "feat_extract_norm", "group");
    if (norm != "group" && norm != "layer") {
      return refuse("feat_extract_norm '" + norm + "' is not built (group and layer are)");
    }
    s.group_norm = norm == "group";
    s.feat_act = NormaliseAct(ConfigString(c, "feat_extract_activation", "gelu"));
    if (!KnownActivation(s.feat_act)) return refuse("feature-encoder activation '" + s.feat_act + "' is not built");
    s.stable = ConfigBool(c, "do_stable_layer_norm", false);
    s.proj_norm = type == "wav2vec2" || ConfigBool(c, "feat_proj_layer_norm", true);
    s.pos_batch_norm = type == "hubert" && ConfigBool(c, "conv_pos_batch_norm", false);
    s.pos_kernel = ConfigInt(c, "num_conv_pos_embeddings", 128);
    s.pos_groups = ConfigInt(c, "num_conv_pos_embedding_groups", 16);
    if (s.hidden % s.pos_groups != 0) return refuse("hidden size is not a multiple of the positional conv groups");
    s.eps = ConfigNumber(c, "layer_norm_eps", 1e-5);
    if (s.head == "ForCTC" && s.vocab <= 0) return refuse("CTC head without a vocabulary size");
    // The audio: profile.seq_len raw samples at 16 kHz (a token profile's 512
    // is 32 ms of audio; still a valid input).
    s.samples = profile.seq_len;
    int64_t length = s.samples;
    for (size_t i = 0; i < s.conv_dim.size(); ++i) {
      length = length >= s.conv_kernel[i] ? (length - s.conv_kernel[i]) / s.conv_stride[i] + 1 : 0;
      s.largest_conv = std::max(s.largest_conv, s.conv_dim[i] * length);
    }
    s.frames = length;
    if (s.frames < 1) {
      int64_t need = 1;
      for (size_t i = s.conv_dim.size(); i-- > 0;) need = (need - 1) * s.conv_stride[i] + s.conv_kernel[i];
      return refuse("the profile's " + std::to_string(s.samples) + " audio samples are fewer than the " +
                    std::to_string(need) + " the feature encoder needs for one frame");
    }
    s.notes.push_back("input: " + std::to_string(s.samples) + " raw 16 kHz samples per item (the profile's seq_len; " +
                      std::to_string(s.frames) + " frame(s) after the feature encoder)");
    return s;
  }

  // Whisper: `features.hidden/heads/layers/intermediate` are the decoder's; the encoder is the audio tower.
  s.hidden = f.hidden, s.heads = f.heads, s.layers = f.layers, s.intermediate = f.intermediate;
  s.enc_layers = f.audio.layers > 0 ? f.audio.layers : f.encoder_layers;
  s.enc_heads = f.audio.heads > 0 ? f.audio.heads : ConfigInt(c, "encoder_attention_heads", 0);
  s.enc_ffn = f.audio.intermediate > 0 ? f.audio.intermediate : ConfigInt(c, "encoder_ffn_dim", 0);
  s.mel_bins = f.audio.mel_bins > 0 ? f.audio.mel_bins : ConfigInt(c, "num_mel_bins", 80);
  if (s.hidden <= 0 || s.enc_layers <= 0 || s.enc_heads <= 0 || s.enc_ffn <= 0) {
    return refuse("encoder width, layers, heads or feed-forward size unknown");
  }
  if (s.head != "ForAudioClassification" && (s.layers <= 0 || s.heads <= 0 || s.intermediate <= 0 || s.vocab <= 0)) {
    return refuse("decoder layers, heads, feed-forward or vocabulary size unknown");
  }
  if (s.hidden % s.enc_heads != 0 || (s.heads > 0 && s.hidden % s.heads != 0)) {
    return refuse("d_model is not a multiple of the attention heads");
  }
  // WhisperConfig's defaults: 1500 source positions (3000 mel frames after
  // the stride-2 conv), 448 target positions.
  s.source_positions = ConfigInt(c, "max_source_positions", 1500);
  s.target_positions = ConfigInt(c, "max_target_positions", 448);
  s.mel_frames = 2 * s.source_positions;
  if (ConfigBool(c, "scale_embedding", false)) {
    return refuse("scale_embedding: true is not built (every released Whisper checkpoint sets false)");
  }
  s.dec_tokens = std::min(kWhisperPromptTokens, s.target_positions);
  s.notes.push_back("input: " + std::to_string(s.mel_frames) + " log-mel frames of " + std::to_string(s.mel_bins) +
                    " bins per item (Whisper's fixed input, 2 x max_source_positions: 30 s of audio); the profile's "
                    "seq_len is not used");
  if (s.head != "ForAudioClassification") {
    s.notes.push_back("decoder: one step over the " + std::to_string(s.dec_tokens) +
                      "-token start-of-transcript prompt (no KV cache), cross-attending to the encoder");
  }
  return s;
}

}  // namespace

BuildPlan PlanSpeech(const selection::Features& f, const json& config, const CaptureProfile& profile,
                     const BuildOptions& options) {
  BuildPlan plan;
  plan.family = "speech";
  auto refuse = [&plan](std::string why) {
    plan.reason = std::move(why);
    return plan;
  };
  const SpeechSpec s = ReadSpeechSpec(f, config, profile);
  if (!s.refusal.empty()) return refuse(s.refusal);
  plan.notes = s.notes;
  const int64_t max_layers = std::max<int64_t>(1, options.max_layers);
  const double eb = ElementBytes(profile.dtype), B = double(profile.batch), H = double(s.hidden);
  if (s.kind == SpeechKind::kWav2Vec2) {
    plan.layers_total = s.layers;
    plan.layers_built = std::min(s.layers, max_layers);
    double conv = 0, conv_flops = 0, in = 1;
    int64_t length = s.samples;
    for (size_t i = 0; i < s.conv_dim.size(); ++i) {
      length = (length - s.conv_kernel[i]) / s.conv_stride[i] + 1;  // positive: ReadSpeechSpec checked
      conv += in * double(s.conv_dim[i] * s.conv_kernel[i]);
      conv_flops += 2.0 * B * double(length) * in * double(s.conv_dim[i] * s.conv_kernel[i]);
      in = double(s.conv_dim[i]);
    }
    const double I = double(s.intermediate), T = double(s.frames);
    const double per_layer = 4.0 * H * H + 2.0 * H * I;
    const double head = H * double(std::max({s.vocab, s.classifier_proj, s.labels}));
    plan.weight_bytes = eb * (conv + in * H + H * H / double(s.pos_groups) * double(s.pos_kernel) +
                              per_layer * double(plan.layers_built) + head);
    plan.activation_bytes = eb * (B * double(s.samples) + 3.0 * B * double(s.largest_conv)) +
                            LayerActivationBytes(eb, B, T, H, I, double(s.heads), T);
    // See Note [Flops estimate].
    const double L = double(plan.layers_built);
    plan.flops = conv_flops + 2.0 * B * T * (in * H + H * H / double(s.pos_groups) * double(s.pos_kernel) + head) +
                 2.0 * B * T * per_layer * L + 4.0 * B * T * T * H * L;
  } else {
    const bool decoder = s.head != "ForAudioClassification";
    const int64_t enc_built = std::min(s.enc_layers, max_layers),
                  dec_built = decoder ? std::min(s.layers, max_layers) : 0;
    plan.layers_total = s.enc_layers + (decoder ? s.layers : 0);
    plan.layers_built = enc_built + dec_built;
    plan.notes.push_back(
        "encoder layers built: " + std::to_string(enc_built) + " of " + std::to_string(s.enc_layers) +
        (decoder ? "; decoder layers built: " + std::to_string(dec_built) + " of " + std::to_string(s.layers)
                 : std::string("; the decoder is not part of this head")));
    const double E = double(s.enc_ffn), D = double(s.intermediate), S = double(s.source_positions);
    const double mel = double(s.mel_bins), T = double(s.dec_tokens), V = double(s.vocab);
    const double encoder = 3.0 * mel * H + 3.0 * H * H + S * H + double(enc_built) * (4.0 * H * H + 2.0 * H * E);
    const double dec = decoder
                           ? V * H + double(s.target_positions) * H + double(dec_built) * (8.0 * H * H + 2.0 * H * D)
                           : H * double(s.classifier_proj + s.labels);
    plan.weight_bytes = eb * (encoder + dec);
    plan.activation_bytes =
        eb * (B * mel * double(s.mel_frames) + 3.0 * B * H * double(s.mel_frames)) +
        LayerActivationBytes(eb, B, S, H, E, double(s.enc_heads), S) +
        (decoder ? LayerActivationBytes(eb, B, T, H, D, double(s.heads), S) + 4.0 * B * T * V : 0.0);
    // See Note [Flops estimate]. A decoder layer: self-attention and the cross
    // q / out projections on the prompt, cross k / v on the encoder output.
    plan.flops = 2.0 * B * (2.0 * S) * mel * H * 3.0 + 2.0 * B * S * H * H * 3.0 +
                 double(enc_built) * (2.0 * B * S * (4.0 * H * H + 2.0 * H * E) + 4.0 * B * S * S * H);
    if (decoder) {
      plan.flops += double(dec_built) *
                    (2.0 * B * T * (6.0 * H * H + 2.0 * H * D) + 2.0 * B * S * 2.0 * H * H + 4.0 * B * T * (T + S) * H);
      if (s.head == "ForConditionalGeneration") plan.flops += 2.0 * B * T * H * V;
    } else {
      plan.flops += 2.0 * B * S * H * double(s.classifier_proj) + 2.0 * B * double(s.classifier_proj * s.labels);
    }
  }
  if (OverBudget(plan, options)) return plan;
  plan.buildable = true;
  return plan;
}

Status RunSpeech(const selection::Features& f, const BuildPlan& plan, const CaptureProfile& profile, ModelSession& rec,
                 uint64_t seed) {
  if (!plan.buildable) return Status::InvalidArgument("model is not buildable: " + plan.reason);
  const SpeechSpec s = ReadSpeechSpec(f, plan.config, profile);
  if (!s.refusal.empty()) return Status::InvalidArgument("model is not buildable: " + s.refusal);
  try {
    at::manual_seed(seed);
    const at::ScalarType dt = ToScalarType(profile.dtype);
    const Weights W{dt, &rec};
    const int64_t B = profile.batch, H = s.hidden;

    if (s.kind == SpeechKind::kWav2Vec2) {
      struct ConvLayer {
        at::Tensor w, b;
        Norm norm;  // group norm on the first layer, or layer norm on each
      };
      struct Layer {
        Norm ln, final_ln;
        Attn attn;
        Linear fc1, fc2;
      };
      std::vector<ConvLayer> convs(s.conv_dim.size());
      int64_t in = 1;
      for (size_t i = 0; i < convs.size(); ++i) {
        convs[i].w = W({s.conv_dim[i], in, s.conv_kernel[i]});
        if (s.conv_bias) convs[i].b = W({s.conv_dim[i]});
        if (!s.group_norm || i == 0) convs[i].norm = MakeLayerNorm(W, s.conv_dim[i]);
        in = s.conv_dim[i];
      }
      Norm proj_ln = MakeLayerNorm(W, in), enc_ln = MakeLayerNorm(W, H);
      Linear proj = MakeLinear(W, in, H);
      // Weight-normed positional conv (parametrizations.weight_norm, dim=2):
      // the weight is recomputed from g and v on every forward.
      at::Tensor pos_v = W({H, H / s.pos_groups, s.pos_kernel}), pos_g = W.Ones({1, 1, s.pos_kernel}), pos_b = W({H});
      BatchNorm pos_bn = MakeBatchNorm(W, H);
      std::vector<Layer> layers(static_cast<size_t>(plan.layers_built));
      for (Layer& l : layers) {
        l.ln = MakeLayerNorm(W, H);
        l.final_ln = MakeLayerNorm(W, H);
        l.attn = MakeAttn(W, H, true, true, true);
        l.fc1 = MakeLinear(W, H, s.intermediate);
        l.fc2 = MakeLinear(W, s.intermediate, H);
      }
      Linear lm_head = MakeLinear(W, H, std::max<int64_t>(1, s.vocab));
      Linear projector = MakeLinear(W, H, s.classifier_proj), classifier = MakeLinear(W, s.classifier_proj, s.labels);
      at::Tensor audio = at::randn({B, s.samples}).to(dt);

      c10::InferenceMode guard(!rec.training);
      rec.Start();
      at::Tensor x;
      {
        ModuleScope scope(&rec, "feature_extractor", "other");  // only the reshape; conv_layers.N are the stem
        x = audio.unsqueeze(1);
      }
      for (size_t i = 0; i < convs.size(); ++i) {
        ModuleScope scope(&rec, "feature_extractor.conv_layers." + std::to_string(i));
        const ConvLayer& l = convs[i];
        x = at::conv1d(x, l.w, l.b, {s.conv_stride[i]});
        if (s.group_norm && i == 0) {
          x = at::group_norm(x, s.conv_dim[0], l.norm.weight, l.norm.bias, 1e-5);
        } else if (!s.group_norm) {
          x = LayerNorm(x.transpose(-2, -1), l.norm, 1e-5).transpose(-2, -1);
        }
        x = Activate(x, s.feat_act);
      }
      x = x.transpose(1, 2);
      {
        ModuleScope scope(&rec, "feature_projection");
        if (s.proj_norm) x = LayerNorm(x, proj_ln, s.eps);
        x = proj(x);
      }
      {
        ModuleScope scope(&rec, "encoder.pos_conv_embed");
        at::Tensor h = x.transpose(1, 2);
        at::Tensor w;
        if (s.pos_batch_norm) {
          h = ApplyBatchNorm(h, pos_bn);
          w = pos_v;
        } else {
          w = at::_weight_norm(pos_v, pos_g, 2);
        }
        h = at::conv1d(h, w, pos_b, {1}, {s.pos_kernel / 2}, {1}, s.pos_groups);
        if (s.pos_kernel % 2 == 0) h = h.slice(2, 0, h.size(2) - 1);  // Wav2Vec2SamePadLayer
        x = x + Activate(h, s.feat_act).transpose(1, 2);
      }
      if (!s.stable) {
        ModuleScope scope(&rec, "encoder.layer_norm");
        x = LayerNorm(x, enc_ln, s.eps);
      }
      for (size_t li = 0; li < layers.size(); ++li) {
        const Layer& l = layers[li];
        const std::string path = "encoder.layers." + std::to_string(li);
        at::Tensor residual = x, h = x;
        if (s.stable) {
          ModuleScope scope(&rec, path + ".layer_norm");
          h = LayerNorm(h, l.ln, s.eps);
        }
        {
          ModuleScope scope(&rec, path + ".attention");
          h = Attend(h, h, l.attn, s.heads, at::Tensor());
        }
        x = residual + h;
        if (s.stable) {
          at::Tensor m;
          {
            ModuleScope scope(&rec, path + ".final_layer_norm");
            m = LayerNorm(x, l.final_ln, s.eps);
          }
          ModuleScope scope(&rec, path + ".feed_forward");
          x = x + l.fc2(Activate(l.fc1(m), s.act));
        } else {
          {
            ModuleScope scope(&rec, path + ".layer_norm");
            x = LayerNorm(x, l.ln, s.eps);
          }
          {
            ModuleScope scope(&rec, path + ".feed_forward");
            x = x + l.fc2(Activate(l.fc1(x), s.act));
          }
          ModuleScope scope(&rec, path + ".final_layer_norm");
          x = LayerNorm(x, l.final_ln, s.eps);
        }
      }
      if (s.stable) {
        ModuleScope scope(&rec, "encoder.layer_norm");
        x = LayerNorm(x, enc_ln, s.eps);
      }
      if (s.head == "ForCTC") {
        ModuleScope scope(&rec, "lm_head");
        x = lm_head(x);
      } else if (s.head == "ForSequenceClassification") {
        {
          ModuleScope scope(&rec, "projector");
          x = projector(x).mean(1);
        }
        ModuleScope scope(&rec, "classifier");
        x = classifier(x);
      }
      rec.Stop();
      return Status::Ok();
    }

    // Whisper.
    struct Layer {
      Norm ln1, ln_cross, ln2;
      Attn self_attn, cross_attn;
      Linear fc1, fc2;
    };
    const bool decoder = s.head != "ForAudioClassification";
    const int64_t max_layers = MaxLayersOf(
        decoder ? std::vector<int64_t>{s.enc_layers, s.layers} : std::vector<int64_t>{s.enc_layers}, plan.layers_built);
    const int64_t enc_built = std::min(s.enc_layers, max_layers);
    const int64_t dec_built = decoder ? std::min(s.layers, max_layers) : 0;
    at::Tensor conv1_w = W({H, s.mel_bins, 3}), conv1_b = W({H}), conv2_w = W({H, H, 3}), conv2_b = W({H});
    at::Tensor enc_pos = W({s.source_positions, H}), all_positions = at::arange(s.source_positions, at::kLong);
    auto make_layer = [&](int64_t ffn, bool cross) {
      Layer l;
      l.ln1 = MakeLayerNorm(W, H);
      l.ln2 = MakeLayerNorm(W, H);
      l.self_attn = MakeAttn(W, H, true, /*k_bias=*/false, true);  // WhisperAttention: k_proj has no bias
      if (cross) l.ln_cross = MakeLayerNorm(W, H), l.cross_attn = MakeAttn(W, H, true, false, true);
      l.fc1 = MakeLinear(W, H, ffn);
      l.fc2 = MakeLinear(W, ffn, H);
      return l;
    };
    std::vector<Layer> enc(static_cast<size_t>(enc_built)), dec;
    for (Layer& l : enc) l = make_layer(s.enc_ffn, false);
    for (int64_t i = 0; i < dec_built; ++i) dec.push_back(make_layer(s.intermediate, true));
    Norm enc_ln = MakeLayerNorm(W, H), dec_ln = MakeLayerNorm(W, H);
    at::Tensor embed = decoder ? W({s.vocab, H}) : at::Tensor(),
               dec_pos = decoder ? W({s.target_positions, H}) : at::Tensor();
    Linear projector = MakeLinear(W, H, s.classifier_proj), classifier = MakeLinear(W, s.classifier_proj, s.labels);
    at::Tensor features = at::randn({B, s.mel_bins, s.mel_frames}).to(dt);
    at::Tensor ids = decoder ? at::randint(0, s.vocab, {B, s.dec_tokens}, at::kLong) : at::Tensor();
    at::Tensor dec_position_ids = at::arange(s.dec_tokens, at::kLong).unsqueeze(0).repeat({B, 1});

    c10::InferenceMode guard(!rec.training);
    rec.Start();
    at::Tensor x;
    {
      ModuleScope scope(&rec, "encoder.conv1");
      x = at::gelu(at::conv1d(features, conv1_w, conv1_b, {1}, {1}));
    }
    {
      ModuleScope scope(&rec, "encoder.conv2");
      x = at::gelu(at::conv1d(x, conv2_w, conv2_b, {2}, {1})).permute({0, 2, 1});
    }
    {
      ModuleScope scope(&rec, "encoder.embed_positions");
      x = x + at::embedding(enc_pos, all_positions);
    }
    auto run_layer = [&](at::Tensor h, const Layer& l, const std::string& path, const at::Tensor& mask,
                         const at::Tensor& memory, int64_t heads) {
      at::Tensor a;
      {
        ModuleScope scope(&rec, path + ".self_attn_layer_norm");
        a = LayerNorm(h, l.ln1, 1e-5);
      }
      {
        ModuleScope scope(&rec, path + ".self_attn");
        h = h + Attend(a, a, l.self_attn, heads, mask);
      }
      if (memory.defined()) {
        {
          ModuleScope scope(&rec, path + ".encoder_attn_layer_norm");
          a = LayerNorm(h, l.ln_cross, 1e-5);
        }
        ModuleScope scope(&rec, path + ".encoder_attn");
        h = h + Attend(a, memory, l.cross_attn, heads, at::Tensor());
      }
      {
        ModuleScope scope(&rec, path + ".final_layer_norm");
        a = LayerNorm(h, l.ln2, 1e-5);
      }
      {
        ModuleScope scope(&rec, path + ".fc1");
        a = Activate(l.fc1(a), s.act);
      }
      ModuleScope scope(&rec, path + ".fc2");
      return h + l.fc2(a);
    };
    for (size_t li = 0; li < enc.size(); ++li) {
      x = run_layer(x, enc[li], "encoder.layers." + std::to_string(li), at::Tensor(), at::Tensor(), s.enc_heads);
    }
    {
      ModuleScope scope(&rec, "encoder.layer_norm");
      x = LayerNorm(x, enc_ln, 1e-5);
    }
    if (!decoder) {
      {
        ModuleScope scope(&rec, "projector");
        x = projector(x).mean(1);
      }
      ModuleScope scope(&rec, "classifier");
      x = classifier(x);
      rec.Stop();
      return Status::Ok();
    }
    at::Tensor y;
    {
      ModuleScope scope(&rec, "decoder.embed_tokens");
      y = at::embedding(embed, ids);
    }
    {
      // WhisperPositionalEmbedding with position ids: weight[position_ids].
      ModuleScope scope(&rec, "decoder.embed_positions");
      y = y + dec_pos.index({dec_position_ids});
    }
    at::Tensor mask;
    {
      ModuleScope scope(&rec, "causal_mask");
      const int64_t T = s.dec_tokens;
      mask = at::full({T, T}, Lowest(dt), at::TensorOptions().dtype(dt)).triu(1).unsqueeze(0).unsqueeze(0);
    }
    for (size_t li = 0; li < dec.size(); ++li) {
      y = run_layer(y, dec[li], "decoder.layers." + std::to_string(li), mask, x, s.heads);
    }
    {
      ModuleScope scope(&rec, "decoder.layer_norm");
      y = LayerNorm(y, dec_ln, 1e-5);
    }
    if (s.head == "ForConditionalGeneration") {
      ModuleScope scope(&rec, "proj_out");  // tied to the token embedding
      y = at::linear(y, embed);
    }
    rec.Stop();
    return Status::Ok();
  } catch (const std::exception& e) {
    rec.Stop();
    return Status::Internal(std::string("building or running the model failed: ") + e.what());
  }
}

}  // namespace coverage::runners::builder
