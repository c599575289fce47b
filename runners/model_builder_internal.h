// Shared by the model builder's families (model_builder.cc dispatches to
// them): config reading, weights, norms, activations, attention pieces.
// Internal to runners; includes ATen.
#pragma once

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "runners/model_builder.h"
#include "runners/model_session.h"

namespace coverage::runners::builder {

using nlohmann::json;

inline bool ConfigBool(const json& c, const char* key, bool fallback) {
  auto it = c.find(key);
  return it != c.end() && it->is_boolean() ? it->get<bool>() : fallback;
}

inline double ConfigNumber(const json& c, const char* key, double fallback) {
  auto it = c.find(key);
  return it != c.end() && it->is_number() ? it->get<double>() : fallback;
}

inline int64_t ConfigInt(const json& c, const char* key, int64_t fallback) {
  auto it = c.find(key);
  if (it == c.end() || !it->is_number_integer()) return fallback;
  const int64_t v = it->get<int64_t>();
  return v > 0 && v <= (int64_t{1} << 40) ? v : fallback;
}

inline bool KnownActivation(const std::string& a) {
  return a == "silu" || a == "gelu" || a == "gelu_tanh" || a == "relu" || a == "quick_gelu" || a == "relu2";
}

inline at::Tensor Activate(const at::Tensor& x, const std::string& a) {
  if (a == "silu") return at::silu(x);
  if (a == "gelu") return at::gelu(x);
  if (a == "gelu_tanh") return at::gelu(x, "tanh");
  if (a == "relu") return at::relu(x);
  if (a == "quick_gelu") return x * at::sigmoid(x * 1.702);
  return at::relu(x).square();  // relu2
}

inline double ElementBytes(DType d) { return d == DType::kFloat32 ? 4 : d == DType::kFloat64 ? 8 : 2; }

// Weights come from the session (model_session.h): random N(0, 0.02^2),
// ones or zeros, in `dtype`, made once per training session.
struct Weights {
  at::ScalarType dtype;
  ModelSession* session;
  at::Tensor operator()(at::IntArrayRef shape) const { return session->Weight(WeightInit::kRandom, shape, dtype); }
  at::Tensor Ones(at::IntArrayRef shape) const { return session->Weight(WeightInit::kOnes, shape, dtype); }
  at::Tensor Zeros(at::IntArrayRef shape) const { return session->Weight(WeightInit::kZeros, shape, dtype); }
};

// Sets the session's module path for the lifetime of the scope (see
// ModelSession::EnterModule / ExitModule).
class ModuleScope {
 public:
  // `kind` overrides the kind the path's name implies (Note [Module kinds]),
  // for modules whose Hugging Face name does not say, e.g. Nemotron-H's "mixer".
  ModuleScope(ModelSession* session, std::string path, const std::string& kind = "")
      : session_(session), previous_(session->module_path()), path_(std::move(path)) {
    session_->EnterModule(path_, kind);
  }
  ~ModuleScope() {
    session_->ExitModule(path_);
    session_->SetModulePath(std::move(previous_));
  }
  ModuleScope(const ModuleScope&) = delete;
  ModuleScope& operator=(const ModuleScope&) = delete;

 private:
  ModelSession* session_;
  std::string previous_;
  std::string path_;
};

struct Norm {
  at::Tensor weight, bias;
};

inline at::Tensor ApplyNorm(const at::Tensor& x, const Norm& n, bool rms, double eps) {
  if (!rms) return at::layer_norm(x, {x.size(-1)}, n.weight, n.bias, eps);
  // Hugging Face RMSNorm: computes in fp32, scales in the model dtype.
  at::Tensor h = x.to(at::kFloat);
  h = h * at::rsqrt(h.pow(2).mean({-1}, /*keepdim=*/true) + eps);
  return n.weight * h.to(x.scalar_type());
}

inline at::Tensor RotateHalf(const at::Tensor& x) {
  const int64_t half = x.size(-1) / 2;
  return at::cat({x.slice(-1, half).neg(), x.slice(-1, 0, half)}, -1);
}

inline double Lowest(at::ScalarType dt) {
  return dt == at::kBFloat16 ? -3.3895313892515355e38
         : dt == at::kHalf   ? -65504.0
                             : static_cast<double>(std::numeric_limits<float>::lowest());
}

// ALiBi slopes of BLOOM / MPT for `heads` heads.
inline at::Tensor AlibiSlopes(int64_t heads) {
  const int64_t closest = int64_t{1} << static_cast<int>(std::floor(std::log2(static_cast<double>(heads))));
  std::vector<float> slopes;
  const double base = std::pow(2.0, -std::pow(2.0, -(std::log2(static_cast<double>(closest)) - 3)));
  for (int64_t i = 1; i <= closest; ++i) slopes.push_back(static_cast<float>(std::pow(base, static_cast<double>(i))));
  if (closest < heads) {
    const double extra = std::pow(2.0, -std::pow(2.0, -(std::log2(static_cast<double>(2 * closest)) - 3)));
    for (int64_t i = 0; i < heads - closest; ++i) {
      slopes.push_back(static_cast<float>(std::pow(extra, static_cast<double>(1 + 2 * i))));
    }
  }
  return at::tensor(slopes);
}


// A linear layer's weight [out, in] and optional bias.
struct Linear {
  at::Tensor w, b;
  at::Tensor operator()(const at::Tensor& x) const { return at::linear(x, w, b); }
};

inline Norm MakeLayerNorm(const Weights& W, int64_t n) { return Norm{W.Ones({n}), W.Zeros({n})}; }

inline at::Tensor LayerNorm(const at::Tensor& x, const Norm& n, double eps) {
  return ApplyNorm(x, n, /*rms=*/false, eps);
}

// Note [Quantized checkpoints]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A quantized checkpoint (quantization_config: fp8, mxfp4, compressed-tensors,
// modelopt, ...) is built as its dense model in the profile's dtype, with
// this note in the plan: the architecture's ops run, the quantization
// library's kernels (which are that library's, not ATen's) do not.
inline std::string QuantizationNote(const std::string& method, DType dtype) {
  const char* word = dtype == DType::kFloat32   ? "float32"
                     : dtype == DType::kFloat64 ? "float64"
                     : dtype == DType::kFloat16 ? "float16"
                     : dtype == DType::kBFloat16 ? "bfloat16"
                                                 : "its dtype";
  return "quantization (" + method + ") not built: weights dense in " + word +
         ", the quantization library's kernels are not exercised";
}

// Each family: Plan* fills a plan for features of its structure (never
// fails; sets buildable and reason), Run* runs a buildable plan.
#define COVERAGE_BUILDER_FAMILY(Name)                                                                       \
  BuildPlan Plan##Name(const selection::Features& f, const json& config, const CaptureProfile& profile,     \
                       const BuildOptions& options);                                                        \
  Status Run##Name(const selection::Features& f, const BuildPlan& plan, const CaptureProfile& profile,      \
                   ModelSession& rec, uint64_t seed);
COVERAGE_BUILDER_FAMILY(Decoder)         // model_decoder.cc: structure "decoder"
COVERAGE_BUILDER_FAMILY(Encoder)         // model_encoder.cc: structure "encoder"
COVERAGE_BUILDER_FAMILY(EncoderDecoder)  // model_encoder.cc: structure "encoder-decoder"
COVERAGE_BUILDER_FAMILY(Vision)          // model_vision.cc: structure "vision" (ViT-style towers)
COVERAGE_BUILDER_FAMILY(Conv)            // model_vision.cc: structure "conv" (ResNet, ConvNeXt)
COVERAGE_BUILDER_FAMILY(Speech)          // model_vision.cc: structure "speech" (wav2vec2, Whisper)
COVERAGE_BUILDER_FAMILY(Hybrid)          // model_hybrid.cc: structure "hybrid" (Nemotron-H, Qwen3-Next)
COVERAGE_BUILDER_FAMILY(Ssm)             // model_hybrid.cc: structure "ssm" (RWKV-5)
COVERAGE_BUILDER_FAMILY(Multimodal)      // model_multimodal.cc: structure "multimodal" (vision + text towers)
#undef COVERAGE_BUILDER_FAMILY

// Training: the loss on a model's output is cross-entropy against fixed
// random labels for language-model logits (last dimension = vocabulary),
// else MSE against a fixed random target; both drawn from `seed` on the CPU.
struct TrainingTarget {
  at::Tensor labels;  // logits: [positions]
  at::Tensor target;  // otherwise: the output's shape, fp32
};
bool IsLogits(const selection::Features& f, const at::Tensor& output);
TrainingTarget MakeTrainingTarget(const selection::Features& f, const at::Tensor& output, uint64_t seed);
at::Tensor TrainingLoss(const at::Tensor& output, const TrainingTarget& target);

// Runs a buildable plan in `session` (RunModel with a session of its own).
Status RunInSession(const selection::Features& f, const BuildPlan& plan, const CaptureProfile& profile,
                    ModelSession& session, uint64_t seed);

// Runs a buildable plan's family in a session whose run has begun (no
// BeginRun: the weights made so far stay, training sessions keep their
// order): for a family that runs another family's plan after its own ops
// (the multimodal family's text tower).
Status RunFamily(const selection::Features& f, const BuildPlan& plan, const CaptureProfile& profile,
                 ModelSession& session, uint64_t seed);

}  // namespace coverage::runners::builder
