// Fault injection of the simulated device: which rule of the configuration
// an op matches (Note [Sim fault matching]) and what the rule's fault does,
// before the op runs (unsupported, error, crash, abort, hang, slow) or to
// what it produced (wrong values, NaN). The host fallback (sim_fallback.cc)
// calls in here; the native memory kernels never do.
#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <functional>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

#include "sim/sim_internal.h"

namespace coverage::sim::internal {
namespace {

const at::Tensor* FirstTensor(const std::vector<c10::IValue>& args, at::Tensor* holder) {
  for (const auto& a : args) {
    bool found = false;
    ForEachTensor(a, [&](const at::Tensor& t) {
      if (!found && t.defined()) {
        *holder = t;
        found = true;
      }
    });
    if (found) return holder;
  }
  return nullptr;
}

int64_t CurrentAttempt() {
  const char* env = std::getenv("COVERAGE_ATTEMPT");
  if (env == nullptr || *env == '\0') return 1;
  char* end = nullptr;
  const long long v = std::strtoll(env, &end, 10);
  return (end != env && *end == '\0' && v >= 1) ? v : 1;
}

// Faults that corrupt what the op produced: floating and integer outputs + 1
// (bool outputs negated), or floating outputs all NaN (integers unchanged).
// An output that is a view of an input becomes a corrupted copy, so that
// the input itself stays intact; an output the op wrote in place is
// corrupted in place.
at::Tensor Corrupt(const at::Tensor& t, FaultKind kind, bool in_place) {
  if (!t.defined() || t.numel() == 0) return t;
  at::Tensor out = in_place ? t : t.clone();
  if (kind == FaultKind::kWrongValues) {
    if (out.scalar_type() == c10::kBool) {
      out.logical_not_();
    } else {
      out.add_(1);
    }
  } else if (out.is_floating_point() || out.is_complex()) {
    out.fill_(std::numeric_limits<double>::quiet_NaN());
  }
  return out;
}

}  // namespace

// Note [Sim fault matching]: rules are tried in order and the first that
// matches decides. A rule matches the op that reaches the backend, which is
// the op after ATen's composite decompositions (aten::linear arrives as
// aten::addmm or aten::matmul's pieces, aten::zeros as empty + zero_). Its
// "op" is a qualified name ("aten::mul.Tensor"), a bare name covering every
// overload ("aten::mul"), or "*" (every op that reaches the fallback, views
// included). dtype, shape and dim look at the first tensor argument (the
// first defined tensor of the first list that has one); a rule with one of
// them does not match an op without tensor arguments. Memory management
// (empty, empty_strided, copy_, _copy_from, _copy_from_and_resize, resize_,
// set_) is native and never faulted.
const FaultRule* MatchFault(const Config& config, const std::string& qualified, const std::string& bare,
                            const std::vector<c10::IValue>& args) {
  if (config.faults.empty()) return nullptr;
  at::Tensor holder;
  const at::Tensor* first = FirstTensor(args, &holder);
  for (const FaultRule& r : config.faults) {
    if (r.op != "*" && r.op != qualified && r.op != bare) continue;
    if ((r.dtype || r.shape || r.dim) && first == nullptr) continue;
    if (r.dtype && DTypeName(first->scalar_type()) != *r.dtype) continue;
    if (r.shape && first->sizes().vec() != *r.shape) continue;
    if (r.dim) {
      const auto sizes = first->sizes();
      if (std::find(sizes.begin(), sizes.end(), *r.dim) == sizes.end()) continue;
    }
    if (!r.attempts.empty() && std::find(r.attempts.begin(), r.attempts.end(), CurrentAttempt()) == r.attempts.end()) {
      continue;
    }
    return &r;
  }
  return nullptr;
}

// Faults that act instead of running the op.
void FaultBeforeRunning(const FaultRule& r, const std::string& qualified) {
  switch (r.fault) {
    case FaultKind::kUnsupported:
      TORCH_CHECK_NOT_IMPLEMENTED(false, "Could not run '", qualified,
                                  "' with arguments from the 'PrivateUse1' backend (simulated by sim: fault rule ",
                                  r.source, ")");
    case FaultKind::kError:
      TORCH_CHECK(false, "sim: injected error in ", qualified, " (fault rule ", r.source, ")");
    case FaultKind::kCrash:
      std::raise(SIGSEGV);
      std::abort();  // if SIGSEGV is caught and returns
    case FaultKind::kAbort:
      std::abort();
    case FaultKind::kHang:
      for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
    case FaultKind::kSlow:  // a slower kernel: right values, late
      std::this_thread::sleep_for(std::chrono::microseconds(r.slow_us));
      return;
    case FaultKind::kWrongValues:
    case FaultKind::kNan:
      return;
  }
}

void CorruptResults(const FaultRule& fault, const c10::FunctionSchema& schema, const std::vector<c10::IValue>& args,
                    torch::jit::Stack* host, const std::function<bool(const at::Tensor&)>& in_argument_memory) {
  if (fault.fault != FaultKind::kWrongValues && fault.fault != FaultKind::kNan) return;
  bool any = false;
  for (size_t r = 0; r < host->size(); ++r) {
    const bool in_place = r < schema.returns().size() && Writes(schema.returns()[r]);
    auto corrupt = [&](const at::Tensor& t) -> at::Tensor {
      any = any || t.defined();
      return Corrupt(t, fault.fault, in_place || !in_argument_memory(t));
    };
    (*host)[r] = MapTensors((*host)[r], corrupt);
  }
  if (!any) {  // an op that returns nothing: corrupt what it wrote
    for (size_t i = 0; i < args.size(); ++i) {
      if (!Writes(schema.arguments()[i])) continue;
      ForEachTensor(args[i], [&](const at::Tensor& t) {
        if (IsSim(t)) Corrupt(HostView(t), fault.fault, /*in_place=*/true);
      });
    }
  }
}

}  // namespace coverage::sim::internal
