#include "replay/program_replay.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <unordered_map>

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/InferenceMode.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "backends/backend.h"
#include "core/index_rules.h"
#include "replay/compare.h"
#include "replay/composites.h"
#include "backends/dtype_map.h"
#include "replay/materialize.h"
#include "replay/reference_upcast.h"
#include "replay/replay.h"

// Note [Program replay]
// ~~~~~~~~~~~~~~~~~~~~~
// A program is a list of ATen calls connected by value ids (the tracer's
// format, capture/tracer/README.md). Replay keeps a table from value id to
// tensor per side (reference on CPU, backend on its device) and runs the
// calls in order:
//  * Leaves are made when first read, deterministically from the seed:
//    parameters and buffers by their recorded init rule (normal, uniform:
//    MakeInitialised's fixed pools, one parallel pass; ones, zeros; "other"
//    rules and inputs by the value domain, Note [Value domains]), constants
//    that were Python numbers as wrapped numbers with that value. The backend's leaves are copies of the reference's.
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
//  * A call the backend raises on is run on the reference too: when the
//    reference cannot run it either, the program is not replayable as
//    captured (traced on meta, where nothing checks an index against its
//    table) and the replay is skipped with the reference's reason; no
//    backend is blamed.
//  * When the free-running replay fails, a second pass feeds every call on
//    the backend the reference's inputs and compares its outputs with the
//    reference's under the unit stage's rules (golden on a miss): the first
//    call that misses is the first divergent call, stored with its op case
//    key so that a failing model links to the op case that broke it.

namespace coverage::replay {
using backends::ToDType;
using backends::ToScalarType;
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

// A call's returns flattened as the tracer flattens them (its outputs'
// value ids): an undefined tensor or None, inside a tuple or list, holds a
// place (value id -1), and so does the nothing an op returning () returns.
void FlattenReturns(const c10::IValue& v, std::vector<c10::IValue>* out) {
  if (v.isTensor()) {
    out->push_back(v.toTensor().defined() ? v : c10::IValue());
  } else if (v.isTensorList()) {
    for (const at::Tensor& t : v.toTensorVector()) out->push_back(t.defined() ? c10::IValue(t) : c10::IValue());
  } else if (v.isTuple()) {
    for (const auto& e : v.toTupleRef().elements()) FlattenReturns(e, out);
  } else if (v.isList()) {
    for (const auto& e : v.toListRef()) FlattenReturns(e, out);
  } else {
    out->push_back(v);
  }
}

void FlattenReturns(const torch::jit::Stack& stack, std::vector<c10::IValue>* out) {
  for (const auto& v : stack) FlattenReturns(v, out);
  if (stack.empty()) out->emplace_back();  // an op returning (): Python's None
}

struct Op {
  c10::OperatorHandle handle;
  std::vector<bool> mutated;      // per schema argument
  std::vector<bool> scalar_list;  // per schema argument: a Scalar[] (NumberListFor)
  bool random = false;            // Note [Random calls]
};

// Note [Random calls]
// ~~~~~~~~~~~~~~~~~~
// A call ATen tags nondeterministic_seeded (rand, randn, randint, randperm,
// normal_, uniform_, bernoulli, multinomial, native_dropout, ...) draws from
// its side's generator, so the backend's values and the reference's differ
// by design, and everything computed from them would too (ViT-MAE masks
// patches by sorting rand noise). Such a call runs on both sides and the
// backend's output is judged on what a draw can be judged on: the
// reference's shape and dtype, finite values, and for floating outputs of
// at least kRandomStatsMin elements a mean within 6 standard errors of the
// reference's and a standard deviation within a factor of 2. Then the
// reference's values are copied into the backend's output, so the calls
// after it compare like with like and two runs on one device agree. The
// reference's generator is seeded from the replay seed at the start of each
// pass; the float64 golden's draws are its own (it is only asked about
// outputs that already missed).
constexpr int64_t kRandomStatsMin = 256;

// Why a random call's backend output cannot be a draw of the reference's
// distribution; "" when it can. `b` and `r` are on the CPU.
std::string RandomOutputProblem(const at::Tensor& b, const at::Tensor& r) {
  if (b.scalar_type() != r.scalar_type()) {
    return fmt::format("the backend drew {}, the reference {}", c10::toString(b.scalar_type()),
                       c10::toString(r.scalar_type()));
  }
  if (!b.is_floating_point() || b.numel() == 0) return "";
  const at::Tensor bd = b.to(at::kDouble), rd = r.to(at::kDouble);
  if (at::isfinite(rd).all().item<bool>() && !at::isfinite(bd).all().item<bool>()) {
    return "the backend drew values that are not finite";
  }
  if (b.numel() < kRandomStatsMin) return "";
  const double mb = bd.mean().item<double>(), mr = rd.mean().item<double>();
  const double sb = bd.std().item<double>(), sr = rd.std().item<double>();
  const double n = static_cast<double>(b.numel());
  if (std::abs(mb - mr) > 6 * sr / std::sqrt(n) + 1e-6) {
    return fmt::format("the backend's draws have mean {:.4g}, the reference's {:.4g} (standard deviation {:.4g})",
                       mb, mr, sr);
  }
  if (sr > 0 && (sb < sr / 2 || sb > sr * 2)) {
    return fmt::format("the backend's draws have standard deviation {:.4g}, the reference's {:.4g}", sb, sr);
  }
  return "";
}

// What the pass does with each call (Note [Program replay]).
enum class Mode {
  kFree,    // reference and backend, backend outputs feed the backend
  kGolden,  // the reference only, in float64
  kLocate,  // reference; each call also on the backend from the reference's inputs
  kModule,  // reference; the chosen modules' own calls also on the backend, from the backend's values inside
            // each module and copies of the reference's at its boundary
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
};

// What a training pass records (Note [Program replay], train).
struct StepRecord {
  double ref_loss = NAN, dev_loss = NAN;
  std::vector<double> ref_grad_norms, dev_grad_norms;  // in order of first use by the optimizer
};

class Replayer {
 public:
  Replayer(const Program& program, Backend* backend, const ProgramReplayOptions& options)
      : program_(program), backend_(backend), options_(options) {
    for (const auto& v : program_.values) leaves_[v.id] = &v;
    last_read_.reserve(program_.calls.size() * 2);
    std::set<int64_t> from_backward;
    for (const auto& c : program_.calls) {
      for (int64_t id : c.inputs) {
        if (id < 0) continue;
        last_read_[id] = c.index;
        if (c.phase == "optimizer" && from_backward.count(id)) grads_.insert(id);
      }
      // An integer leaf with no recorded range (a tensor the model built
      // itself, traced on meta) that indexes a dimension: its values stay
      // inside every dimension it indexes (Note [Value domains]).
      std::vector<int64_t> sizes;  // IndexedSizes(*c.op_case), once a rangeless integer leaf is read
      for (size_t k = 0; c.op_case && k < c.inputs.size(); ++k) {
        auto leaf = leaves_.find(c.inputs[k]);
        if (leaf == leaves_.end() || !leaf->second->tensor) continue;
        const TensorSpec& spec = *leaf->second->tensor;
        if (!IsIntegralDType(spec.dtype) || spec.domain.kind == ValueDomain::Kind::kInteger) continue;
        if (sizes.empty()) sizes = IndexedSizes(*c.op_case);
        if (k >= sizes.size() || sizes[k] <= 0) continue;
        auto [it, fresh] = index_limits_.try_emplace(c.inputs[k], sizes[k]);
        if (!fresh) it->second = std::min(it->second, sizes[k]);
      }
      if (c.phase == "backward") {
        // Autograd seeds the backward pass with ones_like(loss): the first
        // backward call reads the loss.
        if (loss_id_ < 0 && !c.inputs.empty()) loss_id_ = c.inputs.front();
        from_backward.insert(c.outputs.begin(), c.outputs.end());
      }
    }
  }

  // Resolves every call's operator once; a call that cannot be replayed
  // makes the whole program unreplayable (kSkipped with the reason).
  Failure Prepare() {
    RegisterCompositeOps();
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
      Op op{*handle, {}, {}, handle->hasTag(at::Tag::nondeterministic_seeded)};
      const auto& args = handle->schema().arguments();
      if (args.size() != c.op_case->args.size()) {
        return {Outcome::kSkipped,
                fmt::format("call {} ({}) has {} arguments, the schema {}", c.index, Qualified(c), c.op_case->args.size(),
                            args.size()),
                c.index};
      }
      for (const auto& a : args) {
        op.mutated.push_back(a.alias_info() != nullptr && a.alias_info()->isWrite());
        op.scalar_list.push_back(IsScalarList(a));
      }
      ops_.push_back(std::move(op));
    }
    return {};
  }

  // One pass. `modules` selects the calls of kModule (their own calls, not
  // their sub-modules'). Values of carried ids (Carry) survive from the
  // previous pass; everything else starts afresh.
  Failure Run(Mode mode, const std::set<std::string>& modules = {}) {
    mode_ = mode;
    modules_ = modules;
    for (auto* table : {&ref_, &dev_}) {
      std::vector<int64_t> drop;
      for (const auto& [id, t] : *table) {
        if (!carried_.count(id)) drop.push_back(id);
      }
      for (int64_t id : drop) Drop(*table, id);
    }
    dev_owner_.clear();
    judged_.clear();
    normed_.clear();
    step_ = StepRecord{};
    // Note [Random calls]: the reference's draws depend on the seed only.
    at::manual_seed(options_.check.seed);
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
  int64_t reference_upcasts() const { return reference_upcasts_; }
  // The first divergent call of a kLocate pass.
  nlohmann::json divergent() const { return divergent_; }
  // kGolden: the fp64 value of a judged id.
  at::Tensor golden(int64_t id) const {
    auto it = golden_.find(id);
    return it == golden_.end() ? at::Tensor() : it->second;
  }
  int64_t module_calls(const std::string& module) const {
    auto it = module_calls_.find(module);
    return it == module_calls_.end() ? 0 : it->second;
  }
  // Training: parameters and buffers keep their values from pass to pass
  // (the optimizer updates them in place); their first values are kept on
  // CPU for the update check.
  void CarryParameters() {
    for (const auto& v : program_.values) {
      if (v.kind == "parameter" || v.kind == "buffer") carried_.insert(v.id);
    }
    record_initial_ = true;
  }
  const StepRecord& step() const { return step_; }
  // Parameters now and at the start, reference and backend, on CPU.
  struct ParameterState {
    std::string name;
    at::Tensor initial, ref, dev;
  };
  std::vector<ParameterState> Parameters() const {
    std::vector<ParameterState> out;
    for (const auto& v : program_.values) {
      if (v.kind != "parameter") continue;
      auto i = initial_.find(v.id);
      auto r = ref_.find(v.id);
      auto d = dev_.find(v.id);
      if (i == initial_.end() || r == ref_.end() || d == dev_.end()) continue;
      out.push_back({v.name, i->second, r->second, d->second.to(c10::kCPU)});
    }
    return out;
  }

  static std::string Qualified(const ProgramCall& c) { return c.overload.empty() ? c.op : c.op + "." + c.overload; }

 private:
  bool InModule(const ProgramCall& c) const { return modules_.count(c.module) > 0; }

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
      if (floating && (rule == "normal" || rule == "uniform")) {
        const uint64_t stream = Hash(v.name.empty() ? std::to_string(v.id) : v.name, seed);
        // The golden's float32 leaves are made as float64 at once: the same
        // values (computed in float), one pass instead of two.
        TensorSpec made = spec;
        if (to_double && spec.dtype == DType::kFloat32) made.dtype = DType::kFloat64;
        t = rule == "normal" ? MakeInitialised(made, InitRule::kNormal, init.value("mean", 0.0),
                                               std::max(0.0, init.value("std", 0.02)), stream)
                             : MakeInitialised(made, InitRule::kUniform, init.value("lo", -0.1), init.value("hi", 0.1),
                                               stream);
      } else if (rule == "ones" || rule == "zeros") {
        t = at::empty_strided(spec.shape, spec.strides, at::TensorOptions().dtype(st));
        t.fill_(rule == "ones" ? 1 : 0);
      } else if (auto limit = index_limits_.find(v.id); limit != index_limits_.end()) {
        TensorSpec index = spec;
        index.domain = ValueDomain{ValueDomain::Kind::kInteger, 0, limit->second};
        t = MakeTensor(index, v.name.empty() ? std::to_string(v.id) : v.name, seed);
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
    if (record_initial_ && leaf->second->kind == "parameter") initial_[id] = t.clone();
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
        default: {
          c10::IValue v = NonTensorIValue(a, device);
          stack.push_back(op.scalar_list[i] ? NumberListFor(v) : v);
          break;
        }
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
    std::string error;
    try {
      op.handle.callBoxed(&*stack);
    } catch (const std::exception& e) {
      const auto* c10_error = dynamic_cast<const c10::Error*>(&e);
      error = FirstLine(c10_error ? c10_error->what_without_backtrace() : e.what(), 500);
    }
    if (!error.empty()) {
      // Note [Reference upcast]: an integer call the CPU has no kernel for.
      auto again = IsMissingIntegerKernel(error)
                       ? BuildStack(
                             call, op, [&](int64_t id, bool) { return Ref(id); }, c10::Device(c10::kCPU), to_double)
                       : Result<torch::jit::Stack>(Status::Internal("no upcast"));
      if (!again || !CallUpcast(op.handle, op.mutated, &*again)) {
        return {Outcome::kSkipped,
                fmt::format("the CPU reference cannot replay call {} ({}): {}", call.index, Qualified(call), error),
                call.index};
      }
      stack = std::move(again);
      ++reference_upcasts_;
    }
    reference_seconds_ += Since(t0);
    FlattenReturns(*stack, outputs);
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
    FlattenReturns(*stack, outputs);
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
    std::vector<c10::IValue> golden;
    bool golden_tried = false;
    for (size_t k = 0; k < want.size(); ++k) {
      if (!want[k].isTensor() || !got[k].isTensor()) continue;
      const at::Tensor& r = want[k].toTensor();
      const DType dt = ToDType(r.scalar_type()).value_or(DType::kFloat32);
      const Tolerance tol = options_.check.comparison.For(call.op, call.overload, dt);
      const double mult = options_.check.comparison.MultiplierFor(call.op, call.overload, dt);
      const at::Tensor b = got[k].toTensor().to(c10::kCPU);
      const bool meaningful = ValuesMeaningful(*call.op_case, k);
      // Outside the reference tolerance, the call's golden decides.
      auto golden_when_needed = [&]() -> at::Tensor {
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
              FlattenReturns(*stack, &golden);
            }
          } catch (const std::exception&) {
            golden.clear();
          }
        }
        if (golden.size() == want.size() && golden[k].isTensor()) return golden[k].toTensor();
        return at::Tensor();
      };
      const TensorComparison c =
          CompareTensors(b, r, at::Tensor(), tol, mult, meaningful,
                         options_.check.golden == GoldenMode::kNever ? std::function<at::Tensor()>() : golden_when_needed);
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
        if (!call.decomposition.empty()) divergent_["decomposition"] = call.decomposition;
        return {c.outcome, fmt::format("call {} ({}) output {}: {}", call.index, Qualified(call), k, c.message),
                call.index};
      }
    }
    return {};
  }

  // kLocate for a random call (Note [Random calls]): the backend's outputs
  // judged as draws.
  Failure CompareDraws(const ProgramCall& call, const std::vector<c10::IValue>& got,
                       const std::vector<c10::IValue>& want) {
    for (size_t k = 0; k < want.size() && k < got.size(); ++k) {
      if (!want[k].isTensor() || !got[k].isTensor()) continue;
      const std::string problem = RandomOutputProblem(got[k].toTensor().to(c10::kCPU), want[k].toTensor());
      if (problem.empty()) continue;
      divergent_ = {{"call", call.index},          {"op", Qualified(call)},
                    {"case_key", call.op_case->Key()}, {"module", call.module},
                    {"phase", call.phase},         {"output", k},
                    {"outcome", std::string(OutcomeName(Outcome::kMismatch))},
                    {"message", "a random call: " + problem}};
      return DrawMismatch(call, k, problem);
    }
    return {};
  }

  static Failure DrawMismatch(const ProgramCall& call, size_t output, const std::string& problem) {
    return {Outcome::kMismatch,
            fmt::format("call {} ({}, module '{}') output {}: a random call: {}", call.index, Qualified(call),
                        call.module, output, problem),
            call.index};
  }

  bool ReadLater(int64_t id, int64_t index) const {
    auto it = last_read_.find(id);
    return it != last_read_.end() && it->second > index;
  }

  void Release(const ProgramCall& call) {
    for (const auto* ids : {&call.inputs, &call.outputs}) {
      for (int64_t id : *ids) {
        if (id >= 0 && !ReadLater(id, call.index) && !carried_.count(id)) {
          Drop(ref_, id);
          Drop(dev_, id);
        }
      }
    }
  }

  // kModule: a value a module made, read by a call outside that module, is
  // the module's output: judged as it crosses the boundary (before anything
  // writes into it), then the reader gets the reference's value.
  void HandOver(const ProgramCall& call) {
    for (int64_t id : call.inputs) {
      auto owner = dev_owner_.find(id);
      if (id < 0 || owner == dev_owner_.end() || (InModule(call) && owner->second == call.module)) continue;
      auto d = dev_.find(id);
      auto r = ref_.find(id);
      if (d != dev_.end() && r != ref_.end()) {
        judged_.push_back({id, call.index, d->second.to(c10::kCPU, /*non_blocking=*/false, /*copy=*/true),
                           r->second.clone(), "module", "forward", true, owner->second});
      }
      dev_owner_.erase(owner);
      Drop(dev_, id);
    }
  }

  // Training: the loss (the value the backward pass starts from) and each
  // gradient's norm as the optimizer first reads it.
  void RecordTraining(const ProgramCall& call) {
    if (call.phase == "forward") {
      for (int64_t id : call.outputs) {
        if (id != loss_id_) continue;
        auto r = ref_.find(id);
        auto d = dev_.find(id);
        if (r == ref_.end() || d == dev_.end() || r->second.dim() != 0 || !r->second.is_floating_point()) continue;
        step_.ref_loss = r->second.item<double>();
        step_.dev_loss = d->second.to(c10::kCPU).item<double>();
      }
    } else if (call.phase == "optimizer") {
      for (int64_t id : call.inputs) {
        if (!grads_.count(id) || !normed_.insert(id).second) continue;
        auto r = ref_.find(id);
        auto d = dev_.find(id);
        if (r == ref_.end() || d == dev_.end()) continue;
        step_.ref_grad_norms.push_back(r->second.to(at::kDouble).norm().item<double>());
        step_.dev_grad_norms.push_back(d->second.to(c10::kCPU).to(at::kDouble).norm().item<double>());
      }
    }
  }

  // A backend that raised on a call: when the reference cannot run the call
  // either (a program traced on meta, where nothing checks an index against
  // its table, e.g. 512 positions into a 64-row position embedding), the
  // program is not replayable as captured and no backend is blamed: the
  // reference's skip is returned. Otherwise the backend's failure stands.
  Failure ReferenceFirst(const ProgramCall& call, const Op& op, const Failure& backend,
                         std::vector<c10::IValue>* want) {
    if (backend.outcome != Outcome::kError && backend.outcome != Outcome::kUnsupported) return backend;
    Failure r = RunReference(call, op, want);
    return r.outcome == Outcome::kPass ? backend : r;
  }

  Failure Step(const ProgramCall& call) {
    const Op& op = ops_[static_cast<size_t>(call.index)];
    std::vector<c10::IValue> want;
    // kFree and kModule need the backend's inputs built before the reference
    // writes in place into its own.
    if (mode_ == Mode::kModule) HandOver(call);
    if (mode_ == Mode::kFree || (mode_ == Mode::kModule && InModule(call))) {
      std::vector<c10::IValue> got;
      Lookup lookup;
      if (mode_ == Mode::kFree) {
        lookup = [&](int64_t id, bool) { return Dev(id); };
      } else {
        ++module_calls_[call.module];
        // Inside the module: the backend's own values (HandOver left only
        // this module's); at its boundary, a copy of the reference's.
        lookup = [&](int64_t id, bool) -> Result<at::Tensor> {
          auto it = dev_.find(id);
          if (it != dev_.end()) return it->second;
          auto r = Ref(id);
          if (!r) return r.error();
          return ToDevice(*r);
        };
      }
      Failure f = RunBackend(call, op, lookup, &got);
      if (f.outcome != Outcome::kPass) return ReferenceFirst(call, op, f, &want);
      f = RunReference(call, op, &want);
      if (f.outcome != Outcome::kPass) return f;
      for (size_t k = 0; k < got.size(); ++k) {
        if (!got[k].isTensor() || !want[k].isTensor()) continue;
        at::Tensor b = got[k].toTensor();
        const at::Tensor& r = want[k].toTensor();
        if (!b.sizes().equals(r.sizes())) {
          return {Outcome::kShapeDivergence,
                  fmt::format("call {} ({}, module '{}') output {}: the backend gave shape {}, the reference {}",
                              call.index, Qualified(call), call.module, k, ShapeOf(b), ShapeOf(r)),
                  call.index};
        }
        // A call recorded whole (Note [Composites recorded whole]) may give
        // the backend's own layout (sim's attention returns [B, H, L, D]
        // contiguous, the CPU's flash kernel [B, L, H, D] transposed). The
        // calls after it were recorded against the CPU's layout (a
        // reshape recorded as a view), so its outputs take the reference's
        // strides; the values are the backend's.
        if (!call.decomposition.empty() && !b.strides().equals(r.strides())) {
          at::Tensor laid = at::empty_strided(r.sizes(), r.strides(), b.options());
          laid.copy_(b);
          b = laid;
        }
        const int64_t id = call.outputs[k];
        if (op.random) {
          // Note [Random calls]: judged as a draw, then given the reference's values.
          const std::string problem = RandomOutputProblem(b.to(c10::kCPU), r);
          if (!problem.empty()) return DrawMismatch(call, k, problem);
          b.copy_(r);
        }
        if (id < 0) continue;
        Put(dev_, id, b);
        if (mode_ == Mode::kModule) dev_owner_[id] = call.module;
        if (!ReadLater(id, call.index) && !carried_.count(id)) {
          judged_.push_back({id, call.index, b.to(c10::kCPU), r, Qualified(call), call.phase,
                             ValuesMeaningful(*call.op_case, k), mode_ == Mode::kModule ? call.module : ""});
        }
      }
      if (!carried_.empty()) RecordTraining(call);
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
        if (Failure r = ReferenceFirst(call, op, f, &want); r.outcome == Outcome::kSkipped) return r;
        divergent_ = {{"call", call.index},          {"op", Qualified(call)},
                      {"case_key", call.op_case->Key()}, {"module", call.module},
                      {"phase", call.phase},         {"outcome", std::string(OutcomeName(f.outcome))},
                      {"message", f.message}};
        if (!call.decomposition.empty()) divergent_["decomposition"] = call.decomposition;
        return f;
      }
      f = RunReference(call, op, &want);
      if (f.outcome != Outcome::kPass) return f;
      f = op.random ? CompareDraws(call, got, want) : CompareCall(call, op, got, want);
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
  void WantGolden(const std::set<int64_t>& ids) { wanted_golden_ = ids; }

 private:
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
  std::unordered_map<const void*, int> storages_;
  int64_t live_bytes_ = 0, peak_live_bytes_ = 0, calls_run_ = 0;
  double backend_seconds_ = 0, reference_seconds_ = 0;
  int64_t reference_upcasts_ = 0;  // Note [Reference upcast]
  std::vector<Judged> judged_;
  std::set<int64_t> wanted_golden_;
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
                           {"reference_seconds", r.reference_seconds()},
                           {"reference_upcasts", r.reference_upcasts()}};
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

std::vector<ModelCheckItem> ReplayModules(const Program& program, const std::vector<std::string>& modules,
                                          Backend& backend, const ProgramReplayOptions& options) {
  const auto start = Clock::now();
  std::vector<ModelCheckItem> items(modules.size());
  for (size_t i = 0; i < modules.size(); ++i) {
    items[i].item = modules[i];
    items[i].detail["module"] = modules[i];
  }
  auto fail_all = [&](Outcome o, const std::string& why) {
    for (auto& item : items) Fail(item, o, why);
  };
  try {
    Replayer replayer(program, &backend, options);
    Failure f = replayer.Prepare();
    if (f.outcome == Outcome::kPass) f = replayer.Run(Mode::kModule, {modules.begin(), modules.end()});
    if (f.outcome != Outcome::kPass) {
      // A failure inside a module is that module's; any other stops them all.
      const ProgramCall* call = f.call >= 0 ? &program.calls[static_cast<size_t>(f.call)] : nullptr;
      auto it = call ? std::find(modules.begin(), modules.end(), call->module) : modules.end();
      if (it != modules.end()) {
        Fail(items[static_cast<size_t>(it - modules.begin())], f.outcome, f.message);
        for (auto& item : items) Fail(item, Outcome::kSkipped, "not reached: " + f.message);
      } else {
        fail_all(f.outcome, f.message);
      }
    } else {
      for (size_t i = 0; i < modules.size(); ++i) {
        ModelCheckItem& item = items[i];
        std::vector<Judged> outputs;
        for (const auto& o : replayer.judged()) {
          if (o.module == modules[i]) outputs.push_back(o);
        }
        item.detail["calls"] = replayer.module_calls(modules[i]);
        item.detail["boundary_outputs"] = outputs.size();
        if (replayer.module_calls(modules[i]) == 0) {
          Fail(item, Outcome::kSkipped, "no call of the program ran in module '" + modules[i] + "'");
          continue;
        }
        if (outputs.empty()) {
          item.detail["note"] = "the module's values never leave it";
          continue;
        }
        JudgeWithGolden(item, outputs, options, program);
      }
    }
  } catch (const std::exception& e) {
    fail_all(Outcome::kError, "internal error in coverage while replaying the modules: " + FirstLine(e.what(), 500));
  }
  const double seconds = Since(start) / std::max<size_t>(1, modules.size());
  for (auto& item : items) item.seconds = seconds;
  return items;
}

ModelCheckItem ReplayModule(const Program& program, const std::string& module, Backend& backend,
                            const ProgramReplayOptions& options) {
  return ReplayModules(program, {module}, backend, options).front();
}

namespace {

// The CPU as a backend: the reference's own run-to-run difference.
class CpuAgain final : public Backend {
 public:
  std::string name() const override { return "cpu"; }
  c10::Device device() const override { return c10::Device(c10::kCPU); }
  bool RespectsReadOnlyInputs() const override { return true; }
};

struct TrainDiff {
  double loss_rel = 0, grad_rel = 0, param_rel = 0;  // the worst over steps
  std::vector<double> ref_losses, dev_losses;
  // Per step: the loss's relative difference, the worst gradient's and which.
  std::vector<double> loss_rel_at, grad_rel_at;
  std::vector<size_t> grad_index_at;
};

double Relative(double backend, double reference, double floor) {
  if (!std::isfinite(backend) || !std::isfinite(reference)) return std::isfinite(backend) == std::isfinite(reference) ? 0 : INFINITY;
  return std::abs(backend - reference) / std::max(std::abs(reference), floor);
}

// N passes of the step program with parameters carried over; a pass that
// fails gives its Failure instead.
struct TrainRun {
  Failure failure;
  TrainDiff diff;
};

TrainRun Train(const Program& program, Backend& backend, const ProgramReplayOptions& options, int steps) {
  Replayer r(program, &backend, options);
  if (Failure f = r.Prepare(); f.outcome != Outcome::kPass) return {f, {}};
  r.CarryParameters();
  TrainDiff d;
  for (int step = 0; step < steps; ++step) {
    Failure f = r.Run(Mode::kFree);
    if (f.outcome != Outcome::kPass) {
      f.message = fmt::format("step {}: {}", step, f.message);
      return {f, {}};
    }
    const StepRecord& s = r.step();
    d.ref_losses.push_back(s.ref_loss);
    d.dev_losses.push_back(s.dev_loss);
    const double loss_rel = Relative(s.dev_loss, s.ref_loss, 1e-30);
    d.loss_rel_at.push_back(loss_rel);
    d.grad_rel_at.push_back(0);
    d.grad_index_at.push_back(0);
    if (!(loss_rel <= d.loss_rel)) d.loss_rel = loss_rel;
    // A gradient below a millionth of the step's total norm holds rounding
    // noise only: judged against that floor (Note [Model verdicts]).
    double total = 0;
    for (double g : s.ref_grad_norms) total += g * g;
    const double floor = std::max(1e-6 * std::sqrt(total), 1e-30);
    for (size_t w = 0; w < s.ref_grad_norms.size() && w < s.dev_grad_norms.size(); ++w) {
      const double rel = Relative(s.dev_grad_norms[w], s.ref_grad_norms[w], floor);
      if (!(rel <= d.grad_rel_at.back())) {
        d.grad_rel_at.back() = rel;
        d.grad_index_at.back() = w;
      }
      if (!(rel <= d.grad_rel)) d.grad_rel = rel;
    }
  }
  double diff2 = 0, update2 = 0;
  for (const auto& p : r.Parameters()) {
    const at::Tensor ref = p.ref.to(at::kDouble), dev = p.dev.to(at::kDouble), init = p.initial.to(at::kDouble);
    const double diff = (dev - ref).norm().item<double>(), update = (ref - init).norm().item<double>();
    diff2 += diff * diff;
    update2 += update * update;

  }
  d.param_rel = update2 > 0 ? std::sqrt(diff2 / update2) : (diff2 > 0 ? INFINITY : 0);
  return {{}, d};
}

nlohmann::json Finite(double v) { return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json("inf"); }

}  // namespace

ModelCheckItem ReplayTraining(const Program& program, Backend& backend, const ProgramReplayOptions& options) {
  const auto start = Clock::now();
  ModelCheckItem item;
  item.item = "train";
  const int steps = std::max(1, options.check.train_steps);
  item.detail["steps"] = steps;
  try {
    bool has_optimizer = false;
    for (const auto& c : program.calls) has_optimizer = has_optimizer || c.phase == "optimizer";
    if (!has_optimizer) {
      Fail(item, Outcome::kSkipped, "the program has no optimizer step (capture it with a training profile)");
      item.seconds = Since(start);
      return item;
    }
    const TrainRun run = Train(program, backend, options, steps);
    const TrainDiff* diff = &run.diff;
    if (run.failure.outcome != Outcome::kPass) {
      Fail(item, run.failure.outcome, run.failure.message);
      if (run.failure.call >= 0) item.detail["failed_call"] = run.failure.call;
    } else {
      const bool low = [&] {
        for (const auto& v : program.values) {
          if (v.kind == "parameter" && v.tensor && (v.tensor->dtype == DType::kBFloat16 || v.tensor->dtype == DType::kFloat16)) return true;
        }
        return false;
      }();
      const double scale = low ? 10 : 1;
      double loss_tol = options.check.loss_rtol * scale, grad_tol = options.check.grad_norm_rtol * scale,
             param_tol = options.check.param_update_rtol * scale;
      auto judge = [&](const TrainDiff& d) {
        item.outcome = Outcome::kPass;
        item.error.clear();
        // The earliest miss names the item: a gradient of step s comes after
        // step s's loss and before step s+1's.
        for (size_t step = 0; step < d.loss_rel_at.size(); ++step) {
          if (!(d.loss_rel_at[step] <= loss_tol)) {
            Fail(item, std::isfinite(d.loss_rel_at[step]) ? Outcome::kMismatch : Outcome::kNonFiniteMismatch,
                 fmt::format("step {}: loss {:.6g} differs from the reference's {:.6g} by {:.3g} (relative; allowed "
                             "{:.3g})",
                             step, d.dev_losses[step], d.ref_losses[step], d.loss_rel_at[step], loss_tol));
          }
          if (!(d.grad_rel_at[step] <= grad_tol)) {
            Fail(item, std::isfinite(d.grad_rel_at[step]) ? Outcome::kMismatch : Outcome::kNonFiniteMismatch,
                 fmt::format("step {}: the norm of gradient {} differs from the reference's by {:.3g} (relative; "
                             "allowed {:.3g})",
                             step, d.grad_index_at[step], d.grad_rel_at[step], grad_tol));
          }
        }
        if (!(d.param_rel <= param_tol)) {
          Fail(item, std::isfinite(d.param_rel) ? Outcome::kMismatch : Outcome::kNonFiniteMismatch,
               fmt::format("parameters after {} steps differ from the reference's by {:.3g} of its update (allowed {:.3g})",
                           steps, d.param_rel, param_tol));
        }
      };
      judge(*diff);
      item.values_compared = true;
      item.max_rel_err = std::max({diff->loss_rel, diff->grad_rel, diff->param_rel});
      nlohmann::json ref_losses = nlohmann::json::array(), dev_losses = nlohmann::json::array();
      for (double v : diff->ref_losses) ref_losses.push_back(Finite(v));
      for (double v : diff->dev_losses) dev_losses.push_back(Finite(v));
      item.detail["reference_losses"] = ref_losses;
      item.detail["losses"] = dev_losses;
      item.detail["loss_rel"] = Finite(diff->loss_rel);
      item.detail["grad_norm_rel"] = Finite(diff->grad_rel);
      item.detail["param_update_rel"] = Finite(diff->param_rel);
      if (item.outcome != Outcome::kPass) {
        // Note [Reproducible training]: the reference against itself.
        CpuAgain cpu;
        const TrainRun again = Train(program, cpu, options, steps);
        const TrainDiff* self = &again.diff;
        if (again.failure.outcome == Outcome::kPass) {
          const double k = options.check.comparison.default_multiplier;
          item.detail["reference_reproducibility"] = {{"loss_rel", Finite(self->loss_rel)},
                                                      {"grad_norm_rel", Finite(self->grad_rel)},
                                                      {"param_update_rel", Finite(self->param_rel)}};
          const bool unreproducible = self->loss_rel > loss_tol || self->grad_rel > grad_tol || self->param_rel > param_tol;
          loss_tol = std::max(loss_tol, k * self->loss_rel);
          grad_tol = std::max(grad_tol, k * self->grad_rel);
          param_tol = std::max(param_tol, k * self->param_rel);
          const std::string strict = item.error;
          judge(*diff);
          if (item.outcome != Outcome::kPass && unreproducible) {
            item.outcome = Outcome::kSkipped;
            item.error = "no verdict: the CPU reference does not reproduce its own training at these tolerances (" +
                         strict + ")";
          }
        }
      }
      if (item.outcome != Outcome::kPass && item.outcome != Outcome::kSkipped && options.locate_first_divergent) {
        Replayer locate(program, &backend, options);
        if (locate.Prepare().outcome == Outcome::kPass) {
          const Failure lf = locate.Run(Mode::kLocate);
          if (!locate.divergent().is_null()) item.detail["first_divergent"] = locate.divergent();
          else if (lf.outcome != Outcome::kPass) item.detail["first_divergent_note"] = "the search stopped: " + lf.message;
        }
      }
    }
  } catch (const std::exception& e) {
    Fail(item, Outcome::kError, "internal error in coverage while replaying the training step: " + FirstLine(e.what(), 500));
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
  std::set<std::string> seen;
  std::vector<std::string> out;
  for (const auto& c : program.calls) {
    if (c.module.empty() || c.phase != "forward") continue;
    if (seen.insert(kind_of(c.module)).second) out.push_back(c.module);
  }
  return out;
}

std::vector<ModelCheckItem> RunProgramStage(const std::string& stage, const Program& program, Backend& backend,
                                            const ProgramReplayOptions& options) {
  if (stage == "module") {
    const auto modules = ModuleKinds(program);
    if (modules.empty()) {
      ModelCheckItem item;
      item.item = "*";
      item.outcome = Outcome::kSkipped;
      item.error = "no call of the program ran inside a module";
      return {item};
    }
    return ReplayModules(program, modules, backend, options);
  }
  if (stage == "train") return {ReplayTraining(program, backend, options)};
  if (stage == "model") return {ReplayProgram(program, backend, options)};
  ModelCheckItem item;
  item.item = "*";
  item.outcome = Outcome::kError;
  item.error = "'" + stage + "' is not a model-level stage (module, model, train)";
  return {item};
}

std::vector<ModelCheckItem> InProcessProgramStageRunner::Run(const std::string& stage, const std::string& /*model_id*/,
                                                             const std::string& /*profile*/, const Program& program) {
  return RunProgramStage(stage, program, backend_, options_);
}

}  // namespace coverage::replay
