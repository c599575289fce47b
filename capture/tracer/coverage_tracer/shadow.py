"""Running ATen calls on the trace device, with CPU shadows for meta tensors.

Meta tensors carry no data, yet transformers' own Python code looks at a few
small tensors it made from the inputs: it asks whether the attention mask is
all ones (to use is_causal instead of a mask), computes packed-sequence
boundaries, reads cache positions. Those calls fail on meta (`.item()`), and
a plain meta run could never get past the mask code.

So a meta run keeps, beside every *small* meta tensor whose inputs are all
known, a CPU "shadow" holding its real values: the inputs the tracer made,
aranges, masks, positions and everything computed from them alone. A call
that needs data (item, nonzero, equal) then takes it from the shadows, and
its meta outputs get the shapes the CPU computed. Tensors computed from the
weights have no shadow (the weights have no values), so a call that needs
*their* data still fails, and `--device auto` falls back to a CPU run.

One more thing differs between meta and CPU where the dispatch mode can see
it: the scaled-dot-product-attention backend choice (`_fused_sdp_choice`)
answers "math" on meta, which would decompose attention into matmul and
softmax. On meta that choice is computed on CPU stand-ins of the same specs,
so the program holds what the CPU really runs.
"""

from __future__ import annotations

import torch
from torch.utils._pytree import tree_flatten, tree_map, tree_unflatten
from torch.utils.weak import WeakIdKeyDictionary

from .encode import is_written, normalized_arguments

# Largest tensor (in elements) given a shadow: masks for 512 tokens and
# position tables fit; activations of real models do not matter here.
SHADOW_LIMIT = 1 << 20
# Largest call (input plus output elements) re-run on CPU stand-ins to learn
# the CPU kernel's output strides.
STRIDE_ORACLE_LIMIT = 1 << 23

_META = torch.device("meta")
_CPU = torch.device("cpu")

_aten = torch.ops.aten
# Ops whose result depends on the device rather than the data: computed on
# CPU stand-ins so meta takes the path the CPU takes.
_DEVICE_CHOICE_OPS = {_aten._fused_sdp_choice.default}


def _grouped_mm_meta(self, mat2, offs=None, bias=None, out_dtype=None):
    """aten::_grouped_mm's meta kernel accepts bf16 only, while the CPU kernel
    (what a CPU run calls, e.g. for transformers' grouped-mm MoE experts in
    f32) takes any float dtype. The result's shape and strides do not depend
    on the dtype: take them from the meta kernel on bf16 twins."""
    twin = lambda t: None if t is None else torch.empty_strided(t.shape, t.stride(), dtype=torch.bfloat16, device="meta")
    r = _aten._grouped_mm.default(twin(self), twin(mat2), offs, twin(bias))
    return torch.empty_strided(r.shape, r.stride(), dtype=out_dtype or self.dtype, device="meta")


# Ops whose meta kernel refuses what their CPU kernel runs: the shapes come from here.
_META_OVERRIDES = {_aten._grouped_mm.default: _grouped_mm_meta}
_EMPTY_OPS = {
    _aten.empty.memory_format,
    _aten.empty_strided.default,
    _aten.empty_like.default,
    _aten.new_empty.default,
    _aten.new_empty_strided.default,
}


def _returns_fresh(func) -> bool:
    """Whether func's tensor results are new tensors (not views or inputs)."""
    return all(r.alias_info is None for r in func._schema.returns)


def _tensors(tree):
    leaves, _ = tree_flatten(tree)
    return [x for x in leaves if isinstance(x, torch.Tensor)]


class ShadowStore:
    """Maps meta tensors (weakly) to CPU tensors holding their values."""

    def __init__(self):
        self._cpu = WeakIdKeyDictionary()

    def get(self, t: torch.Tensor):
        return self._cpu.get(t)

    def put(self, meta: torch.Tensor, cpu: torch.Tensor) -> None:
        self._cpu[meta] = cpu

    def drop(self, t: torch.Tensor) -> None:
        self._cpu.pop(t, None)

    def _cpu_args(self, args, kwargs):
        """args/kwargs with meta tensors replaced by their shadows and the
        meta device by CPU; None when some meta tensor has no shadow."""
        missing = False

        def swap(x):
            nonlocal missing
            if isinstance(x, torch.Tensor) and x.is_meta:
                s = self._cpu.get(x)
                if s is None:
                    missing = True
                return s
            if isinstance(x, torch.device) and x.type == "meta":
                return _CPU
            return x

        cpu_args = tree_map(swap, args)
        cpu_kwargs = tree_map(swap, kwargs)
        return None if missing else (cpu_args, cpu_kwargs)

    def _stand_ins(self, args, kwargs, zeros=False):
        """CPU tensors of the same specs: shadows where known, else empty
        (or zero, when the call will read them) tensors."""
        def swap(x):
            if isinstance(x, torch.Tensor) and x.is_meta:
                s = self._cpu.get(x)
                if s is not None:
                    return s
                t = torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device=_CPU)
                return t.zero_() if zeros else t
            if isinstance(x, torch.device) and x.type == "meta":
                return _CPU
            return x

        return tree_map(swap, args), tree_map(swap, kwargs)

    def run(self, func, args, kwargs):
        """Runs func on meta, keeping shadows; see the module docstring."""
        inputs = _tensors((args, kwargs))
        if func in _DEVICE_CHOICE_OPS and any(t.is_meta for t in inputs):
            cpu_args, cpu_kwargs = self._stand_ins(args, kwargs)
            return func(*cpu_args, **cpu_kwargs)
        try:
            override = _META_OVERRIDES.get(func)
            if override is not None and any(t.is_meta for t in inputs):
                out = override(*args, **kwargs)
            else:
                out = func(*args, **kwargs)
            error = None
        except Exception as e:  # noqa: BLE001 - re-raised below unless shadows answer
            out, error = None, e
        wants_meta = any(t.is_meta for t in inputs) or any(
            isinstance(x, torch.device) and x.type == "meta" for x in tree_flatten((args, kwargs))[0]
        )
        if error is not None:
            if not wants_meta:
                raise error
            cpu = self._cpu_args(args, kwargs)
            if cpu is None:
                raise error
            return self._mirror(func(*cpu[0], **cpu[1]), args, kwargs)
        outputs = _tensors(out)
        if not wants_meta and not any(t.is_meta for t in outputs):
            return out
        cpu = self._cpu_args(args, kwargs) if sum(t.numel() for t in outputs) <= SHADOW_LIMIT else None
        if cpu is not None:
            try:
                cpu_out = func(*cpu[0], **cpu[1])
            except Exception:  # noqa: BLE001 - the meta result stands; only the shadows are lost
                self._forget_written(func, args, kwargs)
                return out
            if func in _EMPTY_OPS:
                # Undefined values; zeros keep repeated traces identical.
                for t in _tensors(cpu_out):
                    t.zero_()
            return self._pair(func, out, cpu_out, shadow=True)
        self._forget_written(func, args, kwargs)
        if inputs and _returns_fresh(func) and any(1 in t.shape and t.dim() > 1 for t in outputs):
            return self._cpu_strides(func, args, kwargs, out, inputs, outputs)
        return out

    def _cpu_strides(self, func, args, kwargs, out, inputs, outputs):
        """`out` with the strides the CPU kernel gives.

        Meta kernels (many are Python decompositions) may pick different,
        equally valid strides for size-1 dimensions than the CPU kernels;
        those strides then propagate. Where the call is small enough, it is
        run on CPU stand-ins (shadows or zeros) to read the CPU's choice.
        """
        if sum(t.numel() for t in inputs) + sum(t.numel() for t in outputs) > STRIDE_ORACLE_LIMIT:
            return out
        cpu_args, cpu_kwargs = self._stand_ins(args, kwargs, zeros=True)
        try:
            cpu_out = func(*cpu_args, **cpu_kwargs)
        except Exception:  # noqa: BLE001 - keep the meta kernel's strides
            return out
        return self._pair(func, out, cpu_out, shadow=False)

    def _forget_written(self, func, args, kwargs):
        # An in-place call with an input that has no shadow leaves the
        # written tensor's shadow stale.
        for schema_arg, v in normalized_arguments(func, args, kwargs):
            if is_written(schema_arg):
                for t in _tensors(v):
                    self.drop(t)

    def _pair(self, func, out, cpu_out, shadow: bool):
        """`out`, with fresh outputs re-made with the CPU's strides where they
        differ; with shadow=True the CPU results become their shadows."""
        meta_leaves, spec = tree_flatten(out)
        cpu_leaves, _ = tree_flatten(cpu_out)
        if len(meta_leaves) != len(cpu_leaves):
            return out
        fresh = _returns_fresh(func)
        changed = False
        for i, (m, c) in enumerate(zip(meta_leaves, cpu_leaves)):
            if not (isinstance(m, torch.Tensor) and isinstance(c, torch.Tensor) and m.is_meta and m.shape == c.shape):
                continue
            if fresh and m.stride() != c.stride() and c.layout == torch.strided:
                m = torch.empty_strided(c.shape, c.stride(), dtype=m.dtype, device=_META)
                meta_leaves[i] = m
                changed = True
            if shadow:
                self.put(m, c)
        return tree_unflatten(meta_leaves, spec) if changed else out

    def _mirror(self, cpu_out, args, kwargs):
        """Meta results for a call answered by the shadows: data-dependent
        shapes come from the CPU; in-place results are the meta inputs."""
        by_shadow = {}
        for t in _tensors((args, kwargs)):
            s = self._cpu.get(t) if t.is_meta else None
            if s is not None:
                by_shadow[id(s)] = t
        wants_cpu = any(isinstance(x, torch.device) and x.type == "cpu" for x in tree_flatten((args, kwargs))[0])

        def to_meta(c):
            if not isinstance(c, torch.Tensor):
                return c
            if id(c) in by_shadow:
                return by_shadow[id(c)]
            if wants_cpu:
                return c
            m = torch.empty_strided(c.shape, c.stride(), dtype=c.dtype, device=_META)
            self.put(m, c)
            return m

        return tree_map(to_meta, cpu_out)
