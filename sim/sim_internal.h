// What the sources of the simulated device share (sim/README.md names the
// files and what each holds). Private to sim: the plugin's interface is
// backends/plugin_abi.h, whose functions sim.cc exports; everything here is
// hidden (the library is built with hidden visibility).
//
// Threading: kernels run on whatever thread calls them; the process-wide
// State is guarded by its mutex, and the helpers below take it themselves.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_set>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <c10/core/Allocator.h>

#include "sim/sim_config.h"

// The name the device registers (c10::register_privateuse1_backend): tensors
// print as "sim:0" and "sim:0" parses as the device. The build gives another name to
// the test plugin made from these sources (tests/support/plugin).
#ifndef COVERAGE_SIM_DEVICE_NAME
#define COVERAGE_SIM_DEVICE_NAME "sim"
#endif

namespace coverage::sim::internal {

inline constexpr c10::DeviceType kSimType = c10::DeviceType::PrivateUse1;
inline constexpr const char* kDeviceName = COVERAGE_SIM_DEVICE_NAME;
inline const c10::Device kSimDevice(kSimType, 0);

// ---------------------------------------------------------------------------
// Process state and the device (sim.cc).

// Process-wide state. Never destroyed: kernels and deleters may still run
// while static objects of other libraries are torn down at exit.
struct State {
  std::mutex mu;
  std::shared_ptr<const Config> config = std::make_shared<Config>();
  std::string init_error;
  // The counters every report names, from the start (coverage_backend_counters).
  std::map<std::string, int64_t> counters = {{"compiles", 0},    {"cache_hits", 0},      {"fallbacks", 0},
                                             {"allocations", 0}, {"bytes_allocated", 0}, {"faults_injected", 0}};
  std::unordered_set<std::string> signatures;  // (op, shapes, dtypes) seen: "compiled"
};

State& S();

// Adds `n` to the counter `name` (coverage_backend_counters).
void Count(const std::string& name, int64_t n = 1);

// The configuration coverage_backend_init read last (defaults before).
std::shared_ptr<const Config> CurrentConfig();

// The allocator of sim memory: host memory, 64-byte aligned, counted.
c10::Allocator& TheAllocator();

// Throws unless `d` is the one device, sim:0 (or sim without an index).
void CheckDevice(c10::Device d);

// The default generator of sim:0 (Note [Sim generators] in sim_fallback.cc).
const at::Generator& DefaultGenerator(c10::DeviceIndex index);

// ---------------------------------------------------------------------------
// Sim tensors, their host views and walks over boxed values (sim_tensors.cc).

bool IsSim(const at::Tensor& t);

void SetGeometry(at::Tensor& t, c10::IntArrayRef sizes, c10::IntArrayRef strides, int64_t offset);

// A tensor of `storage` with the given geometry and exactly the dispatch
// keys `keys`.
at::Tensor TensorOver(c10::Storage storage, c10::DispatchKeySet keys, caffe2::TypeMeta dtype, c10::IntArrayRef sizes,
                      c10::IntArrayRef strides, int64_t offset);

// `view` with the lazy conjugate and negative bits of `from`.
at::Tensor WithMathBitsOf(at::Tensor view, const at::Tensor& from);

at::Tensor EmptySim(c10::IntArrayRef size, c10::ScalarType dtype, std::optional<c10::MemoryFormat> format);
at::Tensor EmptyStridedSim(c10::IntArrayRef size, c10::IntArrayRef stride, c10::ScalarType dtype);

// A CPU tensor over the memory of sim tensor `sim` (Note [Host views]).
at::Tensor HostView(const at::Tensor& sim);

// HostView(t) for a sim tensor, `t` itself otherwise.
at::Tensor OnHost(const at::Tensor& t);

// A fresh sim tensor with the values (and, when dense, the strides) of `cpu`.
at::Tensor SimCopyOf(const at::Tensor& cpu);

// Replaces the bytes of sim storage `s` by a fresh allocation of `nbytes`
// holding `src` (nbytes_src bytes; the rest uninitialised).
void ReplaceStorageBytes(const c10::Storage& s, size_t nbytes, const void* src, size_t nbytes_src);

// "aten::mul.Tensor"; "aten::relu" for an op without an overload name.
std::string QualifiedName(const c10::OperatorHandle& op);

// The dtype names fault rules and compile signatures use: "f32", "bf16", ...
const char* DTypeName(c10::ScalarType t);

// Calls `fn` on every tensor in `v` (a tensor, lists and tuples of them).
void ForEachTensor(const c10::IValue& v, const std::function<void(const at::Tensor&)>& fn);

// `v` with every tensor in it (a tensor, a tensor list, a list of optional
// tensors) replaced by fn(tensor); anything else unchanged.
c10::IValue MapTensors(const c10::IValue& v, const std::function<at::Tensor(const at::Tensor&)>& fn);

// True for a schema argument or return marked as written (Tensor(a!)).
bool Writes(const c10::Argument& a);

// ---------------------------------------------------------------------------
// Kernels, boxed so that they register whatever the SymInt signatures of the
// libtorch they are built against. Registered in sim.cc.

// Native memory kernels (sim_kernels.cc).
void Empty(const c10::OperatorHandle& op, torch::jit::Stack* stack);
void EmptyStrided(const c10::OperatorHandle& op, torch::jit::Stack* stack);
void Copy(const c10::OperatorHandle& op, torch::jit::Stack* stack);
void CopyFrom(const c10::OperatorHandle& op, torch::jit::Stack* stack);
void CopyFromAndResize(const c10::OperatorHandle& op, torch::jit::Stack* stack);
void Resize(const c10::OperatorHandle& op, torch::jit::Stack* stack);
void Set(const c10::OperatorHandle& op, torch::jit::Stack* stack);

// Attention (Note [Sim attention], sim_kernels.cc). SdpChoice has the
// signature of ATen's _fused_sdp_choice_stub.
int64_t SdpChoice(const at::Tensor&, const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&,
                  double dropout_p, bool, std::optional<double>, bool);
void SdpChoiceBoxed(const c10::OperatorHandle& op, torch::jit::Stack* stack);
void Attention(const c10::OperatorHandle& op, torch::jit::Stack* stack);
void AttentionBackward(const c10::OperatorHandle& op, torch::jit::Stack* stack);

// Every other op (Note [Host fallback], sim_fallback.cc).
void HostFallback(const c10::OperatorHandle& op, torch::jit::Stack* stack);

// ---------------------------------------------------------------------------
// Fault injection (Note [Sim fault matching], sim_faults.cc).

// The first rule of `config` that matches the op and its arguments; null
// when none does.
const FaultRule* MatchFault(const Config& config, const std::string& qualified, const std::string& bare,
                            const std::vector<c10::IValue>& args);

// Acts out the faults that replace running the op (unsupported, error,
// crash, abort, hang) or delay it (slow); returns for the others.
void FaultBeforeRunning(const FaultRule& r, const std::string& qualified);

// For the faults that corrupt results (wrong values, NaN): corrupts the
// results on the host stack `host` the op left, or, when it returns no
// tensor, the sim arguments it wrote. `in_argument_memory` says a result
// lives in the memory of a sim argument (it is then replaced by a corrupted
// copy, unless the op wrote it in place). Does nothing for other faults.
void CorruptResults(const FaultRule& fault, const c10::FunctionSchema& schema, const std::vector<c10::IValue>& args,
                    torch::jit::Stack* host, const std::function<bool(const at::Tensor&)>& in_argument_memory);

// The operands bf16_matmul rounds in `bare` ("aten::mm"), by argument name;
// empty: every read-only fp32 tensor argument (an op of bf16_ops without an
// entry). coverage_backend_numerics() declares the same (Note [Declared
// numerics] in replay/numerics.cc).
std::vector<std::string> RoundedOperands(const std::string& bare);

}  // namespace coverage::sim::internal
