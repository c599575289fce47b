"""`python -m coverage_tracer opinfo`: OpInfo samples as small traces."""

import pytest
import torch

from coverage_tracer.opinfo import full_name, run, select_opinfos

op_db = pytest.importorskip("torch.testing._internal.common_methods_invocations").op_db


def records_of(names, dtypes=(torch.float32,), done=()):
    out = []
    run(select_opinfos(op_db, names), list(dtypes), 0, set(done), out.append)
    return out


def test_names_select_every_variant_or_one():
    assert [full_name(o) for o in select_opinfos(op_db, ["softmax"])] == ["softmax", "softmax.with_dtype"]
    assert [full_name(o) for o in select_opinfos(op_db, ["softmax.with_dtype", "mm"])] == ["mm", "softmax.with_dtype"]
    with pytest.raises(KeyError):
        select_opinfos(op_db, ["softmax.no_such_variant"])


def test_each_sample_is_a_complete_trace_with_its_header():
    records = records_of(["mm"])
    starts = [r for r in records if r["type"] == "start"]
    assert [s["opinfo"]["sample"] for s in starts] == list(range(len(starts))) and len(starts) >= 3
    assert all(s["opinfo"]["name"] == "mm" and s["opinfo"]["dtype"] == "f32" for s in starts)
    assert records[-1] == {"type": "opinfo_done", "name": "mm", "variant": "", "dtype": "f32",
                           "samples": len(starts), "failed": 0}
    ends = [r for r in records if r["type"] == "end"]
    assert len(ends) == len(starts)
    shapes = [c["args"][0]["tensor"]["shape"] for c in records if c["type"] == "call" and c["op"] == "aten::mm"]
    assert [0, 5] in shapes  # an empty matrix among OpInfo's edge cases


def test_kwarg_only_arguments_and_non_contiguous_inputs_are_recorded():
    with_dtype = records_of(["softmax.with_dtype"])
    to_copy = [c for c in with_dtype if c["type"] == "call" and c["op"] == "aten::_to_copy"]
    assert to_copy and all({"name": "dtype", "kind": "int", "i": 7} in c["args"] for c in to_copy)  # f64
    ravel = records_of(["ravel"])
    strides = [a["tensor"]["strides"] for c in ravel if c["type"] == "call" for a in c["args"] if a.get("tensor")]
    assert [50, 10, 2] in strides


def test_samples_are_deterministic():
    def stable(records):  # the end records' timing and memory vary
        return [{k: v for k, v in r.items() if k not in ("seconds", "peak_rss_mb")} for r in records]

    first = records_of(["softmax", "mm"])
    assert stable(first) == stable(records_of(["softmax", "mm"]))
    assert sum(r["type"] == "call" for r in first) >= 20


def test_unsupported_dtypes_are_skipped_with_the_reason_and_done_pairs_are_not_run():
    records = records_of(["bitwise_and", "mm"], done=[("mm", "", "f32")])
    assert records == [
        {"type": "opinfo_skip", "name": "bitwise_and", "variant": "", "dtype": "f32",
         "reason": "bitwise_and does not support f32 on CPU"},
        {"type": "opinfo_before", "name": "mm", "variant": "", "dtype": "f32"},
    ]
