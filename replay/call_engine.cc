#include "replay/call_engine.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include <ATen/ATen.h>
#include <fmt/format.h>

#include "backends/dtype_map.h"
#include "replay/reference_upcast.h"
#include "replay/replay.h"

// Note [One call engine]
// ~~~~~~~~~~~~~~~~~~~~~~
// A call is judged the same wherever it runs: an op case of the unit stage
// (ReplayExecutor), a call of a program whose first divergent call is
// sought (program replay's locate pass), and every later stage that judges
// single calls. The pieces both use live here and nowhere else:
//  * a backend's exception becomes an Outcome (BackendFailure): unsupported
//    when the backend says it has no kernel, else error;
//  * the reference runs on CPU, upcast when the CPU lacks an integer
//    kernel (CallReference, Note [Reference upcast]);
//  * returns are flattened one way (FlattenReturns), the way the tracer
//    records a call's outputs;
//  * each output is judged (JudgeCall): tensors by CompareTensors against
//    the dtype's tolerance and per-op overrides (Note [Tolerances]), the
//    fp64 golden made at most once per call and only when an output misses
//    (CallGolden); views of an input by their metadata (Note [Views
//    compared by their metadata]); outputs the per-op rules say are random
//    or uninitialised by shape and dtype only; numbers exactly, floating
//    ones within the f64 tolerance; anything else by equality.
// What differs between the callers is only where the arguments come from
// (materialised inputs, or a program's table of values) and in which order
// the sides run: the unit stage runs the reference first (a case the CPU
// cannot run is skipped before the backend sees it), program replay runs
// the backend first (its in-place writes need the inputs untouched).

namespace coverage::replay {
using backends::ToDType;
namespace {

using Clock = std::chrono::steady_clock;

double Micros(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::micro>(b - a).count();
}

void Flatten(const c10::IValue& v, std::vector<c10::IValue>* out) {
  if (v.isTensor()) {
    out->push_back(v.toTensor().defined() ? v : c10::IValue());
  } else if (v.isTensorList()) {
    for (const at::Tensor& t : v.toTensorVector()) out->push_back(t.defined() ? c10::IValue(t) : c10::IValue());
  } else if (v.isTuple()) {
    for (const auto& e : v.toTupleRef().elements()) Flatten(e, out);
  } else if (v.isList()) {
    for (const auto& e : v.toListRef()) Flatten(e, out);
  } else {
    out->push_back(v);
  }
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

std::string ErrorText(const std::exception& e, size_t max_len) {
  const auto* c10_error = dynamic_cast<const c10::Error*>(&e);
  return FirstLine(c10_error ? c10_error->what_without_backtrace() : e.what(), max_len);
}

}  // namespace

std::vector<c10::IValue> FlattenReturns(const torch::jit::Stack& after) {
  std::vector<c10::IValue> out;
  for (const auto& v : after) Flatten(v, &out);
  if (after.empty()) out.emplace_back();  // an op returning (): Python's None
  return out;
}

std::vector<c10::IValue> CallOutputs(const torch::jit::Stack& after, const std::vector<c10::IValue>& arguments,
                                     const std::vector<bool>& mutated) {
  if (!after.empty()) return FlattenReturns(after);
  std::vector<c10::IValue> out;
  for (size_t i = 0; i < arguments.size() && i < mutated.size(); ++i) {
    if (mutated[i]) Flatten(arguments[i], &out);
  }
  return out;
}

CallFailure BackendFailure(const std::exception& e, size_t max_len) {
  std::string msg = ErrorText(e, max_len);
  const Outcome o = LooksUnsupported(msg) ? Outcome::kUnsupported : Outcome::kError;
  return {o, std::move(msg)};
}

at::Tensor RoundFp32(const at::Tensor& t, DeclaredNumerics::Rounding rounding) {
  // The whole storage, so a view (expanded, strided, offset) stays the view it was.
  const int64_t n = static_cast<int64_t>(t.storage().nbytes() / sizeof(float));
  const at::Tensor flat = t.as_strided({n}, {1}, 0);
  at::Tensor rounded;
  if (rounding == DeclaredNumerics::Rounding::kBf16) {
    rounded = flat.to(at::kBFloat16).to(at::kFloat);
  } else {  // tf32: 10 of the 23 mantissa bits kept
    const at::Tensor bits = flat.contiguous().view(at::kInt);
    const at::Tensor lsb = bits.bitwise_right_shift(13).bitwise_and(1);
    const at::Tensor kept = (bits + 0xFFF + lsb).bitwise_and(~0x1FFF).view(at::kFloat);
    rounded = at::where(flat.isfinite(), kept, flat);
  }
  return rounded.as_strided(t.sizes(), t.strides(), t.storage_offset());
}

int64_t RoundDeclaredOperands(const c10::OperatorHandle& op, const DeclaredNumerics& numerics,
                              const std::vector<bool>& mutated, std::vector<c10::IValue>* arguments) {
  const std::vector<std::string>* operands = numerics.OperandsOf(op.schema().name());
  if (operands == nullptr) return 0;
  const auto& schema_args = op.schema().arguments();
  int64_t rounded = 0;
  for (size_t i = 0; i < arguments->size() && i < schema_args.size(); ++i) {
    if (i < mutated.size() && mutated[i]) continue;
    if (!operands->empty() &&
        std::find(operands->begin(), operands->end(), schema_args[i].name()) == operands->end()) {
      continue;
    }
    c10::IValue& v = (*arguments)[i];
    if (!v.isTensor()) continue;
    const at::Tensor t = v.toTensor();
    if (!t.defined() || t.scalar_type() != at::kFloat || t.layout() != at::kStrided) continue;
    v = RoundFp32(t, numerics.fp32_operands);
    ++rounded;
  }
  return rounded;
}

Result<ReferenceCall> CallReference(const c10::OperatorHandle& op, const std::vector<bool>& mutated,
                                    const std::function<Result<std::vector<c10::IValue>>()>& build, size_t max_len,
                                    const DeclaredNumerics* numerics) {
  ReferenceCall call;
  COV_ASSIGN_OR_RETURN(call.arguments, build());
  if (numerics != nullptr) call.rounded_operands = RoundDeclaredOperands(op, *numerics, mutated, &call.arguments);
  call.after = call.arguments;
  std::string error;
  try {
    op.callBoxed(&call.after);
    return call;
  } catch (const std::exception& e) {
    error = ErrorText(e, max_len);
  }
  // Note [Reference upcast]: an integer call the CPU has no kernel for.
  if (IsMissingIntegerKernel(error)) {
    COV_ASSIGN_OR_RETURN(call.arguments, build());
    call.after = call.arguments;
    if (CallUpcast(op, mutated, &call.after)) {
      call.upcast = true;
      return call;
    }
  }
  return Status::InvalidArgument(error);
}

void CallGolden::Make() {
  if (tried_) return;
  tried_ = true;
  if (!make_) return;
  const auto t0 = Clock::now();
  try {
    outputs_ = make_();
    ok_ = true;
  } catch (const std::exception&) {
    outputs_.clear();
    ok_ = false;  // e.g. no double kernel, or dtype arguments that forbid it
  }
  micros_ += Micros(t0, Clock::now());
}

at::Tensor CallGolden::Output(size_t i, size_t outputs) const {
  if (!ok_ || outputs_.size() != outputs || !outputs_[i].isTensor()) return at::Tensor();
  return outputs_[i].toTensor();
}

int64_t CallVerdict::FirstFailing() const {
  for (size_t i = 0; i < outputs.size(); ++i) {
    if (outputs[i].outcome != Outcome::kPass) return static_cast<int64_t>(i);
  }
  return -1;
}

nlohmann::json CallVerdict::Detail(bool golden_made) const {
  nlohmann::json details = nlohmann::json::array();
  for (size_t i = 0; i < outputs.size(); ++i) {
    const OutputVerdict& o = outputs[i];
    nlohmann::json d;
    d["output"] = i;
    if (o.tensor) {
      if (o.tensor->values_compared) {
        d["max_abs_err"] = o.tensor->max_abs_err;
        d["mismatched"] = o.tensor->mismatched;
        d["elements"] = o.tensor->elements;
      }
      d["values_compared"] = o.tensor->values_compared;
      d["golden"] = o.golden;
    }
    d["outcome"] = OutcomeName(o.outcome);
    if (!o.message.empty()) d["message"] = o.message;
    details.push_back(std::move(d));
  }
  return nlohmann::json{{"outputs", details}, {"golden", golden_made}};
}

bool AllStridedOrNone(const std::vector<c10::IValue>& outputs) {
  return std::all_of(outputs.begin(), outputs.end(), [](const c10::IValue& v) {
    return v.isNone() || (v.isTensor() && (!v.toTensor().defined() || v.toTensor().layout() == at::kStrided));
  });
}

CallVerdict JudgeCall(const CallToJudge& in) {
  const OpCase& op_case = *in.op_case;
  const ComparisonOptions& rules = *in.comparison;
  const std::vector<c10::IValue>& produced = *in.backend;
  const std::vector<c10::IValue>& reference = *in.reference;
  CallVerdict v;
  if (in.backend_on_cpu != nullptr) v.backend_on_cpu = *in.backend_on_cpu;
  v.backend_on_cpu.resize(produced.size());
  auto cpu_output = [&](size_t i) -> const at::Tensor& {
    const c10::IValue& b = produced[i];
    if (!v.backend_on_cpu[i].defined() && b.isTensor() && b.toTensor().defined() &&
        b.toTensor().layout() == at::kStrided) {
      v.backend_on_cpu[i] = b.toTensor().device().is_cpu() ? b.toTensor() : b.toTensor().cpu();
    }
    return v.backend_on_cpu[i];
  };
  if (produced.size() != reference.size()) {
    v.outcome = Outcome::kShapeMismatch;
    v.error = fmt::format("backend returned {} outputs, reference {}", produced.size(), reference.size());
    return v;
  }
  const std::vector<std::optional<size_t>> viewed =
      in.schema != nullptr ? ViewedArguments(*in.schema) : std::vector<std::optional<size_t>>();
  auto golden_of = [&](size_t i) { return in.golden ? in.golden->Output(i, reference.size()) : at::Tensor(); };
  int worst = 0;
  int64_t elements = 0, mismatched = 0;
  double max_abs = 0, max_rel = 0, cosine = 1;
  std::optional<double> ratio;
  for (size_t i = 0; i < reference.size(); ++i) {
    const c10::IValue& r = reference[i];
    const c10::IValue& b = produced[i];
    OutputVerdict o;
    if (r.isTensor() && b.isTensor()) {
      const at::Tensor& rt = r.toTensor();
      const DType dt = ToDType(rt.scalar_type()).value_or(DType::kFloat32);
      const Tolerance tol = rules.For(op_case.op, op_case.overload, dt);
      const double multiplier = rules.MultiplierFor(op_case.op, op_case.overload, dt);
      at::Tensor gt = golden_of(i);
      const bool meaningful = rules.ValuesCompared(op_case, i);
      std::optional<TensorComparison> as_view;
      if (meaningful && i < viewed.size() && viewed[i] && in.backend_arguments && in.reference_arguments &&
          *viewed[i] < in.backend_arguments->size() && *viewed[i] < in.reference_arguments->size() &&
          (*in.backend_arguments)[*viewed[i]].isTensor() && (*in.reference_arguments)[*viewed[i]].isTensor()) {
        as_view = CompareAsViews(b.toTensor(), (*in.backend_arguments)[*viewed[i]].toTensor(), rt,
                                 (*in.reference_arguments)[*viewed[i]].toTensor());
        if (as_view && gt.defined()) as_view->error_ratio = 1.0;
      }
      // Outside the reference tolerance, the golden decides (rule (b)).
      std::function<at::Tensor()> when_needed;
      if (in.golden != nullptr && !in.golden->tried()) {
        when_needed = [&]() {
          in.golden->Make();
          return golden_of(i);
        };
      }
      o.tensor = as_view ? *as_view
                         : CompareTensors(cpu_output(i).defined() ? cpu_output(i) : b.toTensor(), rt, gt, tol,
                                          multiplier, meaningful, when_needed);
      o.golden = golden_of(i).defined();  // the golden, if the comparison asked for it
      o.outcome = o.tensor->outcome;
      o.message = o.tensor->message;
      const TensorComparison& c = *o.tensor;
      if (c.values_compared) {
        elements += c.elements;
        mismatched += c.mismatched + c.nonfinite_diff;
        max_abs = std::max(max_abs, c.max_abs_err);
        max_rel = std::max(max_rel, c.max_rel_err);
        cosine = std::min(cosine, c.cosine);
        if (c.error_ratio) ratio = std::max(ratio.value_or(0.0), *c.error_ratio);
      }
    } else if (r.isTensor() != b.isTensor() || r.isNone() != b.isNone()) {
      o.outcome = Outcome::kDtypeMismatch;
      o.message = fmt::format("backend returned {}, reference {}", b.tagKind(), r.tagKind());
    } else if (r.isNone()) {
      o.outcome = Outcome::kPass;
    } else if ((r.isDouble() || r.isInt() || r.isBool()) && (b.isDouble() || b.isInt() || b.isBool())) {
      auto number = [](const c10::IValue& x) {
        return x.isDouble() ? x.toDouble() : x.isInt() ? static_cast<double>(x.toInt()) : (x.toBool() ? 1.0 : 0.0);
      };
      const double rv = number(r), bv = number(b);
      const bool exact = !r.isDouble();
      const Tolerance t = rules.For(op_case.op, op_case.overload, DType::kFloat64);
      const bool close = exact ? bv == rv : std::fabs(bv - rv) <= t.atol + t.rtol * std::fabs(rv);
      if (!close && !(std::isnan(bv) && std::isnan(rv))) {
        o.outcome = Outcome::kMismatch;
        o.message = fmt::format("scalar {} != reference {}", bv, rv);
      }
    } else if (r.tagKind() != b.tagKind()) {
      o.outcome = Outcome::kDtypeMismatch;
      o.message = fmt::format("backend returned {}, reference {}", b.tagKind(), r.tagKind());
    } else if (!(r == b)) {  // complex numbers, strings, int lists: exact
      o.outcome = Outcome::kMismatch;
      o.message = fmt::format("backend returned a different {} than the reference", r.tagKind());
    }
    if (Severity(o.outcome) > worst) {
      worst = Severity(o.outcome);
      v.outcome = o.outcome;
      v.error = reference.size() > 1 ? fmt::format("output {}: {}", i, o.message) : o.message;
    }
    v.outputs.push_back(std::move(o));
  }
  if (elements > 0) {
    v.compared = true;
    v.max_abs_err = max_abs;
    v.max_rel_err = max_rel;
    v.mismatch_frac = static_cast<double>(mismatched) / static_cast<double>(elements);
    v.cosine = cosine;
    v.error_ratio = ratio;
  }
  return v;
}

}  // namespace coverage::replay
