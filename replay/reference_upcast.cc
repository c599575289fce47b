#include "replay/reference_upcast.h"

#include <optional>

#include <ATen/ATen.h>

// Note [Reference upcast]
// ~~~~~~~~~~~~~~~~~~~~~~~
// A backend is judged against the CPU, so a call the CPU cannot run leaves
// the backend without a verdict. Some ops have integer kernels on
// accelerators and none on the CPU: transformers' MoE experts count the
// tokens routed to each expert with histc on the integer expert ids on every
// device but the CPU, so a program traced on meta (as if on an accelerator)
// calls aten::histc on int32, and the CPU raises "histogram_cpu" not
// implemented for 'Int'. When the reference raises such an error and the
// call reads integer tensors only (no floating or complex tensor, so there
// is nothing a float64 rounding could blur) and writes none of them in place,
// the reference runs the call once more with its integer tensors as float64
// and casts the floating returns back to the dtype of the first integer
// tensor argument. For counts and sums of integers below 2^53 the result is
// exact. The backend always runs the call as captured: a backend without
// the integer kernel is `unsupported` on that call, as the CPU would be.

namespace coverage::replay {
namespace {

bool IsIntegral(const at::Tensor& t) { return t.defined() && at::isIntegralType(t.scalar_type(), /*includeBool=*/false); }

bool IsFloatingOrComplex(const at::Tensor& t) {
  return t.defined() && (t.is_floating_point() || t.is_complex());
}

}  // namespace

bool IsMissingIntegerKernel(std::string_view what) {
  if (what.find("not implemented for '") == std::string_view::npos) return false;
  for (const char* name : {"'Int'", "'Long'", "'Short'", "'Byte'", "'Char'"}) {
    if (what.find(name) != std::string_view::npos) return true;
  }
  return false;
}

bool CallUpcast(const c10::OperatorHandle& op, const std::vector<bool>& mutated, torch::jit::Stack* stack) {
  std::optional<at::ScalarType> integer_dtype;
  for (size_t i = 0; i < stack->size(); ++i) {
    const c10::IValue& v = (*stack)[i];
    std::vector<at::Tensor> tensors;
    if (v.isTensor()) tensors.push_back(v.toTensor());
    if (v.isTensorList()) tensors = v.toTensorVector();
    for (const at::Tensor& t : tensors) {
      if (IsFloatingOrComplex(t)) return false;
      if (!IsIntegral(t)) continue;
      if (i < mutated.size() && mutated[i]) return false;
      if (!integer_dtype) integer_dtype = t.scalar_type();
    }
  }
  if (!integer_dtype) return false;
  torch::jit::Stack upcast;
  for (const c10::IValue& v : *stack) {
    if (v.isTensor() && IsIntegral(v.toTensor())) {
      upcast.emplace_back(v.toTensor().to(at::kDouble));
    } else if (v.isTensorList()) {
      std::vector<at::Tensor> list = v.toTensorVector();
      for (at::Tensor& t : list) {
        if (IsIntegral(t)) t = t.to(at::kDouble);
      }
      upcast.emplace_back(list);
    } else {
      upcast.push_back(v);
    }
  }
  try {
    op.callBoxed(&upcast);
  } catch (const std::exception&) {
    return false;
  }
  for (c10::IValue& v : upcast) {
    if (v.isTensor() && v.toTensor().is_floating_point()) v = v.toTensor().to(*integer_dtype);
  }
  *stack = std::move(upcast);
  return true;
}

}  // namespace coverage::replay
