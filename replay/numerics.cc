#include "replay/numerics.h"

#include <nlohmann/json.hpp>

#include "core/json_fields.h"

namespace coverage::replay {

// Note [Declared numerics]
// ~~~~~~~~~~~~~~~~~~~~~~~~
// A backend may compute some fp32 ops with narrower operands on purpose:
// AWS's Neuron compiler casts fp32 matmul operands to bf16 by default
// (--auto-cast matmult), CUDA's TF32 keeps 10 mantissa bits, sim's
// bf16_matmul rounds matmul and convolution operands to bf16 and accumulates
// in fp32. It declares so (a file per backend, configs/numerics/<backend>.json,
// or the plugin hook coverage_backend_numerics(), backends/plugin_abi.h):
//
//   {"fp32_operands": "bf16" | "tf32", "ops": {"aten::mm": ["self", "mat2"], ...}}
//
// The CPU reference of a declared op then computes the same way: its fp32
// operands rounded as declared, the kernel accumulating in fp32. The fp64
// golden stays exact. So the verdict (Note [Tolerances]) is against the
// declared precision: a backend that does what it declares is as close to
// the reference as accumulation order allows and, where it is not, at most
// the multiplier times the declared reference's own error from the golden;
// one that is worse than it declares (coarser operands, a wrong kernel)
// fails. The unit stage also records the backend's error against the exact
// fp32 result (detail "exact_fp32"), so the cost of the declared precision
// stays visible. Ops not declared are judged at their dtype's precision as
// before, and "none" (--numerics none) judges every op exactly.

const std::vector<std::string>* DeclaredNumerics::OperandsOf(std::string_view op) const {
  auto it = ops.find(op);
  return it == ops.end() ? nullptr : &it->second;
}

std::string_view DeclaredNumerics::RoundingName(Rounding r) { return r == Rounding::kBf16 ? "bf16" : "tf32"; }

std::string DeclaredNumerics::Summary() const {
  if (empty()) return "exact fp32";
  std::string names;
  size_t shown = 0;
  for (const auto& [op, operands] : ops) {
    if (shown++ == 4) {
      names += ", ...";
      break;
    }
    names += (names.empty() ? "" : ", ") + op;
  }
  return "fp32 operands rounded to " + std::string(RoundingName(fp32_operands)) + " in " + std::to_string(ops.size()) +
         (ops.size() == 1 ? " op (" : " ops (") + names + ")";
}

Result<DeclaredNumerics> DeclaredNumerics::FromJson(std::string_view text, std::string_view source) {
  DeclaredNumerics out;
  if (text.empty()) return out;
  const std::string src(source);
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded()) return Status::InvalidArgument(src + ": not valid JSON");
  const JsonFields f(j, src, StatusCode::kInvalidArgument);
  COV_RETURN_IF_ERROR(f.OnlyMembers({"comment", "source", "fp32_operands", "ops"}));
  std::string rounding;
  COV_RETURN_IF_ERROR(f.RequiredString("fp32_operands", &rounding));
  if (rounding == "bf16") {
    out.fp32_operands = Rounding::kBf16;
  } else if (rounding == "tf32") {
    out.fp32_operands = Rounding::kTf32;
  } else {
    return f.Error("fp32_operands", "expected \"bf16\" or \"tf32\", not \"" + rounding + "\"");
  }
  const nlohmann::json* ops = f.Find("ops");
  if (!ops || !ops->is_object() || ops->empty()) {
    return f.Error("ops", "expected an object of op names to the operands they round, e.g. {\"aten::mm\": "
                          "[\"self\", \"mat2\"]}");
  }
  const JsonFields o = f.Sub("ops", *ops);
  for (const auto& [op, operands] : ops->items()) {
    const size_t colons = op.find("::");
    if (colons == std::string::npos || colons == 0 || colons + 2 == op.size() || op.find('.') != std::string::npos) {
      return o.Error(op.c_str(), "expected an op name without an overload, such as aten::mm");
    }
    std::vector<std::string> names;
    COV_RETURN_IF_ERROR(o.Strings(op.c_str(), &names));
    if (!operands.is_array()) return o.Error(op.c_str(), "expected an array of argument names");
    out.ops[op] = std::move(names);
  }
  out.source = src;
  out.text = std::string(text);
  return out;
}

}  // namespace coverage::replay
