#include "replay/replayer.h"

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
#include "core/input_rules.h"
#include "replay/call_engine.h"
#include "replay/compare.h"
#include "replay/composites.h"
#include "backends/dtype_map.h"
#include "replay/materialize.h"
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

namespace coverage::replay::programs {
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
  c10::TypePtr t = a.real_type();  // type() is the schema's stand-in (int)
  if (auto opt = t->cast<c10::OptionalType>()) t = opt->getElementType();
  return t->kind() == c10::TypeKind::ScalarTypeType;
}

bool IsOptionalTensorListArg(const c10::Argument& a) {
  auto list = a.type()->cast<c10::ListType>();
  return list && list->getElementType()->cast<c10::OptionalType>() != nullptr;
}

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
// A seeded op whose arguments turn its draw off computes deterministically
// and is judged like any call: attention and dropout with a probability of
// 0 (scaled_dot_product_attention's dropout_p in inference), dropout outside
// training (train=False). Judged as a draw, a wrong attention kernel would
// only have to match the reference's mean and spread.
constexpr int64_t kRandomStatsMin = 256;

bool DrawsGivenItsArguments(const OpCase& c) {
  for (const Argument& a : c.args) {
    if ((a.name == "dropout_p" || a.name == "p") && a.kind == Argument::Kind::kDouble && a.d == 0.0) return false;
    if ((a.name == "train" || a.name == "training") && a.kind == Argument::Kind::kBool && !a.b) return false;
  }
  return true;
}

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

const nlohmann::json kNoInit = nlohmann::json::object();

std::string ShapeOf(const at::Tensor& t) { return fmt::format("[{}]", fmt::join(t.sizes(), ",")); }

}  // namespace

Replayer::Replayer(const Program& program, Backend* backend, const ProgramReplayOptions& options)
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

Failure Replayer::Prepare() {
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
    Op op{*handle, {}, {}, handle->hasTag(at::Tag::nondeterministic_seeded) && DrawsGivenItsArguments(*c.op_case)};
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

Failure Replayer::Run(Mode mode, const std::set<std::string>& modules) {
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
  module_calls_.clear();
  normed_.clear();
  step_ = StepRecord{};
  shape_samples_.clear();
  shape_bytes_.clear();
  calls_without_shapes_ = 0;
  if (mode_ == Mode::kShapes) {
    // Carried values are there from the start of every pass but the first.
    for (int64_t id : carried_) {
      if (auto made = Ref(id); !made) return {Outcome::kSkipped, made.error().message()};
    }
  }
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

at::Tensor Replayer::golden(int64_t id) const {
  auto it = golden_.find(id);
  return it == golden_.end() ? at::Tensor() : it->second;
}

int64_t Replayer::module_calls(const std::string& module) const {
  auto it = module_calls_.find(module);
  return it == module_calls_.end() ? 0 : it->second;
}

void Replayer::CarryParameters(bool keep_initial) {
  for (const auto& v : program_.values) {
    if (v.kind == "parameter" || v.kind == "buffer") carried_.insert(v.id);
  }
  record_initial_ = keep_initial;
}

std::vector<Replayer::ParameterState> Replayer::Parameters() const {
  std::vector<ParameterState> out;
  for (const auto& v : program_.values) {
    if (v.kind != "parameter") continue;
    auto i = initial_.find(v.id);
    auto r = ref_.find(v.id);
    auto d = dev_.find(v.id);
    if ((record_initial_ && i == initial_.end()) || r == ref_.end()) continue;
    out.push_back({v.name, i == initial_.end() ? at::Tensor() : i->second, r->second,
                   d == dev_.end() ? at::Tensor() : d->second.to(c10::kCPU)});
  }
  return out;
}

at::Tensor Replayer::MakeLeaf(const ProgramValue& v, bool to_double) {
  const TensorSpec& spec = *v.tensor;
  const uint64_t seed = options_.check.seed;
  at::Tensor t;
  const at::ScalarType st = ToScalarType(spec.dtype);
  if (!v.scalar.is_null()) {
    const nlohmann::json& j = v.scalar;
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
    const nlohmann::json& init = v.init.is_object() ? v.init : kNoInit;
    if (init.contains("rule") && init["rule"].is_string()) rule = init["rule"].get<std::string>();
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

void Replayer::Track(const at::Tensor& t, int delta) {
  if (!t.defined() || !t.has_storage()) return;
  const void* key = t.storage().unsafeGetStorageImpl();
  LiveStorage& s = storages_[key];
  const auto bytes = static_cast<int64_t>(t.storage().nbytes());
  if (delta > 0 && s.refs++ == 0) {
    live_bytes_ += bytes;
    s.bytes64 = t.is_floating_point() ? bytes / static_cast<int64_t>(t.element_size()) * 8 : bytes;
    live_bytes64_ += s.bytes64;
  }
  if (delta < 0 && --s.refs == 0) {
    live_bytes_ -= bytes;
    live_bytes64_ -= s.bytes64;
    storages_.erase(key);
  }
  peak_live_bytes_ = std::max(peak_live_bytes_, live_bytes_);
}

void Replayer::Put(std::unordered_map<int64_t, at::Tensor>& table, int64_t id, const at::Tensor& t) {
  auto it = table.find(id);
  if (it != table.end()) {
    Track(it->second, -1);
    it->second = t;
  } else {
    table.emplace(id, t);
  }
  Track(t, +1);
}

void Replayer::Drop(std::unordered_map<int64_t, at::Tensor>& table, int64_t id) {
  auto it = table.find(id);
  if (it == table.end()) return;
  Track(it->second, -1);
  table.erase(it);
}

Result<at::Tensor> Replayer::Ref(int64_t id) {
  auto it = ref_.find(id);
  if (it != ref_.end()) return it->second;
  auto leaf = leaves_.find(id);
  if (leaf == leaves_.end()) return Status::InvalidArgument(fmt::format("value {} is read before any call made it", id));
  if (!leaf->second->tensor) {
    return Status::InvalidArgument(fmt::format("value {} ('{}') cannot be made: {}", id, leaf->second->name,
                                               leaf->second->unsupported));
  }
  at::Tensor t;
  if (mode_ == Mode::kShapes && leaf->second->scalar.is_null()) {
    const TensorSpec& spec = *leaf->second->tensor;
    t = at::empty({spec.StorageNumel()}, at::TensorOptions().dtype(ToScalarType(spec.dtype)).device(c10::kMeta))
            .as_strided(spec.shape, spec.strides, spec.storage_offset);
  } else {
    t = MakeLeaf(*leaf->second, mode_ == Mode::kGolden);
  }
  Put(ref_, id, t);
  if (record_initial_ && leaf->second->kind == "parameter") initial_[id] = t.clone();
  return t;
}

at::Tensor Replayer::ToDevice(const at::Tensor& t) {
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

Result<at::Tensor> Replayer::Dev(int64_t id) {
  auto it = dev_.find(id);
  if (it != dev_.end()) return it->second;
  if (!leaves_.count(id)) return Status::InvalidArgument(fmt::format("value {} has no backend value", id));
  auto r = Ref(id);
  if (!r) return r.error();
  at::Tensor t = ToDevice(*r);
  Put(dev_, id, t);
  return t;
}

Result<torch::jit::Stack> Replayer::BuildStack(const ProgramCall& call, const Op& op, const Lookup& lookup, c10::Device device,
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

Failure Replayer::RunReference(const ProgramCall& call, const Op& op, std::vector<c10::IValue>* outputs) {
  const bool to_double = mode_ == Mode::kGolden;
  Status built;  // arguments that cannot be built: the program's fault, named with the call
  const auto t0 = Clock::now();
  auto done = CallReference(
      op.handle, op.mutated,
      [&]() {
        auto stack = BuildStack(
            call, op, [&](int64_t id, bool) { return Ref(id); }, c10::Device(c10::kCPU), to_double);
        if (!stack) built = stack.error();
        return stack;
      },
      500, to_double ? nullptr : &options_.check.comparison.numerics);
  if (!done) {
    if (!built.ok()) {
      return {Outcome::kSkipped, fmt::format("call {} ({}): {}", call.index, Qualified(call), built.message()),
              call.index};
    }
    return {Outcome::kSkipped,
            fmt::format("the CPU reference cannot replay call {} ({}): {}", call.index, Qualified(call),
                        done.error().message()),
            call.index};
  }
  if (done->upcast) ++reference_upcasts_;
  reference_rounded_ += done->rounded_operands;
  reference_seconds_ += Since(t0);
  *outputs = FlattenReturns(done->after);
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

Failure Replayer::RunBackend(const ProgramCall& call, const Op& op, const Lookup& lookup, std::vector<c10::IValue>* outputs) {
  if (options_.before_backend_call) options_.before_backend_call(call);
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
    const CallFailure failure = BackendFailure(e, 1000);
    return {failure.outcome,
            fmt::format("call {} ({}, module '{}'): {}", call.index, Qualified(call), call.module, failure.message),
            call.index};
  }
  backend_seconds_ += Since(t0);
  *outputs = FlattenReturns(*stack);
  if (outputs->size() != call.outputs.size()) {
    return {Outcome::kError,
            fmt::format("call {} ({}): the backend returned {} values, the reference {}", call.index, Qualified(call),
                        outputs->size(), call.outputs.size()),
            call.index};
  }
  return {};
}

Failure Replayer::CompareCall(const ProgramCall& call, const Op& op, const std::vector<c10::IValue>& got,
                    const std::vector<c10::IValue>& want) {
  CallGolden golden([&]() {
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
    if (!stack) throw std::runtime_error(stack.error().message());
    op.handle.callBoxed(&*stack);
    return FlattenReturns(*stack);
  });
  const CallVerdict verdict =
      JudgeCall({.op_case = &*call.op_case,
                 .comparison = &options_.check.comparison,
                 .backend = &got,
                 .reference = &want,
                 .golden = options_.check.golden == GoldenMode::kNever ? nullptr : &golden});
  const int64_t k = verdict.FirstFailing();
  if (k < 0) return {};
  const OutputVerdict& o = verdict.outputs[static_cast<size_t>(k)];
  divergent_ = {{"call", call.index},
                {"op", Qualified(call)},
                {"case_key", call.op_case->Key()},
                {"module", call.module},
                {"phase", call.phase},
                {"output", k},
                {"outcome", std::string(OutcomeName(o.outcome))},
                {"message", o.message}};
  if (o.tensor) {
    divergent_["max_abs_err"] = o.tensor->max_abs_err;
    divergent_["cosine"] = o.tensor->cosine;
    if (o.tensor->error_ratio) divergent_["error_ratio"] = *o.tensor->error_ratio;
  }
  if (!call.decomposition.empty()) divergent_["decomposition"] = call.decomposition;
  return {o.outcome, fmt::format("call {} ({}) output {}: {}", call.index, Qualified(call), k, o.message), call.index};
}

Failure Replayer::CompareDraws(const ProgramCall& call, const std::vector<c10::IValue>& got,
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

Failure Replayer::DrawMismatch(const ProgramCall& call, size_t output, const std::string& problem) {
  return {Outcome::kMismatch,
          fmt::format("call {} ({}, module '{}') output {}: a random call: {}", call.index, Qualified(call),
                      call.module, output, problem),
          call.index};
}

bool Replayer::ReadLater(int64_t id, int64_t index) const {
  auto it = last_read_.find(id);
  return it != last_read_.end() && it->second > index;
}

void Replayer::Release(const ProgramCall& call) {
  for (const auto* ids : {&call.inputs, &call.outputs}) {
    for (int64_t id : *ids) {
      // kShapes keeps what the replay judges (the outputs nothing reads), as kFree's judged_ does.
      if (mode_ == Mode::kShapes && ids == &call.outputs && !ReadLater(id, call.index)) continue;
      if (id >= 0 && !ReadLater(id, call.index) && !carried_.count(id)) {
        Drop(ref_, id);
        Drop(dev_, id);
      }
    }
  }
}

void Replayer::HandOver(const ProgramCall& call) {
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

void Replayer::RecordTraining(const ProgramCall& call) {
  if (call.phase == "forward") {
    for (int64_t id : call.outputs) {
      if (id != loss_id_) continue;
      auto r = ref_.find(id);
      auto d = dev_.find(id);
      if (r == ref_.end() || r->second.dim() != 0 || !r->second.is_floating_point()) continue;
      step_.ref_loss = r->second.item<double>();
      if (d != dev_.end()) step_.dev_loss = d->second.to(c10::kCPU).item<double>();
    }
  } else if (call.phase == "optimizer") {
    for (int64_t id : call.inputs) {
      if (!grads_.count(id) || !normed_.insert(id).second) continue;
      auto r = ref_.find(id);
      auto d = dev_.find(id);
      if (r == ref_.end() || (mode_ != Mode::kGolden && d == dev_.end())) continue;
      step_.ref_grad_norms.push_back(r->second.to(at::kDouble).norm().item<double>());
      if (d != dev_.end()) step_.dev_grad_norms.push_back(d->second.to(c10::kCPU).to(at::kDouble).norm().item<double>());
    }
  }
}

Failure Replayer::ReferenceFirst(const ProgramCall& call, const Op& op, const Failure& backend,
                       std::vector<c10::IValue>* want) {
  if (backend.outcome != Outcome::kError && backend.outcome != Outcome::kUnsupported) return backend;
  Failure r = RunReference(call, op, want);
  return r.outcome == Outcome::kPass ? backend : r;
}

Failure Replayer::MeasureCall(const ProgramCall& call, const Op& op) {
  auto stack = BuildStack(
      call, op, [&](int64_t id, bool) { return Ref(id); }, c10::Device(c10::kMeta), false);
  if (!stack) {
    return {Outcome::kSkipped, fmt::format("call {} ({}): {}", call.index, Qualified(call), stack.error().message()),
            call.index};
  }
  ShapeSample sample;
  if (const auto* names = options_.check.comparison.numerics.OperandsOf(call.op)) {
    const auto& args = op.handle.schema().arguments();
    for (size_t i = 0; i < args.size() && i < stack->size(); ++i) {
      if (op.mutated[i] || !(*stack)[i].isTensor()) continue;
      if (!names->empty() && std::find(names->begin(), names->end(), args[i].name()) == names->end()) continue;
      const at::Tensor& t = (*stack)[i].toTensor();
      if (t.defined() && t.scalar_type() == at::kFloat) sample.rounded += t.numel() * 4;
    }
  }
  std::vector<c10::IValue> outputs;
  try {
    op.handle.callBoxed(&*stack);
    outputs = FlattenReturns(*stack);
  } catch (const std::exception&) {
    outputs.clear();  // no meta kernel, or sizes that depend on values
  }
  if (outputs.size() != call.outputs.size()) {
    // Sized as the calls that read them see them; an output nothing reads is not known.
    ++calls_without_shapes_;
    if (read_specs_.empty()) {
      for (const auto& c : program_.calls) {
        if (!c.op_case) continue;
        size_t k = 0;
        for (const auto& a : c.op_case->args) {
          if (a.kind == Argument::Kind::kTensor && k < c.inputs.size()) read_specs_.emplace(c.inputs[k++], &a.tensor);
          if (a.kind != Argument::Kind::kTensorList) continue;
          for (const auto& t : a.tensors) {
            if (k < c.inputs.size() && t) read_specs_.emplace(c.inputs[k], &*t);
            ++k;
          }
        }
      }
    }
    outputs.assign(call.outputs.size(), c10::IValue());
    for (size_t k = 0; k < call.outputs.size(); ++k) {
      auto spec = read_specs_.find(call.outputs[k]);
      if (spec == read_specs_.end()) continue;
      const TensorSpec& s = *spec->second;
      outputs[k] = at::empty({s.StorageNumel()}, at::TensorOptions().dtype(ToScalarType(s.dtype)).device(c10::kMeta))
                       .as_strided(s.shape, s.strides, s.storage_offset);
    }
  }
  for (size_t k = 0; k < outputs.size(); ++k) {
    const int64_t id = call.outputs[k];
    if (id < 0 || !outputs[k].isTensor()) continue;
    const at::Tensor& t = outputs[k].toTensor();
    if (t.defined() && t.has_storage()) {
      if (!storages_.count(t.storage().unsafeGetStorageImpl())) sample.fresh += static_cast<int64_t>(t.storage().nbytes());
      shape_bytes_[id] = static_cast<int64_t>(t.storage().nbytes());
    }
    Put(ref_, id, t);
  }
  sample.live = live_bytes_;
  sample.live64 = live_bytes64_;
  shape_samples_.push_back(sample);
  return {};
}

Failure Replayer::Step(const ProgramCall& call) {
  const Op& op = ops_[static_cast<size_t>(call.index)];
  if (mode_ == Mode::kShapes) {
    Failure f = MeasureCall(call, op);
    if (f.outcome == Outcome::kPass) Release(call);
    return f;
  }
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
        const int64_t first = call.outputs.front();
        const bool by_product = k > 0 && first >= 0 && (ReadLater(first, call.index) || carried_.count(first));
        judged_.push_back({id, call.index, b.to(c10::kCPU), r, Qualified(call), call.phase,
                           options_.check.comparison.ValuesCompared(*call.op_case, k),
                           mode_ == Mode::kModule ? call.module : "", by_product});
      }
    }
    if (!carried_.empty()) RecordTraining(call);
  } else if (mode_ == Mode::kLocate && (modules_.empty() || InModule(call))) {
    // The backend gets copies of the reference's inputs (its writes must
    // not reach the reference's table), before the reference runs. Located
    // within modules, a module's first divergent call is kept and the pass
    // goes on for the others (every call is fed the reference's inputs, so
    // one module's divergence does not reach another's).
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
      if (modules_.empty()) return f;
      divergent_by_module_.emplace(call.module, std::exchange(divergent_, nlohmann::json()));
      if (want.empty()) {
        if (Failure r = RunReference(call, op, &want); r.outcome != Outcome::kPass) return r;
      }
    } else {
      f = RunReference(call, op, &want);
      if (f.outcome != Outcome::kPass) return f;
      f = op.random ? CompareDraws(call, got, want) : CompareCall(call, op, got, want);
      if (f.outcome != Outcome::kPass) {
        if (modules_.empty()) return f;
        divergent_by_module_.emplace(call.module, std::exchange(divergent_, nlohmann::json()));
      }
    }
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
      if (!carried_.empty()) RecordTraining(call);  // the golden step (Note [Training verdicts])
    }
  }
  Release(call);
  return {};
}

}  // namespace coverage::replay::programs
