// The config-driven model builder: builds a model from its architectural
// features (selection/features.h) and its config.json at its real
// dimensions, with random weights, and runs its forward pass under the op
// observer.
//
// Families (model_builder_internal.h lists them, the README's table says
// what each builds): decoder-only (MHA/GQA/MQA, MLA, sparse attention
// indexers, MoE with top-k and DeepSeek routing, rotary variants, ALiBi,
// learned positions, sliding windows, KV caches), encoder-only,
// encoder-decoder, vision towers, conv nets, speech, hybrid (Mamba-2 and
// Gated DeltaNet layers with attention), ssm (RWKV-5) and multimodal (vision
// tower, projector, text tower). Anything else is not built: the plan says
// why. Nothing is approximated silently: what a build does differently (a
// quantized checkpoint built dense, fewer layers) is in the plan's notes.
//
// Layers repeat, so only `max_layers` of them are built (the plan records
// how many of how many); dimensions are never reduced. The plan estimates the
// bytes the build needs and refuses above `max_bytes`, or, for capture with
// `meta_over_budget`, plans a shapes-only run on meta tensors (weights are
// never allocated; see MetaShapeBackend in model_session.h). Otherwise
// weights are real random tensors: the module, model and train checks
// compare values.
//
// Thread safety: pure functions; RunModel uses the calling thread's recorder.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/result.h"
#include "runners/blocks.h"
#include "runners/capture.h"
#include "selection/features.h"

namespace coverage::runners {

// Bump when the builder changes what a model executes.
inline constexpr int kModelBuilderVersion = 2;

struct BuildOptions {
  int64_t max_layers = 2;  // layers built (at most the model's own count)
  double max_bytes = 8e9;  // refuse a build estimated above this
  // Capture only: above max_bytes, plan a run on meta tensors instead of
  // refusing (BuildPlan::meta; never for training profiles).
  bool meta_over_budget = false;
};

struct BuildPlan {
  bool buildable = false;
  std::string reason;  // why not, when !buildable
  std::string family;  // "decoder", ...
  int64_t layers_total = 0;
  int64_t layers_built = 0;
  double weight_bytes = 0;
  double activation_bytes = 0;
  double flops = 0;  // estimated floating-point operations of the forward pass that is run
  nlohmann::json config;            // the model's config.json, for the family's Run
  std::vector<std::string> notes;   // what the build does differently, e.g. "2 of 32 layers"
  bool meta = false;                // shapes only: weights and activations on the meta device (capture)
  // Decoder details read from the config where features do not say.
  bool parallel_residual = false;
  bool qk_norm = false;
  bool linear_bias = false;
  double rotary_fraction = 1.0;
  bool gemma = false;                // embeddings scaled by sqrt(hidden), norms scale by (1 + weight)
  double attn_softcap = 0;           // Gemma 2: scores = cap * tanh(scores / cap)
  double final_softcap = 0;          // the same on the logits
  bool separate_parallel_norms = false;  // Falcon's new decoder: own norms for attention and MLP
  int64_t expert_intermediate = 0;
};

// Decides whether and how `features` (with its `config`) can be built for
// `profile`, and estimates the memory. Never fails: an unbuildable model gets
// a plan with the reason.
BuildPlan PlanModel(const selection::Features& features, const nlohmann::json& config, const CaptureProfile& profile,
                    const BuildOptions& options);

// Builds the model of a buildable `plan` and runs one forward pass of
// `profile` while `recorder` records, with module paths like
// "layers.0.self_attn". Errors: InvalidArgument for a plan that is not
// buildable; Internal for ATen failures (with the message).
Status RunModel(const selection::Features& features, const BuildPlan& plan, const CaptureProfile& profile,
                OpRecorder& recorder, uint64_t seed = 0);

}  // namespace coverage::runners
