// Output comparison: one backend output against the CPU reference, judged
// with the fp64 golden when there is one. Internal to replay/ (torch types).
// See Note [Tolerances] in compare.cc.
#pragma once

#include <functional>
#include <optional>
#include <string>

#include <ATen/core/Tensor.h>

#include "core/outcome.h"
#include "replay/compare_options.h"

namespace coverage::replay {

struct TensorComparison {
  Outcome outcome = Outcome::kPass;
  std::string message;         // why it is not a pass
  int64_t elements = 0;
  int64_t mismatched = 0;      // outside tolerance (finite positions)
  int64_t nonfinite_diff = 0;  // NaN/Inf pattern differs from the reference
  double max_abs_err = 0;      // vs reference
  double max_rel_err = 0;      // vs reference
  double cosine = 1;           // vs reference
  std::optional<double> error_ratio;  // backend error / CPU error, vs golden
  bool values_compared = true;        // false: shape and dtype only
};

// Compares `backend` (any device) with `reference` (CPU). `golden` is the
// fp64 result on CPU, or undefined when the op has none. When it is
// undefined, `golden_when_needed` (if given) is called once an element is
// found outside the reference tolerance, and the golden it returns (or
// undefined) judges the output. When `values_meaningful` is false
// (uninitialised or random outputs) only shape and dtype are checked.
TensorComparison CompareTensors(const at::Tensor& backend, const at::Tensor& reference, const at::Tensor& golden,
                                Tolerance tolerance, double multiplier, bool values_meaningful,
                                const std::function<at::Tensor()>& golden_when_needed = {});

// True when `a` and `b` are CPU tensors with the same dtype, sizes, dense
// layout and bits (Note [Identical outputs] in compare.cc); both undefined
// counts as the same.
bool SameValues(const at::Tensor& a, const at::Tensor& b);

// Note [Views compared by their metadata] in compare.cc: when `backend` is a
// view of the backend's input `backend_input` exactly as `reference` is of
// `reference_input` (same storage, sizes, strides, byte offset, dtype and
// conjugate and negative bits), its values are the input's, and the pass is
// returned without reading an element; otherwise nothing.
std::optional<TensorComparison> CompareAsViews(const at::Tensor& backend, const at::Tensor& backend_input,
                                               const at::Tensor& reference, const at::Tensor& reference_input);

}  // namespace coverage::replay
