// Program: what a model executed for one input profile, as the capture
// tracer recorded it (capture/tracer/README.md): the tensors it starts from
// (parameters, buffers, inputs, constants) and every ATen call in dispatch
// order, connected by value ids. Each call that can be described is also an
// OpCase, so a program is a path through the registry's op cases.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/cost.h"
#include "core/op_case.h"

namespace coverage {

// A tensor the program reads but no recorded call produced.
struct ProgramValue {
  int64_t id = 0;
  std::string kind;                  // parameter, buffer, input, constant
  std::string name;                  // "model.layers.0.mlp.up_proj.weight", "input_ids"; "" for constants
  std::optional<TensorSpec> tensor;  // with its value domain; nullopt when unsupported
  std::string unsupported;           // why it cannot be described
  // The tracer's records about how the value is made, as JSON values (null
  // when absent), parsed once when the program is read:
  nlohmann::json init;    // parameters and buffers: {"rule":"normal","mean":0.0,"std":0.02}, ...
  nlohmann::json scalar;  // a constant made from a Python number: {"kind":"double","d":0.5}

  bool operator==(const ProgramValue&) const = default;
};

struct ProgramCall {
  int64_t index = 0;
  std::string op;                // "aten::mm"
  std::string overload;          // "" for the default overload
  std::optional<OpCase> op_case;  // nullopt when an argument cannot be described
  std::string unsupported;       // "argument: reason" when op_case is nullopt
  // Value id of every tensor argument and tensor-list item, in schema order
  // (-1 for an absent item of a Tensor?[] list); empty when unsupported.
  std::vector<int64_t> inputs;
  // Value id of every flattened return; -1 for a return that is not a
  // tensor (a number, an undefined tensor).
  std::vector<int64_t> outputs;
  std::vector<TensorSpec> output_specs;  // the tensor returns, for cost estimates (not stored)
  std::string module;            // "model.layers.0.self_attn"; "" for the model itself
  std::string phase;             // forward, backward, optimizer
  // A composite recorded whole (scaled_dot_product_attention): the ops the
  // trace device ran for it ("aten::_scaled_dot_product_flash_attention_for_cpu"),
  // which are not calls of the program. Empty for other calls.
  std::vector<std::string> decomposition;

  bool operator==(const ProgramCall&) const = default;
};

// The start and end records of a trace.
struct ProgramInfo {
  int tracer_version = 0;
  std::string model_id;
  std::string profile;
  std::string class_name;           // "LlamaForCausalLM"
  std::string model_type;
  std::string kind;                 // decoder, encoder, encoder-decoder, vision, conv, speech, hybrid, ssm, multimodal
  std::string device;               // meta or cpu
  std::string fallback;             // why a meta run was redone on cpu; "" when it was not
  std::string attn_implementation;  // "sdpa", "eager", ...
  std::string dtype;                // f32, bf16
  std::string layers_json;          // {"num_hidden_layers": {"kept": 2, "of": 22}}
  std::string torch_version;
  std::string transformers_version;
  double estimated_gb = 0;
  int64_t value_count = 0;          // value ids given (leaves and outputs)
  double seconds = 0;               // the trace's wall time, build included
  double peak_rss_mb = 0;

  bool operator==(const ProgramInfo&) const = default;
};

struct Program {
  ProgramInfo info;
  std::vector<ProgramValue> values;  // in the order they were first read
  std::vector<ProgramCall> calls;    // in dispatch order, index == position

  bool operator==(const Program&) const = default;
};

// What replaying a program costs, estimated from its records before running
// it: FLOPs summed over the calls (core/cost.h, from their arguments) and the
// bytes of its leaves. Its memory is replay::EstimateMemory's (it runs the
// calls on the meta device).
struct ProgramFootprint {
  double flops = 0;
  double leaf_bytes = 0;
};
ProgramFootprint EstimateFootprint(const Program& program);

}  // namespace coverage
