"""How tensors, arguments and value domains are written in the JSON records.

Everything here mirrors the C++ side: dtype names are core/op_case.h's
DTypeName, enum integers are c10's, and the domains are what
core/op_case.h's ValueDomain holds and replay/materialize.cc draws from, so
the C++ side reads every case back with the key the tracer gave it.
"""

from __future__ import annotations

import math

import torch

DTYPE_NAMES = {
    torch.float32: "f32",
    torch.float64: "f64",
    torch.float16: "f16",
    torch.bfloat16: "bf16",
    torch.int8: "i8",
    torch.uint8: "u8",
    torch.int16: "i16",
    torch.int32: "i32",
    torch.int64: "i64",
    torch.bool: "b8",
    torch.complex64: "c64",
    torch.complex128: "c128",
}

# c10::ScalarType values (torch/headeronly/core/ScalarType.h). dtype
# arguments reach libtorch's observers as these integers.
SCALAR_TYPE_CODES = {
    torch.uint8: 0,
    torch.int8: 1,
    torch.int16: 2,
    torch.int32: 3,
    torch.int64: 4,
    torch.float16: 5,
    torch.float32: 6,
    torch.float64: 7,
    torch.complex32: 8,
    torch.complex64: 9,
    torch.complex128: 10,
    torch.bool: 11,
    torch.qint8: 12,
    torch.quint8: 13,
    torch.qint32: 14,
    torch.bfloat16: 15,
    torch.quint4x2: 16,
    torch.quint2x4: 17,
    torch.float8_e5m2: 23,
    torch.float8_e4m3fn: 24,
    torch.float8_e5m2fnuz: 25,
    torch.float8_e4m3fnuz: 26,
    torch.uint16: 27,
    torch.uint32: 28,
    torch.uint64: 29,
}

LAYOUT_CODES = {
    torch.strided: 0,
    torch.sparse_coo: 1,
    torch.sparse_csr: 2,
    torch._mkldnn: 3,  # type: ignore[attr-defined]
    torch.sparse_csc: 4,
    torch.sparse_bsr: 5,
    torch.sparse_bsc: 6,
    torch.jagged: 7,
}

MEMORY_FORMAT_CODES = {
    torch.contiguous_format: 0,
    torch.preserve_format: 1,
    torch.channels_last: 2,
    torch.channels_last_3d: 3,
}

INT64_MIN = -(1 << 63)
INT64_MAX = (1 << 63) - 1


def dtype_name(dtype: torch.dtype) -> str | None:
    return DTYPE_NAMES.get(dtype)


def json_double(d: float):
    """JSON has no inf/nan literals; the C++ parser reads these strings."""
    if math.isnan(d):
        return "nan"
    if math.isinf(d):
        return "inf" if d > 0 else "-inf"
    return float(d)


def tensor_spec(t: torch.Tensor):
    """Returns (spec, None) or (None, reason) when the C++ side cannot hold it."""
    if t.layout != torch.strided:
        return None, f"non-strided tensor layout {t.layout}"
    if t.is_quantized:
        return None, "quantized tensor"
    name = DTYPE_NAMES.get(t.dtype)
    if name is None:
        return None, f"unsupported dtype {t.dtype}"
    if t.is_nested:
        return None, "nested tensor"
    return {
        "dtype": name,
        "shape": list(t.shape),
        "strides": list(t.stride()),
        "storage_offset": t.storage_offset(),
    }, None


def _floor_pow2(v: int) -> int:
    return 0 if v <= 0 else 1 << (v.bit_length() - 1)


def integer_low(mn: int) -> int:
    """Coarsened inclusive lower bound of an integer domain."""
    if mn >= 0:
        return 0 if mn == 0 else 1
    if mn == INT64_MIN:
        return mn
    return -_floor_pow2(-mn)


def integer_high(mx: int, lo: int) -> int:
    """Coarsened exclusive upper bound of an integer domain."""
    if mx == INT64_MAX:
        hi = mx
    elif mx + 1 > 0:
        hi = _floor_pow2(mx + 1)
    else:
        hi = mx + 1
    return hi if hi > lo else lo + 1


def domain_of(t: torch.Tensor) -> dict:
    """The value domain of a tensor holding real data (DomainOf in capture.cc).

    Must run with no dispatch mode recording it: it calls min/max itself.
    """
    if t.dtype == torch.bool:
        return {"kind": "bool"}
    if t.numel() == 0 or t.is_meta or t.device.type != "cpu" or t.is_complex():
        return {"kind": "real"}
    with torch.no_grad():
        if not t.is_floating_point():
            mn = int(t.min().item())
            mx = int(t.max().item())
            lo = integer_low(mn)
            return {"kind": "integer", "lo": lo, "hi": integer_high(mx, lo)}
        f = t.to(torch.float32)
        mn = float(f.min().item())
        mx = float(f.max().item())
        if math.isnan(mn) or math.isnan(mx):
            return {"kind": "real"}
        if mn <= -1e30:
            # Additive masks hold 0 and -inf (or the dtype's lowest value).
            stray = bool(torch.logical_and(f.gt(-1e30), f.ne(0)).any().item())
            if not stray and mx <= 0:
                return {"kind": "mask"}
            return {"kind": "real"}
        if not math.isfinite(mx):
            return {"kind": "real"}
        # Unit before positive: probabilities (softmax outputs, Bernoulli
        # parameters, binary cross-entropy's input) are inside (0, 1) and
        # must stay there; the unit domain's replay is also positive.
        if mn >= 0 and mx <= 1:
            return {"kind": "unit"}
        if mn > 0:
            return {"kind": "positive"}
        if mn >= 0:
            return {"kind": "non_negative"}
        return {"kind": "real"}


class Unsupported(Exception):
    """An argument the C++ Argument cannot represent; the message says why."""


def _list_element_kind(schema_type) -> str:
    """'tensor', 'int', 'float', 'bool' or '' for a schema list's elements."""
    elem = schema_type
    if elem.kind() == "OptionalType":
        elem = elem.getElementType()
    if elem.kind() != "ListType":
        return ""
    elem = elem.getElementType()
    if elem.kind() == "OptionalType":
        elem = elem.getElementType()
    return {
        "TensorType": "tensor",
        "IntType": "int",
        "SymIntType": "int",
        "FloatType": "float",
        "BoolType": "bool",
    }.get(elem.kind(), "")


def encode_scalar(name: str, v, schema_type=None) -> dict:
    """Encodes a non-tensor argument value as an Argument JSON object.

    Raises Unsupported for values the C++ Argument has no kind for.
    """
    arg = {"name": name}
    if v is None:
        arg["kind"] = "none"
    elif isinstance(v, bool):
        arg.update(kind="bool", b=v)
    elif isinstance(v, int):
        arg.update(kind="int", i=v)
    elif isinstance(v, float):
        arg.update(kind="double", d=json_double(v))
    elif isinstance(v, str):
        arg.update(kind="string", s=v)
    elif isinstance(v, torch.dtype):
        if v not in SCALAR_TYPE_CODES:
            raise Unsupported(f"dtype argument {v}")
        arg.update(kind="int", i=SCALAR_TYPE_CODES[v])
    elif isinstance(v, torch.layout):
        if v not in LAYOUT_CODES:
            raise Unsupported(f"layout argument {v}")
        arg.update(kind="int", i=LAYOUT_CODES[v])
    elif isinstance(v, torch.memory_format):
        if v not in MEMORY_FORMAT_CODES:
            raise Unsupported(f"memory format argument {v}")
        arg.update(kind="int", i=MEMORY_FORMAT_CODES[v])
    elif isinstance(v, torch.device):
        arg["kind"] = "device"
    elif isinstance(v, (list, tuple)):
        elem = _list_element_kind(schema_type) if schema_type is not None else ""
        if not elem:
            if all(isinstance(e, bool) for e in v) and v:
                elem = "bool"
            elif all(isinstance(e, int) and not isinstance(e, bool) for e in v):
                elem = "int"
            elif all(isinstance(e, (int, float)) and not isinstance(e, bool) for e in v):
                elem = "float"
            else:
                raise Unsupported(f"list argument of {type(v[0]).__name__}")
        if elem == "int":
            arg.update(kind="int_list", ints=[int(e) for e in v])
        elif elem == "float":
            arg.update(kind="double_list", doubles=[json_double(float(e)) for e in v])
        elif elem == "bool":
            arg.update(kind="bool_list", bools=[bool(e) for e in v])
        else:
            raise Unsupported(f"list argument of {elem}")
    else:
        raise Unsupported(f"argument of type {type(v).__name__}")
    return arg


def is_tensor_type(schema_type) -> bool:
    """Tensor or Tensor? (not a list)."""
    t = schema_type.getElementType() if schema_type.kind() == "OptionalType" else schema_type
    return t.kind() == "TensorType"


def is_tensor_list_type(schema_type) -> bool:
    return _list_element_kind(schema_type) == "tensor"


def normalized_arguments(func, args, kwargs):
    """Yields (schema argument, value) for every schema argument in order,
    with the schema's default for those the caller did not pass."""
    positional = 0
    for a in func._schema.arguments:
        if not a.kwarg_only and positional < len(args):
            v = args[positional]
            positional += 1
        elif a.name in kwargs:
            v = kwargs[a.name]
        elif a.has_default_value():
            v = a.default_value
        else:
            v = None
        yield a, v


def is_written(schema_arg) -> bool:
    info = schema_arg.alias_info
    return info is not None and info.is_write


def op_names(func) -> tuple[str, str]:
    """('aten::add', 'Tensor') for torch.ops.aten.add.Tensor; '' for default."""
    schema = func._schema
    return schema.name, schema.overload_name
