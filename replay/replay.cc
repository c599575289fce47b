#include "replay/replay.h"

#include <algorithm>
#include <chrono>
#include <optional>
#include <string_view>

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/InferenceMode.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "backends/backend.h"
#include "backends/backends.h"
#include "replay/compare.h"
#include "replay/composites.h"
#include "backends/dtype_map.h"
#include "replay/materialize.h"
#include "replay/reference_upcast.h"

namespace coverage::replay {
using backends::LibtorchVersion;
using backends::ToDType;
using backends::ToScalarType;
namespace {

using Clock = std::chrono::steady_clock;

double Micros(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::micro>(b - a).count();
}

// An undefined tensor (a gradient output_mask did not ask for) is None.
void Flatten(const c10::IValue& v, std::vector<c10::IValue>* out) {
  if (v.isTensor() && !v.toTensor().defined()) {
    out->emplace_back();
  } else if (v.isTensor() || v.isInt() || v.isDouble() || v.isBool() || v.isComplexDouble()) {
    out->push_back(v);
  } else if (v.isTensorList()) {
    for (const at::Tensor& t : v.toTensorVector()) out->push_back(t.defined() ? c10::IValue(t) : c10::IValue());
  } else if (v.isTuple()) {
    for (const auto& e : v.toTupleRef().elements()) Flatten(e, out);
  } else if (v.isList()) {
    for (const auto& e : v.toListRef()) Flatten(e, out);
  } else if (v.isIntList()) {
    for (int64_t i : v.toIntVector()) out->emplace_back(i);
  } else if (v.isNone()) {
    out->emplace_back();
  }
}

// The values an op produced: its returns, or, for ops that return nothing,
// the arguments it wrote to.
std::vector<c10::IValue> Outputs(const torch::jit::Stack& after, const std::vector<c10::IValue>& inputs,
                                 const std::vector<bool>& mutated) {
  std::vector<c10::IValue> out;
  for (const auto& v : after) Flatten(v, &out);
  if (out.empty()) {
    for (size_t i = 0; i < inputs.size(); ++i) {
      if (mutated[i]) Flatten(inputs[i], &out);
    }
  }
  return out;
}

// For each return of a schema whose returns are all single tensors: the
// argument it is a read-only view of (`t(Tensor(a) self) -> Tensor(a)`),
// if any. Empty when a return is a list (outputs are flattened).
std::vector<std::optional<size_t>> ViewedArguments(const c10::FunctionSchema& schema) {
  std::vector<std::optional<size_t>> out;
  for (const c10::Argument& ret : schema.returns()) {
    if (ret.type()->kind() != c10::TypeKind::TensorType) return {};
    std::optional<size_t> arg;
    const c10::AliasInfo* alias = ret.alias_info();
    if (alias != nullptr && !alias->isWrite()) {
      for (size_t j = 0; j < schema.arguments().size(); ++j) {
        const c10::AliasInfo* a = schema.arguments()[j].alias_info();
        if (a != nullptr && !a->isWrite() && a->beforeSets() == alias->beforeSets()) arg = j;
      }
    }
    out.push_back(arg);
  }
  return out;
}

int Severity(Outcome o) {
  switch (o) {
    case Outcome::kPass: return 0;
    case Outcome::kMismatch: return 1;
    case Outcome::kNonFiniteMismatch: return 2;
    case Outcome::kDtypeMismatch: return 3;
    case Outcome::kShapeMismatch: return 4;
    default: return 5;
  }
}

bool HasFloatingTensor(const OpCase& c) {
  bool found = false;
  c.ForEachTensor([&](const TensorSpec& t) { found = found || (IsFloatingDType(t.dtype) && t.dtype != DType::kFloat64); });
  return found;
}

}  // namespace

bool ValuesMeaningful(const OpCase& c, size_t output) {
  static constexpr std::string_view kNeverMeaningful[] = {
      "aten::empty", "aten::empty_like", "aten::empty_strided", "aten::new_empty", "aten::new_empty_strided",
      "aten::empty_permuted",  // found by `coverage import opinfo`: 12 of its samples "failed" on cpu
      "aten::rand", "aten::rand_like", "aten::randn", "aten::randn_like", "aten::randint", "aten::randint_like",
      "aten::randperm", "aten::bernoulli", "aten::bernoulli_", "aten::multinomial", "aten::normal",
      "aten::normal_", "aten::uniform_", "aten::exponential_", "aten::random_", "aten::_fused_dropout",
      "aten::resize_", "aten::set_",
      // found by `coverage import opinfo`: geometric_ "failed" on sim (its generator is not the CPU's)
      "aten::geometric_", "aten::cauchy_", "aten::log_normal_", "aten::poisson", "aten::binomial",
      "aten::_standard_gamma", "aten::_sample_dirichlet"};
  for (auto op : kNeverMeaningful) {
    if (c.op == op) return false;
  }
  // Random only in training mode.
  auto training = [&](std::string_view name) {
    for (const auto& a : c.args) {
      if (a.name == name && a.kind == Argument::Kind::kBool) return a.b;
    }
    return false;
  };
  if (c.op == "aten::dropout" || c.op == "aten::native_dropout" || c.op == "aten::feature_dropout" ||
      c.op == "aten::alpha_dropout" || c.op == "aten::dropout_") {
    return !training("train");
  }
  // found by `coverage import opinfo`: the slopes of rrelu's negative part are drawn at random
  if (c.op == "aten::rrelu" || c.op == "aten::rrelu_" || c.op == "aten::rrelu_with_noise" ||
      c.op == "aten::rrelu_with_noise_" || c.op == "aten::rrelu_with_noise_functional") {
    return !training("training");
  }
  // found by `coverage import opinfo`: _ctc_loss's second output, log_alpha,
  // is written only up to each input's length and target's length; the rest is
  // whatever the allocation held.
  if (c.op == "aten::_ctc_loss" && output == 1) return false;
  return true;
}

bool LooksUnsupported(std::string_view msg) {
  return msg.find("Could not run") != std::string_view::npos ||
         msg.find("not implemented for") != std::string_view::npos ||
         msg.find("NotImplementedError") != std::string_view::npos ||
         msg.find("is not supported") != std::string_view::npos;
}

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
  std::vector<c10::IValue> reference, golden;
  bool golden_ok = false, golden_tried = false;
  std::optional<MaterializedCase> inputs;
  std::vector<at::Tensor> produced;  // per output: CPU copy, undefined for None
  bool produced_complete = false;     // every output a tensor or None
  CaseResult judged;
};

namespace {

// True when every output is a strided tensor or None (undefined): the
// outputs a rerun can be matched with bit for bit.
bool AllStridedOrNone(const std::vector<c10::IValue>& outputs) {
  return std::all_of(outputs.begin(), outputs.end(), [](const c10::IValue& v) {
    return v.isNone() || (v.isTensor() && (!v.toTensor().defined() || v.toTensor().layout() == at::kStrided));
  });
}

}  // namespace

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
  // Runs the op once on CPU with freshly built inputs.
  auto run_cpu = [&](bool to_double, double* compute_us) -> std::vector<c10::IValue> {
    auto tm = Clock::now();
    auto inputs = m.Build(cpu, to_double, /*verify=*/false);
    if (!inputs) throw std::runtime_error(inputs.error().message());
    if (!to_double) reference_inputs = *inputs;
    torch::jit::Stack stack = *inputs;
    auto tc = Clock::now();
    res.timing.materialize_us += Micros(tm, tc);
    op.callBoxed(&stack);
    *compute_us += Micros(tc, Clock::now());
    return Outputs(stack, *inputs, m.mutated());
  };

  // fp64 golden: only meaningful for ops that compute on floating inputs.
  std::vector<c10::IValue> golden;
  bool golden_ok = false, golden_tried = false;
  if (kept) {
    golden = kept->golden;
    golden_ok = kept->golden_ok;
    golden_tried = kept->golden_tried;
  }
  auto run_golden = [&]() {
    if (golden_tried) return;
    golden_tried = true;
    if (options_.golden == GoldenMode::kNever || !HasFloatingTensor(op_case)) return;
    try {
      golden = run_cpu(/*to_double=*/true, &res.timing.golden_us);
      golden_ok = true;
    } catch (const std::exception&) {
      golden_ok = false;  // e.g. no double kernel, or dtype arguments that forbid it
    }
  };
  if (options_.golden == GoldenMode::kAlways) run_golden();

  std::vector<c10::IValue> reference;
  try {
    if (kept) {
      reference = kept->reference;
    } else {
      reference = run_cpu(/*to_double=*/false, &res.timing.reference_us);
    }
  } catch (const std::exception& e) {
    // Note [Reference upcast]: an integer call the CPU has no kernel for.
    bool upcast = false;
    if (IsMissingIntegerKernel(e.what())) {
      auto inputs = m.Build(cpu, /*to_double=*/false, /*verify=*/false);
      if (inputs) {
        torch::jit::Stack stack = *inputs;
        const auto tc = Clock::now();
        upcast = CallUpcast(op, m.mutated(), &stack);
        res.timing.reference_us += Micros(tc, Clock::now());
        if (upcast) reference = Outputs(stack, *inputs, m.mutated());
      }
    }
    if (!upcast) {
      res.outcome = Outcome::kSkipped;
      res.error = "the CPU reference cannot run this case: " + FirstLine(e.what());
      return finish();
    }
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

  // Backend: first call, then warm repetitions.
  std::vector<c10::IValue> produced;
  std::vector<double> warm;
  // Counter deltas cover every backend call of the case, placing inputs on
  // the device included, and are kept when the backend fails.
  const std::map<std::string, int64_t> counters_before = backend_->Counters();
  auto record_counters = [&]() {
    for (const auto& [name, after] : backend_->Counters()) {
      auto it = counters_before.find(name);
      const int64_t delta = after - (it == counters_before.end() ? 0 : it->second);
      if (delta != 0) res.counters[name] = delta;
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
        produced = Outputs(stack, *inputs, m.mutated());
        backend_inputs = std::move(*inputs);
      } else {
        warm.push_back(us);
      }
    }
  } catch (const std::exception& e) {
    const auto* c10_error = dynamic_cast<const c10::Error*>(&e);
    const std::string msg = FirstLine(c10_error ? c10_error->what_without_backtrace() : e.what());
    res.outcome = LooksUnsupported(msg) ? Outcome::kUnsupported : Outcome::kError;
    res.error = msg;
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
  auto tcmp = Clock::now();
  // The backend's outputs on CPU, each read from the device at most once
  // (views judged by their metadata are not read), kept when the case is to
  // be rerun.
  std::vector<at::Tensor> produced_cpu(produced.size());
  auto cpu_output = [&](size_t i) -> const at::Tensor& {
    const c10::IValue& v = produced[i];
    if (!produced_cpu[i].defined() && v.isTensor() && v.toTensor().defined() && v.toTensor().layout() == at::kStrided) {
      produced_cpu[i] = v.toTensor().device().is_cpu() ? v.toTensor() : v.toTensor().cpu();
    }
    return produced_cpu[i];
  };
  const bool produced_complete = AllStridedOrNone(produced);
  auto same_as_first = [&]() {
    if (!kept || !kept->produced_complete || !produced_complete || kept->produced.size() != produced.size()) return false;
    for (size_t i = 0; i < produced.size(); ++i) {
      if (!SameValues(cpu_output(i), kept->produced[i])) return false;
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
    last_->inputs = std::move(m);
    return finish();
  }
  const std::vector<std::optional<size_t>> viewed = ViewedArguments(op.schema());
  nlohmann::json details = nlohmann::json::array();
  if (produced.size() != reference.size()) {
    res.outcome = Outcome::kShapeMismatch;
    res.error = fmt::format("backend returned {} outputs, reference {}", produced.size(), reference.size());
  } else {
    int worst = 0;
    int64_t elements = 0, mismatched = 0;
    double max_abs = 0, max_rel = 0, cosine = 1;
    std::optional<double> ratio;
    for (size_t i = 0; i < reference.size(); ++i) {
      const c10::IValue& r = reference[i];
      const c10::IValue& b = produced[i];
      nlohmann::json d;
      d["output"] = i;
      Outcome o = Outcome::kPass;
      std::string why;
      if (r.isTensor() && b.isTensor()) {
        const at::Tensor& rt = r.toTensor();
        const DType dt = ToDType(rt.scalar_type()).value_or(DType::kFloat32);
        const Tolerance tol = options_.comparison.For(op_case.op, op_case.overload, dt);
        const double multiplier = options_.comparison.MultiplierFor(op_case.op, op_case.overload, dt);
        auto golden_of = [&]() {
          at::Tensor gt;
          if (golden_ok && golden.size() == reference.size() && golden[i].isTensor()) gt = golden[i].toTensor();
          return gt;
        };
        at::Tensor gt = golden_of();
        const bool meaningful = ValuesMeaningful(op_case, i);
        std::optional<TensorComparison> as_view;
        if (meaningful && i < viewed.size() && viewed[i] && *viewed[i] < backend_inputs.size() &&
            *viewed[i] < reference_inputs.size() && backend_inputs[*viewed[i]].isTensor() &&
            reference_inputs[*viewed[i]].isTensor()) {
          as_view = CompareAsViews(b.toTensor(), backend_inputs[*viewed[i]].toTensor(), rt,
                                   reference_inputs[*viewed[i]].toTensor());
          if (as_view && gt.defined()) as_view->error_ratio = 1.0;
        }
        // Outside the reference tolerance, the golden decides (rule (b)).
        auto golden_when_needed = [&]() {
          const auto tg = Clock::now();
          run_golden();
          tcmp += Clock::now() - tg;  // golden time is compute, not comparison
          return golden_of();
        };
        TensorComparison c =
            as_view ? *as_view
                    : CompareTensors(cpu_output(i).defined() ? cpu_output(i) : b.toTensor(), rt, gt, tol, multiplier,
                                     meaningful, golden_tried ? std::function<at::Tensor()>() : golden_when_needed);
        gt = golden_of();  // the golden, if the comparison asked for it
        o = c.outcome;
        why = c.message;
        if (c.values_compared) {
          elements += c.elements;
          mismatched += c.mismatched + c.nonfinite_diff;
          max_abs = std::max(max_abs, c.max_abs_err);
          max_rel = std::max(max_rel, c.max_rel_err);
          cosine = std::min(cosine, c.cosine);
          if (c.error_ratio) ratio = std::max(ratio.value_or(0.0), *c.error_ratio);
          d["max_abs_err"] = c.max_abs_err;
          d["mismatched"] = c.mismatched;
          d["elements"] = c.elements;
        }
        d["values_compared"] = c.values_compared;
        d["golden"] = gt.defined();
      } else if (r.isTensor() != b.isTensor() || r.isNone() != b.isNone()) {
        o = Outcome::kDtypeMismatch;
        why = fmt::format("backend returned {}, reference {}", b.tagKind(), r.tagKind());
      } else if (r.isNone()) {
        o = Outcome::kPass;
      } else if ((r.isDouble() || r.isInt() || r.isBool()) && (b.isDouble() || b.isInt() || b.isBool())) {
        auto number = [](const c10::IValue& v) {
          return v.isDouble() ? v.toDouble() : v.isInt() ? static_cast<double>(v.toInt()) : (v.toBool() ? 1.0 : 0.0);
        };
        const double rv = number(r), bv = number(b);
        const bool exact = !r.isDouble();
        const Tolerance t = options_.comparison.For(op_case.op, op_case.overload, DType::kFloat64);
        const bool close = exact ? bv == rv : std::fabs(bv - rv) <= t.atol + t.rtol * std::fabs(rv);
        if (!close && !(std::isnan(bv) && std::isnan(rv))) {
          o = Outcome::kMismatch;
          why = fmt::format("scalar {} != reference {}", bv, rv);
        }
      } else if (r.tagKind() != b.tagKind()) {
        o = Outcome::kDtypeMismatch;
        why = fmt::format("backend returned {}, reference {}", b.tagKind(), r.tagKind());
      } else if (!(r == b)) {  // complex numbers, strings: exact
        o = Outcome::kMismatch;
        why = fmt::format("backend returned a different {} than the reference", r.tagKind());
      }
      d["outcome"] = OutcomeName(o);
      if (!why.empty()) d["message"] = why;
      details.push_back(std::move(d));
      if (Severity(o) > worst) {
        worst = Severity(o);
        res.outcome = o;
        res.error = reference.size() > 1 ? fmt::format("output {}: {}", i, why) : why;
      }
    }
    if (elements > 0) {
      res.max_abs_err = max_abs;
      res.max_rel_err = max_rel;
      res.mismatch_frac = static_cast<double>(mismatched) / static_cast<double>(elements);
      res.cosine = cosine;
      res.error_ratio = ratio;
    }
  }
  res.timing.compare_us = Micros(tcmp, Clock::now());
  res.detail_json = nlohmann::json{{"outputs", details}, {"golden", golden_ok}}.dump();
  if (IsUnexpectedFailure(res.outcome) && res.outcome != Outcome::kUnsupported) {
    // Only a failing case is rerun (Note [Reruns]).
    last_ = std::make_unique<LastReference>();
    last_->key = op_case.Key();
    last_->reference = std::move(reference);
    last_->golden = std::move(golden);
    last_->golden_ok = golden_ok;
    last_->golden_tried = golden_tried;
    last_->inputs = std::move(m);
    for (size_t i = 0; i < produced.size(); ++i) cpu_output(i);
    last_->produced = std::move(produced_cpu);
    last_->produced_complete = produced_complete;
    last_->judged = res;
  }
  return finish();
}

}  // namespace coverage::replay
