// Kernels of the simulated device that the host fallback cannot serve: the
// native memory kernels, which make or reshape sim memory themselves, and
// sim's own scaled-dot-product attention (Note [Sim attention]). sim.cc
// registers them.
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/EmptyTensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

#include "sim/sim_internal.h"

namespace coverage::sim::internal {

// ---------------------------------------------------------------------------
// Native kernels: what cannot go through the host fallback because it makes
// or reshapes sim memory itself. All boxed, so that they register whatever
// the SymInt signatures of the libtorch they are built against.

namespace {

c10::ScalarType DTypeArg(const c10::IValue& v) {
  return v.isNone() ? c10::typeMetaToScalarType(c10::get_default_dtype()) : v.toScalarType();
}

void CheckFactoryArgs(const c10::IValue& layout, const c10::IValue& device) {
  TORCH_CHECK(layout.isNone() || layout.toLayout() == c10::kStrided, "sim supports strided tensors only, got layout ",
              layout.toLayout());
  if (!device.isNone()) CheckDevice(device.toDevice());
}

void CopyValues(const at::Tensor& dst, const at::Tensor& src) {
  TORCH_CHECK((IsSim(dst) || dst.device().is_cpu()) && (IsSim(src) || src.device().is_cpu()),
              kDeviceName, " copies between ", kDeviceName, " and cpu only, got ", src.device(), " -> ", dst.device());
  Count(IsSim(dst) && IsSim(src) ? "copies_device_to_device" : IsSim(dst) ? "copies_to_device" : "copies_to_host");
  if (dst.numel() == 0) return;
  OnHost(dst).copy_(OnHost(src));
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

void SetTo(const at::Tensor& self, const c10::Storage& storage, int64_t offset, c10::IntArrayRef sizes,
           c10::IntArrayRef strides) {
  TORCH_CHECK(storage.device().type() == kSimType || storage.nbytes() == 0, kDeviceName, ": set_ needs ", kDeviceName, " storage, got ",
              storage.device());
  c10::TensorImpl* impl = self.unsafeGetTensorImpl();
  if (!impl->storage().is_alias_of(storage)) impl->set_storage_keep_dtype(storage);
  impl->set_sizes_and_strides(sizes, strides);
  impl->set_storage_offset(offset);
}

}  // namespace

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

namespace {

constexpr int64_t kSdpMath = 0;          // sdp::SDPBackend::math
constexpr int64_t kSdpOverrideable = 4;  // sdp::SDPBackend::overrideable

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

}  // namespace

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

}  // namespace coverage::sim::internal
