// Sim tensors and their host views (Note [Host views]), and the walks over
// boxed values that the kernels, the fallback and the faults share.
#include <algorithm>
#include <cstring>
#include <functional>
#include <optional>
#include <string>
#include <utility>

#include <ATen/ATen.h>
#include <ATen/EmptyTensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/CPUAllocator.h>

#include "sim/sim_internal.h"

namespace coverage::sim::internal {

bool IsSim(const at::Tensor& t) { return t.defined() && t.device().type() == kSimType; }

void SetGeometry(at::Tensor& t, c10::IntArrayRef sizes, c10::IntArrayRef strides, int64_t offset) {
  t.unsafeGetTensorImpl()->set_sizes_and_strides(sizes, strides);
  t.unsafeGetTensorImpl()->set_storage_offset(offset);
}

// Like ATen's own views, the tensor takes its keys from the tensor it
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

at::Tensor SimCopyOf(const at::Tensor& cpu) {
  at::Tensor sim = cpu.is_non_overlapping_and_dense() ? EmptyStridedSim(cpu.sizes(), cpu.strides(), cpu.scalar_type())
                                                      : EmptySim(cpu.sizes(), cpu.scalar_type(), std::nullopt);
  if (cpu.numel() > 0) HostView(sim).copy_(cpu);
  Count("copies_to_device");
  return sim;
}

void ReplaceStorageBytes(const c10::Storage& s, size_t nbytes, const void* src, size_t nbytes_src) {
  c10::DataPtr fresh = TheAllocator().allocate(nbytes);
  if (nbytes_src > 0 && src != nullptr) std::memcpy(fresh.get(), src, std::min(nbytes, nbytes_src));
  s.set_data_ptr_noswap(std::move(fresh));
  s.set_nbytes(nbytes);
}

std::string QualifiedName(const c10::OperatorHandle& op) {
  const auto& n = op.operator_name();
  return n.overload_name.empty() ? n.name : n.name + "." + n.overload_name;
}

// ---------------------------------------------------------------------------
// Boxed values.

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

}  // namespace coverage::sim::internal
