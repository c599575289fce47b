// Program replay's engine room: the Replayer runs a captured program's
// calls in order on the reference and the backend (Note [Program replay]
// in replayer.cc) in one of four modes. Torch-facing, internal to replay/;
// program_replay.cc builds the stages' verdicts on it.
#pragma once

#include <cmath>
#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <nlohmann/json.hpp>

#include "core/program.h"
#include "core/result.h"
#include "replay/program_replay.h"

namespace coverage::replay::programs {

struct Op {
  c10::OperatorHandle handle;
  std::vector<bool> mutated;      // per schema argument
  std::vector<bool> scalar_list;  // per schema argument: a Scalar[] (NumberListFor)
  bool random = false;            // Note [Random calls]
};

// What the pass does with each call (Note [Program replay]).
enum class Mode {
  kFree,    // reference and backend, backend outputs feed the backend
  kGolden,  // the reference only, in float64
  kLocate,  // reference; each call also on the backend from the reference's inputs
  kModule,  // reference; the chosen modules' own calls also on the backend, from the backend's values inside
            // each module and copies of the reference's at its boundary
  kShapes,  // the reference's side on the meta device: sizes and storages only (Note [Memory estimate])
};

// kShapes: the reference side's memory as each call ends (Note [Memory estimate]).
struct ShapeSample {
  int64_t live = 0;     // bytes of the storages alive, the judged outputs kept
  int64_t live64 = 0;   // the same with every floating storage in float64 (the golden's)
  int64_t fresh = 0;    // bytes of the storages the call's outputs created
  int64_t rounded = 0;  // bytes of the fp32 operands the backend declares rounded (Note [Declared numerics])
};

struct Failure {
  Outcome outcome = Outcome::kPass;
  std::string message;
  int64_t call = -1;
};

struct Judged {
  int64_t id = 0;
  int64_t call = 0;
  at::Tensor backend, reference;  // on CPU
  std::string op;                 // the producing call's op (for tolerance overrides)
  std::string phase;
  bool meaningful = true;
  std::string module;             // kModule: the module whose output it is
  // A secondary output nothing reads, of a call whose first output is read
  // on (a layer norm's saved mean and rstd in inference): Note [By-products].
  bool by_product = false;
};

// What a training pass records (Note [Program replay], train).
struct StepRecord {
  double ref_loss = NAN, dev_loss = NAN;
  std::vector<double> ref_grad_norms, dev_grad_norms;  // in order of first use by the optimizer
};

class Replayer {
 public:
  Replayer(const Program& program, Backend* backend, const ProgramReplayOptions& options);

  // Resolves every call's operator once; a call that cannot be replayed
  // makes the whole program unreplayable (kSkipped with the reason).
  Failure Prepare();

  // One pass. `modules` selects the calls of kModule, or those kLocate runs
  // on the backend (their own calls, not their sub-modules'). Values of carried ids (Carry) survive from the
  // previous pass; everything else starts afresh.
  Failure Run(Mode mode, const std::set<std::string>& modules = {});

  const std::vector<Judged>& judged() const { return judged_; }
  int64_t peak_live_bytes() const { return peak_live_bytes_; }
  // kShapes: one sample per call, and the calls without a meta kernel (their
  // outputs sized from the calls that read them).
  const std::vector<ShapeSample>& shape_samples() const { return shape_samples_; }
  int64_t calls_without_shapes() const { return calls_without_shapes_; }
  // kShapes: the bytes of the storage a call's output `id` lives in (0 when unknown).
  int64_t shape_bytes(int64_t id) const {
    auto it = shape_bytes_.find(id);
    return it == shape_bytes_.end() ? 0 : it->second;
  }
  int64_t calls_run() const { return calls_run_; }
  double backend_seconds() const { return backend_seconds_; }
  double reference_seconds() const { return reference_seconds_; }
  int64_t reference_upcasts() const { return reference_upcasts_; }
  // fp32 operands the reference rounded as the backend declares (Note [Declared numerics]).
  int64_t reference_rounded() const { return reference_rounded_; }
  // The first divergent call of a kLocate pass.
  nlohmann::json divergent() const { return divergent_; }
  // A kLocate pass given modules runs only their calls on the backend and
  // keeps each module's first divergent call here (module -> as divergent()).
  const std::map<std::string, nlohmann::json>& divergent_by_module() const { return divergent_by_module_; }
  // kGolden: the fp64 value of a judged id.
  at::Tensor golden(int64_t id) const;
  int64_t module_calls(const std::string& module) const;
  // Training: parameters and buffers keep their values from pass to pass
  // (the optimizer updates them in place); their first values are kept on
  // CPU for the update check.
  // `keep_initial`: keep the first values too (the golden of a training
  // run leaves them out: they are the backend run's, Note [Training verdicts]).
  void CarryParameters(bool keep_initial = true);
  const StepRecord& step() const { return step_; }
  // Parameters now and at the start, reference and backend (undefined in
  // kGolden, where the reference is the fp64 golden), on CPU.
  struct ParameterState {
    std::string name;
    at::Tensor initial, ref, dev;
  };
  std::vector<ParameterState> Parameters() const;
  // kGolden: the judged ids whose fp64 values to keep.
  void WantGolden(const std::set<int64_t>& ids) { wanted_golden_ = ids; }

  static std::string Qualified(const ProgramCall& c) { return c.overload.empty() ? c.op : c.op + "." + c.overload; }

 private:
  bool InModule(const ProgramCall& c) const { return modules_.count(c.module) > 0; }

  // A leaf on CPU (the reference's; the backend gets a copy).
  at::Tensor MakeLeaf(const ProgramValue& v, bool to_double);

  void Track(const at::Tensor& t, int delta);

  void Put(std::unordered_map<int64_t, at::Tensor>& table, int64_t id, const at::Tensor& t);

  void Drop(std::unordered_map<int64_t, at::Tensor>& table, int64_t id);

  // The reference's value of `id`, making a leaf on first read.
  Result<at::Tensor> Ref(int64_t id);

  // A copy on the backend's device that shares nothing with the reference.
  at::Tensor ToDevice(const at::Tensor& t);

  // The backend's value of `id` in kFree: made from the reference's leaf.
  Result<at::Tensor> Dev(int64_t id);

  // The argument stack of `call` for one side.
  using Lookup = std::function<Result<at::Tensor>(int64_t id, bool mutated)>;
  Result<torch::jit::Stack> BuildStack(const ProgramCall& call, const Op& op, const Lookup& lookup, c10::Device device,
                                       bool to_double);

  // Runs `call` on the reference (CPU) side into ref_.
  Failure RunReference(const ProgramCall& call, const Op& op, std::vector<c10::IValue>* outputs);

  // Runs `call` on the backend with `lookup`'s inputs.
  Failure RunBackend(const ProgramCall& call, const Op& op, const Lookup& lookup, std::vector<c10::IValue>* outputs);

  // Judges one call's backend outputs against the reference's (kLocate) in
  // the call engine (Note [One call engine]): the unit stage's rules, the
  // call's golden on a miss.
  Failure CompareCall(const ProgramCall& call, const Op& op, const std::vector<c10::IValue>& got,
                      const std::vector<c10::IValue>& want);

  // kLocate for a random call (Note [Random calls]): the backend's outputs
  // judged as draws.
  Failure CompareDraws(const ProgramCall& call, const std::vector<c10::IValue>& got,
                       const std::vector<c10::IValue>& want);

  static Failure DrawMismatch(const ProgramCall& call, size_t output, const std::string& problem);

  bool ReadLater(int64_t id, int64_t index) const;

  void Release(const ProgramCall& call);

  // kModule: a value a module made, read by a call outside that module, is
  // the module's output: judged as it crosses the boundary (before anything
  // writes into it), then the reader gets the reference's value.
  void HandOver(const ProgramCall& call);

  // Training: the loss (the value the backward pass starts from) and each
  // gradient's norm as the optimizer first reads it.
  void RecordTraining(const ProgramCall& call);

  // A backend that raised on a call: when the reference cannot run the call
  // either (a program traced on meta, where nothing checks an index against
  // its table, e.g. 512 positions into a 64-row position embedding), the
  // program is not replayable as captured and no backend is blamed: the
  // reference's skip is returned. Otherwise the backend's failure stands.
  Failure ReferenceFirst(const ProgramCall& call, const Op& op, const Failure& backend,
                         std::vector<c10::IValue>* want);

  Failure Step(const ProgramCall& call);

  // kShapes: one call on meta tensors (Note [Memory estimate]).
  Failure MeasureCall(const ProgramCall& call, const Op& op);

  const Program& program_;
  Backend* backend_;
  const ProgramReplayOptions& options_;
  std::unordered_map<int64_t, const ProgramValue*> leaves_;
  std::unordered_map<int64_t, int64_t> last_read_;
  std::unordered_map<int64_t, int64_t> index_limits_;  // leaf id -> the smallest dimension it indexes
  std::vector<Op> ops_;
  Mode mode_ = Mode::kFree;
  std::set<std::string> modules_;
  std::unordered_map<int64_t, std::string> dev_owner_;
  std::set<int64_t> grads_, carried_, normed_;
  bool record_initial_ = false;
  int64_t loss_id_ = -1;
  std::unordered_map<int64_t, at::Tensor> initial_;
  StepRecord step_;
  std::map<std::string, int64_t> module_calls_;
  std::unordered_map<int64_t, at::Tensor> ref_, dev_;
  struct LiveStorage {
    int refs = 0;
    int64_t bytes64 = 0;  // kShapes: its bytes in float64
  };
  std::unordered_map<const void*, LiveStorage> storages_;
  int64_t live_bytes_ = 0, peak_live_bytes_ = 0, calls_run_ = 0, live_bytes64_ = 0;
  std::vector<ShapeSample> shape_samples_;
  int64_t calls_without_shapes_ = 0;
  std::unordered_map<int64_t, int64_t> shape_bytes_;
  std::unordered_map<int64_t, const TensorSpec*> read_specs_;  // kShapes: a value's spec where a call reads it
  double backend_seconds_ = 0, reference_seconds_ = 0;
  int64_t reference_upcasts_ = 0;  // Note [Reference upcast]
  int64_t reference_rounded_ = 0;  // Note [Declared numerics]
  std::vector<Judged> judged_;
  std::set<int64_t> wanted_golden_;
  std::unordered_map<int64_t, at::Tensor> golden_;
  nlohmann::json divergent_;
  std::map<std::string, nlohmann::json> divergent_by_module_;
};

}  // namespace coverage::replay::programs
