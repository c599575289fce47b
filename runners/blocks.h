// Representative blocks built directly with ATen at a real model's
// dimensions: the seed of the bundled registry until the config-driven model
// builder exists. Each family runs the ops its real counterpart runs, in the
// order and with the shapes and strides the Hugging Face implementation
// produces, for one layer (layers repeat; capture says so in provenance via
// the module path "layers.0").
//
// Families (the `family` field of data/seed_models.jsonl):
//   decoder  Llama-style decoder layer: embedding, RMSNorm, attention with GQA
//            and rotary embedding (optional per-head q/k RMSNorm as in Qwen3),
//            KV cache in decode profiles, SwiGLU MLP, LM head.
//   encoder  BERT-style: word + position + token-type embeddings, LayerNorm,
//            attention with a padding mask, GELU MLP, pooler.
//   vit      ViT: conv patch embedding, class token, position embedding,
//            pre-norm encoder layer with GELU MLP, classifier head.
//   convnet  ResNet: 7x7 conv stem with batch norm, ReLU and max pool, one
//            bottleneck block with projection shortcut, pooling, classifier.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/op_case.h"
#include "core/result.h"
#include "runners/capture.h"

namespace coverage::runners {

struct BlockModel {
  std::string id;      // Hub model id
  std::string family;  // decoder | encoder | vit | convnet
  nlohmann::json config;
  std::string source;  // where the config came from
};

struct CaptureProfile {
  std::string name;                   // "prefill", "decode", "image", ...
  std::vector<std::string> families;  // families it applies to
  int64_t batch = 1;
  int64_t seq_len = 0;   // tokens processed this step
  int64_t past_len = 0;  // tokens already in the KV cache (decode)
  DType dtype = DType::kFloat32;
  bool training = false;  // model builder: forward, a loss and backward (seed block capture skips these)
};

// Parses one line of data/seed_models.jsonl. Errors name the field.
Result<BlockModel> ParseBlockModel(const nlohmann::json& line);
// Parses configs/capture_profiles.json.
Result<std::vector<CaptureProfile>> ParseCaptureProfiles(const nlohmann::json& doc);

// Rough peak bytes the blocks of `model` need under `profile` (weights of one
// layer, embeddings and activations), to refuse before allocating.
double EstimateBlockBytes(const BlockModel& model, const CaptureProfile& profile);

// Runs the blocks of `model` under `profile` while `recorder` records; sets
// the recorder's module path per block. Errors (bad config values, ATen
// failures) are Statuses naming the model and field.
Status RunBlocks(const BlockModel& model, const CaptureProfile& profile, OpRecorder& recorder);

}  // namespace coverage::runners
