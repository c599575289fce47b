"""The dispatch mode that records the program: every ATen call in order.

Each call becomes one `call` record: the op, every schema argument (tensors
by value id and spec, scalars as literals), its outputs' value ids, the
module whose forward was running and the phase. Tensors that no recorded
call produced (parameters, buffers, inputs, cache entries, constants) get a
`value` record just before the first call that uses them.
"""

from __future__ import annotations

import torch
from torch.utils._pytree import tree_flatten
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes
from torch.utils.weak import WeakIdKeyDictionary

from .encode import (Unsupported, domain_of, encode_scalar, is_tensor_list_type, is_tensor_type, is_written,
                     json_double, normalized_arguments, op_names, tensor_spec)


# Bookkeeping, not computation: record_function ranges (Optimizer.step).
_UNRECORDED_NAMESPACES = {"profiler"}
# Calls whose outputs hold whatever the allocator left in the memory.
_UNINITIALISED_FACTORIES = {"aten::empty", "aten::empty_like", "aten::empty_strided", "aten::new_empty",
                            "aten::new_empty_strided", "aten::empty_permuted"}


def _version_of(t: torch.Tensor):
    """t's version counter; None for an inference tensor, which has none."""
    try:
        return t._version
    except RuntimeError:
        return None


class ValueTable:
    """Value ids for tensors, by tensor object identity.

    The table holds tensors weakly, so it never keeps one alive; ids come
    from a counter, so a dead tensor's id is never reused. Tensors the
    autograd engine saves and hands back in backward keep their Python
    object (PyTorch preserves it while the C++ tensor lives), so they keep
    their ids too.
    """

    def __init__(self, emit, shadows=None):
        self._emit = emit
        self._shadows = shadows
        self._ids = WeakIdKeyDictionary()
        self._leaves = WeakIdKeyDictionary()
        self._domains: dict[int, tuple[int, int, dict]] = {}
        # Inputs drawn from a known range (Inputs.leaf): id -> (version, domain).
        self._declared: dict[int, tuple[int, dict]] = {}
        # Tensors over memory nothing has written yet, with their version
        # then: an in-place write moves the version on.
        self._unwritten = WeakIdKeyDictionary()
        self.count = 0

    def mark_unwritten(self, t: torch.Tensor) -> None:
        try:
            self._unwritten[t] = t._version
        except RuntimeError:  # inference tensors have no version counter
            pass

    def is_unwritten(self, t: torch.Tensor) -> bool:
        version = self._unwritten.get(t)
        if version is None:
            return False
        try:
            return t._version == version
        except RuntimeError:
            return False

    def register_leaf(self, t: torch.Tensor, kind: str, name: str, init: dict | None = None,
                      domain: dict | None = None) -> None:
        """`domain`: an input's declared range (Inputs.leaf), recorded
        instead of the one its values give."""
        if t not in self._ids and t not in self._leaves:
            self._leaves[t] = (kind, name, init, domain)

    def _new_id(self, t: torch.Tensor) -> int:
        vid = self.count
        self.count += 1
        self._ids[t] = vid
        return vid

    def domain(self, t: torch.Tensor, vid: int):
        """The domain of t's current values, or None where they are unknown
        (including memory nothing wrote: its values are the allocator's
        leftovers, different from run to run)."""
        if t.dtype == torch.bool:
            return {"kind": "bool"}
        if self.is_unwritten(t):
            return None
        declared = self._declared.get(vid)
        if declared is not None and _version_of(t) == declared[0]:
            return declared[1]
        data = t
        if t.is_meta:
            data = self._shadows.get(t) if self._shadows is not None else None
            if data is None:
                return None
        elif t.device.type != "cpu":
            return None
        try:
            version = data._version
        except RuntimeError:  # inference tensors have no version counter
            return domain_of(data)
        # The version counter says whether the values changed since; the
        # tensor is remembered by id only, never kept alive.
        cached = self._domains.get(vid)
        if cached is not None and cached[0] == version and cached[1] == id(data):
            return cached[2]
        d = domain_of(data)
        self._domains[vid] = (version, id(data), d)
        return d

    def input(self, t: torch.Tensor, scalar=None) -> int:
        """The id of a tensor read by a call; emits its value record if new."""
        vid = self._ids.get(t)
        if vid is not None:
            return vid
        vid = self._new_id(t)
        kind, name, init, declared = self._leaves.pop(t, ("constant", "", None, None))
        record = {"type": "value", "id": vid, "kind": kind, "name": name}
        if scalar is not None:
            record["scalar"] = {k: v for k, v in encode_scalar("", scalar).items() if k != "name"}
        spec, why = tensor_spec(t)
        if spec is None:
            record["unsupported"] = why
        else:
            record["tensor"] = spec
        if kind in ("parameter", "buffer"):
            record["init"] = init or {"rule": "other", "note": "not seen at build"}
        elif declared is not None:
            # Until an in-place call changes it, the input's domain is the
            # range it was drawn from, in its value record and its calls.
            self._declared[vid] = (_version_of(t), declared)
            record["domain"] = declared
        else:
            d = self.domain(t, vid)
            if d is not None:
                record["domain"] = d
        self._emit(record)
        return vid

    def alias(self, new: torch.Tensor, existing: torch.Tensor) -> None:
        """Gives `new` the id of `existing` (a meta twin of a CPU tensor)."""
        vid = self._ids.get(existing)
        if vid is not None:
            self._ids[new] = vid

    def output(self, t: torch.Tensor) -> int:
        """The id of a tensor a call returned: its own if it already had one
        (in-place and out= calls return an argument), else a fresh one."""
        vid = self._ids.get(t)
        return vid if vid is not None else self._new_id(t)


class ModuleStack:
    """The innermost module whose forward is running, from forward hooks."""

    def __init__(self):
        self._stack: list[str] = []
        self._handles = []

    def attach(self, model: torch.nn.Module) -> None:
        for name, module in model.named_modules():
            self._handles.append(module.register_forward_pre_hook(self._push(name)))
            self._handles.append(module.register_forward_hook(self._pop, always_call=True))

    def detach(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()
        self._stack.clear()

    def _push(self, name):
        def hook(module, args):
            self._stack.append(name)

        return hook

    def _pop(self, module, args, output):
        if self._stack:
            self._stack.pop()

    @property
    def current(self) -> str:
        return self._stack[-1] if self._stack else ""


class AutogradModules:
    """Which module's forward made each autograd node, for backward calls.

    A call's outputs get their grad_fn only after the dispatch mode returns,
    so outputs are kept (until the next call) with the module that was
    running, and then every node reachable from their grad_fn that no
    earlier call claimed is tagged with that module. In backward the engine
    names the node it is running (torch._C._current_autograd_node).
    """

    def __init__(self):
        self._tags: dict = {}
        self._pending: list = []

    def add(self, tensors, module: str) -> None:
        if tensors:
            self._pending.append((tensors, module))

    def flush(self) -> None:
        pending, self._pending = self._pending, []
        for tensors, module in pending:
            stack = [t.grad_fn for t in tensors if t.grad_fn is not None]
            while stack:
                node = stack.pop()
                if node is None or node in self._tags:
                    continue
                self._tags[node] = module
                stack.extend(n for n, _ in node.next_functions)

    def current(self) -> str:
        node = torch._C._current_autograd_node()
        return self._tags.get(node, "") if node is not None else ""

    def clear(self) -> None:
        self._tags.clear()
        self._pending.clear()


class ProgramRecorder(TorchDispatchMode):
    """Runs every call with `run_call` and, while `recording`, emits it."""

    def __init__(self, run_call, values: ValueTable, modules: ModuleStack, emit, autograd: AutogradModules | None):
        super().__init__()
        self._run_call = run_call
        self._values = values
        self._modules = modules
        self._emit = emit
        self._autograd = autograd
        self.recording = False
        self.phase = "forward"
        self.calls = 0
        # While a composite recorded whole runs (record_whole): the names of
        # the calls it made, which are run but not recorded.
        self._inside: list[str] | None = None

    def set_phase(self, phase: str) -> None:
        if self._autograd is not None:
            self._autograd.flush()
        self.phase = phase

    def _module(self) -> str:
        if self.phase == "forward":
            return self._modules.current
        if self.phase == "backward" and self._autograd is not None:
            return self._autograd.current()
        return ""

    def _tensor_arg(self, t: torch.Tensor, with_domain: bool) -> dict:
        vid = self._values.input(t)
        spec, why = tensor_spec(t)
        if spec is None:
            raise Unsupported(why)
        item = {"value": vid, "tensor": spec}
        if with_domain:
            d = self._values.domain(t, vid)
            if d is not None:
                item["domain"] = d
        return item

    def _wrapped_number(self, v) -> dict:
        """A Python number passed for a Tensor argument. PyTorch hands
        wrapped-number tensors to dispatch modes as plain numbers; libtorch's
        observers see a 0-dim CPU tensor (f64, i64, b8 or c128), and so does
        the C++ side, so it is described as one: a fresh constant value."""
        if isinstance(v, complex):
            raise Unsupported("complex number for a Tensor argument")
        dtype = torch.bool if isinstance(v, bool) else torch.int64 if isinstance(v, int) else torch.float64
        t = torch.tensor(v, dtype=dtype, device="cpu")
        vid = self._values.input(t, scalar=v)
        spec, why = tensor_spec(t)
        if spec is None:
            raise Unsupported(why)
        # Replayed as itself (a constant domain), not drawn like a tensor's values.
        return {"value": vid, "tensor": spec, "domain": {"kind": "constant", "value": json_double(float(v))}}

    def _describe_args(self, func, args, kwargs):
        """(args list, None) or (None, reason); registers every input tensor."""
        described, unsupported = [], None
        for schema_arg, v in normalized_arguments(func, args, kwargs):
            # Tensors written by out= variants need no domain: their values are overwritten.
            with_domain = not (is_written(schema_arg) and schema_arg.kwarg_only)
            try:
                if isinstance(v, torch.Tensor):
                    described.append({"name": schema_arg.name, "kind": "tensor", **self._tensor_arg(v, with_domain)})
                elif isinstance(v, (bool, int, float, complex)) and is_tensor_type(schema_arg.type):
                    described.append({"name": schema_arg.name, "kind": "tensor", **self._wrapped_number(v)})
                elif isinstance(v, (list, tuple)) and (is_tensor_list_type(schema_arg.type)
                                                       or any(isinstance(e, torch.Tensor) for e in v)):
                    items = [None if e is None else self._tensor_arg(e, with_domain) for e in v]
                    described.append({"name": schema_arg.name, "kind": "tensor_list", "items": items})
                else:
                    described.append(encode_scalar(schema_arg.name, v, schema_arg.type))
            except Unsupported as e:
                unsupported = unsupported or f"{schema_arg.name}: {e}"
                # Keep registering the remaining tensors so ids stay complete.
                for t in tree_flatten(v)[0]:
                    if isinstance(t, torch.Tensor):
                        self._values.input(t)
        return (None, unsupported) if unsupported else (described, None)

    def _describe_outputs(self, out):
        outputs, tensors = [], []
        for x in tree_flatten(out)[0]:
            if isinstance(x, torch.Tensor):
                vid = self._values.output(x)
                spec, why = tensor_spec(x)
                outputs.append({"value": vid, "tensor": spec} if spec is not None else {"value": vid, "unsupported": why})
                tensors.append(x)
            else:
                try:
                    outputs.append({k: v for k, v in encode_scalar("", x).items() if k != "name"})
                except Unsupported as e:
                    outputs.append({"kind": "none", "unsupported": str(e)})
        return outputs, tensors

    def _track_unwritten(self, op, args, kwargs, outputs) -> None:
        """Marks outputs over unwritten memory: those of empty* factories and
        views (detach, view, slices) of still-unwritten inputs."""
        if not outputs:
            return
        if op in _UNINITIALISED_FACTORIES:
            for t in outputs:
                self._values.mark_unwritten(t)
            return
        sources = [t for t in tree_flatten((args, kwargs))[0]
                   if isinstance(t, torch.Tensor) and self._values.is_unwritten(t)]
        for t in outputs:
            if any(torch._C._is_alias_of(t, s) for s in sources):
                self._values.mark_unwritten(t)

    def record_whole(self, op, args, kwargs, run):
        """Records one call of `op` (args and kwargs bound to its schema)
        whose outputs are what `run()` returns. The calls `run` makes are the
        trace device's decomposition of it: they run, unrecorded, and their
        names become the call's `decomposition` (composites.py)."""
        if not self.recording or self._inside is not None:
            return run()
        if self._autograd is not None and self.phase == "forward":
            self._autograd.flush()
        module = self._module()
        # Describing reads values (domains); this runs outside the dispatch
        # mode's handler, so the modes are set aside for it.
        with _disable_current_modes():
            described, unsupported = self._describe_args(op, args, kwargs)
        self._inside = []
        try:
            out = run()
        finally:
            inside, self._inside = self._inside, None
        with _disable_current_modes():
            outputs, tensors = self._describe_outputs(out)
        # Each op once, in order of first use; detach is bookkeeping (autograd
        # wrappers detach), never a kernel a device computes.
        decomposition = [n for n in dict.fromkeys(inside) if n != "aten::detach"]
        self._emit_call(op, described, unsupported, outputs, tensors, module, decomposition=decomposition)
        return out

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if not self.recording or func.namespace in _UNRECORDED_NAMESPACES:
            return self._run_call(func, args, kwargs)
        if self._inside is not None:
            name, overload = op_names(func)
            self._inside.append(f"{name}.{overload}" if overload else name)
            return self._run_call(func, args, kwargs)
        if self._autograd is not None and self.phase == "forward":
            self._autograd.flush()
        module = self._module()
        described, unsupported = self._describe_args(func, args, kwargs)
        out = self._run_call(func, args, kwargs)
        outputs, tensors = self._describe_outputs(out)
        self._track_unwritten(op_names(func)[0], args, kwargs, tensors)
        self._emit_call(func, described, unsupported, outputs, tensors, module)
        return out

    def _emit_call(self, func, described, unsupported, outputs, tensors, module, **extra) -> None:
        """Emits one call record (index, op, args or why not, outputs, module,
        phase, then `extra`) and hands its outputs to the autograd tags."""
        op, overload = op_names(func)
        record = {"type": "call", "index": self.calls, "op": op, "overload": overload}
        if unsupported is not None:
            record["unsupported"] = unsupported
        else:
            record["args"] = described
        record.update(outputs=outputs, module=module, phase=self.phase, **extra)
        self._emit(record)
        self.calls += 1
        if self._autograd is not None and self.phase == "forward":
            self._autograd.add(tensors, module)
