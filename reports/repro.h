// Reproductions of one op case for people: what `coverage repro` prints.
// Torch-free: the Python snippet is text, for a machine with PyTorch.
#pragma once

#include <cstdint>
#include <string>

#include "core/op_case.h"

namespace coverage::reports {

// A self-contained Python script that builds the case's inputs with the same
// shapes, dtypes, strides, storage offsets and value domains (from
// torch.manual_seed(seed); the values are not bit-identical to the unit
// stage's), calls torch.ops.aten.<op>.<overload> on the CPU and on `device`,
// and prints the largest difference. Keyword arguments by schema name.
std::string PythonRepro(const OpCase& op_case, uint64_t seed, const std::string& device);

}  // namespace coverage::reports
