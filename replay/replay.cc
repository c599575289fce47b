#include "replay/replay.h"

#include <algorithm>
#include <chrono>
#include <functional>
#include <optional>
#include <string_view>

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/InferenceMode.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "backends/backend.h"
#include "backends/backends.h"
#include "core/json_double.h"
#include "replay/call_engine.h"
#include "replay/compare.h"
#include "replay/composites.h"
#include "backends/dtype_map.h"
#include "replay/materialize.h"

namespace coverage::replay {
using backends::LibtorchVersion;
using backends::ToDType;
using backends::ToScalarType;
namespace {

using Clock = std::chrono::steady_clock;

double Micros(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::micro>(b - a).count();
}

bool HasFloatingTensor(const OpCase& c) {
  bool found = false;
  c.ForEachTensor([&](const TensorSpec& t) { found = found || (IsFloatingDType(t.dtype) && t.dtype != DType::kFloat64); });
  return found;
}

}  // namespace

std::string FirstLine(std::string_view msg, size_t max_len) {
  // c10::Error messages carry a C++ backtrace after the first lines.
  std::string s(msg.substr(0, max_len));
  auto pos = s.find("\nException raised from");
  if (pos != std::string::npos) s.resize(pos);
  return s;
}

bool HasSchema(const OpCase& op_case) {
  RegisterCompositeOps();
  return c10::Dispatcher::singleton().findSchema({op_case.op, op_case.overload}).has_value();
}

namespace {

// A verdict's figures into the result (none when no value was compared).
void SetFigures(const CallVerdict& v, CaseResult* res) {
  if (!v.compared) return;
  res->max_abs_err = v.max_abs_err;
  res->max_rel_err = v.max_rel_err;
  res->mismatch_frac = v.mismatch_frac;
  res->cosine = v.cosine;
  res->error_ratio = v.error_ratio;
}

}  // namespace

// What the last case's CPU side produced, kept for RunAgain of the same
// case: the inputs are seeded, so the reference and the golden would come
// out the same, and a rerun needs only the backend again. Its inputs are
// kept too, with their copies on the device: a rerun makes none of them
// again (a multi-GB weight's fill and copy cost more than a matmul on it).
// Arguments the op writes are copied afresh for every call as before; a
// backend that wrote into a read-only device copy in the first run sees
// its own damage in the rerun, which then differs: flaky, not hidden.
// The first run's outputs (on CPU) and its judgement are kept as well: a
// rerun whose outputs are the same bits is judged the same without
// comparing them again (Note [Identical outputs] in compare.cc).
struct ReplayExecutor::LastReference {
  std::string key;
  std::vector<c10::IValue> reference;
  CallGolden golden;
  std::optional<MaterializedCase> inputs;
  std::vector<at::Tensor> produced;  // per output: CPU copy, undefined for None
  bool produced_complete = false;     // every output a tensor or None
  CaseResult judged;
  int64_t rounded_operands = 0;       // the reference's, as declared (Note [Declared numerics])
};

ReplayExecutor::ReplayExecutor(std::shared_ptr<Backend> backend, ReplayOptions options)
    : backend_(std::move(backend)),
      options_(std::move(options)),
      cache_(options_.input_cache_bytes > 0 ? std::make_unique<InputCache>(options_.input_cache_bytes) : nullptr) {}
ReplayExecutor::~ReplayExecutor() = default;

CaseResult ReplayExecutor::Run(const OpCase& op_case) {
  // Backend failures are handled inside RunCase; anything escaping it is a
  // harness bug, recorded as an error of the case rather than ending the run.
  try {
    return RunCase(op_case);
  } catch (const std::exception& e) {
    CaseResult res;
    res.outcome = Outcome::kError;
    res.error = "internal error in coverage while replaying this case: " + FirstLine(e.what());
    return res;
  }
}

CaseResult ReplayExecutor::RunAgain(const OpCase& op_case) {
  const int warm = options_.warm_iterations;
  options_.warm_iterations = 0;
  again_ = true;
  CaseResult res = Run(op_case);
  again_ = false;
  options_.warm_iterations = warm;
  return res;
}

CaseResult ReplayExecutor::RunCase(const OpCase& op_case) {
  const auto t_start = Clock::now();
  CaseResult res;
  auto finish = [&]() -> CaseResult {
    res.timing.total_us = Micros(t_start, Clock::now());
    return res;
  };
  RegisterCompositeOps();
  auto handle = c10::Dispatcher::singleton().findSchema({op_case.op, op_case.overload});
  if (!handle) {
    res.outcome = Outcome::kSkipped;
    res.error = fmt::format("no operator {} in this libtorch ({})", op_case.QualifiedName(), LibtorchVersion());
    return finish();
  }
  const c10::OperatorHandle op = *handle;
  c10::InferenceMode inference_mode;
  // The CPU side of this very case, when this is its rerun; any other case
  // lets go of the last one's buffers before it allocates its own.
  std::unique_ptr<LastReference> kept;
  if (again_ && last_ && last_->key == op_case.Key()) kept = std::move(last_);
  last_.reset();

  auto t0 = Clock::now();
  Result<MaterializedCase> materialized = Status::Internal("not materialised");
  if (kept && kept->inputs) {
    materialized = std::move(*kept->inputs);
  } else {
    ++inputs_made_;
    try {
      materialized = Materialize(op_case, op.schema(), options_.seed, cache_.get());
    } catch (const std::exception& e) {
      materialized = Status::InvalidArgument(FirstLine(e.what()));
    }
  }
  if (!materialized) {
    res.outcome = Outcome::kSkipped;
    res.error = "cannot materialise inputs: " + materialized.error().message();
    return finish();
  }
  MaterializedCase& m = *materialized;
  res.timing.materialize_us += Micros(t0, Clock::now());

  const c10::Device cpu(c10::kCPU);
  // The arguments of the reference call and of the backend's first call:
  // Note [Views compared by their metadata] in compare.cc.
  std::vector<c10::IValue> reference_inputs, backend_inputs;

  // fp64 golden (Note [One call engine]): only meaningful for ops that
  // compute on floating inputs; a rerun keeps the first run's.
  CallGolden golden;
  if (kept) golden = std::move(kept->golden);
  const double golden_us_before = golden.micros();
  std::function<std::vector<c10::IValue>()> make_golden;
  if (options_.golden != GoldenMode::kNever && HasFloatingTensor(op_case)) {
    make_golden = [&]() {
      auto inputs = m.Build(cpu, /*to_double=*/true, /*verify=*/false);
      if (!inputs) throw std::runtime_error(inputs.error().message());
      torch::jit::Stack stack = *inputs;
      op.callBoxed(&stack);
      return CallOutputs(stack, *inputs, m.mutated());
    };
  }
  golden.SetMaker(std::move(make_golden));
  if (options_.golden == GoldenMode::kAlways) golden.Make();

  std::vector<c10::IValue> reference;
  int64_t rounded_operands = 0;
  if (kept) {
    reference = kept->reference;
    rounded_operands = kept->rounded_operands;
  } else {
    double build_us = 0;
    const auto tr = Clock::now();
    auto call = CallReference(
        op, m.mutated(),
        [&]() {
          const auto tm = Clock::now();
          auto inputs = m.Build(cpu, /*to_double=*/false, /*verify=*/false);
          build_us += Micros(tm, Clock::now());
          return inputs;
        },
        2000, &options_.comparison.numerics);
    res.timing.materialize_us += build_us;
    res.timing.reference_us += Micros(tr, Clock::now()) - build_us;
    if (!call) {
      res.outcome = Outcome::kSkipped;
      res.error = "the CPU reference cannot run this case: " + call.error().message();
      return finish();
    }
    if (!call->upcast) reference_inputs = call->arguments;
    reference = CallOutputs(call->after, call->arguments, m.mutated());
    rounded_operands = call->rounded_operands;
  }

  // Sparse and other non-strided outputs (`_to_sparse`) have no strided
  // storage to copy back or compare element by element: found by `coverage
  // import opinfo` as an "internal error in coverage".
  for (const c10::IValue& r : reference) {
    if (r.isTensor() && r.toTensor().defined() && r.toTensor().layout() != at::kStrided) {
      res.outcome = Outcome::kSkipped;
      res.error = fmt::format("its output has layout {}, which the unit stage does not compare (strided tensors only)",
                              c10::str(r.toTensor().layout()));
      return finish();
    }
  }

  // Backend: first call, then warm repetitions. A warm call is timed and
  // judged too: its outputs are compared with the first call's bit for bit,
  // and the first that differs is judged against the reference below (a
  // backend whose answer changes between calls; Note [Warm calls judged]).
  std::vector<c10::IValue> produced;
  std::vector<double> warm;
  // The first call's outputs on the CPU, each read from the device once (for
  // the warm comparison, a rerun's and judging).
  std::vector<at::Tensor> produced_cpu;
  struct WarmChange {
    int call = 0;  // 1-based: the first warm call is call 2
    std::vector<c10::IValue> outputs;
  };
  std::optional<WarmChange> warm_change;
  auto cpu_copy = [](const c10::IValue& v) {
    return v.isTensor() && v.toTensor().defined() ? v.toTensor().cpu() : at::Tensor();
  };
  // Counter deltas cover every backend call of the case, placing inputs on
  // the device included, and are kept when the backend fails.
  const std::map<std::string, int64_t> counters_before = backend_->Counters();
  auto record_counters = [&]() {
    // Both sorted by name: one walk.
    auto before = counters_before.begin();
    for (const auto& [name, after] : backend_->Counters()) {
      while (before != counters_before.end() && before->first < name) ++before;
      const bool known = before != counters_before.end() && before->first == name;
      const int64_t delta = after - (known ? before->second : 0);
      if (delta != 0) res.counters.emplace_hint(res.counters.end(), name, delta);
    }
  };
  try {
    const c10::Device device = backend_->device();
    const bool verify = options_.always_verify_inputs || !backend_->RespectsReadOnlyInputs();
    for (int iter = 0; iter <= options_.warm_iterations; ++iter) {
      auto tm = Clock::now();
      auto inputs = m.Build(device, /*to_double=*/false, verify);
      if (!inputs) throw std::runtime_error(inputs.error().message());
      torch::jit::Stack stack = *inputs;
      auto tc = Clock::now();
      res.timing.materialize_us += Micros(tm, tc);
      backend_->Execute(op, &stack);
      backend_->Synchronize();
      const double us = Micros(tc, Clock::now());
      res.timing.backend_us += us;
      if (iter == 0) {
        res.first_call_us = us;
        produced = CallOutputs(stack, *inputs, m.mutated());
        backend_inputs = std::move(*inputs);
        produced_cpu.resize(produced.size());
      } else {
        warm.push_back(us);
        if (!warm_change && AllStridedOrNone(produced)) {
          std::vector<c10::IValue> outputs = CallOutputs(stack, *inputs, m.mutated());
          for (size_t i = 0; i < produced.size() && i < outputs.size(); ++i) {
            if (!options_.comparison.ValuesCompared(op_case, i)) continue;  // random or uninitialised
            if (!produced_cpu[i].defined()) produced_cpu[i] = cpu_copy(produced[i]);
            if (!SameValues(produced_cpu[i], cpu_copy(outputs[i]))) {
              warm_change = WarmChange{iter + 1, std::move(outputs)};
              break;
            }
          }
        }
      }
    }
  } catch (const std::exception& e) {
    const CallFailure failure = BackendFailure(e, 2000);
    res.outcome = failure.outcome;
    res.error = failure.message;
    record_counters();
    // A backend may have written into shared inputs before it failed: check
    // them now so that no damaged input stays cached for later cases.
    if (Status intact = m.VerifyReadOnlyInputs(); !intact.ok()) res.error += "; " + intact.message();
    return finish();
  }
  record_counters();
  if (Status intact = m.VerifyReadOnlyInputs(); !intact.ok()) {
    res.outcome = Outcome::kError;
    res.error = intact.message();
    return finish();
  }
  if (!warm.empty()) {
    std::sort(warm.begin(), warm.end());
    res.warm_us = warm[warm.size() / 2];
    // Max - min rather than a percentile range: with the default 3 warm
    // calls there is nothing between them.
    if (warm.size() >= 2) res.warm_spread_us = warm.back() - warm.front();
    res.warm_min_us = warm.front();
  }

  // Compare.
  const auto tcmp = Clock::now();
  const bool produced_complete = AllStridedOrNone(produced);
  // A rerun's outputs on the CPU, each read from the device once: compared
  // with the first run's, then judged from the same copies.
  produced_cpu.resize(produced.size());
  auto same_as_first = [&]() {
    if (!kept || !kept->produced_complete || !produced_complete || kept->produced.size() != produced.size()) return false;
    for (size_t i = 0; i < produced.size(); ++i) {
      if (produced[i].isTensor() && !produced_cpu[i].defined()) produced_cpu[i] = produced[i].toTensor().cpu();
      if (!SameValues(produced_cpu[i], kept->produced[i])) return false;
    }
    return true;
  };
  if (same_as_first()) {
    // The rerun reproduced the first run bit for bit: its judgement stands.
    const CaseResult& first = kept->judged;
    res.outcome = first.outcome;
    res.error = first.error;
    res.max_abs_err = first.max_abs_err;
    res.max_rel_err = first.max_rel_err;
    res.mismatch_frac = first.mismatch_frac;
    res.cosine = first.cosine;
    res.error_ratio = first.error_ratio;
    nlohmann::json detail = nlohmann::json::parse(first.detail_json, nullptr, /*allow_exceptions=*/false);
    if (detail.is_object()) detail["rerun"] = "outputs bit-identical to the first run's: its judgement stands";
    res.detail_json = detail.is_object() ? detail.dump() : first.detail_json;
    res.timing.compare_us = Micros(tcmp, Clock::now());
    last_ = std::move(kept);
    last_->golden = std::move(golden);
    last_->inputs = std::move(m);
    return finish();
  }
  const double golden_us_judging = golden.micros();
  CallVerdict verdict = JudgeCall({.op_case = &op_case,
                                   .comparison = &options_.comparison,
                                   .backend = &produced,
                                   .reference = &reference,
                                   .schema = &op.schema(),
                                   .backend_arguments = &backend_inputs,
                                   .reference_arguments = &reference_inputs,
                                   .golden = &golden,
                                   .backend_on_cpu = &produced_cpu});
  res.outcome = verdict.outcome;
  res.error = verdict.error;
  SetFigures(verdict, &res);
  // Golden time is compute, not comparison.
  res.timing.compare_us = Micros(tcmp, Clock::now()) - (golden.micros() - golden_us_judging);
  res.timing.golden_us += golden.micros() - golden_us_before;
  nlohmann::json detail = verdict.Detail(golden.ok());
  if (warm_change) {
    // Note [Warm calls judged]
    // ~~~~~~~~~~~~~~~~~~~~~~~~
    // Warm calls are timed, and a backend can change its answer between
    // calls (a cache that returns another signature's result, a kernel
    // wrong in some calls). Each warm call's outputs whose values are
    // compared are checked against the first call's bit for bit (on the CPU
    // copies judging needs anyway); the first that differs is judged like
    // the first call. A failure the first call did not have fails the case,
    // flagged flaky, with the call named; a change that still passes (a
    // nondeterministic reduction) is recorded in the detail only.
    const CallVerdict again = JudgeCall({.op_case = &op_case,
                                         .comparison = &options_.comparison,
                                         .backend = &warm_change->outputs,
                                         .reference = &reference,
                                         .schema = &op.schema(),
                                         .golden = &golden});
    detail["warm_changed"] = {{"call", warm_change->call},
                              {"calls", options_.warm_iterations + 1},
                              {"outcome", OutcomeName(again.outcome)}};
    if (IsUnexpectedFailure(again.outcome) && !IsUnexpectedFailure(res.outcome)) {
      res.outcome = again.outcome;
      res.error = fmt::format("call {} of {} (warm) differs from the first call and fails: {}", warm_change->call,
                              options_.warm_iterations + 1, again.error);
      res.flaky = true;
      SetFigures(again, &res);
    }
  }
  if (rounded_operands > 0) {
    // Note [Declared numerics]: judged against the declared precision; the
    // error against exact fp32 is recorded beside it.
    detail["declared"] = {{"rounded_operands", rounded_operands},
                          {"fp32_operands", DeclaredNumerics::RoundingName(options_.comparison.numerics.fp32_operands)},
                          {"source", options_.comparison.numerics.source}};
    const auto te = Clock::now();
    auto exact = CallReference(
        op, m.mutated(), [&]() { return m.Build(cpu, /*to_double=*/false, /*verify=*/false); }, 2000);
    if (exact) {
      const std::vector<c10::IValue> exact_outputs = CallOutputs(exact->after, exact->arguments, m.mutated());
      double max_abs = 0, max_rel = 0;
      for (size_t i = 0; i < exact_outputs.size() && i < verdict.backend_on_cpu.size(); ++i) {
        const at::Tensor& b = verdict.backend_on_cpu[i];
        if (!b.defined() || !exact_outputs[i].isTensor() || !b.is_floating_point()) continue;
        const TensorComparison c =
            CompareTensors(b, exact_outputs[i].toTensor(), at::Tensor(), Tolerance{}, 1.0, true);
        max_abs = std::max(max_abs, c.max_abs_err);
        max_rel = std::max(max_rel, c.max_rel_err);
      }
      detail["declared"]["exact_fp32"] = {{"max_abs_err", DoubleToJson(max_abs)},
                                          {"max_rel_err", DoubleToJson(max_rel)}};
    }
    res.timing.reference_us += Micros(te, Clock::now());
  }
  res.detail_json = detail.dump();
  if (IsUnexpectedFailure(res.outcome) && res.outcome != Outcome::kUnsupported) {
    // Only a failing case is rerun (Note [Reruns]).
    last_ = std::make_unique<LastReference>();
    last_->key = op_case.Key();
    last_->rounded_operands = rounded_operands;
    last_->reference = std::move(reference);
    last_->golden = std::move(golden);
    last_->inputs = std::move(m);
    for (size_t i = 0; i < produced.size(); ++i) {
      if (!verdict.backend_on_cpu[i].defined() && produced[i].isTensor() && produced[i].toTensor().defined() &&
          produced[i].toTensor().layout() == at::kStrided) {
        verdict.backend_on_cpu[i] = produced[i].toTensor().cpu();
      }
    }
    last_->produced = std::move(verdict.backend_on_cpu);
    last_->produced_complete = produced_complete;
    last_->judged = res;
  }
  return finish();
}

}  // namespace coverage::replay
