"""Composites that pick their kernel by device, recorded whole.

A dispatch mode sees the calls *below* a CompositeImplicitAutograd op: what
the composite chose for the device the trace ran on. For most composites the
choice does not depend on the device, but for some it does, and then a
program traced on the CPU (or on meta, taking the CPU's choice) holds
kernels a backend never receives:

* scaled_dot_product_attention asks the device (the `_fused_sdp_choice`
  stub) and calls `_scaled_dot_product_flash_attention_for_cpu` on the CPU,
  a CPU-only kernel; on a PrivateUse1 device it calls the device's choice
  (`_scaled_dot_product_fused_attention_overrideable`) or the math path.

So scaled_dot_product_attention is recorded as one call of
`aten::scaled_dot_product_attention`, with the mask, causal flag, scale and
GQA flag the model passed. The calls the trace device made for it run but
are not recorded; their names are kept in the call's `decomposition`, so a
failing call says what the CPU runs in its place. When the inputs need
gradients (training), the composite's backward is recorded whole too, as
`coverage::scaled_dot_product_attention_backward`, an op of this project
(its C++ kernel, replay/composites.cc, recomputes the forward under
autograd on the replaying device, so the device runs its own attention
backward).

Checked and left to the dispatch mode, because a PrivateUse1 device receives
the same calls as the CPU: batch norm, layer/group/instance/RMS norm,
embedding_bag, convolutions (aten::convolution is dispatched whole),
linear, softmax, cross entropy, interpolate, pooling, stft. Recurrent
layers (aten::lstm, aten::gru) do differ (mkldnn_rnn_layer on the CPU,
_thnn_fused_*_cell elsewhere); see the README for why they are not recorded
whole yet. Dropout differs too, but every dropout probability is 0 in a
trace (config.zero_dropout).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import _disable_current_modes

from .metafunctions import sdpa_args

_aten = torch.ops.aten

SDPA_BACKWARD_SCHEMA = ("scaled_dot_product_attention_backward(Tensor grad_out, Tensor query, Tensor key, "
                        "Tensor value, Tensor? attn_mask, float dropout_p, bool is_causal, float? scale, "
                        "bool enable_gqa, bool[4] output_mask) -> (Tensor, Tensor, Tensor, Tensor)")

_library = None


def _sdpa_backward_op():
    """torch.ops.coverage.scaled_dot_product_attention_backward: the schema
    only (the tracer never calls it; it names and normalises the record)."""
    global _library
    if _library is None:
        _library = torch.library.Library("coverage", "DEF")
        _library.define(SDPA_BACKWARD_SCHEMA)
    return torch.ops.coverage.scaled_dot_product_attention_backward.default


class _AttentionWithBackward(torch.autograd.Function):
    """scaled_dot_product_attention as one autograd node, so that its
    backward is one recorded call too. The forward runs the real composite
    on detached inputs with grad enabled and keeps that inner graph; the
    backward takes the gradients from it."""

    @staticmethod
    def forward(ctx, recorder, flags, query, key, value, attn_mask):
        originals = (query, key, value, attn_mask)

        def run():
            # The detaches are this wrapper's, not the composite's: unrecorded.
            with _disable_current_modes():
                inner = [None if t is None else t.detach().requires_grad_(t.requires_grad) for t in originals]
            with torch.enable_grad():
                out = F.scaled_dot_product_attention(inner[0], inner[1], inner[2], attn_mask=inner[3], **flags)
            ctx.inner, ctx.out = inner, out
            with _disable_current_modes():
                return out.detach()

        ctx.recorder, ctx.flags, ctx.originals = recorder, flags, originals
        return recorder.record_whole(_aten.scaled_dot_product_attention.default,
                                     (query, key, value), {"attn_mask": attn_mask, **flags}, run)

    @staticmethod
    def backward(ctx, grad_out):
        need = [t is not None and t.requires_grad for t in ctx.inner]

        def run():
            wanted = [t for t, n in zip(ctx.inner, need) if n]
            grads = iter(torch.autograd.grad(ctx.out, wanted, grad_out))
            return tuple(next(grads) if n else None for n in need)

        q, k, v, mask = ctx.originals
        f = ctx.flags
        grads = ctx.recorder.record_whole(
            _sdpa_backward_op(),
            (grad_out, q, k, v, mask, f["dropout_p"], f["is_causal"], f["scale"], f["enable_gqa"], need), {}, run)
        ctx.inner = ctx.out = ctx.originals = None
        return (None, None, *grads)


class WholeComposites(TorchFunctionMode):
    """Records the composites above as single calls (ProgramRecorder.record_whole)."""

    def __init__(self, recorder):
        super().__init__()
        self._recorder = recorder

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is not F.scaled_dot_product_attention or not self._recorder.recording:
            return func(*args, **kwargs)
        q, k, v, mask, dropout_p, is_causal, scale, gqa = sdpa_args(*args, **kwargs)
        flags = {"dropout_p": dropout_p, "is_causal": is_causal, "scale": scale, "enable_gqa": gqa}
        inputs = [t for t in (q, k, v, mask) if t is not None]
        if torch.is_grad_enabled() and any(t.requires_grad for t in inputs):
            return _AttentionWithBackward.apply(self._recorder, flags, q, k, v, mask)
        return self._recorder.record_whole(_aten.scaled_dot_product_attention.default, (q, k, v),
                                           {"attn_mask": mask, **flags}, lambda: func(*args, **kwargs))
