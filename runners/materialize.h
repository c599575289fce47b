// Materialisation: turning an OpCase's argument descriptions into real
// values that keep the op valid. Internal to runners (torch types).
//
// Values are deterministic: a case's inputs depend only on its key and the
// seed. They are drawn from one pool of uniform numbers generated once, so
// making a tensor costs one pass over its storage rather than a random-number
// generator call per element. See Note [Value domains] in materialize.cc.
#pragma once

#include <cstdint>
#include <vector>

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>

#include "core/op_case.h"
#include "core/result.h"

namespace coverage::runners {

// Inputs of one case on CPU. Tensors are kept as (storage base, spec) so that
// each run can get a fresh view or copy, on any device, with the recorded
// strides and offset.
class MaterializedCase {
 public:
  // Builds the IValue arguments for one run on `device`. When `fresh` is
  // true, tensors get their own storage (for ops that mutate inputs);
  // otherwise runs may share the bases that `device` already has.
  // `to_double` converts floating tensors to float64 (the golden run).
  Result<std::vector<c10::IValue>> Build(c10::Device device, bool fresh, bool to_double);

  const std::vector<bool>& mutated() const { return mutated_; }

 private:
  friend Result<MaterializedCase> Materialize(const OpCase&, const c10::FunctionSchema&, uint64_t);
  struct TensorInput {
    at::Tensor base;  // CPU storage, storage-numel elements, contiguous
    TensorSpec spec;
  };
  // One per schema argument: either a non-tensor IValue or tensor slots.
  struct Slot {
    size_t arg_index = 0;            // into op_case_.args
    std::vector<int> tensor_ids;        // into tensors_, -1 for a None item
    bool optional_list = false;         // Tensor?[]
  };
  at::Tensor MakeView(int id, c10::Device device, bool fresh, bool to_double);

  std::vector<TensorInput> tensors_;
  std::vector<Slot> slots_;
  std::vector<bool> mutated_;  // per schema argument: written by the op
  OpCase op_case_;
  // Device copies of bases, cached per (device, dtype-conversion).
  std::vector<std::pair<std::string, at::Tensor>> cache_;
};

// Materialises the inputs of `op_case` for `schema`. Fails (InvalidArgument)
// when the case does not fit the schema or a spec cannot be built.
Result<MaterializedCase> Materialize(const OpCase& op_case, const c10::FunctionSchema& schema, uint64_t seed);

}  // namespace coverage::runners
