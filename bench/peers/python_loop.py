"""The peer a backend team would write instead: a Python loop over torch.ops.

For each op case of a coverage registry, as OpInfo / BackendBench-style
tests do it: make the inputs the case describes (shape, strides, storage
offset, value domain) from a seeded generator, call the op on the CPU
reference and on the backend (the first call and WARM more, as coverage's
unit stage does), compare with torch.testing.assert_close's default
tolerances for the dtype, and on a miss compute an fp64 golden and both
errors against it. Prints one JSON object: cases, verdicts, wall seconds,
seconds in op calls (reference, backend, golden), in making inputs and in
comparing, and the per-case overhead (wall minus op calls, per case).

    .venv/bin/python bench/peers/python_loop.py --registry out/main.db [--op mm] [--limit N]

Backend: `cpu` (the CPU kernels again, as coverage's `cpu` backend). It
reads the registry with the sqlite3 module only; it never writes it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import sqlite3
import sys
import time

import torch

DTYPES = {"f32": torch.float32, "f64": torch.float64, "f16": torch.float16, "bf16": torch.bfloat16,
          "i8": torch.int8, "u8": torch.uint8, "i16": torch.int16, "i32": torch.int32, "i64": torch.int64,
          "b8": torch.bool, "c64": torch.complex64, "c128": torch.complex128}
# c10::ScalarType codes, as the case JSON holds dtype arguments.
SCALAR_TYPES = {0: torch.uint8, 1: torch.int8, 2: torch.int16, 3: torch.int32, 4: torch.int64, 5: torch.float16,
                6: torch.float32, 7: torch.float64, 9: torch.complex64, 10: torch.complex128, 11: torch.bool,
                15: torch.bfloat16}
LAYOUTS = {0: torch.strided}
MEMORY_FORMATS = {0: torch.contiguous_format, 1: torch.preserve_format, 2: torch.channels_last,
                  3: torch.channels_last_3d}


class Skip(Exception):
    pass


def resolve(op: str, overload: str):
    ns, name = op.split("::", 1)
    try:
        packet = getattr(getattr(torch.ops, ns), name)
        return getattr(packet, overload or "default")
    except (AttributeError, RuntimeError) as e:
        raise Skip(f"no operator {op}.{overload or 'default'}: {e}")


def number(v):
    if isinstance(v, str):
        return float(v)  # "inf", "-inf", "nan"
    return v


def make_tensor(spec: dict, gen: torch.Generator) -> torch.Tensor:
    dtype = DTYPES[spec["dtype"]]
    shape, strides, offset = spec["shape"], spec["strides"], spec.get("offset", 0)
    numel = math.prod(shape)
    extent = offset + (1 + sum((s - 1) * st for s, st in zip(shape, strides)) if numel else 0)
    domain = spec.get("domain", {"kind": "real"})
    kind = domain.get("kind", "real")
    n = max(extent, 1)
    if kind == "const":  # a recorded Python number, replayed as itself
        value = domain["value"]
        value = float(value) if isinstance(value, str) else value  # "inf", "-inf", "nan"
        base = torch.full((n,), value, dtype=torch.float64).to(dtype)
    elif dtype == torch.bool or kind == "bool":
        base = torch.randint(0, 2, (n,), generator=gen).to(torch.bool)
    elif not dtype.is_floating_point and not dtype.is_complex:
        lo, hi = (domain["lo"], domain["hi"]) if kind == "int" else (0, 2)
        base = torch.randint(lo, hi, (n,), generator=gen, dtype=torch.int64)
        base[0], base[-1] = lo, hi - 1  # both ends of the range, as the replay draws them
        base = base.to(dtype)
    else:
        lo, hi = {"nonneg": (0.0, 2.0), "positive": (0.5, 2.0), "unit": (0.002, 0.998)}.get(kind, (-1.0, 1.0))
        real = torch.rand((n,), generator=gen) * (hi - lo) + lo
        if kind == "mask":
            real = torch.where(torch.rand((n,), generator=gen) < 0.5, 0.0, float("-inf"))
        if dtype.is_complex:
            base = torch.complex(real, torch.rand((n,), generator=gen) * 2 - 1).to(dtype)
        else:
            base = real.to(dtype)
    return base.as_strided(shape, strides, offset)


def build_args(case: dict, schema, gen: torch.Generator):
    """(args, kwargs, written argument names) for the op's schema."""
    by_name = {a["name"]: a for a in case["args"]}
    args, kwargs, written = [], {}, []
    for sa in schema.arguments:
        a = by_name.get(sa.name)
        if a is None:
            if sa.has_default_value():
                continue
            raise Skip(f"argument {sa.name} missing")
        kind = a["type"]
        t = str(sa.type)
        if kind == "tensor":
            v = make_tensor(a["tensor"], gen)
        elif kind == "tensor[]":
            v = [None if s is None else make_tensor(s, gen) for s in a["items"]]
        elif kind == "none":
            v = None
        elif kind == "device":
            v = torch.device("cpu")
        elif kind == "int":
            v = a["value"]
            if "ScalarType" in t:
                v = SCALAR_TYPES.get(v)
            elif "Layout" in t:
                v = LAYOUTS.get(v)
            elif "MemoryFormat" in t:
                v = MEMORY_FORMATS.get(v)
        elif kind in ("float", "float[]"):
            v = [number(x) for x in a["value"]] if kind == "float[]" else number(a["value"])
        else:  # bool, str, int[], bool[]
            v = a["value"]
        if sa.alias_info is not None and sa.alias_info.is_write:
            written.append(sa.name)
        if sa.kwarg_only:
            kwargs[sa.name] = v
        else:
            args.append(v)
    return args, kwargs, written


def clone_written(args, kwargs, written, schema):
    """Fresh copies of the arguments the op writes, so each call sees the same inputs."""
    names = [sa.name for sa in schema.arguments if not sa.kwarg_only]
    args = [v.clone() if names[i] in written and isinstance(v, torch.Tensor) else v for i, v in enumerate(args)]
    kwargs = {k: (v.clone() if k in written and isinstance(v, torch.Tensor) else v) for k, v in kwargs.items()}
    return args, kwargs


def tensors_of(out):
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (list, tuple)):
        return [t for x in out for t in tensors_of(x)]
    return []


def to_double(v):
    if isinstance(v, torch.Tensor) and (v.is_floating_point() or v.is_complex()):
        return v.to(torch.complex128 if v.is_complex() else torch.float64)
    if isinstance(v, list):
        return [to_double(x) for x in v]
    return v


def run_case(case: dict, key: str, warm: int, t: dict) -> str:
    op = resolve(case["op"], case.get("overload", ""))
    schema = op._schema
    gen = torch.Generator().manual_seed(int(hashlib.sha256(key.encode()).hexdigest()[:15], 16))
    s = time.perf_counter()
    args, kwargs, written = build_args(case, schema, gen)
    t["inputs"] += time.perf_counter() - s

    def call(a, k):
        s0 = time.perf_counter()
        ref_a, ref_k = clone_written(a, k, written, schema)
        s1 = time.perf_counter()
        out = op(*ref_a, **ref_k)
        s2 = time.perf_counter()
        t["inputs"] += s1 - s0
        t["compute"] += s2 - s1
        return out

    try:
        ref = call(args, kwargs)
    except Exception as e:  # noqa: BLE001 - the reference cannot run this case
        raise Skip(f"the CPU reference cannot run this case: {str(e).splitlines()[0][:200]}")
    # The backend: its own copy of the inputs (cpu here), the first call and `warm` more.
    s = time.perf_counter()
    dev_args = [v.clone() if isinstance(v, torch.Tensor) else v for v in args]
    dev_kwargs = {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in kwargs.items()}
    t["inputs"] += time.perf_counter() - s
    try:
        out = call(dev_args, dev_kwargs)
        for _ in range(warm):
            call(dev_args, dev_kwargs)
    except Exception:  # noqa: BLE001
        return "error"
    s = time.perf_counter()
    verdict = "pass"
    for r, o in zip(tensors_of(ref), tensors_of(out)):
        try:
            torch.testing.assert_close(o, r, equal_nan=True)
        except AssertionError:
            verdict = "mismatch"
    t["compare"] += time.perf_counter() - s
    if verdict == "mismatch" and all(x.is_floating_point() for x in tensors_of(ref)):
        # fp64 golden: is the backend further from it than the reference?
        g_args, g_kwargs = to_double(args), {k: to_double(v) for k, v in kwargs.items()}
        try:
            golden = call(g_args, g_kwargs)
        except Exception:  # noqa: BLE001
            return verdict
        s = time.perf_counter()
        for r, o, g in zip(tensors_of(ref), tensors_of(out), tensors_of(golden)):
            ref_err = (r.double() - g).abs().max().item() if r.numel() else 0.0
            dev_err = (o.double() - g).abs().max().item() if o.numel() else 0.0
            if dev_err <= 2 * ref_err + 1e-12:
                verdict = "pass"
        t["compare"] += time.perf_counter() - s
    return verdict


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python bench/peers/python_loop.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--registry", required=True)
    p.add_argument("--op", action="append", default=[], help="only this op (aten::mm or mm; repeatable)")
    p.add_argument("--source", choices=["captured", "opinfo"], help="only cases of this source")
    p.add_argument("--warm", type=int, default=3, help="backend calls after the first (default 3, as coverage)")
    p.add_argument("--limit", type=int, default=0)
    p.add_argument("--threads", type=int, default=1, help="ATen threads (default 1)")
    args = p.parse_args(argv)
    if args.warm < 0 or args.limit < 0 or not 1 <= args.threads <= 4096:
        p.error("--warm and --limit must be >= 0, --threads in [1, 4096]")
    torch.set_num_threads(args.threads)
    db = sqlite3.connect(f"file:{args.registry}?mode=ro", uri=True)
    sql = "SELECT key, case_json FROM op_cases c WHERE 1"
    params = []
    if args.op:
        ops = [o if "::" in o else "aten::" + o for o in args.op]
        sql += f" AND c.op IN ({','.join('?' * len(ops))})"
        params += ops
    if args.source == "captured":
        sql += " AND EXISTS (SELECT 1 FROM case_sources s WHERE s.case_id = c.case_id)"
    elif args.source == "opinfo":
        sql += " AND EXISTS (SELECT 1 FROM opinfo_samples o WHERE o.case_id = c.case_id)"
    sql += " ORDER BY c.op, c.overload, c.flops DESC, c.key"
    if args.limit:
        sql += f" LIMIT {args.limit}"
    rows = db.execute(sql, params).fetchall()

    # assert_close's first call imports and sets up what it needs (0.8 s):
    # paid before the clock starts, as coverage's process start is.
    torch.testing.assert_close(torch.zeros(1), torch.zeros(1))
    t = {"inputs": 0.0, "compute": 0.0, "compare": 0.0}
    verdicts: dict[str, int] = {}
    start = time.perf_counter()
    for key, text in rows:
        try:
            v = run_case(json.loads(text), key, args.warm, t)
        except Skip:
            v = "skipped"
        verdicts[v] = verdicts.get(v, 0) + 1
    wall = time.perf_counter() - start
    n = len(rows)
    print(json.dumps({
        "peer": "python loop", "torch": torch.__version__, "threads": args.threads, "warm": args.warm,
        "cases": n, "verdicts": verdicts, "wall_s": round(wall, 3), "op_compute_s": round(t["compute"], 3),
        "op_compute_share": round(t["compute"] / wall, 4) if wall else 0.0,
        "inputs_s": round(t["inputs"], 3), "compare_s": round(t["compare"], 3),
        "overhead_ms_per_case": round((wall - t["compute"]) / n * 1e3, 3) if n else 0.0,
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
