// ModelSession: one execution of a built model (model_builder.h), and the
// dispatch routing that sends a model's ops to a backend under test.
//
// The families of the model builder write their forward pass once. What the
// execution does besides running it is the session's business:
//   - capture: an OpRecorder records between Start() and Stop();
//   - backends: a DispatchRoute sends the ops (all of them, or only those
//     inside chosen modules) to a Backend, see Note [Dispatch routing];
//   - training: weights require grad, are created once and reused by later
//     calls (the same weights for N optimizer steps), and inference mode is
//     off;
//   - golden: weights are rounded to the profile's dtype, then widened, so
//     an fp64 run computes the same model exactly.
// The forward pass hands its final tensor to Stop(output); without one, the
// output is the last op's (see Note [Module outputs]).
//
// Torch-facing; internal to runners (stages use model_check.h).
// Thread safety: a session is used by the thread that runs the model.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include "runners/backend.h"
#include "runners/capture.h"

namespace coverage::runners {

class Backend;
class ModelSession;

// Note [Dispatch routing]
// ~~~~~~~~~~~~~~~~~~~~~~~
// A model is run "on a backend" by routing its ATen calls, not by porting
// the builder to devices: while a DispatchRouteScope is alive, a boxed
// fallback on the dispatcher's TESTING_ONLY_GenericMode key (a
// functionality key above Autograd, present in libtorch 1.13 and 2.x, which
// no production code enables) receives every op called on this thread,
// including the ones the autograd engine calls for backward. For a routed
// op it moves tensor arguments to the backend's device, calls
// Backend::Execute (the unit stage's seam), copies results of arguments the
// schema says are written back into the caller's tensors, and leaves the
// returns on the backend's device, so the next op reads them there. Ops
// that are not routed run on ATen's CPU kernels. Composite ops (aten::linear)
// reach the backend whole, as they would from Python.
struct DispatchRoute {
  Backend* backend = nullptr;  // null: nothing is routed (observe only)
  // Which module paths route to the backend; empty: every op is routed.
  std::function<bool(const std::string& module_path)> routed;
  ModelSession* session = nullptr;  // module paths and op outputs
  // Filled in by the fallback.
  int64_t routed_ops = 0;
  std::map<std::string, int64_t> op_counts;  // routed ops by qualified name
};

class DispatchRouteScope {
 public:
  explicit DispatchRouteScope(DispatchRoute* route);
  ~DispatchRouteScope();
  DispatchRouteScope(const DispatchRouteScope&) = delete;
  DispatchRouteScope& operator=(const DispatchRouteScope&) = delete;

 private:
  DispatchRoute* previous_;
  DispatchRoute* previous_global_;
  c10::impl::IncludeDispatchKeyGuard include_;
};

// Thrown by the fallback to end a run early once the session has what it
// watches for (ModelSession::stop_when_watched); the session records it.
struct SessionStopped : std::exception {
  const char* what() const noexcept override { return "session stopped after its watched module"; }
};

// A backend on the meta device, for capturing the shapes of a model too big
// to build (BuildPlan::meta): ops run on meta tensors where ATen has a meta
// kernel; an op without one (1.13 has none for layer_norm, conv2d, one_hot,
// nonzero, item, ...) runs on zero-filled CPU tensors of its arguments'
// shapes and returns meta tensors of its results' shapes, and
// aten::embedding is shaped directly (its weight can be the largest tensor
// of a model). Data-dependent shapes (MoE routing) therefore follow zero
// inputs.
class MetaShapeBackend final : public Backend {
 public:
  std::string name() const override { return "meta"; }
  c10::Device device() const override { return c10::Device(c10::kMeta); }
  void Execute(const c10::OperatorHandle& op, torch::jit::Stack* stack) override;
  int64_t fallbacks = 0;  // ops that ran on zero-filled CPU tensors
};

// "attention", "mlp", "norm", "embedding", "stem", "head" or "other", from
// the last component of a module path (Note [Module kinds] in model_session.cc).
std::string ModuleKindOf(const std::string& module_path);

enum class WeightInit { kRandom, kOnes, kZeros };

class ModelSession {
 public:
  explicit ModelSession(OpRecorder* recorder = nullptr) : recorder_(recorder) {}

  // What the run does; set before RunModel.
  bool training = false;                           // grads on, weights kept for the next call
  std::optional<at::ScalarType> weight_rounding;   // golden: round weights to this dtype first
  c10::Device device = c10::Device(c10::kCPU);     // where weights are placed
  DispatchRoute* route = nullptr;                  // active between Start() and Stop()
  // Watching: the first module of each watched kind keeps its output
  // (Note [Module outputs]); empty: nothing is watched.
  std::function<bool(const std::string& module_path)> watch;
  bool stop_when_watched = false;  // stop the run once a watched module has finished

  // Called by RunModel before the family runs; `seed` seeds the weights.
  void BeginRun(uint64_t seed);

  // The forward bracket (families call these).
  void Start();
  void Stop(const at::Tensor& output = at::Tensor());
  void SetModulePath(std::string path);
  const std::string& module_path() const { return path_; }
  void EnterModule(const std::string& path, const std::string& kind = "");
  void ExitModule(const std::string& path);

  // A weight of `shape`: made on the first call, the same tensor again on
  // later calls of a training session.
  at::Tensor Weight(WeightInit init, at::IntArrayRef shape, at::ScalarType dtype);

  // The module kind of `path`: what its family said, else ModuleKindOf(path).
  std::string KindOf(const std::string& path) const;

  // Called by the dispatch fallback with each op's returns.
  void NoteOpOutput(const at::Tensor& output);
  // Results.
  const at::Tensor& output() const { return output_; }
  const std::vector<at::Tensor>& weights() const { return weights_; }
  // Watched modules: path -> output, in the order they finished.
  const std::vector<std::pair<std::string, at::Tensor>>& watched() const { return watched_; }
  bool stopped() const { return stopped_; }
  void MarkStopped() { stopped_ = true; }
  bool ShouldStop() const { return stop_when_watched && !watched_.empty(); }

 private:
  OpRecorder* recorder_;
  std::string path_;
  at::Tensor output_;
  at::Tensor last_op_output_;
  std::optional<at::Generator> generator_;
  std::vector<at::Tensor> weights_;
  size_t next_weight_ = 0;
  std::vector<std::pair<std::string, at::Tensor>> watched_;
  std::map<std::string, std::string> kinds_;  // path -> kind its family gave
  std::optional<DispatchRouteScope> route_scope_;
  bool stopped_ = false;
};

}  // namespace coverage::runners
