#include "runners/program_replay.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <unordered_map>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/InferenceMode.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "runners/backend.h"
#include "runners/compare.h"
#include "runners/dtype_map.h"
#include "runners/materialize.h"
#include "runners/replay.h"

// Note [Program replay]
// ~~~~~~~~~~~~~~~~~~~~~
// A program is a list of ATen calls connected by value ids (the tracer's
// format, capture/tracer/README.md). Replay keeps a table from value id to
// tensor per side (reference on CPU, backend on its device) and runs the
// calls in order:
//  * Leaves are made when first read, deterministically from the seed:
//    parameters and buffers by their recorded init rule (normal, uniform,
//    ones, zeros; "other" rules and inputs by the value domain, Note [Value
//    domains]), constants that were Python numbers as wrapped numbers with
//    that value. The backend's leaves are copies of the reference's.
//  * A call's tensor arguments come from the table by id; everything else
//    from its op case (dtypes, sizes, scalars; device arguments name the
//    side's device). In-place and out= calls return their argument's id, so
//    writes and views behave as in the model.
//  * Each value is dropped after its last read (liveness from the program),
//    so the peak is the program's largest live set, not its total.
//  * Outputs no later call reads are the program's outputs: logits, loss,
//    updated parameters, and dead ends such as an unused second return.
//    They are judged as the model stage judges (Note [Model verdicts]); a
//    mismatch asks the fp64 golden (floating leaves and dtype arguments
//    made float64) whether the CPU is just as far off.
//  * A backend output of another shape than the reference's in the middle
//    of the program (a data-dependent op such as nonzero, or a wrong
//    kernel) stops the replay as shape_divergence naming the call: later
//    calls' recorded sizes no longer fit.
//  * When the free-running replay fails, a second pass feeds every call on
//    the backend the reference's inputs and compares its outputs with the
//    reference's under the unit stage's rules (golden on a miss): the first
//    call that misses is the first divergent call, stored with its op case
//    key so that a failing model links to the op case that broke it.

namespace coverage::runners {
namespace {

using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

uint64_t Hash(std::string_view text, uint64_t seed) {
  uint64_t h = 0xcbf29ce484222325ULL ^ (seed * 0x9e3779b97f4a7c15ULL);
  for (unsigned char c : text) h = (h ^ c) * 0x100000001b3ULL;
  return h;
}

bool IsScalarTypeArg(const c10::Argument& a) {
  c10::TypePtr t = a.type();
  if (auto opt = t->cast<c10::OptionalType>()) t = opt->getElementType();
  return t->kind() == c10::TypeKind::ScalarTypeType;
}

bool IsOptionalTensorListArg(const c10::Argument& a) {
  auto list = a.type()->cast<c10::ListType>();
  return list && list->getElementType()->cast<c10::OptionalType>() != nullptr;
}

// A call's returns in the tracer's order (pytree leaves: None and undefined
// tensors have none).
void FlattenReturns(const c10::IValue& v, std::vector<c10::IValue>* out) {
  if (v.isTensor()) {
    if (v.toTensor().defined()) out->push_back(v);
  } else if (v.isTensorList()) {
    for (const at::Tensor& t : v.toTensorVector()) {
      if (t.defined()) out->emplace_back(t);
    }
  } else if (v.isTuple()) {
    for (const auto& e : v.toTupleRef().elements()) FlattenReturns(e, out);
  } else if (v.isList()) {
    for (const auto& e : v.toListRef()) FlattenReturns(e, out);
  } else if (v.isNone()) {
    // nothing
  } else {
    out->push_back(v);
  }
}

struct Op {
  c10::OperatorHandle handle;
  std::vector<bool> mutated;  // per schema argument
};

// What the pass does with each call (Note [Program replay]).
enum class Mode {
  kFree,    // reference and backend, backend outputs feed the backend
  kGolden,  // the reference only, in float64
  kLocate,  // reference; each call also on the backend from the reference's inputs
  kModule,  // reference; the module's calls also on the backend, from the backend's values inside it
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
};

class Replayer {
 public:
  Replayer(const Program& program, Backend* backend, const ProgramReplayOptions& options)
      : program_(program), backend_(backend), options_(options) {
    for (const auto& v : program_.values) leaves_[v.id] = &v;
    last_read_.reserve(program_.calls.size() * 2);
    for (const auto& c : program_.calls) {
      for (int64_t id : c.inputs) {
        if (id >= 0) last_read_[id] = c.index;
      }
    }
  }

  // Resolves every call's operator once; a call that cannot be replayed
  // makes the whole program unreplayable (kSkipped with the reason).
  Failure Prepare() {
    ops_.clear();
    ops_.reserve(program_.calls.size());
    for (const auto& c : program_.calls) {
      if (!c.op_case) {
        return {Outcome::kSkipped, fmt::format("call {} ({}) cannot be replayed: {}", c.index, Qualified(c), c.unsupported), c.index};
      }
      auto handle = c10::Dispatcher::singleton().findSchema({c.op, c.overload});
      if (!handle) {
        return {Outcome::kSkipped, fmt::format("call {}: no operator {} in this libtorch", c.index, Qualified(c)), c.index};
      }
      Op op{*handle, {}};
      const auto& args = handle->schema().arguments();
      if (args.size() != c.op_case->args.size()) {
        return {Outcome::kSkipped,
                fmt::format("call {} ({}) has {} arguments, the schema {}", c.index, Qualified(c), c.op_case->args.size(),
                            args.size()),
                c.index};
      }
      for (const auto& a : args) op.mutated.push_back(a.alias_info() != nullptr && a.alias_info()->isWrite());
      ops_.push_back(std::move(op));
    }
    return {};
  }

  // One pass. `module` selects the calls of kModule.
  Failure Run(Mode mode, const std::string& module = "") {
    mode_ = mode;
    module_ = module;
    ref_.clear();
    dev_.clear();
    storages_.clear();
    live_bytes_ = 0;
    judged_.clear();
    c10::InferenceMode inference_mode;
    for (const auto& call : program_.calls) {
      Failure f = Step(call);
      ++calls_run_;
      if (f.outcome != Outcome::kPass) return f;
    }
    return {};
  }

  const std::vector<Judged>& judged() const { return judged_; }
  int64_t peak_live_bytes() const { return peak_live_bytes_; }
  int64_t calls_run() const { return calls_run_; }
  double backend_seconds() const { return backend_seconds_; }
  double reference_seconds() const { return reference_seconds_; }
  // The first divergent call of a kLocate pass.
  nlohmann::json divergent() const { return divergent_; }
  // kGolden: the fp64 value of a judged id.
  at::Tensor golden(int64_t id) const {
    auto it = golden_.find(id);
    return it == golden_.end() ? at::Tensor() : it->second;
  }
  bool module_ran() const { return module_calls_ > 0; }

  static std::string Qualified(const ProgramCall& c) { return c.overload.empty() ? c.op : c.op + "." + c.overload; }

 private:
  bool InModule(const ProgramCall& c) const {
    return c.module == module_ || (c.module.size() > module_.size() && c.module.compare(0, module_.size(), module_) == 0 &&
                                   c.module[module_.size()] == '.');
  }

  // A leaf on CPU (the reference's; the backend gets a copy).
  at::Tensor MakeLeaf(const ProgramValue& v, bool to_double) {
    const TensorSpec& spec = *v.tensor;
    const uint64_t seed = options_.check.seed;
    at::Tensor t;
    const at::ScalarType st = ToScalarType(spec.dtype);
    if (!v.scalar_json.empty()) {
      const auto j = nlohmann::json::parse(v.scalar_json, nullptr, false);
      double number = 0;
      if (j.is_object()) {
        if (j.contains("d") && j["d"].is_number()) number = j["d"].get<double>();
        if (j.contains("d") && j["d"].is_string()) {
          const std::string s = j["d"];
          number = s == "nan" ? NAN : s == "-inf" ? -INFINITY : INFINITY;
        }
        if (j.contains("i") && j["i"].is_number()) number = j["i"].get<double>();
        if (j.contains("b") && j["b"].is_boolean()) number = j["b"].get<bool>() ? 1 : 0;
      }
      t = at::scalar_tensor(number, at::TensorOptions().dtype(st));
      t.unsafeGetTensorImpl()->set_wrapped_number(true);
    } else {
      std::string rule;
      nlohmann::json init;
      if (!v.init_json.empty()) {
        init = nlohmann::json::parse(v.init_json, nullptr, false);
        if (init.is_object()) rule = init.value("rule", "");
      }
      const bool floating = IsFloatingDType(spec.dtype);
      if (floating && (rule == "normal" || rule == "uniform") && spec.storage_offset == 0) {
        at::Generator gen = at::detail::createCPUGenerator(Hash(v.name.empty() ? std::to_string(v.id) : v.name, seed));
        at::Tensor f = at::empty_strided(spec.shape, spec.strides, at::TensorOptions().dtype(at::kFloat));
        if (rule == "normal") {
          f.normal_(init.value("mean", 0.0), std::max(0.0, init.value("std", 0.02)), gen);
        } else {
          f.uniform_(init.value("lo", -0.1), init.value("hi", 0.1), gen);
        }
        t = f.to(st);
        if (!t.strides().equals(spec.strides)) t = at::empty_strided(spec.shape, spec.strides, f.options().dtype(st)).copy_(f);
      } else if (rule == "ones" || rule == "zeros") {
        t = at::empty_strided(spec.shape, spec.strides, at::TensorOptions().dtype(st));
        t.fill_(rule == "ones" ? 1 : 0);
      } else {
        t = MakeTensor(spec, v.name.empty() ? std::to_string(v.id) : v.name, seed);
      }
    }
    if (to_double && t.is_floating_point() && t.scalar_type() != at::kDouble) {
      const bool wrapped = t.unsafeGetTensorImpl()->is_wrapped_number();
      t = t.to(at::kDouble);
      if (wrapped) t.unsafeGetTensorImpl()->set_wrapped_number(true);
    }
    return t;
  }

  void Track(const at::Tensor& t, int delta) {
    if (!t.defined() || !t.has_storage()) return;
    const void* key = t.storage().unsafeGetStorageImpl();
    int& n = storages_[key];
    if (delta > 0 && n++ == 0) live_bytes_ += static_cast<int64_t>(t.storage().nbytes());
    if (delta < 0 && --n == 0) {
      live_bytes_ -= static_cast<int64_t>(t.storage().nbytes());
      storages_.erase(key);
    }
    peak_live_bytes_ = std::max(peak_live_bytes_, live_bytes_);
  }

  void Put(std::unordered_map<int64_t, at::Tensor>& table, int64_t id, const at::Tensor& t) {
    auto it = table.find(id);
    if (it != table.end()) {
      Track(it->second, -1);
      it->second = t;
    } else {
      table.emplace(id, t);
    }
    Track(t, +1);
  }

  void Drop(std::unordered_map<int64_t, at::Tensor>& table, int64_t id) {
    auto it = table.find(id);
    if (it == table.end()) return;
    Track(it->second, -1);
    table.erase(it);
  }

  // The reference's value of `id`, making a leaf on first read.
  Result<at::Tensor> Ref(int64_t id) {
    auto it = ref_.find(id);
    if (it != ref_.end()) return it->second;
    auto leaf = leaves_.find(id);
    if (leaf == leaves_.end()) return Status::InvalidArgument(fmt::format("value {} is read before any call made it", id));
    if (!leaf->second->tensor) {
      return Status::InvalidArgument(fmt::format("value {} ('{}') cannot be made: {}", id, leaf->second->name,
                                                 leaf->second->unsupported));
    }
    at::Tensor t = MakeLeaf(*leaf->second, mode_ == Mode::kGolden);
    Put(ref_, id, t);
    return t;
  }

  // A copy on the backend's device that shares nothing with the reference.
  at::Tensor ToDevice(const at::Tensor& t) {
    const bool wrapped = t.unsafeGetTensorImpl()->is_wrapped_number();
    if (wrapped) return t;  // wrapped numbers stay CPU scalars, as in eager mode
    if (t.is_non_overlapping_and_dense()) {
      at::Tensor d = at::empty_strided(t.sizes(), t.strides(), t.options().device(backend_->device()));
      d.copy_(t);
      return d;
    }
    // Overlapping (expanded) or sparse views: copy the storage they look
    // into and take the same view of the copy.
    const int64_t n = static_cast<int64_t>(t.storage().nbytes() / t.element_size());
    at::Tensor whole = at::empty({0}, t.options()).set_(t.storage(), 0, {n}, {1});
    return whole.to(backend_->device(), /*non_blocking=*/false, /*copy=*/true)
        .as_strided(t.sizes(), t.strides(), t.storage_offset());
  }

  // The backend's value of `id` in kFree: made from the reference's leaf.
  Result<at::Tensor> Dev(int64_t id) {
    auto it = dev_.find(id);
    if (it != dev_.end()) return it->second;
    if (!leaves_.count(id)) return Status::InvalidArgument(fmt::format("value {} has no backend value", id));
    auto r = Ref(id);
    if (!r) return r.error();
    at::Tensor t = ToDevice(*r);
    Put(dev_, id, t);
    return t;
  }

  // The argument stack of `call` for one side.
  using Lookup = std::function<Result<at::Tensor>(int64_t id, bool mutated)>;
  Result<torch::jit::Stack> BuildStack(const ProgramCall& call, const Op& op, const Lookup& lookup, c10::Device device,
                                       bool to_double) {
    const auto& schema_args = op.handle.schema().arguments();
    torch::jit::Stack stack;
    stack.reserve(schema_args.size());
    size_t cursor = 0;
    auto next = [&](bool mutated) -> Result<at::Tensor> {
      if (cursor >= call.inputs.size()) return Status::InvalidArgument("more tensor arguments than recorded value ids");
      const int64_t id = call.inputs[cursor++];
      if (id < 0) return at::Tensor();
      return lookup(id, mutated);
    };
    for (size_t i = 0; i < schema_args.size(); ++i) {
      const Argument& a = call.op_case->args[i];
      const bool mutated = op.mutated[i];
      switch (a.kind) {
        case Argument::Kind::kTensor: {
          auto t = next(mutated);
          if (!t) return t.error();
          stack.emplace_back(*t);
          break;
        }
        case Argument::Kind::kTensorList: {
          if (IsOptionalTensorListArg(schema_args[i])) {
            c10::List<std::optional<at::Tensor>> list;
            for (size_t k = 0; k < a.tensors.size(); ++k) {
              auto t = next(mutated);
              if (!t) return t.error();
              list.push_back(t->defined() ? std::optional<at::Tensor>(*t) : std::nullopt);
            }
            stack.emplace_back(std::move(list));
          } else {
            std::vector<at::Tensor> list;
            for (size_t k = 0; k < a.tensors.size(); ++k) {
              auto t = next(mutated);
              if (!t) return t.error();
              list.push_back(*t);
            }
            stack.emplace_back(std::move(list));
          }
          break;
        }
        case Argument::Kind::kInt: {
          int64_t v = a.i;
          // The golden runs in float64: dtype arguments that pick a floating
          // type pick float64 (c10 codes: float16=5, float32=6, bfloat16=15).
          if (to_double && IsScalarTypeArg(schema_args[i]) && (v == 5 || v == 6 || v == 15)) v = 7;
          stack.emplace_back(v);
          break;
        }
        default: stack.push_back(NonTensorIValue(a, device)); break;
      }
    }
    return stack;
  }

  static std::string ShapeOf(const at::Tensor& t) { return fmt::format("[{}]", fmt::join(t.sizes(), ",")); }

  // Runs `call` on the reference (CPU) side into ref_.
  Failure RunReference(const ProgramCall& call, const Op& op, std::vector<c10::IValue>* outputs) {
    const bool to_double = mode_ == Mode::kGolden;
    auto stack = BuildStack(
        call, op, [&](int64_t id, bool) { return Ref(id); }, c10::Device(c10::kCPU), to_double);
    if (!stack) {
      return {Outcome::kSkipped, fmt::format("call {} ({}): {}", call.index, Qualified(call), stack.error().message()),
              call.index};
    }
    const auto t0 = Clock::now();
    try {
      op.handle.callBoxed(&*stack);
    } catch (const std::exception& e) {
      const auto* c10_error = dynamic_cast<const c10::Error*>(&e);
      return {Outcome::kSkipped,
              fmt::format("the CPU reference cannot replay call {} ({}): {}", call.index, Qualified(call),
                          FirstLine(c10_error ? c10_error->what_without_backtrace() : e.what(), 500)),
              call.index};
    }
    reference_seconds_ += Since(t0);
    for (const auto& v : *stack) FlattenReturns(v, outputs);
    if (outputs->size() != call.outputs.size()) {
      return {Outcome::kSkipped,
              fmt::format("call {} ({}) returned {} values, the program recorded {}", call.index, Qualified(call),
                          outputs->size(), call.outputs.size()),
              call.index};
    }
    for (size_t k = 0; k < outputs->size(); ++k) {
      const int64_t id = call.outputs[k];
      if (id >= 0 && (*outputs)[k].isTensor()) Put(ref_, id, (*outputs)[k].toTensor());
    }
    return {};
  }

  // Runs `call` on the backend with `lookup`'s inputs.
  Failure RunBackend(const ProgramCall& call, const Op& op, const Lookup& lookup, std::vector<c10::IValue>* outputs) {
    auto stack = BuildStack(call, op, lookup, backend_->device(), false);
    if (!stack) {
      return {Outcome::kSkipped, fmt::format("call {} ({}): {}", call.index, Qualified(call), stack.error().message()),
              call.index};
    }
    const auto t0 = Clock::now();
    try {
      backend_->Execute(op.handle, &*stack);
      backend_->Synchronize();
    } catch (const std::exception& e) {
      const auto* c10_error = dynamic_cast<const c10::Error*>(&e);
      const std::string msg = FirstLine(c10_error ? c10_error->what_without_backtrace() : e.what(), 1000);
      return {LooksUnsupported(msg) ? Outcome::kUnsupported : Outcome::kError,
              fmt::format("call {} ({}, module '{}'): {}", call.index, Qualified(call), call.module, msg), call.index};
    }
    backend_seconds_ += Since(t0);
    for (const auto& v : *stack) FlattenReturns(v, outputs);
    if (outputs->size() != call.outputs.size()) {
      return {Outcome::kError,
              fmt::format("call {} ({}): the backend returned {} values, the reference {}", call.index, Qualified(call),
                          outputs->size(), call.outputs.size()),
              call.index};
    }
    return {};
  }

  // Compares one call's backend outputs with the reference's (kLocate), with
  // the unit stage's rules; the golden of the call decides a miss.
  Failure CompareCall(const ProgramCall& call, const Op& op, const std::vector<c10::IValue>& got,
                      const std::vector<c10::IValue>& want) {
    const bool meaningful = ValuesMeaningful(*call.op_case);
    std::vector<c10::IValue> golden;
    bool golden_tried = false;
    for (size_t k = 0; k < want.size(); ++k) {
      if (!want[k].isTensor() || !got[k].isTensor()) continue;
      const at::Tensor& r = want[k].toTensor();
      const DType dt = ToDType(r.scalar_type()).value_or(DType::kFloat32);
      const Tolerance tol = options_.check.comparison.For(call.op, call.overload, dt);
      const double mult = options_.check.comparison.MultiplierFor(call.op, call.overload, dt);
      const at::Tensor b = got[k].toTensor().to(c10::kCPU);
      TensorComparison c = CompareTensors(b, r, at::Tensor(), tol, mult, meaningful);
      if (c.outcome == Outcome::kMismatch && options_.check.golden != GoldenMode::kNever) {
        if (!golden_tried) {
          golden_tried = true;
          auto stack = BuildStack(
              call, op,
              [&](int64_t id, bool) -> Result<at::Tensor> {
                auto t = Ref(id);
                if (!t) return t.error();
                if (!t->is_floating_point() || t->scalar_type() == at::kDouble) return t->clone();
                at::Tensor d = t->to(at::kDouble);
                if (t->unsafeGetTensorImpl()->is_wrapped_number()) d.unsafeGetTensorImpl()->set_wrapped_number(true);
                return d;
              },
              c10::Device(c10::kCPU), true);
          try {
            if (stack) {
              op.handle.callBoxed(&*stack);
              for (const auto& v : *stack) FlattenReturns(v, &golden);
            }
          } catch (const std::exception&) {
            golden.clear();
          }
        }
        if (golden.size() == want.size() && golden[k].isTensor()) {
          c = CompareTensors(b, r, golden[k].toTensor(), tol, mult, meaningful);
        }
      }
      if (c.outcome != Outcome::kPass) {
        divergent_ = {{"call", call.index},
                      {"op", Qualified(call)},
                      {"case_key", call.op_case->Key()},
                      {"module", call.module},
                      {"phase", call.phase},
                      {"output", k},
                      {"outcome", std::string(OutcomeName(c.outcome))},
                      {"message", c.message},
                      {"max_abs_err", c.max_abs_err},
                      {"cosine", c.cosine}};
        if (c.error_ratio) divergent_["error_ratio"] = *c.error_ratio;
        return {c.outcome, fmt::format("call {} ({}) output {}: {}", call.index, Qualified(call), k, c.message),
                call.index};
      }
    }
    return {};
  }

  bool ReadLater(int64_t id, int64_t index) const {
    auto it = last_read_.find(id);
    return it != last_read_.end() && it->second > index;
  }

  void Release(const ProgramCall& call) {
    for (int64_t id : call.inputs) {
      if (id >= 0 && !ReadLater(id, call.index) && !kept_.count(id)) {
        Drop(ref_, id);
        Drop(dev_, id);
      }
    }
    for (int64_t id : call.outputs) {
      if (id >= 0 && !ReadLater(id, call.index) && !kept_.count(id)) {
        Drop(ref_, id);
        Drop(dev_, id);
      }
    }
  }

  Failure Step(const ProgramCall& call) {
    const Op& op = ops_[static_cast<size_t>(call.index)];
    std::vector<c10::IValue> want;
    // kFree and kModule need the backend's inputs built before the reference
    // writes in place into its own.
    if (mode_ == Mode::kFree || (mode_ == Mode::kModule && InModule(call))) {
      std::vector<c10::IValue> got;
      Lookup lookup;
      if (mode_ == Mode::kFree) {
        lookup = [&](int64_t id, bool) { return Dev(id); };
      } else {
        ++module_calls_;
        // Inside the module: the backend's own values; at its boundary, a
        // copy of the reference's.
        lookup = [&](int64_t id, bool) -> Result<at::Tensor> {
          auto it = dev_.find(id);
          if (it != dev_.end()) return it->second;
          auto r = Ref(id);
          if (!r) return r.error();
          at::Tensor t = ToDevice(*r);
          Put(dev_, id, t);
          return t;
        };
      }
      Failure f = RunBackend(call, op, lookup, &got);
      if (f.outcome != Outcome::kPass) return f;
      f = RunReference(call, op, &want);
      if (f.outcome != Outcome::kPass) return f;
      for (size_t k = 0; k < got.size(); ++k) {
        if (!got[k].isTensor() || !want[k].isTensor()) continue;
        const at::Tensor& b = got[k].toTensor();
        const at::Tensor& r = want[k].toTensor();
        if (!b.sizes().equals(r.sizes())) {
          return {Outcome::kShapeDivergence,
                  fmt::format("call {} ({}, module '{}') output {}: the backend gave shape {}, the reference {}",
                              call.index, Qualified(call), call.module, k, ShapeOf(b), ShapeOf(r)),
                  call.index};
        }
        const int64_t id = call.outputs[k];
        if (id < 0) continue;
        Put(dev_, id, b);
        if (!ReadLater(id, call.index)) {
          judged_.push_back({id, call.index, b.to(c10::kCPU), r, Qualified(call), call.phase,
                             ValuesMeaningful(*call.op_case)});
        }
      }
    } else if (mode_ == Mode::kLocate) {
      // The backend gets copies of the reference's inputs (its writes must
      // not reach the reference's table), before the reference runs.
      std::vector<c10::IValue> got;
      Failure f = RunBackend(
          call, op,
          [&](int64_t id, bool) -> Result<at::Tensor> {
            auto r = Ref(id);
            if (!r) return r.error();
            return ToDevice(*r);
          },
          &got);
      if (f.outcome != Outcome::kPass) {
        divergent_ = {{"call", call.index},          {"op", Qualified(call)},
                      {"case_key", call.op_case->Key()}, {"module", call.module},
                      {"phase", call.phase},         {"outcome", std::string(OutcomeName(f.outcome))},
                      {"message", f.message}};
        return f;
      }
      f = RunReference(call, op, &want);
      if (f.outcome != Outcome::kPass) return f;
      f = CompareCall(call, op, got, want);
      if (f.outcome != Outcome::kPass) return f;
    } else {
      Failure f = RunReference(call, op, &want);
      if (f.outcome != Outcome::kPass) return f;
      if (mode_ == Mode::kGolden) {
        for (size_t k = 0; k < want.size(); ++k) {
          const int64_t id = call.outputs[k];
          if (id >= 0 && want[k].isTensor() && wanted_golden_.count(id) && !ReadLater(id, call.index)) {
            golden_[id] = want[k].toTensor();
          }
        }
      }
    }
    Release(call);
    return {};
  }

 public:
  // kModule: the values the module produced that a call outside it reads
  // (or nothing reads): collected before the pass so they are kept.
  void PlanModule(const std::string& module) {
    module_ = module;
    kept_.clear();
    std::unordered_map<int64_t, bool> made_inside;
    for (const auto& c : program_.calls) {
      const bool inside = InModule(c);
      if (!inside) {
        for (int64_t id : c.inputs) {
          auto it = made_inside.find(id);
          if (it != made_inside.end() && it->second) kept_.insert(id);
        }
      }
      for (int64_t id : c.outputs) {
        if (id < 0) continue;
        if (inside) {
          made_inside[id] = true;
          if (!ReadLater(id, c.index)) kept_.insert(id);
        } else if (!leaves_.count(id)) {
          // written again outside the module (in place): no longer the module's
          made_inside[id] = made_inside.count(id) ? made_inside[id] : false;
        }
      }
    }
  }
  const std::set<int64_t>& kept() const { return kept_; }
  at::Tensor dev_value(int64_t id) const {
    auto it = dev_.find(id);
    return it == dev_.end() ? at::Tensor() : it->second;
  }
  at::Tensor ref_value(int64_t id) const {
    auto it = ref_.find(id);
    return it == ref_.end() ? at::Tensor() : it->second;
  }
  void WantGolden(const std::set<int64_t>& ids) { wanted_golden_ = ids; }

 private:
  const Program& program_;
  Backend* backend_;
  const ProgramReplayOptions& options_;
  std::unordered_map<int64_t, const ProgramValue*> leaves_;
  std::unordered_map<int64_t, int64_t> last_read_;
  std::vector<Op> ops_;
  Mode mode_ = Mode::kFree;
  std::string module_;
  std::unordered_map<int64_t, at::Tensor> ref_, dev_;
  std::unordered_map<const void*, int> storages_;
  int64_t live_bytes_ = 0, peak_live_bytes_ = 0, calls_run_ = 0, module_calls_ = 0;
  double backend_seconds_ = 0, reference_seconds_ = 0;
  std::vector<Judged> judged_;
  std::set<int64_t> kept_, wanted_golden_;
  std::unordered_map<int64_t, at::Tensor> golden_;
  nlohmann::json divergent_;
};

void Fail(ModelCheckItem& item, Outcome outcome, const std::string& why) {
  if (item.outcome == Outcome::kPass) {
    item.outcome = outcome;
    item.error = why;
  }
}

bool LanguageModel(const Program& p) {
  static const std::set<std::string> kinds = {"decoder", "encoder-decoder", "hybrid", "ssm", "multimodal"};
  return kinds.count(p.info.kind) > 0;
}

// Judges the outputs (Note [Model verdicts]): each output against the
// reference (golden where given), the worst one reported.
void JudgeOutputs(ModelCheckItem& item, const std::vector<Judged>& outputs,
                  const std::function<at::Tensor(int64_t)>& golden_of, const ProgramReplayOptions& options) {
  item.outcome = Outcome::kPass;
  item.error.clear();
  item.values_compared = false;
  item.max_abs_err = item.max_rel_err = 0;
  item.cosine = 1;
  item.error_ratio.reset();
  int64_t elements = 0, mismatched = 0;
  for (const auto& o : outputs) {
    const DType dt = ToDType(o.reference.scalar_type()).value_or(DType::kFloat32);
    const Tolerance tol = options.check.comparison.For("model", "forward", dt);
    const double mult = options.check.comparison.MultiplierFor("model", "forward", dt);
    const TensorComparison c = CompareTensors(o.backend, o.reference, golden_of(o.id), tol, mult, o.meaningful);
    if (!c.values_compared) continue;
    item.values_compared = true;
    elements += c.elements;
    mismatched += c.mismatched + c.nonfinite_diff;
    item.max_abs_err = std::max(item.max_abs_err, c.max_abs_err);
    item.max_rel_err = std::max(item.max_rel_err, c.max_rel_err);
    if (c.error_ratio) item.error_ratio = std::max(item.error_ratio.value_or(0.0), *c.error_ratio);
    const std::string where = fmt::format("output of call {} ({})", o.call, o.op);
    if (c.outcome != Outcome::kPass) Fail(item, c.outcome, where + ": " + c.message);
    if (o.reference.is_floating_point() && o.reference.numel() > 1) {
      item.cosine = std::min(item.cosine, c.cosine);
      if (c.cosine < options.check.min_cosine && c.outcome != Outcome::kShapeMismatch &&
          c.outcome != Outcome::kDtypeMismatch) {
        Fail(item, Outcome::kMismatch,
             fmt::format("{}: cosine similarity {:.6f} below {}", where, c.cosine, options.check.min_cosine));
      }
    }
  }
  item.detail["outputs"] = outputs.size();
  item.detail["elements"] = elements;
  item.detail["mismatched"] = mismatched;
}

void TopK(ModelCheckItem& item, const at::Tensor& backend, const at::Tensor& reference, const ModelCheckOptions& options) {
  const int64_t V = reference.size(-1);
  const at::Tensor r = reference.reshape({-1, V}).to(at::kFloat);
  const at::Tensor b = backend.reshape({-1, V}).to(at::kFloat);
  const int64_t k = std::min<int64_t>(std::max<int64_t>(1, options.top_k), V);
  const at::Tensor ref_top = std::get<1>(r.topk(k, -1));
  const at::Tensor top1 = b.argmax(-1, /*keepdim=*/true);
  const double agreement = (ref_top == top1).any(-1).to(at::kDouble).mean().item<double>();
  item.detail["top_k"] = k;
  item.detail["topk_agreement"] = agreement;
  item.detail["top1_agreement"] = (r.argmax(-1) == b.argmax(-1)).to(at::kDouble).mean().item<double>();
  if (agreement < options.min_topk_agreement) {
    Fail(item, Outcome::kMismatch,
         fmt::format("the backend's top-1 token is in the reference's top-{} at {:.1f}% of positions (needs {:.1f}%)",
                     k, 100 * agreement, 100 * options.min_topk_agreement));
  }
}

void Stats(ModelCheckItem& item, const Replayer& r, const Program& p) {
  item.detail["replay"] = {{"calls", p.calls.size()},
                           {"calls_run", r.calls_run()},
                           {"peak_live_bytes", r.peak_live_bytes()},
                           {"backend_seconds", r.backend_seconds()},
                           {"reference_seconds", r.reference_seconds()}};
}

// Judged outputs, golden asked for when they mismatch.
void JudgeWithGolden(ModelCheckItem& item, const std::vector<Judged>& outputs,
                     const ProgramReplayOptions& options, const Program& program) {
  JudgeOutputs(item, outputs, [](int64_t) { return at::Tensor(); }, options);
  const bool ask = options.check.golden == GoldenMode::kAlways ||
                   (options.check.golden == GoldenMode::kWhenNeeded && item.outcome == Outcome::kMismatch);
  if (!ask) return;
  std::set<int64_t> ids;
  for (const auto& o : outputs) ids.insert(o.id);
  Replayer golden(program, nullptr, options);
  if (golden.Prepare().outcome != Outcome::kPass) return;
  golden.WantGolden(ids);
  if (golden.Run(Mode::kGolden).outcome != Outcome::kPass) return;
  JudgeOutputs(item, outputs, [&](int64_t id) { return golden.golden(id); }, options);
  item.detail["golden"] = true;
}

}  // namespace

ModelCheckItem ReplayProgram(const Program& program, Backend& backend, const ProgramReplayOptions& options) {
  const auto start = Clock::now();
  ModelCheckItem item;
  item.item = "forward";
  try {
    Replayer replayer(program, &backend, options);
    Failure f = replayer.Prepare();
    if (f.outcome == Outcome::kPass) f = replayer.Run(Mode::kFree);
    Stats(item, replayer, program);
    if (f.outcome != Outcome::kPass) {
      Fail(item, f.outcome, f.message);
      if (f.call >= 0) item.detail["failed_call"] = f.call;
    } else {
      const auto& outputs = replayer.judged();
      JudgeWithGolden(item, outputs, options, program);
      // The main output: the last floating one of the forward phase.
      const Judged* main = nullptr;
      for (const auto& o : outputs) {
        if (o.phase == "forward" && o.reference.is_floating_point() && o.meaningful) main = &o;
      }
      if (main) {
        item.detail["output_shape"] = main->reference.sizes().vec();
        if (LanguageModel(program) && main->reference.dim() >= 2 && main->backend.sizes() == main->reference.sizes() &&
            main->reference.size(-1) > 1) {
          TopK(item, main->backend, main->reference, options.check);
        }
      }
    }
    if (item.outcome != Outcome::kPass && item.outcome != Outcome::kSkipped && options.locate_first_divergent) {
      Replayer locate(program, &backend, options);
      if (locate.Prepare().outcome == Outcome::kPass) {
        const Failure lf = locate.Run(Mode::kLocate);
        if (!locate.divergent().is_null()) {
          item.detail["first_divergent"] = locate.divergent();
        } else if (lf.outcome == Outcome::kPass) {
          item.detail["first_divergent_note"] =
              "every call is within its tolerance given the reference's inputs: the error accumulated over calls";
        } else {
          item.detail["first_divergent_note"] = "the search stopped: " + lf.message;
        }
      }
    }
  } catch (const std::exception& e) {
    const std::string what = "internal error in coverage while replaying the program: " + FirstLine(e.what(), 500);
    if (item.outcome == Outcome::kPass) {
      Fail(item, Outcome::kError, what);
    } else {
      item.detail["first_divergent_note"] = "the search stopped: " + what;  // the verdict above stands
    }
  }
  item.seconds = Since(start);
  return item;
}

ModelCheckItem ReplayModule(const Program& program, const std::string& module, Backend& backend,
                            const ProgramReplayOptions& options) {
  const auto start = Clock::now();
  ModelCheckItem item;
  item.item = module;
  item.detail["module"] = module;
  try {
    Replayer replayer(program, &backend, options);
    replayer.PlanModule(module);
    Failure f = replayer.Prepare();
    if (f.outcome == Outcome::kPass) f = replayer.Run(Mode::kModule, module);
    Stats(item, replayer, program);
    if (f.outcome != Outcome::kPass) {
      Fail(item, f.outcome, f.message);
    } else if (!replayer.module_ran()) {
      Fail(item, Outcome::kSkipped, "no call of the program ran in module '" + module + "'");
    } else {
      std::vector<Judged> outputs;
      for (int64_t id : replayer.kept()) {
        const at::Tensor b = replayer.dev_value(id), r = replayer.ref_value(id);
        if (!b.defined() || !r.defined()) continue;
        outputs.push_back({id, -1, b.to(c10::kCPU), r, "module", "forward", true});
      }
      JudgeWithGolden(item, outputs, options, program);
      item.detail["boundary_outputs"] = outputs.size();
    }
  } catch (const std::exception& e) {
    Fail(item, Outcome::kError, "internal error in coverage while replaying the module: " + FirstLine(e.what(), 500));
  }
  item.seconds = Since(start);
  return item;
}

std::vector<std::string> ModuleKinds(const Program& program) {
  // A kind is the path with every all-digit component replaced by '*'.
  auto kind_of = [](const std::string& path) {
    std::string out, part;
    auto flush = [&] {
      const bool digits = !part.empty() && std::all_of(part.begin(), part.end(), ::isdigit);
      out += (out.empty() ? "" : ".") + (digits ? std::string("*") : part);
      part.clear();
    };
    for (char c : path) {
      if (c == '.') {
        flush();
      } else {
        part += c;
      }
    }
    flush();
    return out;
  };
  std::set<std::string> all;
  for (const auto& c : program.calls) {
    if (!c.module.empty()) all.insert(c.module);
  }
  std::set<std::string> seen;
  std::vector<std::string> out;
  for (const auto& c : program.calls) {
    if (c.module.empty() || c.phase != "forward") continue;
    // Leaves only: a module with a sub-module that ran is covered by that one.
    auto it = all.lower_bound(c.module + ".");
    if (it != all.end() && it->compare(0, c.module.size() + 1, c.module + ".") == 0) continue;
    const std::string kind = kind_of(c.module);
    if (seen.insert(kind).second) out.push_back(c.module);
  }
  return out;
}

}  // namespace coverage::runners
