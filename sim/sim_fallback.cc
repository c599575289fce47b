// The host fallback of the simulated device (Note [Host fallback]): every op
// without a native kernel runs on ATen's CPU kernel over host views of its
// sim arguments. On the way it simulates what sim/README.md describes: the
// bf16 numerics of matmul-like ops, compilation on a signature's first call
// (Note [Simulated compilation]), sim's own generators (Note [Sim
// generators]) and, through sim_faults.cc, the configured faults.
#include <algorithm>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

#include "sim/sim_internal.h"

namespace coverage::sim::internal {
namespace {

std::string Signature(const std::string& qualified, const std::vector<c10::IValue>& args) {
  std::string sig = qualified;
  for (const auto& a : args) {
    sig += '|';
    ForEachTensor(a, [&](const at::Tensor& t) {
      if (!t.defined()) {
        sig += "-;";
        return;
      }
      sig += DTypeName(t.scalar_type());
      for (int64_t s : t.sizes()) sig += "," + std::to_string(s);
      sig += ';';
    });
  }
  return sig;
}

// Note [Simulated compilation]: graph-compiling backends compile each new
// (op, shapes, dtypes) signature on its first call and hit a cache after
// that. sim counts the first call of a signature in the process as a compile
// (sleeping compile_us) and later ones as cache hits. Views (ops whose every
// result aliases an argument without writing it) are neither.
void SimulateCompilation(const std::string& qualified, const std::vector<c10::IValue>& args, int64_t compile_us) {
  const std::string sig = Signature(qualified, args);
  bool first = false;
  {
    std::lock_guard<std::mutex> lock(S().mu);
    first = S().signatures.insert(sig).second;
    S().counters[first ? "compiles" : "cache_hits"] += 1;
  }
  if (first && compile_us > 0) std::this_thread::sleep_for(std::chrono::microseconds(compile_us));
}

bool InOpList(const std::vector<std::string>& list, const std::string& qualified, const std::string& bare) {
  return std::find(list.begin(), list.end(), qualified) != list.end() ||
         std::find(list.begin(), list.end(), bare) != list.end();
}

bool IsMatmulOperand(const std::string& bare, const std::string& arg) {
  const std::vector<std::string> operands = RoundedOperands(bare);
  return operands.empty() || std::find(operands.begin(), operands.end(), arg) != operands.end();
}

struct Alias {
  at::Tensor sim;                   // the sim argument
  at::Tensor host;                  // its host view (Note [Host views])
  const c10::StorageImpl* storage;  // the host view's storage, as made
  const char* data;                 // the sim bytes
  size_t nbytes;
};

class HostCall {
 public:
  // Converts one argument: sim tensors to host views, devices to cpu, sim
  // generators to CPU generators holding their state. `generator_arg` says
  // the schema takes a Generator? here: None stands for sim's default
  // generator, as on a device (Note [Sim generators]).
  c10::IValue ToHost(const c10::IValue& v, bool round_fp32, bool generator_arg) {
    if (v.isDevice() && v.toDevice().type() == kSimType) return c10::IValue(c10::Device(c10::kCPU));
    if (generator_arg && (v.isNone() || v.isGenerator())) {
      at::Generator sim = v.isNone() ? DefaultGenerator(0) : v.toGenerator();
      if (sim.device().type() != kSimType) return v;
      at::Generator cpu = at::make_generator<at::CPUGeneratorImpl>();
      {
        std::lock_guard<std::mutex> lock(sim.mutex());
        cpu.set_state(sim.get_state());
      }
      generators_.emplace_back(sim, cpu);
      return c10::IValue(cpu);
    }
    return MapTensors(v, [&](const at::Tensor& t) { return ToHostTensor(t, round_fp32); });
  }

  // Moves what CPU kernels did to host views back into sim memory: a view
  // whose storage was resized or replaced gets fresh sim bytes, and one
  // whose geometry changed (resize_, as_strided_, squeeze_) passes it on.
  void SyncBack() {
    for (auto& [sim, cpu] : generators_) {
      std::lock_guard<std::mutex> lock(sim.mutex());
      sim.set_state(cpu.get_state());
    }
    for (Alias& a : aliases_) {
      const c10::Storage& hs = a.host.storage();
      if (hs.unsafeGetStorageImpl() != a.storage || static_cast<const char*>(hs.data_ptr().get()) != a.data ||
          hs.nbytes() != a.nbytes) {
        ReplaceStorageBytes(a.sim.storage(), hs.nbytes(), hs.data_ptr().get(), hs.nbytes());
        a.data = static_cast<const char*>(a.sim.storage().data_ptr().get());
        a.nbytes = hs.nbytes();
      }
      if (a.host.sizes() != a.sim.sizes() || a.host.strides() != a.sim.strides() ||
          a.host.storage_offset() != a.sim.storage_offset()) {
        SetGeometry(a.sim, a.host.sizes(), a.host.strides(), a.host.storage_offset());
      }
    }
  }

  // The sim tensor of the same memory when `t` is (a view of) a sim argument.
  std::optional<at::Tensor> SimAliasOf(const at::Tensor& t) const {
    if (!t.defined() || !t.has_storage()) return std::nullopt;
    const c10::StorageImpl* impl = t.storage().unsafeGetStorageImpl();
    const char* p = static_cast<const char*>(t.storage().data_ptr().get());
    for (const Alias& a : aliases_) {
      if (impl == a.storage || impl == a.host.storage().unsafeGetStorageImpl()) {
        return WithMathBitsOf(
            TensorOver(a.sim.storage(), a.sim.key_set(), t.dtype(), t.sizes(), t.strides(), t.storage_offset()), t);
      }
      // Memory inside a sim argument's bytes under another storage object.
      if (p != nullptr && p >= a.data && p < a.data + a.nbytes) {
        const int64_t bytes = (p - a.data) + t.storage_offset() * static_cast<int64_t>(t.dtype().itemsize());
        if (bytes % static_cast<int64_t>(t.dtype().itemsize()) == 0) {
          return WithMathBitsOf(TensorOver(a.sim.storage(), a.sim.key_set(), t.dtype(), t.sizes(), t.strides(),
                                           bytes / static_cast<int64_t>(t.dtype().itemsize())),
                                t);
        }
      }
    }
    return std::nullopt;
  }

  // Converts one result: a CPU tensor in a sim argument's memory becomes a
  // sim tensor sharing that storage; any other CPU tensor is copied into a
  // fresh sim allocation.
  c10::IValue ToSim(const c10::IValue& v) const {
    return MapTensors(v, [&](const at::Tensor& t) { return ToSimTensor(t); });
  }

  at::Tensor ToSimTensor(const at::Tensor& t) const {
    if (!t.defined() || !t.device().is_cpu()) return t;
    if (auto alias = SimAliasOf(t)) return *alias;
    return SimCopyOf(t);
  }

 private:
  at::Tensor ToHostTensor(const at::Tensor& t, bool round_fp32) {
    if (!IsSim(t)) return t;
    at::Tensor host = HostView(t);
    if (round_fp32 && host.scalar_type() == c10::kFloat) {
      Count("bf16_rounded_operands");
      return host.to(c10::kBFloat16).to(c10::kFloat);
    }
    const c10::StorageImpl* impl = host.storage().unsafeGetStorageImpl();
    aliases_.push_back(Alias{t, host, impl, static_cast<const char*>(t.storage().data_ptr().get()), t.storage().nbytes()});
    return host;
  }

  std::vector<Alias> aliases_;
  std::vector<std::pair<at::Generator, at::Generator>> generators_;  // (sim, its CPU stand-in)
};

// Note [Sim generators]: a random op on sim (normal_, uniform_, bernoulli,
// randperm, ...) draws from sim's generator, never the host's: its
// Generator? argument, or sim's default generator when it is None. Since the
// kernel runs on the host, it gets a CPU generator with that state, and the
// state it leaves is copied back, so a seeded sequence of random ops on sim
// is reproducible and independent of the CPU's. Random results are compared
// by shape and dtype only (replay/replay.cc), so the streams need not equal
// the CPU reference's.
bool IsGeneratorArgument(const c10::Argument& a) {
  const c10::TypePtr& t = a.type();
  if (t->kind() == c10::TypeKind::GeneratorType) return true;
  return t->kind() == c10::TypeKind::OptionalType &&
         t->expectRef<c10::OptionalType>().getElementType()->kind() == c10::TypeKind::GeneratorType;
}

// Note [Host fallback]: every op without a native sim kernel lands here. The
// sim arguments are shown to ATen's CPU kernel as host views (Note [Host
// views]) and the op runs on CPU; results that live in an argument's memory
// (views, in-place, out=) come back as sim tensors sharing its storage, the
// rest are copied into fresh sim memory. Returns the schema marks as written
// arguments (Tensor(a!)) are the argument objects themselves.
// Like a real device, sim refuses an op whose tensors live on the device
// and on the host at once (0-dim host tensors, scalars, excepted): a model
// stage that left a buffer on the CPU must fail here as it would on
// hardware, not quietly run on the host.
void RefuseMixedDevices(const c10::FunctionSchema& schema, const std::string& qualified,
                        const std::vector<c10::IValue>& args) {
  bool any_sim = false;
  std::string host_arg;
  for (size_t i = 0; i < args.size(); ++i) {
    ForEachTensor(args[i], [&](const at::Tensor& t) {
      if (!t.defined()) return;
      if (IsSim(t)) {
        any_sim = true;
      } else if (host_arg.empty() && !(t.device().is_cpu() && t.dim() == 0)) {
        host_arg = schema.arguments()[i].name();
      }
    });
  }
  TORCH_CHECK(!any_sim || host_arg.empty(),
              "Expected all tensors to be on the same device, but found at least two devices, ", kSimDevice,
              " and cpu! (when checking argument '", host_arg, "' of ", qualified, ")");
}

}  // namespace

void HostFallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const std::string qualified = QualifiedName(op);
  const std::string& bare = op.operator_name().name;
  const c10::FunctionSchema& schema = op.schema();
  std::shared_ptr<const Config> config = CurrentConfig();
  std::vector<c10::IValue> args = torch::jit::pop(*stack, schema.arguments().size());
  RefuseMixedDevices(schema, qualified, args);

  const FaultRule* fault = MatchFault(*config, qualified, bare, args);
  if (fault != nullptr) {
    Count("faults_injected");
    FaultBeforeRunning(*fault, qualified);
  }
  // Views only describe memory: nothing to compile.
  bool is_view = !schema.returns().empty();
  for (const c10::Argument& ret : schema.returns()) is_view = is_view && ret.alias_info() && !ret.alias_info()->isWrite();
  if (!is_view) SimulateCompilation(qualified, args, config->compile_us);
  Count("fallbacks");
  Count("fallback:" + qualified);

  const bool round = config->numerics == Numerics::kBf16Matmul && InOpList(config->bf16_ops, qualified, bare);
  HostCall call;
  torch::jit::Stack host;
  for (size_t i = 0; i < args.size(); ++i) {
    const c10::Argument& a = schema.arguments()[i];
    host.push_back(call.ToHost(args[i], round && !Writes(a) && IsMatmulOperand(bare, a.name()), IsGeneratorArgument(a)));
  }
  if (round) Count("bf16_matmul_ops");

  // convolution_overrideable is how ATen's convolution reaches a device it
  // has no convolution for; on the host, aten::convolution (same arguments)
  // is the real thing.
  if (bare == "aten::convolution_overrideable") {
    c10::Dispatcher::singleton().findSchemaOrThrow("aten::convolution", "").callBoxed(&host);
  } else {
    op.callBoxed(&host);
  }
  call.SyncBack();

  if (fault != nullptr) {
    CorruptResults(*fault, schema, args, &host, [&](const at::Tensor& t) { return call.SimAliasOf(t).has_value(); });
  }

  for (size_t r = 0; r < host.size(); ++r) {
    const c10::Argument* ret = r < schema.returns().size() ? &schema.returns()[r] : nullptr;
    if (ret != nullptr && Writes(*ret)) {
      // Tensor(a!): the argument of the same alias set, itself.
      const auto& sets = ret->alias_info()->beforeSets();
      bool pushed = false;
      for (size_t i = 0; i < args.size() && !pushed; ++i) {
        const c10::Argument& a = schema.arguments()[i];
        if (Writes(a) && a.alias_info()->beforeSets() == sets && args[i].isTensor() && IsSim(args[i].toTensor())) {
          stack->push_back(args[i]);
          pushed = true;
        }
      }
      if (pushed) continue;
    }
    stack->push_back(call.ToSim(host[r]));
  }
}

std::vector<std::string> RoundedOperands(const std::string& bare) {
  static const std::map<std::string, std::vector<std::string>> kOperands = {
      {"aten::mm", {"self", "mat2"}},        {"aten::bmm", {"self", "mat2"}},
      {"aten::addmm", {"mat1", "mat2"}},     {"aten::baddbmm", {"batch1", "batch2"}},
      {"aten::addbmm", {"batch1", "batch2"}}, {"aten::matmul", {"self", "other"}},
      {"aten::addmv", {"mat", "vec"}},       {"aten::mv", {"self", "vec"}},
      {"aten::dot", {"self", "tensor"}},     {"aten::convolution", {"input", "weight"}},
      {"aten::_convolution", {"input", "weight"}}, {"aten::convolution_overrideable", {"input", "weight"}},
      {"aten::_grouped_mm", {"self", "mat2"}}};
  auto it = kOperands.find(bare);
  return it == kOperands.end() ? std::vector<std::string>{} : it->second;
}

}  // namespace coverage::sim::internal
