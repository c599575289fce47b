// Backend: where the op under test runs, in the manner of an ONNX Runtime
// execution provider: a few required methods, optional hooks with harmless
// defaults. A new backend touches no framework code: implement this class
// and register a factory in a BackendRegistry (backends.h).
//
// This header exposes torch types and is for backend implementers, replay/
// and tests; stages and apps use backends.h, which is torch-free.
//
// Thread safety: a Backend is used from one thread at a time.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <c10/core/Device.h>

namespace coverage::backends {

class Backend {
 public:
  virtual ~Backend() = default;

  // Stable name, stored with each run ("cpu", "fake", "privateuse1:neuron").
  virtual std::string name() const = 0;
  // Device that inputs are placed on before Execute.
  virtual c10::Device device() const = 0;

  // Runs `op` on `stack` (inputs already on device()), leaving its returns
  // on the stack, like OperatorHandle::callBoxed. Throws c10::Error (or any
  // std::exception) on failure; the replay loop turns that into an Outcome.
  virtual void Execute(const c10::OperatorHandle& op, torch::jit::Stack* stack) { op.callBoxed(stack); }

  // Optional hooks.
  // Waits for queued work (asynchronous devices); timing calls it.
  virtual void Synchronize() {}
  // Version string of the backend's software stack, stored with each run.
  virtual std::string Version() const { return ""; }
  // Cumulative counters since the process started (compiles, cache hits,
  // fallbacks, allocations, ...). Replay records per case how much each one
  // grew while the case ran on the backend (CaseResult::counters).
  virtual std::map<std::string, int64_t> Counters() const { return {}; }
  // How the backend computes where it differs from exact fp32 on purpose
  // (Note [Declared numerics] in replay/numerics.cc), as JSON; "" for none.
  // A file configs/numerics/<name>.json, when there is one, is used instead.
  virtual std::string Numerics() const { return ""; }
  // True only for kernels known never to write into arguments the schema
  // marks read-only (ATen's own CPU kernels, which also compute the
  // reference). Inputs a CPU-device backend reads in place are otherwise
  // fingerprinted and checked after its runs (MaterializedCase::VerifyReadOnlyInputs).
  virtual bool RespectsReadOnlyInputs() const { return false; }
};

}  // namespace coverage::backends
