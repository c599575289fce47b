#include "runners/model_session.h"

#include <algorithm>
#include <cctype>
#include <atomic>
#include <mutex>
#include <stdexcept>

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/record_function.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/library.h>

#include "runners/backend.h"

namespace coverage::runners {
namespace {

constexpr c10::DispatchKey kRouteKey = c10::DispatchKey::TESTING_ONLY_GenericMode;

thread_local DispatchRoute* tls_route = nullptr;
// The route of the newest scope on any thread: the autograd engine runs the
// backward of non-CPU tensors on its own device threads, which inherit the
// dispatch key (it travels in ThreadLocalState) but not tls_route. One model
// check runs at a time per process (model_check.h).
std::atomic<DispatchRoute*> g_route{nullptr};

std::string QualifiedName(const c10::OperatorHandle& op) {
  const auto& n = op.operator_name();
  return n.overload_name.empty() ? n.name : n.name + "." + n.overload_name;
}

at::Tensor ToDevice(const at::Tensor& t, c10::Device device) {
  return t.defined() && t.device() != device ? t.to(device) : t;
}

// Moves the tensors of argument `v` to `device`. Returns true when something moved.
bool MoveArgument(c10::IValue& v, c10::Device device) {
  if (v.isTensor()) {
    const at::Tensor& t = v.toTensor();
    if (!t.defined() || t.device() == device) return false;
    v = t.to(device);
    return true;
  }
  bool moved = false;
  if (v.isTensorList()) {
    c10::List<at::Tensor> list = v.toTensorList();
    c10::List<at::Tensor> out;
    for (const at::Tensor& t : list) {
      moved |= t.defined() && t.device() != device;
      out.push_back(ToDevice(t, device));
    }
    if (moved) v = out;
  } else if (v.isList()) {
    // Tensor?[] (aten::index): a list of optional tensors.
    c10::List<c10::IValue> list = v.toList();
    bool any_tensor = false;
    for (size_t i = 0; i < list.size(); ++i) any_tensor |= list.get(i).isTensor();
    if (!any_tensor) return false;
    c10::List<std::optional<at::Tensor>> out;
    for (size_t i = 0; i < list.size(); ++i) {
      c10::IValue e = list.get(i);
      if (e.isTensor()) {
        moved |= e.toTensor().device() != device;
        out.push_back(ToDevice(e.toTensor(), device));
      } else {
        out.push_back(std::nullopt);
      }
    }
    if (moved) v = out;
  }
  return moved;
}

void RouteFallback(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
  c10::impl::ExcludeDispatchKeyGuard exclude(kRouteKey);
  DispatchRoute* route = tls_route != nullptr ? tls_route : g_route.load();
  ModelSession* session = route ? route->session : nullptr;
  if (session && session->ShouldStop()) {
    session->MarkStopped();
    throw SessionStopped();
  }
  const bool to_backend =
      route && route->backend &&
      (!route->routed || route->routed(session ? session->module_path() : std::string()));
  if (!to_backend) {
    // Below this key, so the op is not observed a second time.
    op.redispatchBoxed(keys & c10::DispatchKeySet(c10::DispatchKeySet::FULL_AFTER, kRouteKey), stack);
  } else {
    const c10::Device device = route->backend->device();
    const auto& schema = op.schema();
    const size_t n_args = schema.arguments().size();
    const size_t first = stack->size() - n_args;
    // Arguments the op writes into, moved to the device: copied back after.
    std::vector<std::pair<at::Tensor, size_t>> written;
    for (size_t i = 0; i < n_args; ++i) {
      c10::IValue& v = (*stack)[first + i];
      // Factories (arange, full, zeros_like, ...) make their tensors on the device.
      if (schema.arguments()[i].type()->kind() == c10::TypeKind::OptionalType &&
          schema.arguments()[i].type()->castRaw<c10::OptionalType>()->getElementType()->kind() ==
              c10::TypeKind::DeviceObjType &&
          (v.isNone() || (v.isDevice() && v.toDevice() != device))) {
        v = device;
        continue;
      }
      at::Tensor original = v.isTensor() ? v.toTensor() : at::Tensor();
      if (!MoveArgument(v, device)) continue;
      const auto* alias = schema.arguments()[i].alias_info();
      if (original.defined() && alias && alias->isWrite()) written.emplace_back(original, first + i);
    }
    std::vector<at::Tensor> moved_written;
    for (auto& [original, index] : written) moved_written.push_back((*stack)[index].toTensor());
    try {
      route->backend->Execute(op, stack);
      for (size_t i = 0; i < written.size(); ++i) {
        if (moved_written[i].is_meta()) continue;  // shapes only: nothing to copy back
        at::Tensor& original = written[i].first;
        if (original.sizes() != moved_written[i].sizes()) original.resize_(moved_written[i].sizes());
        original.copy_(moved_written[i].to(original.device()));
      }
    } catch (const SessionStopped&) {
      throw;
    } catch (const std::exception& e) {
      throw std::runtime_error(QualifiedName(op) + " failed on backend " + route->backend->name() + ": " + e.what());
    }
    ++route->routed_ops;
    ++route->op_counts[QualifiedName(op)];
  }
  if (session) {
    for (const c10::IValue& v : *stack) {
      if (v.isTensor()) {
        session->NoteOpOutput(v.toTensor());
        break;
      }
    }
  }
}

void RegisterFallbackOnce() {
  static std::once_flag once;
  static torch::Library* library = nullptr;
  std::call_once(once, [] {
    // Kept for the life of the process: the registration ends with the Library.
    library = new torch::Library(torch::Library::IMPL, "_", kRouteKey, __FILE__, __LINE__);
    library->fallback(torch::CppFunction::makeFromBoxedFunction<&RouteFallback>());
  });
}

bool Contains(const std::string& s, const char* what) { return s.find(what) != std::string::npos; }

at::Tensor ZerosLike(const at::Tensor& meta) {
  return at::zeros(meta.sizes(), meta.options().device(c10::kCPU));
}

at::Tensor MetaLike(const at::Tensor& t) {
  return at::empty_strided(t.sizes(), t.strides(), t.options().device(c10::kMeta));
}

// Meta tensors in `v` become zero-filled CPU tensors (to_cpu) or CPU
// tensors become meta ones (!to_cpu).
c10::IValue Convert(const c10::IValue& v, bool to_cpu) {
  auto one = [&](const at::Tensor& t) {
    if (!t.defined()) return t;
    if (to_cpu) return t.is_meta() ? ZerosLike(t) : t;
    return t.is_meta() ? t : MetaLike(t);
  };
  if (v.isTensor()) return one(v.toTensor());
  if (v.isTensorList()) {
    c10::List<at::Tensor> out;
    for (const at::Tensor& t : v.toTensorList()) out.push_back(one(t));
    return out;
  }
  if (v.isTuple()) {
    std::vector<c10::IValue> items;
    for (const auto& e : v.toTupleRef().elements()) items.push_back(Convert(e, to_cpu));
    return c10::ivalue::Tuple::create(std::move(items));
  }
  if (v.isList()) {
    c10::List<c10::IValue> list = v.toList();
    bool tensors = false;
    for (size_t i = 0; i < list.size(); ++i) tensors |= list.get(i).isTensor();
    if (!tensors) return v;
    c10::List<std::optional<at::Tensor>> out;
    for (size_t i = 0; i < list.size(); ++i) {
      c10::IValue e = list.get(i);
      if (e.isTensor()) {
        out.push_back(one(e.toTensor()));
      } else {
        out.push_back(std::nullopt);
      }
    }
    return out;
  }
  return v;
}

}  // namespace

void MetaShapeBackend::Execute(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  // The routed call was recorded where the model made it; its meta and
  // zero-filled executions are not calls of the model.
  at::RecordFunctionGuard not_observed(/*is_enabled=*/false);
  const size_t n_args = op.schema().arguments().size();
  const size_t first = stack->size() - n_args;
  if (op.operator_name().name == "aten::embedding") {
    // embedding(weight, indices, ...) -> indices.shape + [weight.size(1)]
    const at::Tensor weight = (*stack)[first].toTensor(), indices = (*stack)[first + 1].toTensor();
    std::vector<int64_t> shape = indices.sizes().vec();
    shape.push_back(weight.size(1));
    stack->resize(first);
    stack->emplace_back(at::empty(shape, weight.options().device(c10::kMeta)));
    return;
  }
  const torch::jit::Stack args(stack->begin() + static_cast<std::ptrdiff_t>(first), stack->end());
  try {
    op.callBoxed(stack);
    return;
  } catch (const c10::Error&) {
    // No meta kernel (or one that needs data): run it on zeros below.
  }
  ++fallbacks;
  stack->resize(first);
  for (const c10::IValue& v : args) stack->push_back(Convert(v, /*to_cpu=*/true));
  op.callBoxed(stack);
  for (size_t i = first; i < stack->size(); ++i) (*stack)[i] = Convert((*stack)[i], /*to_cpu=*/false);
}

DispatchRouteScope::DispatchRouteScope(DispatchRoute* route)
    : previous_((RegisterFallbackOnce(), tls_route)), previous_global_(g_route.load()), include_(kRouteKey) {
  tls_route = route;
  g_route = route;
}

DispatchRouteScope::~DispatchRouteScope() {
  tls_route = previous_;
  g_route = previous_global_;
}

// Note [Module kinds]
// ~~~~~~~~~~~~~~~~~~~
// The module stage compares one module of each kind. The kind comes from the
// last component of the module path the families use (their Hugging Face
// names), checked in this order:
//   norm       ...norm..., ln_*, layrnorm (CLIP's spelling)
//   stem       patch embeddings, conv stems and feature extractors
//   embedding  ...embed..., rotary_emb, relative attention bias
//   linear_attention  ...linear_attn... (Gated DeltaNet)
//   attention  ...attn..., ...attention..., self, attention.output (BERT)
//   mlp        mlp, ffn, feed_forward, intermediate, fc1/fc2, output
//   head       lm_head, classifiers, poolers, projections, predictions
// masks and anything else are "other" (as are whole conv blocks). A family may name the
// kind itself where the path does not say (Nemotron-H's "mixer" is a Mamba-2
// mixer ("ssm"), attention or an MLP, by layer).
std::string ModuleKindOf(const std::string& module_path) {
  std::string last = module_path.substr(module_path.rfind('.') == std::string::npos ? 0 : module_path.rfind('.') + 1);
  // "conv_layers.3" and "layers.0": a number names the block its parent holds.
  if (!last.empty() && std::all_of(last.begin(), last.end(), [](unsigned char c) { return std::isdigit(c); })) {
    const std::string parent = module_path.substr(0, module_path.rfind('.'));
    if (Contains(parent, "conv_layers")) return "stem";
    return "other";
  }
  std::transform(last.begin(), last.end(), last.begin(), [](unsigned char c) { return std::tolower(c); });
  if (Contains(last, "mask")) return "other";  // attention masks are inputs, not modules
  if (last == "output") {
    // BERT's BertSelfOutput ("attention.output") closes the attention block;
    // the layer's own "output" closes its MLP.
    const std::string parent = module_path.substr(0, module_path.rfind('.'));
    const std::string parent_last = parent.substr(parent.rfind('.') == std::string::npos ? 0 : parent.rfind('.') + 1);
    return parent_last == "attention" ? "attention" : "mlp";
  }
  if (Contains(last, "norm") || last.rfind("ln_", 0) == 0 || Contains(last, "layrnorm")) return "norm";
  if (Contains(last, "patch") || Contains(last, "conv") || Contains(last, "feature_extractor") ||
      last == "embedder" || Contains(last, "feature_projection") || Contains(last, "downsampling")) {
    return "stem";
  }
  if (Contains(last, "embed") || Contains(last, "rotary") || Contains(last, "relative_attention_bias")) return "embedding";
  if (Contains(last, "linear_attn")) return "linear_attention";
  if (Contains(last, "attn") || Contains(last, "attention") || last == "self") return "attention";
  if (last == "mlp" || Contains(last, "ffn") || Contains(last, "feed_forward") || last == "intermediate" ||
      last == "fc1" || last == "fc2" || last == "output" || Contains(last, "experts") || last == "moe") {
    return "mlp";
  }
  if (Contains(last, "head") || Contains(last, "classifier") || Contains(last, "pooler") || Contains(last, "proj") ||
      Contains(last, "predictions") || Contains(last, "seq_relationship") || last == "qa_outputs") {
    return "head";
  }
  return "other";
}

void ModelSession::BeginRun(uint64_t seed) {
  // Weights draw from their own generator, so reusing them in a later call
  // leaves the global generator (the inputs) where the first call had it.
  generator_ = at::make_generator<at::CPUGeneratorImpl>(seed ^ 0x9e3779b97f4a7c15ULL);
  next_weight_ = 0;
  output_ = at::Tensor();
  last_op_output_ = at::Tensor();
  watched_.clear();
  stopped_ = false;
  path_.clear();
}

void ModelSession::Start() {
  if (recorder_) recorder_->Start();
  if (route && !route_scope_) route_scope_.emplace(route);
}

void ModelSession::Stop(const at::Tensor& output) {
  route_scope_.reset();
  if (recorder_) recorder_->Stop();
  output_ = output.defined() ? output : last_op_output_;
}

void ModelSession::SetModulePath(std::string path) {
  if (recorder_) recorder_->SetModulePath(path);
  path_ = std::move(path);
}

void ModelSession::EnterModule(const std::string& path, const std::string& kind) {
  if (!kind.empty()) kinds_[path] = kind;
  SetModulePath(path);
  last_op_output_ = at::Tensor();
}

// Note [Module outputs]
// ~~~~~~~~~~~~~~~~~~~~~
// A module's output is the first tensor returned by the last op called
// inside its scope: the families end every scope with the op that makes the
// module's result (the output projection, the norm's last scale, the
// residual add where the Hugging Face module includes it).
void ModelSession::ExitModule(const std::string& path) {
  if (watch && last_op_output_.defined() && watch(path)) {
    c10::impl::ExcludeDispatchKeyGuard exclude(c10::DispatchKey::TESTING_ONLY_GenericMode);
    watched_.emplace_back(path, last_op_output_.detach().to(c10::kCPU).clone());
  }
}

std::string ModelSession::KindOf(const std::string& path) const {
  auto it = kinds_.find(path);
  return it != kinds_.end() ? it->second : ModuleKindOf(path);
}

void ModelSession::NoteOpOutput(const at::Tensor& output) { last_op_output_ = output; }

at::Tensor ModelSession::Weight(WeightInit init, at::IntArrayRef shape, at::ScalarType dtype) {
  const bool keep = training;
  if (keep && next_weight_ < weights_.size()) return weights_[next_weight_++];
  if (!generator_) generator_ = at::make_generator<at::CPUGeneratorImpl>(0x9e3779b97f4a7c15ULL);
  at::Tensor w;
  if (device.is_meta()) {
    // Shapes only (MetaShapeBackend): no values, no memory.
    w = at::empty(shape, at::TensorOptions().dtype(dtype).device(c10::kMeta));
    if (keep) {
      weights_.push_back(w);
      ++next_weight_;
    }
    return w;
  }
  switch (init) {
    case WeightInit::kRandom:
      w = at::randn(shape, *generator_) * 0.02;
      break;
    case WeightInit::kOnes:
      w = at::ones(shape);
      break;
    case WeightInit::kZeros:
      w = at::zeros(shape);
      break;
  }
  if (weight_rounding) w = w.to(*weight_rounding);
  w = w.to(dtype);
  if (device != w.device()) w = w.to(device);
  if (training && at::isFloatingType(dtype)) w.requires_grad_(true);
  if (keep) {
    weights_.push_back(w);
    ++next_weight_;
  }
  return w;
}

}  // namespace coverage::runners
