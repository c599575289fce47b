// Capture profiles (configs/capture_profiles.json): the inputs a model is
// traced under. Each names the model structures it applies to ("decoder",
// "encoder", "encoder-decoder", "vision", "conv", "speech", "multimodal",
// "hybrid", "ssm"), the batch, the tokens of this step and of the KV cache
// before it, the dtype, and whether it is a training step (forward, the
// library's loss, backward and one AdamW step). The tracer reads the same
// file (capture/tracer/README.md); the model stages use it to pick which
// captured program of a model each stage replays.
//
// Torch-free.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/op_case.h"
#include "core/result.h"

namespace coverage::capture {

struct CaptureProfile {
  std::string name;                   // "prefill", "decode", "image", ...
  std::vector<std::string> families;  // model structures it applies to
  int64_t batch = 1;
  int64_t seq_len = 0;   // tokens processed this step
  int64_t past_len = 0;  // tokens already in the KV cache (decode)
  DType dtype = DType::kFloat32;
  bool training = false;  // forward, the loss, backward and an optimizer step
};

// Parses configs/capture_profiles.json ({"profiles": [...]}). Errors name the
// profile's index and name and the field.
Result<std::vector<CaptureProfile>> ParseCaptureProfiles(const nlohmann::json& doc);

}  // namespace coverage::capture
