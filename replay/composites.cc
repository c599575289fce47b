#include "replay/composites.h"

#include <array>
#include <optional>
#include <tuple>
#include <vector>

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/library.h>

// Note [Composites recorded whole]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A few CompositeImplicitAutograd ops pick their kernel by device, so what
// the CPU runs for them is not what a backend receives:
// scaled_dot_product_attention runs _scaled_dot_product_flash_attention_for_cpu
// on the CPU and asks a PrivateUse1 device for its own choice
// (_fused_sdp_choice, then _scaled_dot_product_fused_attention_overrideable
// or the math path). The tracer records such a composite as one call of the
// composite (capture/tracer/coverage_tracer/composites.py), with the names
// of the calls the trace device made for it kept as its decomposition.
// Replay then calls the composite on each side: the backend makes its own
// choice, and the CPU reference computes the composite the CPU's way.
//
// Its backward has no ATen op of its own, so training programs record it as
// coverage::scaled_dot_product_attention_backward, defined here: the
// gradients of the forward with respect to query, key, value and (when
// output_mask[3]) the mask, for grad_out. The kernel recomputes the forward
// under autograd on the replaying side's device and differentiates it, so
// the device runs its own attention forward and backward
// (_scaled_dot_product_fused_attention_overrideable_backward, or the math
// path's backward), as activation checkpointing would have it run them.

namespace coverage::replay {
namespace {

constexpr const char* kAttentionBackwardSchema =
    "scaled_dot_product_attention_backward(Tensor grad_out, Tensor query, Tensor key, Tensor value, "
    "Tensor? attn_mask, float dropout_p, bool is_causal, float? scale, bool enable_gqa, bool[4] output_mask) "
    "-> (Tensor, Tensor, Tensor, Tensor)";

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> AttentionBackward(
    const at::Tensor& grad_out, const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
    const std::optional<at::Tensor>& attn_mask, double dropout_p, bool is_causal, std::optional<double> scale,
    bool enable_gqa, std::array<bool, 4> output_mask) {
  // Replay runs in inference mode; the recomputed forward needs autograd.
  // Clones (outside inference mode) are ordinary tensors autograd may save.
  c10::InferenceMode not_inference(false);
  at::AutoGradMode grad_mode(true);
  const bool has_mask = attn_mask.has_value() && attn_mask->defined();
  std::array<at::Tensor, 4> inputs = {query.clone(), key.clone(), value.clone(),
                                      has_mask ? attn_mask->clone() : at::Tensor()};
  std::vector<at::Tensor> wrt;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const bool wanted = output_mask[i] && inputs[i].defined() && inputs[i].is_floating_point();
    if (wanted) {
      inputs[i].requires_grad_(true);
      wrt.push_back(inputs[i]);
    }
  }
  std::array<at::Tensor, 4> grads;
  if (!wrt.empty()) {
    const at::Tensor out = at::scaled_dot_product_attention(
        inputs[0], inputs[1], inputs[2], has_mask ? std::optional<at::Tensor>(inputs[3]) : std::nullopt, dropout_p,
        is_causal, scale, enable_gqa);
    const std::vector<at::Tensor> got = torch::autograd::grad({out}, wrt, {grad_out.clone()});
    size_t k = 0;
    for (size_t i = 0; i < inputs.size(); ++i) {
      if (inputs[i].requires_grad()) grads[i] = got[k++];
    }
  }
  return {grads[0], grads[1], grads[2], grads[3]};
}

}  // namespace

void RegisterCompositeOps() {
  static const bool registered = [] {
    static torch::Library def(torch::Library::DEF, "coverage", std::nullopt, __FILE__, __LINE__);
    def.def(kAttentionBackwardSchema);
    static torch::Library impl(torch::Library::IMPL, "coverage", c10::DispatchKey::CompositeImplicitAutograd,
                               __FILE__, __LINE__);
    impl.impl("scaled_dot_product_attention_backward", TORCH_FN(AttentionBackward));
    return true;
  }();
  (void)registered;
}

}  // namespace coverage::replay
