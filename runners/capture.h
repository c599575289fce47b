// Op capture: records the ATen calls made while a module runs, as OpCases.
//
// An OpRecorder installs a thread-local at::RecordFunction observer (with
// inputs and outputs) for as long as it is recording. Every call is seen with
// its nesting depth: a call made from inside another op (aten::linear calling
// aten::addmm) belongs to its parent. Calls up to `max_depth` are kept (0 =
// top-level only, the default: replaying the parent exercises the children).
// Identical calls (same canonical case, module, depth and parent) are merged
// with a count. Torch-free interface.
//
// Thread safety: an OpRecorder observes the thread that called Start() and
// must be used from that thread only; one recorder records per thread at a
// time (starting a second one is a programming error and aborts).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/op_case.h"

namespace coverage::runners {

struct CaptureOptions {
  int max_depth = 0;  // keep calls at nesting depth <= max_depth
};

struct CapturedCall {
  OpCase op_case;
  std::string key;          // op_case.Key()
  std::string module_path;  // scope set with ModuleScope, e.g. "layers.0.mlp"
  std::string parent_op;    // for depth > 0: the enclosing op
  int depth = 0;
  int64_t count = 0;        // identical calls merged
  double flops = 0;         // estimated (core/cost.h)
  double bytes = 0;
};

class OpRecorder {
 public:
  explicit OpRecorder(CaptureOptions options = {});
  ~OpRecorder();  // stops recording
  OpRecorder(const OpRecorder&) = delete;
  OpRecorder& operator=(const OpRecorder&) = delete;

  void Start();
  void Stop();
  void SetModulePath(std::string path);
  const std::string& module_path() const;

  // Merged calls recorded so far, in first-seen order; clears them.
  std::vector<CapturedCall> TakeCalls();
  // Calls that could not be described (e.g. a Generator argument), by reason.
  const std::map<std::string, int64_t>& skipped() const;

  struct State;  // implementation detail, shared with the observer callbacks

 private:
  std::unique_ptr<State> state_;
};

// Sets the recorder's module path for the lifetime of the scope.
class ModuleScope {
 public:
  ModuleScope(OpRecorder* recorder, std::string path);
  ~ModuleScope();

 private:
  OpRecorder* recorder_;
  std::string previous_;
};

}  // namespace coverage::runners
