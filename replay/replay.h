// Replay: runs a captured OpCase on a backend and on the CPU reference and
// judges the result. Torch-free interface; the implementation dispatches
// through c10::Dispatcher (findSchemaOrThrow(...).callBoxed), so any ATen op
// a model calls can be tested without a hand-written test.
//
// A backend failure is data: every exception from the backend becomes an
// Outcome in the CaseResult (kError, or kUnsupported when the backend says it
// has no kernel). A case the CPU reference itself cannot run is kSkipped with
// the reason. Nothing here throws.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "core/case_result.h"
#include "core/op_case.h"
#include "replay/compare_options.h"

namespace coverage::backends {
class Backend;  // backends/backend.h (torch-facing)
}  // namespace coverage::backends

namespace coverage::replay {

using backends::Backend;
class InputCache;

// When the fp64 golden runs (see Note [Tolerances] in compare.cc).
enum class GoldenMode {
  kNever,       // judge against the CPU reference only
  kWhenNeeded,  // only when an output fails the reference tolerance: the golden
                // then decides whether the backend is merely as inexact as the CPU
  kAlways,      // for every case with floating inputs (records the error ratio everywhere)
};

struct ReplayOptions {
  ComparisonOptions comparison;
  int warm_iterations = 3;  // backend calls after the first; warm latency is their median
  GoldenMode golden = GoldenMode::kWhenNeeded;
  uint64_t seed = 0;        // mixed into every input's values
  // Inputs made for one case are kept (LRU) for later cases with the same
  // tensor spec, up to this many bytes (0 disables the cache).
  int64_t input_cache_bytes = int64_t{2} << 30;
  // Check read-only inputs after every backend run that read them in place,
  // even for backends that declare RespectsReadOnlyInputs() (to measure it).
  bool always_verify_inputs = false;
};

// Runs cases one at a time. Implementations may run cases in-process (this
// one) or in a worker process; the CaseResult is the same either way.
class CaseExecutor {
 public:
  virtual ~CaseExecutor() = default;
  virtual CaseResult Run(const OpCase& op_case) = 0;
  // Runs `cases`, calling on_result(i, result) as each one's result is final
  // (not necessarily in order: a case that runs again comes after the
  // others). Stops at a harness failure (HarnessStatus), leaving the rest
  // unreported. This one runs them one by one; worker isolation pipelines
  // them (Note [Pipelined requests] in isolation/worker.h).
  virtual void RunMany(const std::vector<const OpCase*>& cases,
                       const std::function<void(size_t, CaseResult)>& on_result) {
    for (size_t i = 0; i < cases.size(); ++i) {
      CaseResult result = Run(*cases[i]);
      if (!HarnessStatus().ok()) return;
      on_result(i, std::move(result));
    }
  }
  // True when RunMany gains from more than one case at a time; the unit
  // stage hands such an executor batches of small cases, others one case.
  virtual bool Pipelines() const { return false; }
  // A failure of the harness itself (a worker that cannot start); the stage
  // stops with it and does not store the last Run's result.
  virtual Status HarnessStatus() const { return Status::Ok(); }
};

class ReplayExecutor final : public CaseExecutor {
 public:
  ReplayExecutor(std::shared_ptr<Backend> backend, ReplayOptions options);
  ~ReplayExecutor() override;
  CaseResult Run(const OpCase& op_case) override;
  // The case again to see whether a wrong answer reproduces (Note [Reruns]
  // in isolation/isolation.cc): judged as Run judges it, with one backend
  // call and no warm calls, since its latency is the first run's. Right
  // after Run of the same failing case, the CPU reference and fp64 golden
  // that run made are reused (its inputs are seeded: they would come out
  // the same), and its inputs with their device copies, and only the
  // backend runs again.
  CaseResult RunAgain(const OpCase& op_case);
  // How many cases had their inputs made (a rerun that reuses them does not).
  int64_t inputs_made() const { return inputs_made_; }

 private:
  struct LastReference;
  CaseResult RunCase(const OpCase& op_case);
  std::unique_ptr<LastReference> last_;  // the last failing case's inputs, reference and golden
  bool again_ = false;
  int64_t inputs_made_ = 0;
  std::shared_ptr<Backend> backend_;
  ReplayOptions options_;
  std::unique_ptr<InputCache> cache_;
};

// An error message without the C++ backtrace c10::Error appends, at most max_len bytes.
std::string FirstLine(std::string_view msg, size_t max_len = 2000);

// True when ATen has a schema for the case's op and overload in this build.
bool HasSchema(const OpCase& op_case);

}  // namespace coverage::replay
