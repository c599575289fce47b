"""Python-level calls that a meta run must take the CPU's way.

Two things the dispatch mode cannot fix, because the decision is made in
C++ above it, without a dispatched call:

* scaled_dot_product_attention picks its backend with a device-specific
  stub. On CPU that picks the fused flash kernel
  (aten::_scaled_dot_product_flash_attention_for_cpu); on meta there is no
  stub and it always decomposes into the math path. On meta this mode asks
  the CPU chooser (aten::_fused_sdp_choice on CPU stand-ins of the same
  specs, unrecorded) and, for flash, makes the calls the CPU composite makes:
  the bool-mask conversion (scalar_tensor, scalar_tensor, where), then the
  flash kernel.
* torch.tensor(data) on meta drops the data (it allocates an empty meta
  tensor without a dispatched call). On meta this mode builds the tensor on
  CPU, as a CPU run does (the same aten::lift_fresh gets recorded), and
  returns a meta twin whose shadow holds the values and whose value id is
  the CPU tensor's.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten
from torch.utils._python_dispatch import _disable_current_modes

_aten = torch.ops.aten
_SDP_FLASH = 1  # sdp::SDPBackend::flash_attention
_DATA_CONSTRUCTORS = (torch.tensor, torch.as_tensor, torch.asarray, torch.Tensor.new_tensor)


def sdpa_args(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """scaled_dot_product_attention's arguments, positional or not, in order."""
    return query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa


class MetaFunctions(TorchFunctionMode):
    def __init__(self, shadows, alias=None):
        super().__init__()
        self._shadows = shadows
        self._alias = alias or (lambda new, old: None)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention:
            q, k, v, mask, dropout_p, is_causal, scale, gqa = sdpa_args(*args, **kwargs)
            if q.is_meta and self._cpu_choice(q, k, v, mask, dropout_p, is_causal, scale, gqa) == _SDP_FLASH:
                return self._flash(q, k, v, mask, dropout_p, is_causal, scale)
        elif func in _DATA_CONSTRUCTORS:
            out = self._construct(func, args, kwargs)
            if out is not None:
                return out
        return func(*args, **kwargs)

    def _stand_in(self, t):
        """A CPU tensor of t's spec, needing a gradient where t does: the
        CPU chooser refuses the flash kernel for a mask that needs one (T5's
        learned position bias in training)."""
        if t is None:
            return None
        shadow = self._shadows.get(t) if t.is_meta else None
        if shadow is not None:
            stand_in = shadow.detach()
        else:
            stand_in = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="cpu")
        return stand_in.requires_grad_(t.requires_grad)

    def _cpu_choice(self, q, k, v, mask, dropout_p, is_causal, scale, gqa) -> int:
        with _disable_current_modes(), torch._C.DisableTorchFunction():
            return _aten._fused_sdp_choice.default(
                self._stand_in(q), self._stand_in(k), self._stand_in(v), self._stand_in(mask), dropout_p, is_causal,
                scale=scale, enable_gqa=gqa)

    def _flash(self, q, k, v, mask, dropout_p, is_causal, scale):
        if mask is not None and mask.dtype == torch.bool:
            # convert_boolean_attn_mask, as the CPU composite dispatches it.
            neg_inf = _aten.scalar_tensor.default(-math.inf, dtype=q.dtype, device=q.device)
            zero = _aten.scalar_tensor.default(0.0, dtype=q.dtype, layout=torch.strided, device=q.device)
            mask = _aten.where.self(mask, zero, neg_inf)
        return _aten._scaled_dot_product_flash_attention_for_cpu.default(
            q, k, v, dropout_p, is_causal, attn_mask=mask, scale=scale)[0]

    def _construct(self, func, args, kwargs):
        device = kwargs.get("device")
        rest = args
        if func is torch.Tensor.new_tensor:
            if device is None:
                device = args[0].device
            rest = args[1:]
        if device is None:
            device = torch.get_default_device()
        if torch.device(device).type != "meta":
            return None
        if any(isinstance(x, torch.Tensor) and x.is_meta for x in tree_flatten((rest, kwargs))[0]):
            return None
        cpu = func(*args, **{**kwargs, "device": "cpu"})
        with _disable_current_modes(), torch._C.DisableTorchFunction():
            twin = torch.empty_strided(cpu.shape, cpu.stride(), dtype=cpu.dtype, device="meta")
        self._shadows.put(twin, cpu)
        self._alias(twin, cpu)
        return twin
