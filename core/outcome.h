// Outcome: how one case (op case, module, model, train step) ended on the
// backend under test. A backend failure is data: it is stored in `results`
// and reported, never raised as a Status.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace coverage {

enum class Outcome {
  kPass,               // within tolerance of the reference (see Note [Tolerances])
  kMismatch,           // values differ beyond tolerance
  kShapeMismatch,      // an output has a different shape than the reference
  kShapeDivergence,    // program replay: a call in the middle of the program gave another shape
                       // on the backend (a data-dependent op, a wrong kernel); later calls cannot run
  kDtypeMismatch,      // an output has a different dtype than the reference
  kNonFiniteMismatch,  // NaN/Inf where the reference has finite values, or vice versa
  kError,              // the backend raised an error while running the case
  kUnsupported,        // the backend reported that it does not implement the op
  kSkipped,            // not run (cost cap, filter, gate); the reason is stored
  kCrash,              // the worker died with a signal
  kTimeout,            // the case ran past its deadline
  kExpectedFailure,    // failed, and configs/ lists it as a known failure
  kUnexpectedPass,     // passed, but configs/ lists it as a known failure
};

inline constexpr Outcome kAllOutcomes[] = {
    Outcome::kPass,  Outcome::kMismatch,    Outcome::kShapeMismatch, Outcome::kShapeDivergence, Outcome::kDtypeMismatch,
    Outcome::kNonFiniteMismatch, Outcome::kError, Outcome::kUnsupported, Outcome::kSkipped,
    Outcome::kCrash, Outcome::kTimeout,     Outcome::kExpectedFailure, Outcome::kUnexpectedPass,
};

// Stable lower-case names stored in the database ("pass", "mismatch", ...).
std::string_view OutcomeName(Outcome outcome);
std::optional<Outcome> OutcomeFromName(std::string_view name);
// The attempts of a rerun item as a row and a report hold them: "crash,pass"
// ("" for none); reading back names an unknown outcome.
std::string OutcomesText(const std::vector<Outcome>& outcomes);
Status OutcomesFromText(std::string_view text, std::vector<Outcome>* out);

// Note [Missing kernels]: a backend that has no kernel for an op says so in
// one of PyTorch's own words, and such a case is kUnsupported, not kError
// (a gap of the backend, not a failure of a kernel it has):
//  * the dispatcher: "Could not run 'aten::mm' with arguments from the
//    'PrivateUse1' backend";
//  * a default kernel that only throws: "convolution_overrideable not
//    implemented. ... please use TORCH_LIBRARY_IMPL to override this
//    function", "convolution_backward_overrideable: You are likely
//    triggering this ... please use TORCH_LIBRARY_IMPL", "derivative for ...
//    is not implemented";
//  * a kernel without the dtype: "\"abs_cpu\" not implemented for 'Int'";
//  * Python's NotImplementedError (a plugin's Python side), "is not supported".
// MissingKernel names what is missing: the operator or kernel the message
// names, with the dtype when it gives one ("aten::mm", "abs_cpu for 'Int'",
// "convolution_backward_overrideable"); "" when it names none.
bool LooksUnsupported(std::string_view message);
std::string MissingKernel(std::string_view message);

// True for outcomes that make a run fail (exit code 1): everything except
// pass, skipped and expected-failure.
bool IsUnexpectedFailure(Outcome outcome);

}  // namespace coverage
