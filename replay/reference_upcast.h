// The CPU reference for integer calls the CPU has no kernel for (Note
// [Reference upcast] in reference_upcast.cc). Torch-facing, internal to
// replay/.
#pragma once

#include <string_view>
#include <vector>

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

namespace coverage::replay {

// The message of a CPU kernel missing for an integer dtype ("histogram_cpu"
// not implemented for 'Int').
bool IsMissingIntegerKernel(std::string_view what);

// Runs `op` on `stack` (its arguments, on CPU) with every integer tensor
// argument as float64 and the floating returns cast back to the first
// integer argument's dtype; `mutated` holds, per schema argument, whether
// the op writes it. Returns false, leaving `stack` as it was, when the call
// does not qualify (a floating or complex tensor argument, an integer
// argument written in place, no integer tensor argument) or still fails.
bool CallUpcast(const c10::OperatorHandle& op, const std::vector<bool>& mutated, torch::jit::Stack* stack);

}  // namespace coverage::replay
