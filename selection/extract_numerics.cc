// Numerics: the dtype and the quantization method.
#include <nlohmann/json.hpp>

#include "selection/config_reader.h"
#include "selection/extract.h"

namespace coverage::selection::detail {
namespace {

// torch dtype names, folded to the four the features know; "" otherwise.
std::string NormaliseDtype(std::string_view raw) {
  std::string d = Lower(raw);
  if (StartsWith(d, "torch.")) d = d.substr(6);
  if (OneOf(d, {"float32", "fp32", "float", "f32"})) return "float32";
  if (OneOf(d, {"float16", "fp16", "half", "f16"})) return "float16";
  if (OneOf(d, {"bfloat16", "bf16"})) return "bfloat16";
  if (StartsWith(d, "float8") || StartsWith(d, "fp8") || StartsWith(d, "f8")) return "float8";
  return "";
}

// quantization_config's quant_method; bitsandbytes split by its bit width.
std::string QuantizationOf(const json* where) {
  const json* q = Object(where, "quantization_config");
  std::string method = AsToken(Member(q, "quant_method"));
  if (method == "bitsandbytes") {
    if (AsBool(Member(q, "load_in_4bit")).value_or(false) || AsBool(Member(q, "_load_in_4bit")).value_or(false)) {
      method = "bnb-4bit";
    } else if (AsBool(Member(q, "load_in_8bit")).value_or(false) ||
               AsBool(Member(q, "_load_in_8bit")).value_or(false)) {
      method = "bnb-8bit";
    }
  }
  return method;
}

}  // namespace

// The top level's, else the language model's.
void ReadNumerics(const Stack& s, Features* f) {
  for (const json* where : {s.config, s.main.config()}) {
    for (std::string_view key : {"dtype", "torch_dtype"}) {
      if (f->dtype.empty()) f->dtype = NormaliseDtype(AsToken(Member(where, key)));
    }
    if (f->quantization.empty()) f->quantization = QuantizationOf(where);
  }
}

}  // namespace coverage::selection::detail
