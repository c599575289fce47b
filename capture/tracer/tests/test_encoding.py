"""The record encodings the C++ side relies on: domains, enums, arguments."""

import math

import torch

from coverage_tracer.encode import domain_of, encode_scalar, integer_high, integer_low, tensor_spec


def test_integer_domains_are_coarsened_like_the_cpp_observer():
    assert integer_low(0) == 0 and integer_low(5) == 1 and integer_low(-3) == -2 and integer_low(-4) == -4
    assert integer_high(127, 0) == 128 and integer_high(126, 0) == 64 and integer_high(0, 0) == 1
    ids = torch.tensor([[0, 3, 31999]])
    assert domain_of(ids) == {"kind": "integer", "lo": 0, "hi": 16384}
    assert domain_of(torch.ones(4, dtype=torch.long)) == {"kind": "integer", "lo": 1, "hi": 2}


def test_float_domains():
    assert domain_of(torch.tensor([0.0, float("-inf"), 0.0])) == {"kind": "mask"}
    assert domain_of(torch.tensor([0.0, torch.finfo(torch.float32).min])) == {"kind": "mask"}
    assert domain_of(torch.tensor([-1e38, 0.5])) == {"kind": "real"}
    assert domain_of(torch.tensor([0.5, 2.0])) == {"kind": "positive"}
    assert domain_of(torch.tensor([0.0, 1.0])) == {"kind": "unit"}
    assert domain_of(torch.tensor([0.25, 0.75])) == {"kind": "unit"}  # probabilities stay below 1
    assert domain_of(torch.tensor([0.0, 3.0])) == {"kind": "non_negative"}
    assert domain_of(torch.tensor([-1.0, 3.0])) == {"kind": "real"}
    assert domain_of(torch.tensor([1.0, float("nan")])) == {"kind": "real"}
    assert domain_of(torch.tensor([True, False])) == {"kind": "bool"}
    assert domain_of(torch.empty(2, device="meta")) == {"kind": "real"}


def test_scalar_and_enum_arguments():
    assert encode_scalar("dtype", torch.bfloat16) == {"name": "dtype", "kind": "int", "i": 15}
    assert encode_scalar("dtype", torch.bool)["i"] == 11
    assert encode_scalar("layout", torch.strided)["i"] == 0
    assert encode_scalar("memory_format", torch.channels_last)["i"] == 2
    assert encode_scalar("d", math.inf)["d"] == "inf" and encode_scalar("d", -math.inf)["d"] == "-inf"
    assert encode_scalar("d", math.nan)["d"] == "nan"
    assert encode_scalar("b", True) == {"name": "b", "kind": "bool", "b": True}
    assert encode_scalar("dev", torch.device("cpu")) == {"name": "dev", "kind": "device"}
    size = torch.ops.aten.view.default._schema.arguments[1].type
    assert encode_scalar("size", [], size) == {"name": "size", "kind": "int_list", "ints": []}


def test_tensor_spec_and_unsupported_dtypes():
    t = torch.empty(4, 6)[:, 1:3]
    spec, why = tensor_spec(t)
    assert why is None and spec == {"dtype": "f32", "shape": [4, 2], "strides": [6, 1], "storage_offset": 1}
    spec, why = tensor_spec(torch.empty(2, dtype=torch.float8_e4m3fn))
    assert spec is None and "float8" in why
