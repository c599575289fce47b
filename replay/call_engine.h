// The call engine: one ATen call run on the backend under test and on the
// CPU reference, and judged. Both the unit stage (replay.cc, one op case)
// and program replay (program_replay.cc, each call of a captured program)
// run and judge calls only through these functions, so a rule of judging
// has one home (Note [One call engine] in call_engine.cc). Torch-facing,
// internal to replay/.
#pragma once

#include <cstddef>
#include <exception>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <nlohmann/json.hpp>

#include "core/op_case.h"
#include "core/outcome.h"
#include "core/result.h"
#include "replay/compare.h"
#include "replay/compare_options.h"
#include "replay/numerics.h"

namespace coverage::replay {

// A call's returns flattened into one value per place, as the tracer records
// a call's outputs: an undefined tensor or None inside a tuple or list holds
// a place, and so does the nothing an op returning () returns.
std::vector<c10::IValue> FlattenReturns(const torch::jit::Stack& after);

// What a call produced for judging: its returns, or, for an op that returns
// nothing, the arguments it wrote to (`mutated`: per schema argument).
std::vector<c10::IValue> CallOutputs(const torch::jit::Stack& after, const std::vector<c10::IValue>& arguments,
                                     const std::vector<bool>& mutated);

// An exception a backend raised, as the outcome it is: kUnsupported when the
// message says the backend has no kernel (Note [Missing kernels], core/outcome.h), else kError.
// The message is its first line without the C++ backtrace, at most max_len.
struct CallFailure {
  Outcome outcome = Outcome::kPass;
  std::string message;
};
CallFailure BackendFailure(const std::exception& e, size_t max_len);

// The reference call: `op` on the CPU arguments `build()` makes. An integer
// call the CPU has no kernel for runs again upcast (Note [Reference
// upcast]). An op the backend declares numerics for (`numerics`, Note
// [Declared numerics]) computes with its fp32 operands rounded as declared.
// The error is the reference's reason when it cannot run at all.
struct ReferenceCall {
  std::vector<c10::IValue> arguments;  // as passed (in-place writes visible)
  torch::jit::Stack after;             // the stack after the call: its returns
  bool upcast = false;
  int64_t rounded_operands = 0;  // fp32 operands rounded as declared
};
Result<ReferenceCall> CallReference(const c10::OperatorHandle& op, const std::vector<bool>& mutated,
                                    const std::function<Result<std::vector<c10::IValue>>()>& build, size_t max_len,
                                    const DeclaredNumerics* numerics = nullptr);

// `t` (fp32) with every value of its storage rounded as `rounding` says
// (round to nearest even; inf and nan unchanged), as a view of the same
// sizes, strides and offset.
at::Tensor RoundFp32(const at::Tensor& t, DeclaredNumerics::Rounding rounding);

// Rounds the fp32 operands `numerics` declares for `op` among `arguments`
// (read-only ones: `mutated` per schema argument); returns how many it rounded.
int64_t RoundDeclaredOperands(const c10::OperatorHandle& op, const DeclaredNumerics& numerics,
                              const std::vector<bool>& mutated, std::vector<c10::IValue>* arguments);

// The fp64 golden of one call, made at most once and only when asked
// (Note [Tolerances]): `make` runs the call on float64 copies of the
// reference's inputs and returns its outputs; it may throw (no double
// kernel), which leaves no golden.
class CallGolden {
 public:
  CallGolden() = default;
  explicit CallGolden(std::function<std::vector<c10::IValue>()> make) : make_(std::move(make)) {}
  // A golden kept from an earlier run of the same call makes nothing new
  // once tried; until then it uses this maker.
  void SetMaker(std::function<std::vector<c10::IValue>()> make) { make_ = std::move(make); }
  // Makes the golden unless it was tried.
  void Make();
  bool tried() const { return tried_; }
  bool ok() const { return ok_; }
  // Output i of the golden, or undefined (none made, or not a tensor).
  at::Tensor Output(size_t i, size_t outputs) const;
  // Time spent making it.
  double micros() const { return micros_; }

 private:
  std::function<std::vector<c10::IValue>()> make_;
  std::vector<c10::IValue> outputs_;
  bool tried_ = false, ok_ = false;
  double micros_ = 0;
};

// What to judge: the backend's outputs (any device) against the reference's
// (CPU) under the case's rules.
struct CallToJudge {
  const OpCase* op_case = nullptr;            // op, overload: tolerances and the per-op rules
  const ComparisonOptions* comparison = nullptr;
  const std::vector<c10::IValue>* backend = nullptr;
  const std::vector<c10::IValue>* reference = nullptr;
  // For Note [Views compared by their metadata]: the schema and both sides'
  // arguments; without them every output is compared by value.
  const c10::FunctionSchema* schema = nullptr;
  const std::vector<c10::IValue>* backend_arguments = nullptr;
  const std::vector<c10::IValue>* reference_arguments = nullptr;
  // Asked for the golden once an output misses the reference tolerance; null: never.
  CallGolden* golden = nullptr;
  // Backend outputs already copied to the CPU (a rerun compares them with
  // its first run's first), so no output is read from the device twice.
  const std::vector<at::Tensor>* backend_on_cpu = nullptr;
};

// One output's verdict.
struct OutputVerdict {
  Outcome outcome = Outcome::kPass;
  std::string message;
  std::optional<TensorComparison> tensor;  // tensors: the comparison
  bool golden = false;                     // a golden judged it
};

struct CallVerdict {
  Outcome outcome = Outcome::kPass;  // the worst output's
  std::string error;                 // "output i: why" when the call has several outputs
  std::vector<OutputVerdict> outputs;
  // Over the elements compared by value (none: `compared` is false and these stay at their defaults).
  bool compared = false;
  double max_abs_err = 0, max_rel_err = 0, mismatch_frac = 0, cosine = 1;
  std::optional<double> error_ratio;
  // The backend's outputs on CPU (strided tensors; undefined otherwise), each
  // read from the device once.
  std::vector<at::Tensor> backend_on_cpu;
  // The first output that is not a pass, or -1.
  int64_t FirstFailing() const;
  // {"outputs": [...], "golden": golden made}, the unit stage's detail.
  nlohmann::json Detail(bool golden_made) const;
};

CallVerdict JudgeCall(const CallToJudge& call);

// True when every output is a strided tensor or None: outputs a rerun can
// be matched with bit for bit.
bool AllStridedOrNone(const std::vector<c10::IValue>& outputs);

}  // namespace coverage::replay
