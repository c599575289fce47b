#include "runners/capture.h"

#include <bit>
#include <cmath>
#include <limits>
#include <unordered_map>

#include <ATen/ATen.h>
#include <ATen/record_function.h>

#include "core/check.h"
#include "core/cost.h"
#include "runners/dtype_map.h"

namespace coverage::runners {

struct OpRecorder::State {
  CaptureOptions options;
  std::string module_path;
  std::vector<CapturedCall> calls;
  std::unordered_map<std::string, size_t> index;  // merge key -> calls_ position
  std::map<std::string, int64_t> skipped;

  struct Frame {
    std::string op;
    bool keep = false;
    OpCase op_case;
    std::string parent;
    int depth = 0;
    bool is_op = false;  // an operator call, not a named range such as the autograd engine's
  };
  std::vector<Frame> frames;
  int op_frames = 0;  // frames that are operator calls: the depth of the next call
  at::CallbackHandle handle = 0;
  bool recording = false;
};

namespace {

thread_local OpRecorder::State* tls_state = nullptr;

int64_t FloorPow2(int64_t v) { return v <= 0 ? 0 : int64_t{1} << (63 - std::countl_zero(static_cast<uint64_t>(v))); }

// Integer ranges are coarsened so that calls that only differ in their data
// (token ids, positions) merge into one case, while every replayed value
// stays valid where the real ones were (Note [Value domains]):
//  * lo is 0 when the smallest value seen is 0, 1 when it is positive (a
//    divisor stays non-zero), and -2^k >= the smallest when it is negative;
//  * hi (exclusive) is the largest power of two <= max + 1, so values stay
//    at or below the largest seen (an index stays inside its dimension).
int64_t IntegerLow(int64_t mn) {
  if (mn >= 0) return mn == 0 ? 0 : 1;
  if (mn == std::numeric_limits<int64_t>::min()) return mn;
  return -FloorPow2(-mn);
}

int64_t IntegerHigh(int64_t mx, int64_t lo) {
  int64_t hi;
  if (mx == std::numeric_limits<int64_t>::max()) {
    hi = mx;
  } else if (mx + 1 > 0) {
    hi = FloorPow2(mx + 1);
  } else {
    hi = mx + 1;
  }
  return hi > lo ? hi : lo + 1;
}

// See Note [Value domains] in materialize.cc. Called with record functions
// disabled: the min/max below are ATen calls themselves.
ValueDomain DomainOf(const at::Tensor& t) {
  ValueDomain d;
  if (t.scalar_type() == at::kBool) {
    d.kind = ValueDomain::Kind::kBool;
    return d;
  }
  if (t.numel() == 0 || t.is_meta() || !t.device().is_cpu() || t.is_complex()) return d;
  if (at::isIntegralType(t.scalar_type(), /*includeBool=*/false)) {
    const int64_t mn = t.min().item<int64_t>();
    const int64_t mx = t.max().item<int64_t>();
    d.kind = ValueDomain::Kind::kInteger;
    d.lo = IntegerLow(mn);
    d.hi = IntegerHigh(mx, d.lo);
    return d;
  }
  const at::Tensor f = t.to(at::kFloat);
  const double mn = f.min().item<double>();
  const double mx = f.max().item<double>();
  if (std::isnan(mn) || std::isnan(mx)) return d;
  if (mn <= -1e30) {
    // Additive masks hold 0 and -inf (or the dtype's lowest value).
    const bool only_zero_or_huge = f.gt(-1e30).logical_and(f.ne(0)).any().item<bool>() == false;
    if (only_zero_or_huge && mx <= 0) d.kind = ValueDomain::Kind::kMask;
    return d;
  }
  if (!std::isfinite(mx)) return d;
  if (mn > 0) {
    d.kind = ValueDomain::Kind::kPositive;
  } else if (mn >= 0 && mx <= 1) {
    d.kind = ValueDomain::Kind::kUnit;
  } else if (mn >= 0) {
    d.kind = ValueDomain::Kind::kNonNegative;
  }
  return d;
}

// Returns false (with `why`) when the tensor cannot be described.
bool DescribeTensor(const at::Tensor& t, bool with_domain, TensorSpec* spec, std::string* why) {
  if (t.layout() != at::kStrided) {
    *why = "non-strided tensor layout";
    return false;
  }
  if (t.is_quantized()) {
    *why = "quantized tensor";
    return false;
  }
  auto dtype = ToDType(t.scalar_type());
  if (!dtype) {
    *why = std::string("unsupported dtype ") + c10::toString(t.scalar_type());
    return false;
  }
  spec->dtype = *dtype;
  spec->shape = t.sizes().vec();
  spec->strides = t.strides().vec();
  spec->storage_offset = t.storage_offset();
  if (with_domain) spec->domain = DomainOf(t);
  return true;
}

// libtorch passes SymInt arguments as SymInt IValues (concrete in eager
// mode) or as plain ints.
bool IsSymInt(const c10::IValue& v) { return v.isSymInt(); }

int64_t ToInt(const c10::IValue& v) {
  if (v.isSymInt()) return v.toSymInt().expect_int();
  return v.toInt();
}

bool IsIntLike(const c10::IValue& list) {
  const auto elements = list.toListRef();
  if (elements.empty()) return false;
  for (const c10::IValue& e : elements) {
    if (!e.isInt() && !IsSymInt(e)) return false;
  }
  return true;
}

bool DescribeArgument(const c10::Argument& sarg, const c10::IValue& v, Argument* a, std::string* why) {
  a->name = sarg.name();
  if (v.isNone()) {
    a->kind = Argument::Kind::kNone;
  } else if (v.isTensor()) {
    const at::Tensor& t = v.toTensor();
    if (!t.defined()) {
      a->kind = Argument::Kind::kNone;
      return true;
    }
    a->kind = Argument::Kind::kTensor;
    // Outputs written by out= variants need no domain: their values are overwritten.
    const bool is_out = sarg.alias_info() && sarg.alias_info()->isWrite() && sarg.kwarg_only();
    return DescribeTensor(t, !is_out, &a->tensor, why);
  } else if (v.isTensorList()) {
    a->kind = Argument::Kind::kTensorList;
    for (const at::Tensor& t : v.toTensorVector()) {
      TensorSpec s;
      if (!DescribeTensor(t, true, &s, why)) return false;
      a->tensors.emplace_back(std::move(s));
    }
  } else if (v.isIntList()) {
    a->kind = Argument::Kind::kIntList;
    a->ints = v.toIntVector();
  } else if (v.isDoubleList()) {
    a->kind = Argument::Kind::kDoubleList;
    a->doubles = v.toDoubleVector();
  } else if (v.isBoolList()) {
    a->kind = Argument::Kind::kBoolList;
    for (bool b : v.toBoolList()) a->bools.push_back(b);
  } else if (v.isList() && IsIntLike(v)) {
    // SymInt[] (libtorch 2.x) with concrete values.
    a->kind = Argument::Kind::kIntList;
    for (const c10::IValue& e : v.toListRef()) a->ints.push_back(ToInt(e));
  } else if (v.isList()) {
    // Tensor?[] (e.g. aten::index.Tensor).
    a->kind = Argument::Kind::kTensorList;
    for (const c10::IValue& e : v.toListRef()) {
      if (e.isNone()) {
        a->tensors.emplace_back(std::nullopt);
      } else if (e.isTensor()) {
        TensorSpec s;
        if (!DescribeTensor(e.toTensor(), true, &s, why)) return false;
        a->tensors.emplace_back(std::move(s));
      } else {
        *why = "list of " + std::string(e.tagKind());
        return false;
      }
    }
  } else if (v.isInt() || IsSymInt(v)) {
    a->kind = Argument::Kind::kInt;
    a->i = ToInt(v);
  } else if (v.isDouble()) {
    a->kind = Argument::Kind::kDouble;
    a->d = v.toDouble();
  } else if (v.isBool()) {
    a->kind = Argument::Kind::kBool;
    a->b = v.toBool();
  } else if (v.isString()) {
    a->kind = Argument::Kind::kString;
    a->s = v.toStringRef();
  } else if (v.isDevice()) {
    a->kind = Argument::Kind::kDevice;
  } else {
    *why = "argument of type " + std::string(v.tagKind());
    return false;
  }
  return true;
}

void CollectOutputSpecs(const c10::IValue& v, std::vector<TensorSpec>* out) {
  if (v.isTensor()) {
    const at::Tensor& t = v.toTensor();
    TensorSpec s;
    std::string why;
    if (t.defined() && DescribeTensor(t, false, &s, &why)) out->push_back(std::move(s));
  } else if (v.isTensorList()) {
    for (const at::Tensor& t : v.toTensorVector()) CollectOutputSpecs(c10::IValue(t), out);
  } else if (v.isTuple()) {
    for (const auto& e : v.toTupleRef().elements()) CollectOutputSpecs(e, out);
  }
}

std::unique_ptr<at::ObserverContext> OnStart(const at::RecordFunction& fn) {
  OpRecorder::State* s = tls_state;
  if (!s || !s->recording) return nullptr;
  OpRecorder::State::Frame frame;
  auto name = fn.operator_name();
  frame.op = name ? name->name : fn.name();
  // Named ranges ("autograd::engine::evaluate_function: GeluBackward0")
  // do not nest: the ops the autograd engine calls are top-level calls.
  frame.is_op = name.has_value();
  frame.depth = s->op_frames;
  for (auto it = s->frames.rbegin(); it != s->frames.rend(); ++it) {
    if (it->is_op) {
      frame.parent = it->op;
      break;
    }
  }
  if (frame.is_op) ++s->op_frames;
  if (name && frame.depth <= s->options.max_depth) {
    auto handle = c10::Dispatcher::singleton().findSchema(*name);
    if (!handle) {
      ++s->skipped["no schema for " + frame.op];
    } else {
      at::RecordFunctionGuard no_recording(/*is_enabled=*/false);
      const auto& schema_args = handle->schema().arguments();
      auto inputs = fn.inputs();
      frame.op_case.op = name->name;
      frame.op_case.overload = name->overload_name;
      frame.keep = inputs.size() == schema_args.size();
      if (!frame.keep) ++s->skipped[frame.op + ": inputs do not match the schema"];
      for (size_t i = 0; frame.keep && i < schema_args.size(); ++i) {
        Argument a;
        std::string why;
        if (!DescribeArgument(schema_args[i], inputs[i], &a, &why)) {
          frame.keep = false;
          ++s->skipped[frame.op + ": " + why];
          break;
        }
        frame.op_case.args.push_back(std::move(a));
      }
    }
  }
  s->frames.push_back(std::move(frame));
  return nullptr;
}

void OnEnd(const at::RecordFunction& fn, at::ObserverContext*) {
  OpRecorder::State* s = tls_state;
  if (!s || s->frames.empty()) return;
  OpRecorder::State::Frame frame = std::move(s->frames.back());
  s->frames.pop_back();
  if (frame.is_op) --s->op_frames;
  if (!frame.keep) return;
  at::RecordFunctionGuard no_recording(/*is_enabled=*/false);
  std::vector<TensorSpec> outputs;
  for (const auto& v : fn.outputs()) CollectOutputSpecs(v, &outputs);
  const std::string key = frame.op_case.Key();
  const std::string merge_key = key + "|" + s->module_path + "|" + std::to_string(frame.depth) + "|" + frame.parent;
  auto it = s->index.find(merge_key);
  if (it != s->index.end()) {
    ++s->calls[it->second].count;
    return;
  }
  CapturedCall call;
  const CostEstimate cost = EstimateCost(frame.op_case, outputs);
  call.op_case = std::move(frame.op_case);
  call.key = key;
  call.module_path = s->module_path;
  call.parent_op = frame.parent;
  call.depth = frame.depth;
  call.count = 1;
  call.flops = cost.flops;
  call.bytes = cost.bytes;
  s->index.emplace(merge_key, s->calls.size());
  s->calls.push_back(std::move(call));
}

}  // namespace

OpRecorder::OpRecorder(CaptureOptions options) : state_(std::make_unique<State>()) { state_->options = options; }

OpRecorder::~OpRecorder() { Stop(); }

void OpRecorder::Start() {
  if (state_->recording) return;
  COV_CHECK(tls_state == nullptr, "another OpRecorder is already recording on this thread");
  tls_state = state_.get();
  state_->recording = true;
  state_->handle = at::addThreadLocalCallback(at::RecordFunctionCallback(&OnStart, &OnEnd)
                                                  .needsInputs(true)
                                                  .needsOutputs(true)
                                                  .scopes({at::RecordScope::FUNCTION}));
}

void OpRecorder::Stop() {
  if (!state_->recording) return;
  at::removeCallback(state_->handle);
  state_->recording = false;
  state_->frames.clear();
  state_->op_frames = 0;
  if (tls_state == state_.get()) tls_state = nullptr;
}

void OpRecorder::SetModulePath(std::string path) { state_->module_path = std::move(path); }
const std::string& OpRecorder::module_path() const { return state_->module_path; }

std::vector<CapturedCall> OpRecorder::TakeCalls() {
  std::vector<CapturedCall> out = std::move(state_->calls);
  state_->calls.clear();
  state_->index.clear();
  return out;
}

const std::map<std::string, int64_t>& OpRecorder::skipped() const { return state_->skipped; }

ModuleScope::ModuleScope(OpRecorder* recorder, std::string path) : recorder_(recorder) {
  previous_ = recorder_->module_path();
  recorder_->SetModulePath(std::move(path));
}

ModuleScope::~ModuleScope() { recorder_->SetModulePath(std::move(previous_)); }

}  // namespace coverage::runners
