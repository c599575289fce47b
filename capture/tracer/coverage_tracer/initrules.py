"""Which initialisation rule each parameter and buffer got.

The rule is not guessed from module types: the model is built (and, on meta,
its `initialize_weights` run) under a dispatch mode that notes every call
writing a tensor in place and the call that created each tensor. The last
call that overwrote all of a parameter names its rule: `normal_` is
normal(mean, std), `uniform_` uniform(lo, hi), `fill_` ones/zeros, and so
on, exactly as the library's `_init_weights` (or torch's own reset) left it.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import math

import torch
from torch.utils._pytree import tree_flatten
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.weak import WeakIdKeyDictionary

from .encode import is_written, normalized_arguments

# Calls that replace every element of the tensor they write.
_OVERWRITES = {"normal_", "uniform_", "fill_", "zero_", "copy_", "random_", "bernoulli_", "exponential_",
               "log_normal_", "cauchy_", "geometric_"}
# torch.nn.init functions that return at once on meta tensors (so no call
# shows on meta): they are noted by name, after they ran, on every device.
_NAMED_INITS = ("trunc_normal_", "orthogonal_", "dirac_", "sparse_")


def _short(op_name: str) -> str:
    return op_name.split("::", 1)[-1]


def _scalars(func, args, kwargs) -> dict:
    out = {}
    for a, v in normalized_arguments(func, args, kwargs):
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            out[a.name] = v
    return out


class InitRecorder(TorchDispatchMode):
    """Dispatch mode used while building: runs each call with `run_call`
    and keeps, per tensor (weakly), the calls that created or wrote it."""

    def __init__(self, run_call):
        super().__init__()
        self._run_call = run_call
        self.events = WeakIdKeyDictionary()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = self._run_call(func, args, kwargs)
        name = _short(func._schema.name)
        inputs = set()
        for a, v in normalized_arguments(func, args, kwargs):
            for t in tree_flatten(v)[0]:
                if isinstance(t, torch.Tensor):
                    inputs.add(id(t))
                    if is_written(a):
                        self.events.setdefault(t, []).append((name, _scalars(func, args, kwargs)))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and id(t) not in inputs:
                self.events[t] = [("create:" + name, _scalars(func, args, kwargs))]
        return out

    def rule_for(self, t: torch.Tensor) -> dict:
        return classify(self.events.get(t, []))

    @contextlib.contextmanager
    def named_inits(self):
        """Wraps the _NAMED_INITS in torch.nn.init, and in transformers'
        table of the originals it calls through, while building."""
        import transformers.initialization as hf_init

        tables = [(torch.nn.init, name) for name in _NAMED_INITS]
        table = getattr(hf_init, "TORCH_INIT_FUNCTIONS", {})
        saved = []
        try:
            for module, name in tables:
                original = getattr(module, name)
                saved.append((setattr, module, name, original))
                setattr(module, name, self._noting(name, original))
            for name in _NAMED_INITS:
                if name in table:
                    saved.append((table.__setitem__, None, name, table[name]))
                    table[name] = self._noting(name, table[name])
            yield
        finally:
            for restore, module, name, original in reversed(saved):
                if module is None:
                    restore(name, original)
                else:
                    restore(module, name, original)

    def _noting(self, name, fn):
        signature = inspect.signature(fn)

        @functools.wraps(fn)
        def wrapper(tensor, *args, **kwargs):
            out = fn(tensor, *args, **kwargs)
            bound = signature.bind(tensor, *args, **kwargs)
            bound.apply_defaults()
            params = {k: v for k, v in bound.arguments.items()
                      if isinstance(v, (int, float)) and not isinstance(v, bool)}
            self.events.setdefault(tensor, []).append((name, params))
            return out

        return wrapper


def _num(v) -> float:
    return float(v)


def classify(events: list) -> dict:
    """The init record for one tensor from its creation/write history."""
    if not events:
        return {"rule": "other", "note": "no initialisation call seen"}
    last = max((i for i, (name, _) in enumerate(events) if name in _OVERWRITES or name in _NAMED_INITS),
               default=None)
    if last is None:
        name, params = events[0]
        if name.startswith("create:"):
            op = name[len("create:"):]
            if op in ("zeros", "zeros_like", "new_zeros"):
                return {"rule": "zeros"}
            if op in ("ones", "ones_like", "new_ones"):
                return {"rule": "ones"}
            if op in ("full", "full_like", "new_full") and "fill_value" in params:
                return _constant(params["fill_value"])
            if op.startswith("empty") or op.startswith("new_empty"):
                return {"rule": "other", "note": "left uninitialised (empty)"}
            return {"rule": "other", "note": f"computed at build by aten::{op}"}
        return {"rule": "other", "note": "written by " + ", ".join(f"aten::{n}" for n, _ in events)}
    name, params = events[last]
    after = [n for n, _ in events[last + 1:]]
    if name == "trunc_normal_" and not after:
        mean, std = _num(params.get("mean", 0.0)), _num(params.get("std", 1.0))
        lo, hi = _num(params.get("a", -2.0)), _num(params.get("b", 2.0))
        if std > 0 and mean - lo >= 6 * std and hi - mean >= 6 * std:
            # Bounds 6 std or more away never cut anything a replay would draw.
            return {"rule": "normal", "mean": mean, "std": std, "note": f"trunc_normal_ to [{lo:g}, {hi:g}]"}
        return {"rule": "other", "note": f"trunc_normal_(mean={mean:g}, std={std:g}, a={lo:g}, b={hi:g})"}
    if name in _NAMED_INITS and not after:
        return {"rule": "other", "note": name}
    if name == "uniform_" and after[:4] == ["erfinv_", "mul_", "add_", "clamp_"]:
        # torch.nn.init.trunc_normal_: uniform, erfinv, scale by std*sqrt(2), shift by mean, clamp.
        scale = events[last + 2][1].get("other")
        shift = events[last + 3][1].get("other")
        note = "trunc_normal"
        if scale is not None and shift is not None:
            note += f"(mean={_num(shift):g}, std={_num(scale) / math.sqrt(2):g})"
        return {"rule": "other", "note": note}
    if after:
        return {"rule": "other", "note": f"aten::{name} then " + ", ".join(f"aten::{n}" for n in after)}
    if name == "normal_":
        return {"rule": "normal", "mean": _num(params.get("mean", 0.0)), "std": _num(params.get("std", 1.0))}
    if name == "uniform_":
        return {"rule": "uniform", "lo": _num(params.get("from", 0.0)), "hi": _num(params.get("to", 1.0))}
    if name == "zero_":
        return {"rule": "zeros"}
    if name == "fill_":
        if "value" in params:
            return _constant(params["value"])
        return {"rule": "other", "note": "filled from a tensor"}
    if name == "copy_":
        return {"rule": "other", "note": "copied from a tensor computed at build"}
    return {"rule": "other", "note": f"aten::{name}"}


def _constant(v) -> dict:
    if v == 1:
        return {"rule": "ones"}
    if v == 0:
        return {"rule": "zeros"}
    return {"rule": "other", "note": f"constant {v:g}"}
