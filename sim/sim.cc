// The simulated PrivateUse1 device ("sim"): an out-of-tree backend plugin that
// registers itself the way a real accelerator's PyTorch 2.x extension does
// (the device renamed from privateuseone to "sim", an allocator, a device
// guard with streams and events, the PrivateUse1 hooks with a generator per
// device and a host allocator, ATen kernels for PrivateUse1 and a boxed
// fallback), with host memory behind it. See sim/README.md for what it
// simulates and how it is configured.
//
// It links libtorch only; the project loads it like any other plugin
// (backends/plugin_backend.h) and talks to it through backends/plugin_abi.h.
#include <atomic>
#include <chrono>
#include <cmath>
#include <limits>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_set>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/EmptyTensor.h>
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

// The name the device registers (c10::register_privateuse1_backend): tensors
// print as "sim:0" and "sim:0" parses as the device. The build gives another name to
// the test plugin made from these sources (tests/support/plugin).
#ifndef COVERAGE_SIM_DEVICE_NAME
#define COVERAGE_SIM_DEVICE_NAME "sim"
#endif

namespace coverage::sim {
namespace {

constexpr c10::DeviceType kSimType = c10::DeviceType::PrivateUse1;
constexpr const char* kDeviceName = COVERAGE_SIM_DEVICE_NAME;
const c10::Device kSimDevice(kSimType, 0);

// Process-wide state. Never destroyed: kernels and deleters may still run
// while static objects of other libraries are torn down at exit.
struct State {
  std::mutex mu;
  std::shared_ptr<const Config> config = std::make_shared<Config>();
  std::string init_error;
  std::map<std::string, int64_t> counters;
  std::unordered_set<std::string> signatures;  // (op, shapes, dtypes) seen: "compiled"
};

State& S() {
  static State* state = new State;
  return *state;
}

void Count(const std::string& name, int64_t n = 1) {
  std::lock_guard<std::mutex> lock(S().mu);
  S().counters[name] += n;
}

std::shared_ptr<const Config> CurrentConfig() {
  std::lock_guard<std::mutex> lock(S().mu);
  return S().config;
}

// ---------------------------------------------------------------------------
// Memory: host memory, counted.

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

SimAllocator& TheAllocator() {
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

constexpr c10::StreamId kStreams = 32;

void CheckDevice(c10::Device d) {
  TORCH_CHECK(d.type() == kSimType && (!d.has_index() || d.index() == 0), kDeviceName, " has one device, ",
              kDeviceName, ":0; got ", d);
}

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

// ---------------------------------------------------------------------------
// Generators and hooks: what PyTorch 2.x asks of an accelerator beyond memory
// and kernels (at::manual_seed, torch.Generator(device="sim"),
// torch.accelerator, pinned memory).

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

const at::Generator& DefaultGenerator(c10::DeviceIndex index) {
  CheckDevice(c10::Device(kSimType, index < 0 ? 0 : index));
  static const at::Generator* generator = new at::Generator(at::make_generator<SimGenerator>(0));
  return *generator;
}

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

// ---------------------------------------------------------------------------
// Tensors: sim tensors and their host views.

bool IsSim(const at::Tensor& t) { return t.defined() && t.device().type() == kSimType; }

void SetGeometry(at::Tensor& t, c10::IntArrayRef sizes, c10::IntArrayRef strides, int64_t offset) {
  t.unsafeGetTensorImpl()->set_sizes_and_strides(sizes, strides);
  t.unsafeGetTensorImpl()->set_storage_offset(offset);
}

// A tensor of `storage` with the given geometry and exactly the dispatch
// keys `keys`. Like ATen's own views it takes its keys from the tensor it
// stands for, not from the current InferenceMode: a view made inside
// InferenceMode of a normal tensor is a normal tensor.
at::Tensor TensorOver(c10::Storage storage, c10::DispatchKeySet keys, caffe2::TypeMeta dtype, c10::IntArrayRef sizes,
                      c10::IntArrayRef strides, int64_t offset) {
  at::Tensor t = at::detail::make_tensor<c10::TensorImpl>(c10::TensorImpl::VIEW, std::move(storage), keys, dtype);
  SetGeometry(t, sizes, strides, offset);
  return t;
}

// A view over the memory of `from` reads its values only with its lazy
// conjugate and negative bits (x.conj() of a complex tensor is a view with
// the conjugate bit set); without them the view holds other values.
at::Tensor WithMathBitsOf(at::Tensor view, const at::Tensor& from) {
  if (from.is_conj()) view._set_conj(true);
  if (from.is_neg()) view._set_neg(true);
  return view;
}

at::Tensor EmptySim(c10::IntArrayRef size, c10::ScalarType dtype, std::optional<c10::MemoryFormat> format) {
  return at::detail::empty_generic(size, &TheAllocator(), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), dtype,
                                   format);
}

at::Tensor EmptyStridedSim(c10::IntArrayRef size, c10::IntArrayRef stride, c10::ScalarType dtype) {
  return at::detail::empty_strided_generic(size, stride, &TheAllocator(),
                                           c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), dtype);
}

// Note [Host views]: sim memory is host memory, so a sim tensor can be shown
// to a CPU kernel as a CPU tensor over the same bytes: a CPU storage with a
// non-owning DataPtr over the whole sim storage, and the same offset, sizes
// and strides. Writes through the view are writes to the sim tensor. The
// view does not keep the sim storage alive; it lives only while the sim
// tensor it was made from is held. The CPU storage is resizable (with the
// CPU allocator) so that a CPU kernel that resizes an out= argument works;
// the fallback then moves the new bytes back into sim memory.
at::Tensor HostView(const at::Tensor& sim) {
  const c10::Storage& s = sim.storage();
  c10::Storage cpu(c10::Storage::use_byte_size_t(), s.nbytes(), c10::DataPtr(s.data_ptr().get(), c10::Device(c10::kCPU)),
                   c10::GetCPUAllocator(), /*resizable=*/true);
  c10::DispatchKeySet keys(c10::DispatchKey::CPU);
  if (!sim.is_inference()) keys = keys | c10::DispatchKeySet({c10::DispatchKey::AutogradCPU, c10::DispatchKey::ADInplaceOrView});
  return WithMathBitsOf(TensorOver(std::move(cpu), keys, sim.dtype(), sim.sizes(), sim.strides(), sim.storage_offset()),
                        sim);
}

at::Tensor OnHost(const at::Tensor& t) { return IsSim(t) ? HostView(t) : t; }

// A fresh sim tensor with the values (and, when dense, the strides) of `cpu`.
at::Tensor SimCopyOf(const at::Tensor& cpu) {
  at::Tensor sim = cpu.is_non_overlapping_and_dense() ? EmptyStridedSim(cpu.sizes(), cpu.strides(), cpu.scalar_type())
                                                      : EmptySim(cpu.sizes(), cpu.scalar_type(), std::nullopt);
  if (cpu.numel() > 0) HostView(sim).copy_(cpu);
  Count("copies_to_device");
  return sim;
}

// Replaces the bytes of sim storage `s` by a fresh allocation of `nbytes`
// holding `src` (nbytes_src bytes; the rest uninitialised).
void ReplaceStorageBytes(const c10::Storage& s, size_t nbytes, const void* src, size_t nbytes_src) {
  c10::DataPtr fresh = TheAllocator().allocate(nbytes);
  if (nbytes_src > 0 && src != nullptr) std::memcpy(fresh.get(), src, std::min(nbytes, nbytes_src));
  s.set_data_ptr_noswap(std::move(fresh));
  s.set_nbytes(nbytes);
}

// Storage.resize_() of a sim storage (Python's untyped_storage().resize_()).
void SimHooks::resizePrivateUse1Bytes(const c10::Storage& storage, size_t nbytes) const {
  ReplaceStorageBytes(storage, nbytes, storage.data_ptr().get(), storage.nbytes());
}

std::string QualifiedName(const c10::OperatorHandle& op) {
  const auto& n = op.operator_name();
  return n.overload_name.empty() ? n.name : n.name + "." + n.overload_name;
}

// ---------------------------------------------------------------------------
// Native kernels: what cannot go through the host fallback because it makes
// or reshapes sim memory itself. All boxed, so that they register whatever
// the SymInt signatures of the libtorch they are built against.

c10::ScalarType DTypeArg(const c10::IValue& v) {
  return v.isNone() ? c10::typeMetaToScalarType(c10::get_default_dtype()) : v.toScalarType();
}

void CheckFactoryArgs(const c10::IValue& layout, const c10::IValue& device) {
  TORCH_CHECK(layout.isNone() || layout.toLayout() == c10::kStrided, "sim supports strided tensors only, got layout ",
              layout.toLayout());
  if (!device.isNone()) CheckDevice(device.toDevice());
}

// empty.memory_format(SymInt[] size, *, ScalarType? dtype, Layout? layout, Device? device, bool? pin_memory, MemoryFormat? memory_format)
void Empty(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  auto args = torch::jit::pop(*stack, op.schema().arguments().size());
  CheckFactoryArgs(args[2], args[3]);
  std::optional<c10::MemoryFormat> format;
  if (!args[5].isNone()) format = args[5].toMemoryFormat();
  torch::jit::push(*stack, EmptySim(args[0].toIntVector(), DTypeArg(args[1]), format));
}

// empty_strided(SymInt[] size, SymInt[] stride, *, ScalarType? dtype, Layout? layout, Device? device, bool? pin_memory)
void EmptyStrided(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  auto args = torch::jit::pop(*stack, op.schema().arguments().size());
  CheckFactoryArgs(args[3], args[4]);
  torch::jit::push(*stack, EmptyStridedSim(args[0].toIntVector(), args[1].toIntVector(), DTypeArg(args[2])));
}

void CopyValues(const at::Tensor& dst, const at::Tensor& src) {
  TORCH_CHECK((IsSim(dst) || dst.device().is_cpu()) && (IsSim(src) || src.device().is_cpu()),
              kDeviceName, " copies between ", kDeviceName, " and cpu only, got ", src.device(), " -> ", dst.device());
  Count(IsSim(dst) && IsSim(src) ? "copies_device_to_device" : IsSim(dst) ? "copies_to_device" : "copies_to_host");
  if (dst.numel() == 0) return;
  OnHost(dst).copy_(OnHost(src));
}

// copy_(Tensor(a!) self, Tensor src, bool non_blocking=False) -> Tensor(a!)
void Copy(const c10::OperatorHandle&, torch::jit::Stack* stack) {
  auto args = torch::jit::pop(*stack, 3);
  CopyValues(args[0].toTensor(), args[1].toTensor());
  torch::jit::push(*stack, args[0]);
}

// _copy_from(Tensor self, Tensor dst, bool non_blocking=False) -> Tensor
void CopyFrom(const c10::OperatorHandle&, torch::jit::Stack* stack) {
  auto args = torch::jit::pop(*stack, 3);
  CopyValues(args[1].toTensor(), args[0].toTensor());
  torch::jit::push(*stack, args[1]);
}

void ResizeSim(const at::Tensor& self, c10::IntArrayRef size, std::optional<c10::MemoryFormat> format) {
  c10::TensorImpl* impl = self.unsafeGetTensorImpl();
  impl->set_sizes_contiguous(size);
  if (format && *format != c10::MemoryFormat::Preserve) impl->empty_tensor_restride(*format);
  const size_t needed = at::detail::computeStorageNbytes(self.sizes(), self.strides(), self.dtype().itemsize(),
                                                         static_cast<size_t>(self.storage_offset()));
  const c10::Storage& s = self.storage();
  if (needed > s.nbytes()) ReplaceStorageBytes(s, needed, s.data_ptr().get(), s.nbytes());
}

// _copy_from_and_resize(Tensor self, Tensor dst) -> Tensor
void CopyFromAndResize(const c10::OperatorHandle&, torch::jit::Stack* stack) {
  auto args = torch::jit::pop(*stack, 2);
  const at::Tensor& src = args[0].toTensor();
  const at::Tensor& dst = args[1].toTensor();
  if (IsSim(dst)) {
    ResizeSim(dst, src.sizes(), std::nullopt);
  } else {
    dst.resize_(src.sizes());
  }
  CopyValues(dst, src);
  torch::jit::push(*stack, args[1]);
}

// resize_(Tensor(a!) self, SymInt[] size, *, MemoryFormat? memory_format=None) -> Tensor(a!)
void Resize(const c10::OperatorHandle&, torch::jit::Stack* stack) {
  auto args = torch::jit::pop(*stack, 3);
  std::optional<c10::MemoryFormat> format;
  if (!args[2].isNone()) format = args[2].toMemoryFormat();
  ResizeSim(args[0].toTensor(), args[1].toIntVector(), format);
  torch::jit::push(*stack, args[0]);
}

void SetTo(const at::Tensor& self, const c10::Storage& storage, int64_t offset, c10::IntArrayRef sizes,
           c10::IntArrayRef strides) {
  TORCH_CHECK(storage.device().type() == kSimType || storage.nbytes() == 0, kDeviceName, ": set_ needs ", kDeviceName, " storage, got ",
              storage.device());
  c10::TensorImpl* impl = self.unsafeGetTensorImpl();
  if (!impl->storage().is_alias_of(storage)) impl->set_storage_keep_dtype(storage);
  impl->set_sizes_and_strides(sizes, strides);
  impl->set_storage_offset(offset);
}

// set_.source_Storage(Tensor(a!) self, Storage source) -> Tensor(a!)
// set_.source_Storage_storage_offset(Tensor(a!) self, Storage source, SymInt storage_offset, SymInt[] size, SymInt[] stride=[]) -> Tensor(a!)
// set_.source_Tensor(Tensor(a!) self, Tensor source) -> Tensor(a!)
// set_(Tensor(a!) self) -> Tensor(a!)
void Set(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const std::string overload = op.operator_name().overload_name;
  auto args = torch::jit::pop(*stack, op.schema().arguments().size());
  const at::Tensor& self = args[0].toTensor();
  const int64_t item = static_cast<int64_t>(self.dtype().itemsize());
  if (overload.empty()) {
    c10::Storage empty(c10::Storage::use_byte_size_t(), 0, TheAllocator().allocate(0), &TheAllocator(), true);
    SetTo(self, empty, 0, {0}, {1});
  } else if (overload == "source_Storage") {
    const c10::Storage s = args[1].toStorage();
    const int64_t n = static_cast<int64_t>(s.nbytes()) / item;
    SetTo(self, s, 0, {n}, {1});
  } else if (overload == "source_Tensor") {
    const at::Tensor& src = args[1].toTensor();
    SetTo(self, src.storage(), src.storage_offset(), src.sizes(), src.strides());
  } else {
    const std::vector<int64_t> size = args[3].toIntVector();
    std::vector<int64_t> stride = args[4].toIntVector();
    if (stride.empty()) {
      const auto contiguous = c10::contiguous_strides(size);
      stride.assign(contiguous.begin(), contiguous.end());
    }
    SetTo(self, args[1].toStorage(), args[2].toInt(), size, stride);
  }
  torch::jit::push(*stack, args[0]);
}

// ---------------------------------------------------------------------------
// The host fallback.

const char* DTypeName(c10::ScalarType t) {
  switch (t) {
    case c10::kFloat: return "f32";
    case c10::kDouble: return "f64";
    case c10::kHalf: return "f16";
    case c10::kBFloat16: return "bf16";
    case c10::kChar: return "i8";
    case c10::kByte: return "u8";
    case c10::kShort: return "i16";
    case c10::kInt: return "i32";
    case c10::kLong: return "i64";
    case c10::kBool: return "bool";
    case c10::kComplexFloat: return "c64";
    case c10::kComplexDouble: return "c128";
    default: return "other";
  }
}

void ForEachTensor(const c10::IValue& v, const std::function<void(const at::Tensor&)>& fn) {
  if (v.isTensor()) {
    fn(v.toTensor());
  } else if (v.isTensorList()) {
    for (const at::Tensor& t : v.toTensorVector()) fn(t);
  } else if (v.isList()) {
    for (const c10::IValue& e : v.toListRef()) ForEachTensor(e, fn);
  } else if (v.isTuple()) {
    for (const c10::IValue& e : v.toTupleRef().elements()) ForEachTensor(e, fn);
  }
}

const at::Tensor* FirstTensor(const std::vector<c10::IValue>& args, at::Tensor* holder) {
  for (const auto& a : args) {
    bool found = false;
    ForEachTensor(a, [&](const at::Tensor& t) {
      if (!found && t.defined()) {
        *holder = t;
        found = true;
      }
    });
    if (found) return holder;
  }
  return nullptr;
}

int64_t CurrentAttempt() {
  const char* env = std::getenv("COVERAGE_ATTEMPT");
  if (env == nullptr || *env == '\0') return 1;
  char* end = nullptr;
  const long long v = std::strtoll(env, &end, 10);
  return (end != env && *end == '\0' && v >= 1) ? v : 1;
}

// Note [Sim fault matching]: rules are tried in order and the first that
// matches decides. A rule matches the op that reaches the backend, which is
// the op after ATen's composite decompositions (aten::linear arrives as
// aten::addmm or aten::matmul's pieces, aten::zeros as empty + zero_). Its
// "op" is a qualified name ("aten::mul.Tensor"), a bare name covering every
// overload ("aten::mul"), or "*" (every op that reaches the fallback, views
// included). dtype, shape and dim look at the first tensor argument (the
// first defined tensor of the first list that has one); a rule with one of
// them does not match an op without tensor arguments. Memory management
// (empty, empty_strided, copy_, _copy_from, _copy_from_and_resize, resize_,
// set_) is native and never faulted.
const FaultRule* MatchFault(const Config& config, const std::string& qualified, const std::string& bare,
                            const std::vector<c10::IValue>& args) {
  if (config.faults.empty()) return nullptr;
  at::Tensor holder;
  const at::Tensor* first = FirstTensor(args, &holder);
  for (const FaultRule& r : config.faults) {
    if (r.op != "*" && r.op != qualified && r.op != bare) continue;
    if ((r.dtype || r.shape || r.dim) && first == nullptr) continue;
    if (r.dtype && DTypeName(first->scalar_type()) != *r.dtype) continue;
    if (r.shape && first->sizes().vec() != *r.shape) continue;
    if (r.dim) {
      const auto sizes = first->sizes();
      if (std::find(sizes.begin(), sizes.end(), *r.dim) == sizes.end()) continue;
    }
    if (!r.attempts.empty() && std::find(r.attempts.begin(), r.attempts.end(), CurrentAttempt()) == r.attempts.end()) {
      continue;
    }
    return &r;
  }
  return nullptr;
}

// Faults that act instead of running the op.
void FaultBeforeRunning(const FaultRule& r, const std::string& qualified) {
  switch (r.fault) {
    case FaultKind::kUnsupported:
      TORCH_CHECK_NOT_IMPLEMENTED(false, "Could not run '", qualified,
                                  "' with arguments from the 'PrivateUse1' backend (simulated by sim: fault rule ",
                                  r.source, ")");
    case FaultKind::kError:
      TORCH_CHECK(false, "sim: injected error in ", qualified, " (fault rule ", r.source, ")");
    case FaultKind::kCrash:
      std::raise(SIGSEGV);
      std::abort();  // if SIGSEGV is caught and returns
    case FaultKind::kAbort:
      std::abort();
    case FaultKind::kHang:
      for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
    case FaultKind::kSlow:  // a slower kernel: right values, late
      std::this_thread::sleep_for(std::chrono::microseconds(r.slow_us));
      return;
    case FaultKind::kWrongValues:
    case FaultKind::kNan:
      return;
  }
}

// Faults that corrupt what the op produced: floating and integer outputs + 1
// (bool outputs negated), or floating outputs all NaN (integers unchanged).
// An output that is a view of an input becomes a corrupted copy, so that
// the input itself stays intact; an output the op wrote in place is
// corrupted in place.
at::Tensor Corrupt(const at::Tensor& t, FaultKind kind, bool in_place) {
  if (!t.defined() || t.numel() == 0) return t;
  at::Tensor out = in_place ? t : t.clone();
  if (kind == FaultKind::kWrongValues) {
    if (out.scalar_type() == c10::kBool) {
      out.logical_not_();
    } else {
      out.add_(1);
    }
  } else if (out.is_floating_point() || out.is_complex()) {
    out.fill_(std::numeric_limits<double>::quiet_NaN());
  }
  return out;
}

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

// The operands bf16_matmul rounds, by argument name; an op in bf16_ops that
// is not listed here has every read-only fp32 tensor argument rounded.
bool IsMatmulOperand(const std::string& bare, const std::string& arg) {
  static const std::map<std::string, std::vector<std::string>> kOperands = {
      {"aten::mm", {"self", "mat2"}},        {"aten::bmm", {"self", "mat2"}},
      {"aten::addmm", {"mat1", "mat2"}},     {"aten::baddbmm", {"batch1", "batch2"}},
      {"aten::addbmm", {"batch1", "batch2"}}, {"aten::matmul", {"self", "other"}},
      {"aten::addmv", {"mat", "vec"}},       {"aten::mv", {"self", "vec"}},
      {"aten::dot", {"self", "tensor"}},     {"aten::convolution", {"input", "weight"}},
      {"aten::_convolution", {"input", "weight"}}, {"aten::convolution_overrideable", {"input", "weight"}}};
  auto it = kOperands.find(bare);
  if (it == kOperands.end()) return true;
  return std::find(it->second.begin(), it->second.end(), arg) != it->second.end();
}

// `v` with every tensor in it (a tensor, a tensor list, a list of optional
// tensors) replaced by fn(tensor); anything else unchanged.
c10::IValue MapTensors(const c10::IValue& v, const std::function<at::Tensor(const at::Tensor&)>& fn) {
  if (v.isTensor()) return c10::IValue(fn(v.toTensor()));
  if (v.isTensorList()) {
    c10::List<at::Tensor> out;
    for (const at::Tensor& t : v.toTensorVector()) out.push_back(fn(t));
    return c10::IValue(out);
  }
  if (v.isList()) {
    c10::List<c10::IValue> in = v.toList();
    const c10::TypePtr& element = in.elementType();
    if (element->kind() == c10::TypeKind::OptionalType &&
        element->expectRef<c10::OptionalType>().getElementType()->kind() == c10::TypeKind::TensorType) {
      c10::List<std::optional<at::Tensor>> out;
      for (const c10::IValue& e : in) {
        out.push_back(e.isNone() ? std::optional<at::Tensor>() : std::optional<at::Tensor>(fn(e.toTensor())));
      }
      return c10::IValue(out);
    }
  }
  return v;
}

bool Writes(const c10::Argument& a) { return a.alias_info() != nullptr && a.alias_info()->isWrite(); }

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

  if (fault != nullptr && (fault->fault == FaultKind::kWrongValues || fault->fault == FaultKind::kNan)) {
    bool any = false;
    for (size_t r = 0; r < host.size(); ++r) {
      const bool in_place = r < schema.returns().size() && Writes(schema.returns()[r]);
      auto corrupt = [&](const at::Tensor& t) -> at::Tensor {
        any = any || t.defined();
        return Corrupt(t, fault->fault, in_place || !call.SimAliasOf(t));
      };
      host[r] = MapTensors(host[r], corrupt);
    }
    if (!any) {  // an op that returns nothing: corrupt what it wrote
      for (size_t i = 0; i < args.size(); ++i) {
        if (!Writes(schema.arguments()[i])) continue;
        ForEachTensor(args[i], [&](const at::Tensor& t) {
          if (IsSim(t)) Corrupt(HostView(t), fault->fault, /*in_place=*/true);
        });
      }
    }
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

// ---------------------------------------------------------------------------
// Note [Sim attention]: sim has its own scaled-dot-product attention, as an
// accelerator does, so that what a model's attention sends a device can be
// tested. ATen's scaled_dot_product_attention asks the device which kernel
// to use (the _fused_sdp_choice stub, and the aten::_fused_sdp_choice op for
// callers that ask the dispatcher); sim answers "overrideable" (math when
// dropout is asked for, which sim leaves to ATen), and ATen then calls
// _scaled_dot_product_fused_attention_overrideable and, in backward,
// _scaled_dot_product_fused_attention_overrideable_backward, whose default
// kernels only throw. sim computes both on the host in float32 (float64
// stays float64): scores = q k^T * scale, the mask added (a bool mask keeps
// where true), causal positions above the diagonal dropped, a row with no
// position left gives 0 (as _safe_softmax), keys and values of fewer heads
// shared by groups of query heads (GQA). The backward differentiates that
// analytically. Counted as "sdp_choice", "attention" and
// "attention_backward"; faults and bf16 rounding do not apply to them.

constexpr int64_t kSdpMath = 0;          // sdp::SDPBackend::math
constexpr int64_t kSdpOverrideable = 4;  // sdp::SDPBackend::overrideable

int64_t SdpChoice(const at::Tensor&, const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&,
                  double dropout_p, bool, std::optional<double>, bool) {
  Count("sdp_choice");
  return dropout_p > 0 ? kSdpMath : kSdpOverrideable;
}

// _fused_sdp_choice(Tensor query, Tensor key, Tensor value, Tensor? attn_mask=None, float dropout_p=0.0, bool is_causal=False, *, float? scale=None, bool enable_gqa=False) -> int
void SdpChoiceBoxed(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  auto args = torch::jit::pop(*stack, op.schema().arguments().size());
  torch::jit::push(*stack, SdpChoice(at::Tensor(), at::Tensor(), at::Tensor(), std::nullopt, args[4].toDouble(), false,
                                     std::nullopt, false));
}

// The forward on the host, in the compute dtype: scores with mask and
// causality applied, the probabilities, and key/value with their heads
// repeated to the query's.
struct HostAttention {
  at::Tensor q, k, v, scores, probs;
  double scale = 1;
  int64_t groups = 1;
};

HostAttention AttentionOnHost(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                              const at::Tensor& mask, bool is_causal, std::optional<double> scale) {
  HostAttention a;
  const c10::ScalarType compute = query.scalar_type() == c10::kDouble ? c10::kDouble : c10::kFloat;
  a.q = OnHost(query).to(compute);
  a.k = OnHost(key).to(compute);
  a.v = OnHost(value).to(compute);
  TORCH_CHECK(a.q.dim() >= 3 && a.k.dim() == a.q.dim() && a.v.dim() == a.q.dim(), kDeviceName,
              " attention: query, key and value must have the same rank (>= 3)");
  const int64_t hq = a.q.dim() == 4 ? a.q.size(1) : 1;
  const int64_t hk = a.k.dim() == 4 ? a.k.size(1) : 1;
  TORCH_CHECK(hk > 0 && hq % hk == 0, kDeviceName, " attention: ", hq, " query heads for ", hk, " key heads");
  a.groups = hq / hk;
  if (a.groups > 1) {
    a.k = a.k.repeat_interleave(a.groups, 1);
    a.v = a.v.repeat_interleave(a.groups, 1);
  }
  a.scale = scale.value_or(1.0 / std::sqrt(static_cast<double>(a.q.size(-1))));
  a.scores = at::matmul(a.q, a.k.transpose(-2, -1)).mul_(a.scale);
  const int64_t l = a.q.size(-2), s = a.k.size(-2);
  if (is_causal) {
    const at::Tensor keep = at::ones({l, s}, at::TensorOptions().dtype(c10::kBool)).tril();
    a.scores.masked_fill_(keep.logical_not(), -std::numeric_limits<double>::infinity());
  }
  if (mask.defined()) {
    const at::Tensor m = OnHost(mask);
    if (m.scalar_type() == c10::kBool) {
      a.scores.masked_fill_(m.logical_not(), -std::numeric_limits<double>::infinity());
    } else {
      a.scores.add_(m.to(compute));
    }
  }
  a.probs = at::_safe_softmax(a.scores, -1);
  return a;
}

// Sums a gradient over the query-head groups that shared one key head.
at::Tensor SumGroups(const at::Tensor& g, int64_t groups) {
  if (groups == 1) return g;
  auto sizes = g.sizes().vec();
  sizes[1] /= groups;
  sizes.insert(sizes.begin() + 2, groups);
  return g.reshape(sizes).sum(2);
}

// _scaled_dot_product_fused_attention_overrideable(Tensor query, Tensor key, Tensor value, Tensor? attn_bias=None, float dropout_p=0.0, bool is_causal=False, bool return_debug_mask=False, *, float? scale=None) -> (Tensor output, Tensor logsumexp, Tensor cum_seq_q, Tensor cum_seq_k, SymInt max_q, SymInt max_k, Tensor philox_seed, Tensor philox_offset, Tensor debug_attn_mask)
void Attention(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  auto args = torch::jit::pop(*stack, op.schema().arguments().size());
  Count("attention");
  const at::Tensor q = args[0].toTensor();
  TORCH_CHECK(args[4].toDouble() == 0, kDeviceName, " attention runs without dropout");
  const at::Tensor mask = args[3].isNone() ? at::Tensor() : args[3].toTensor();
  std::optional<double> scale;
  if (!args[7].isNone()) scale = args[7].toDouble();
  const HostAttention a = AttentionOnHost(q, args[1].toTensor(), args[2].toTensor(), mask, args[5].toBool(), scale);
  const at::Tensor out = at::matmul(a.probs, a.v).to(q.scalar_type());
  const at::Tensor lse = at::logsumexp(a.scores, -1).to(c10::kFloat);
  const at::Tensor none = SimCopyOf(at::empty({0}, at::TensorOptions().dtype(c10::kLong)));
  torch::jit::push(*stack, SimCopyOf(out.contiguous()), SimCopyOf(lse), none, none, q.size(-2), args[1].toTensor().size(-2),
                   none, none, SimCopyOf(at::empty({0}, at::TensorOptions().dtype(q.scalar_type()))));
}

// _scaled_dot_product_fused_attention_overrideable_backward(Tensor grad_out, Tensor query, Tensor key, Tensor value, Tensor attn_bias, bool[4] grad_input_mask, Tensor out, Tensor logsumexp, Tensor cum_seq_q, Tensor cum_seq_k, SymInt max_q, SymInt max_k, float dropout_p, bool is_causal, Tensor philox_seed, Tensor philox_offset, *, float? scale=None) -> (Tensor grad_query, Tensor grad_key, Tensor grad_value, Tensor grad_attn_bias)
void AttentionBackward(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  auto args = torch::jit::pop(*stack, op.schema().arguments().size());
  Count("attention_backward");
  const at::Tensor q = args[1].toTensor(), k = args[2].toTensor(), v = args[3].toTensor();
  const at::Tensor mask = args[4].isNone() ? at::Tensor() : args[4].toTensor();
  const std::vector<bool> wanted = args[5].toBoolList().vec();
  std::optional<double> scale;
  if (!args[16].isNone()) scale = args[16].toDouble();
  const HostAttention a = AttentionOnHost(q, k, v, mask, args[13].toBool(), scale);
  const at::Tensor d_out = OnHost(args[0].toTensor()).to(a.q.scalar_type());
  // out = P v, P = softmax(S), S = q k^T * scale (+ mask).
  const at::Tensor d_v = at::matmul(a.probs.transpose(-2, -1), d_out);
  const at::Tensor d_p = at::matmul(d_out, a.v.transpose(-2, -1));
  const at::Tensor d_s = a.probs * (d_p - (d_p * a.probs).sum(-1, /*keepdim=*/true));
  const at::Tensor d_q = at::matmul(d_s, a.k).mul_(a.scale);
  const at::Tensor d_k = at::matmul(d_s.transpose(-2, -1), a.q).mul_(a.scale);
  auto result = [&](size_t i, const at::Tensor& g, const at::Tensor& like) -> c10::IValue {
    if (i >= wanted.size() || !wanted[i] || !like.defined()) return at::Tensor();
    return SimCopyOf(g.to(like.scalar_type()).contiguous());
  };
  at::Tensor d_mask;
  if (mask.defined() && mask.is_floating_point()) d_mask = at::sum_to(d_s, mask.sizes());
  torch::jit::push(*stack, result(0, d_q, q), result(1, SumGroups(d_k, a.groups), k),
                   result(2, SumGroups(d_v, a.groups), v), result(3, d_mask, mask));
}

// ---------------------------------------------------------------------------
// Registration (static, as every PyTorch device extension does: loading the
// library is what makes the device exist).

// The name first: c10 accepts it only before any tensor of the device exists.
const bool kDeviceNamed = [] {
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
}  // namespace coverage::sim

// ATen's scaled_dot_product_attention asks this stub, not the op, which
// kernel a device wants (Note [Sim attention]).
namespace at::native {
REGISTER_PRIVATEUSE1_DISPATCH(_fused_sdp_choice_stub, &coverage::sim::SdpChoice)
}  // namespace at::native

// ---------------------------------------------------------------------------
// The plugin ABI (backends/plugin_abi.h).

#define SIM_EXPORT extern "C" __attribute__((visibility("default")))

// Reads the configuration from the environment again (sim/README.md); the
// error names the variable, the file and the key.
SIM_EXPORT const char* coverage_backend_init(void) {
  using namespace coverage::sim;
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
  using namespace coverage::sim;
  thread_local std::string text;
  nlohmann::json j = nlohmann::json::object();
  {
    std::lock_guard<std::mutex> lock(S().mu);
    for (const char* always : {"compiles", "cache_hits", "fallbacks", "allocations", "bytes_allocated", "faults_injected"}) {
      j[always] = 0;
    }
    for (const auto& [name, value] : S().counters) j[name] = value;
  }
  text = j.dump();
  return text.c_str();
}

SIM_EXPORT void coverage_backend_synchronize(void) {}  // host memory: every op has finished when it returns
