// The simulated PrivateUse1 device ("sim"): an out-of-tree backend plugin that
// registers itself the way a real accelerator's PyTorch 2.x extension does
// (the device renamed from privateuseone to "sim", an allocator, a device
// guard with streams and events, the PrivateUse1 hooks with a generator per
// device and a host allocator, ATen kernels for PrivateUse1 and a boxed
// fallback), with host memory behind it. See sim/README.md for what it
// simulates and how it is configured.
//
// This file holds the device (process state, allocator, guard, generators,
// hooks), the static registration of everything, and the plugin ABI. The
// kernels are in sim_kernels.cc and sim_fallback.cc, the faults in
// sim_faults.cc, host views in sim_tensors.cc (sim_internal.h declares what
// they share).
//
// It links libtorch only; the project loads it like any other plugin
// (backends/plugin_backend.h) and talks to it through backends/plugin_abi.h.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <string_view>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <ATen/native/DispatchStub.h>
#include <ATen/native/transformers/attention.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <nlohmann/json.hpp>
#include <torch/library.h>
#include <torch/version.h>

#include "backends/plugin_abi.h"
#include "sim/sim_config.h"
#include "sim/sim_internal.h"

namespace coverage::sim::internal {

State& S() {
  static State* state = new State;
  return *state;
}

void Count(const std::string& name, int64_t n) {
  std::lock_guard<std::mutex> lock(S().mu);
  S().counters[name] += n;
}

std::shared_ptr<const Config> CurrentConfig() {
  std::lock_guard<std::mutex> lock(S().mu);
  return S().config;
}

// ---------------------------------------------------------------------------
// Memory: host memory, counted.

namespace {

void SimFree(void* p) {
  if (p == nullptr) return;
  std::free(p);
  Count("frees");
}

class SimAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t n) override {
    void* p = nullptr;
    if (n > 0) {
      p = std::aligned_alloc(64, (n + 63) / 64 * 64);
      TORCH_CHECK(p != nullptr, "sim: out of host memory allocating ", n, " bytes");
    }
    {
      std::lock_guard<std::mutex> lock(S().mu);
      S().counters["allocations"] += 1;
      S().counters["bytes_allocated"] += static_cast<int64_t>(n);
    }
    return c10::DataPtr(p, p, &SimFree, kSimDevice);
  }
  c10::DeleterFnPtr raw_deleter() const override { return &SimFree; }
  void copy_data(void* dest, const void* src, std::size_t count) const override { std::memcpy(dest, src, count); }
};

}  // namespace

c10::Allocator& TheAllocator() {
  static SimAllocator* allocator = new SimAllocator;
  return *allocator;
}

// ---------------------------------------------------------------------------
// Device guard: one device, sim:0. Note [Sim streams and events]: sim runs
// every op to completion on the calling thread, so it is synchronous like a
// device whose queues are always drained: streams are ids (0 the default,
// 1..kStreams-1 a pool handed out round-robin, the current one per thread),
// recording an event stamps the host clock, waiting on one returns at once,
// and elapsedTime is the time between two stamps. That is what autograd's
// engine, torch.accelerator and stream-aware callers need of a device.

void CheckDevice(c10::Device d) {
  TORCH_CHECK(d.type() == kSimType && (!d.has_index() || d.index() == 0), kDeviceName, " has one device, ",
              kDeviceName, ":0; got ", d);
}

namespace {

constexpr c10::StreamId kStreams = 32;

c10::StreamId& CurrentStreamId() {
  thread_local c10::StreamId id = 0;
  return id;
}

struct SimEvent {
  std::chrono::steady_clock::time_point stamp;
  bool recorded = false;
};

class SimGuardImpl final : public c10::impl::DeviceGuardImplInterface {
 public:
  c10::DeviceType type() const override { return kSimType; }
  c10::Device exchangeDevice(c10::Device d) const override {
    CheckDevice(d);
    return kSimDevice;
  }
  c10::Device getDevice() const override { return kSimDevice; }
  void setDevice(c10::Device d) const override { CheckDevice(d); }
  void uncheckedSetDevice(c10::Device) const noexcept override {}
  c10::Stream getStream(c10::Device) const noexcept override { return StreamOf(CurrentStreamId()); }
  c10::Stream getDefaultStream(c10::Device) const override { return StreamOf(0); }
  c10::Stream getStreamFromGlobalPool(c10::Device, bool) const override { return NextPoolStream(); }
  c10::Stream getNewStream(c10::Device, int) const override { return NextPoolStream(); }
  c10::Stream exchangeStream(c10::Stream s) const noexcept override {
    const c10::StreamId previous = CurrentStreamId();
    CurrentStreamId() = s.id();
    return StreamOf(previous);
  }
  c10::DeviceIndex deviceCount() const noexcept override { return 1; }

  void record(void** event, const c10::Stream& stream, const c10::DeviceIndex device_index,
              const c10::EventFlag) const override {
    CheckDevice(c10::Device(kSimType, device_index < 0 ? 0 : device_index));
    CheckDevice(stream.device());
    if (*event == nullptr) *event = new SimEvent;
    auto* e = static_cast<SimEvent*>(*event);
    e->stamp = std::chrono::steady_clock::now();
    e->recorded = true;
  }
  void block(void*, const c10::Stream& stream) const override { CheckDevice(stream.device()); }
  bool queryEvent(void*) const override { return true; }
  void destroyEvent(void* event, const c10::DeviceIndex) const noexcept override { delete static_cast<SimEvent*>(event); }
  void synchronizeEvent(void*) const override {}
  bool queryStream(const c10::Stream& stream) const override {
    CheckDevice(stream.device());
    return true;
  }
  void synchronizeStream(const c10::Stream& stream) const override { CheckDevice(stream.device()); }
  void synchronizeDevice(const c10::DeviceIndex device_index) const override {
    CheckDevice(c10::Device(kSimType, device_index < 0 ? 0 : device_index));
  }
  void recordDataPtrOnStream(const c10::DataPtr&, const c10::Stream&) const override {}
  double elapsedTime(void* start, void* end, const c10::DeviceIndex) const override {
    auto* a = static_cast<SimEvent*>(start);
    auto* b = static_cast<SimEvent*>(end);
    TORCH_CHECK(a != nullptr && b != nullptr && a->recorded && b->recorded, kDeviceName,
                ": both events must be recorded before elapsedTime");
    return std::chrono::duration<double, std::milli>(b->stamp - a->stamp).count();
  }

 private:
  static c10::Stream StreamOf(c10::StreamId id) { return c10::Stream(c10::Stream::UNSAFE, kSimDevice, id); }
  static c10::Stream NextPoolStream() {
    static std::atomic<c10::StreamId> next{0};
    return StreamOf(1 + next.fetch_add(1) % (kStreams - 1));
  }
};

}  // namespace

// ---------------------------------------------------------------------------
// Generators and hooks: what PyTorch 2.x asks of an accelerator beyond memory
// and kernels (at::manual_seed, torch.Generator(device="sim"),
// torch.accelerator, pinned memory).

namespace {

// A generator of sim:0: the Philox-free CPU engine (mt19937) with the device
// and dispatch key of sim, as OpenReg's generator is. Random ops reach the
// host fallback, which runs them on a CPU generator holding this one's state
// and hands the advanced state back (Note [Sim generators]).
class SimGenerator final : public at::CPUGeneratorImpl {
 public:
  explicit SimGenerator(c10::DeviceIndex index) {
    device_ = c10::Device(kSimType, index);
    key_set_ = c10::DispatchKeySet(c10::DispatchKey::PrivateUse1);
  }
};

}  // namespace

const at::Generator& DefaultGenerator(c10::DeviceIndex index) {
  CheckDevice(c10::Device(kSimType, index < 0 ? 0 : index));
  static const at::Generator* generator = new at::Generator(at::make_generator<SimGenerator>(0));
  return *generator;
}

namespace {

class SimHooks final : public at::PrivateUse1HooksInterface {
 public:
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return true; }
  bool hasPrimaryContext(c10::DeviceIndex index) const override {
    CheckDevice(c10::Device(kSimType, index));
    return true;
  }
  c10::DeviceIndex deviceCount() const override { return 1; }
  void setCurrentDevice(c10::DeviceIndex index) const override { CheckDevice(c10::Device(kSimType, index)); }
  c10::DeviceIndex getCurrentDevice() const override { return 0; }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex index) const override {
    CheckDevice(c10::Device(kSimType, index));
    return 0;
  }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex index) const override { return exchangeDevice(index); }
  const at::Generator& getDefaultGenerator(c10::DeviceIndex index) const override { return DefaultGenerator(index); }
  at::Generator getNewGenerator(c10::DeviceIndex index) const override {
    CheckDevice(c10::Device(kSimType, index < 0 ? 0 : index));
    return at::make_generator<SimGenerator>(index < 0 ? 0 : index);
  }
  at::Device getDeviceFromPtr(void*) const override { return kSimDevice; }
  // Device memory is host memory: the host allocator pins nothing.
  bool isPinnedPtr(const void*) const override { return false; }
  c10::Allocator* getPinnedMemoryAllocator() const override { return c10::GetCPUAllocator(); }
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t nbytes) const override;
};

// Storage.resize_() of a sim storage (Python's untyped_storage().resize_()).
void SimHooks::resizePrivateUse1Bytes(const c10::Storage& storage, size_t nbytes) const {
  ReplaceStorageBytes(storage, nbytes, storage.data_ptr().get(), storage.nbytes());
}

// ---------------------------------------------------------------------------
// Registration (static, as every PyTorch device extension does: loading the
// library is what makes the device exist).

// The name first: c10 accepts it only before any tensor of the device exists.
// $COVERAGE_SIM_UNNAMED=1 leaves the device "privateuseone", as a backend
// whose C++ library leaves naming to its Python package (`--device-name`).
const bool kDeviceNamed = [] {
  const char* unnamed = std::getenv("COVERAGE_SIM_UNNAMED");
  if (unnamed != nullptr && std::string_view(unnamed) == "1") return false;
  c10::register_privateuse1_backend(kDeviceName);
  return true;
}();

C10_REGISTER_GUARD_IMPL(PrivateUse1, SimGuardImpl);

const bool kAllocatorSet = [] {
  c10::SetAllocator(kSimType, &TheAllocator());
  at::RegisterPrivateUse1HooksInterface(new SimHooks);
  return true;
}();

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("empty.memory_format", torch::CppFunction::makeFromBoxedFunction<&Empty>());
  m.impl("empty_strided", torch::CppFunction::makeFromBoxedFunction<&EmptyStrided>());
  m.impl("copy_", torch::CppFunction::makeFromBoxedFunction<&Copy>());
  m.impl("_copy_from", torch::CppFunction::makeFromBoxedFunction<&CopyFrom>());
  m.impl("_copy_from_and_resize", torch::CppFunction::makeFromBoxedFunction<&CopyFromAndResize>());
  m.impl("resize_", torch::CppFunction::makeFromBoxedFunction<&Resize>());
  m.impl("set_", torch::CppFunction::makeFromBoxedFunction<&Set>());
  m.impl("set_.source_Storage", torch::CppFunction::makeFromBoxedFunction<&Set>());
  m.impl("set_.source_Storage_storage_offset", torch::CppFunction::makeFromBoxedFunction<&Set>());
  m.impl("set_.source_Tensor", torch::CppFunction::makeFromBoxedFunction<&Set>());
  // A CompositeExplicitAutograd kernel that only throws; the fallback runs
  // aten::convolution on the host instead.
  m.impl("convolution_overrideable", torch::CppFunction::makeFromBoxedFunction<&HostFallback>());
  // Note [Sim attention].
  m.impl("_fused_sdp_choice", torch::CppFunction::makeFromBoxedFunction<&SdpChoiceBoxed>());
  m.impl("_scaled_dot_product_fused_attention_overrideable", torch::CppFunction::makeFromBoxedFunction<&Attention>());
  m.impl("_scaled_dot_product_fused_attention_overrideable_backward",
         torch::CppFunction::makeFromBoxedFunction<&AttentionBackward>());
}

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) { m.fallback(torch::CppFunction::makeFromBoxedFunction<&HostFallback>()); }

// Note [Structured ops]: ATen gives the functional and in-place variants of
// its structured ops (aten::mul.Tensor, aten::mul_.Tensor) a
// CompositeExplicitAutogradNonFunctional kernel that serves every backend
// without its own: it allocates the result with aten::empty and calls the
// out= variant. Left alone, a device would only ever see aten::mul.out. Real
// devices implement the functional ops themselves, so sim takes them too:
// every op with such a kernel gets the host fallback as its PrivateUse1
// kernel, and the op that reaches sim is the one the caller called. So do
// the _foreach_* ops (CompositeExplicitAutograd loops over their lists), as
// on devices with foreach kernels: an AdamW step reaches sim as
// _foreach_lerp_, _foreach_addcdiv_, ..., not as one call per parameter.
const bool kStructuredOpsTaken = [] {
  static torch::Library* library =
      new torch::Library(torch::Library::IMPL, "aten", c10::DispatchKey::PrivateUse1, __FILE__, __LINE__);
  for (const c10::OperatorName& name : c10::Dispatcher::singleton().getAllOpNames()) {
    auto op = c10::Dispatcher::singleton().findOp(name);
    if (!op || name.name.rfind("aten::", 0) != 0) continue;
    // The foreach ops too: their CompositeExplicitAutograd kernel loops over
    // the list, so a device without its own would see one add_ per tensor,
    // not the _foreach_add_ an optimizer step sends.
    const bool foreach = name.name.rfind("aten::_foreach_", 0) == 0 &&
                         op->hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutograd);
    if (!foreach && !op->hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutogradNonFunctional)) continue;
    if (op->hasKernelForDispatchKey(c10::DispatchKey::PrivateUse1)) continue;
    const std::string qualified = name.overload_name.empty() ? name.name : name.name + "." + name.overload_name;
    library->impl(qualified.substr(6).c_str(), torch::CppFunction::makeFromBoxedFunction<&HostFallback>());
  }
  return true;
}();

}  // namespace
}  // namespace coverage::sim::internal

// ATen's scaled_dot_product_attention asks this stub, not the op, which
// kernel a device wants (Note [Sim attention]).
namespace at::native {
REGISTER_PRIVATEUSE1_DISPATCH(_fused_sdp_choice_stub, &coverage::sim::internal::SdpChoice)
}  // namespace at::native

// ---------------------------------------------------------------------------
// The plugin ABI (backends/plugin_abi.h).

#define SIM_EXPORT extern "C" __attribute__((visibility("default")))

// Reads the configuration from the environment again (sim/README.md); the
// error names the variable, the file and the key.
SIM_EXPORT const char* coverage_backend_init(void) {
  using namespace coverage::sim;
  using namespace coverage::sim::internal;
  auto config = std::make_shared<Config>();
  std::string error = ConfigFromEnvironment(config.get());
  std::lock_guard<std::mutex> lock(S().mu);
  S().init_error = error;
  if (error.empty()) S().config = std::move(config);
  return S().init_error.empty() ? nullptr : S().init_error.c_str();
}

SIM_EXPORT const char* coverage_backend_version(void) {
  static const std::string version = std::string(COVERAGE_SIM_DEVICE_NAME) + " 2.0 (simulated; host memory, libtorch " + TORCH_VERSION + ")";
  return version.c_str();
}

SIM_EXPORT const char* coverage_backend_counters(void) {
  using namespace coverage::sim::internal;
  // Asked before and after every case, with a counter per op seen: written
  // by hand in key order (names are op names; nlohmann escapes any other).
  thread_local std::string text;
  std::lock_guard<std::mutex> lock(S().mu);
  text = "{";
  for (const auto& [name, value] : S().counters) {
    if (text.size() > 1) text += ',';
    const bool plain = std::none_of(name.begin(), name.end(), [](char c) {
      return c == '"' || c == '\\' || static_cast<unsigned char>(c) < 0x20;
    });
    text += plain ? '"' + name + '"' : nlohmann::json(name).dump();
    text += ':';
    text += std::to_string(value);
  }
  text += '}';
  return text.c_str();
}

SIM_EXPORT void coverage_backend_synchronize(void) {}  // host memory: every op has finished when it returns

// What sim's numerics do, declared (Note [Declared numerics] in
// replay/numerics.cc): with "bf16_matmul" the fp32 operands of bf16_ops are
// rounded to bf16; "exact" declares nothing.
SIM_EXPORT const char* coverage_backend_numerics(void) {
  using namespace coverage::sim;
  using namespace coverage::sim::internal;
  thread_local std::string text;
  const std::shared_ptr<const Config> config = CurrentConfig();
  if (config->numerics != Numerics::kBf16Matmul || config->bf16_ops.empty()) return "";
  nlohmann::json ops = nlohmann::json::object();
  for (const std::string& op : config->bf16_ops) {
    const std::string bare = op.substr(0, op.find('.', op.find("::")));
    ops[bare] = RoundedOperands(bare);
  }
  text = nlohmann::json{{"comment", "sim's bf16_matmul numerics (configs/sim.json): fp32 operands of these ops are "
                                    "rounded to bf16, the kernel accumulates in fp32"},
                        {"fp32_operands", "bf16"},
                        {"ops", ops}}
             .dump();
  return text.c_str();
}
