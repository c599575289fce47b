"""python -m coverage_tracer opinfo: the ATen calls of PyTorch's OpInfo samples.

PyTorch tests its operators on the samples of its OpInfo database
(torch.testing._internal.common_methods_invocations.op_db): for each
operator, inputs chosen to reach its edge cases (empty and zero-size
tensors, scalars, broadcasting, non-contiguous and offset views, reduction
over every dim, keyword-only options). This module runs each sample of the
venv's torch on CPU under the program recorder and writes what it executed,
one small trace per sample, in the tracer's record format (README.md,
"Records"), so `coverage import opinfo` reads them with the same reader as a
model's program and stores their calls as op cases.

Per sample: a `start` record whose `opinfo` member names it ({"name",
"variant", "sample", "sample_name", "dtype"}), then `value` and `call`
records and an `end` record, or `start` and an `error` record when the
sample raises. After the samples of one (OpInfo, dtype), an `opinfo_done`
record {"name", "variant", "dtype", "samples", "failed"}; an OpInfo that has
no samples for a dtype (it does not support it, or making them raised) gets
an `opinfo_skip` record {"name", "variant", "dtype", "reason"} instead, and
one named in --done an `opinfo_before` record {"name", "variant", "dtype"}.

Samples are deterministic: the generator is seeded with --seed before each
(OpInfo, dtype) makes its samples. Values enter the records only as value
domains (encode.py), so an extreme value a sample holds (inf, a large
number) is replayed as a value of its domain, not as itself.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time

EXIT_USAGE = 2


def _parser():
    p = argparse.ArgumentParser(
        prog="python -m coverage_tracer opinfo", allow_abbrev=False,
        description="Record the ATen calls of PyTorch's OpInfo samples (CPU) as JSON lines.")
    p.add_argument("--dtype", action="append", default=None,
                   help="sample dtype: f32, f64, f16, bf16, i64, i32, i16, i8, u8, b8 (repeatable; default f32)")
    p.add_argument("--opinfo", action="append", default=[],
                   help="only this OpInfo: NAME (every variant) or NAME.VARIANT (repeatable; default all)")
    p.add_argument("--seed", type=int, default=0, help="seed of the samples' values (default 0)")
    p.add_argument("--done", default=None,
                   help="a file ('-': stdin) holding a JSON array of [name, variant, dtype] already imported: "
                        "they are not run (an opinfo_before record each)")
    p.add_argument("--list", action="store_true", help="print the OpInfo names (NAME or NAME.VARIANT) and exit")
    return p


def full_name(op) -> str:
    return f"{op.name}.{op.variant_test_name}" if op.variant_test_name else op.name


def select_opinfos(op_db, wanted):
    """The OpInfos named in `wanted` (NAME: every variant; NAME.VARIANT: one),
    in (name, variant) order; all of them when `wanted` is empty. Raises
    KeyError naming a name that matches none."""
    ops = sorted(op_db, key=lambda o: (o.name, o.variant_test_name))
    if not wanted:
        return ops
    chosen, seen = [], set()
    for w in wanted:
        hits = [o for o in ops if full_name(o) == w or o.name == w]
        if not hits:
            raise KeyError(w)
        for o in hits:
            if id(o) not in seen:
                seen.add(id(o))
                chosen.append(o)
    return sorted(chosen, key=lambda o: (o.name, o.variant_test_name))


def trace_sample(op, sample, header: dict) -> list[dict]:
    """The records of one sample: start, values and calls, end; or start and
    an error record when the call raises (what it ran before is dropped)."""
    import torch

    from . import TRACER_VERSION
    from .recorder import ModuleStack, ProgramRecorder, ValueTable
    from .trace import error_record

    t0 = time.time()
    start = {"type": "start", "tracer_version": TRACER_VERSION, "model": f"opinfo/{header['name']}",
             "profile": header["dtype"], "class": "OpInfo", "model_type": "", "kind": "opinfo",
             "torch": torch.__version__, "device": "cpu", "layers": {}, "attn_implementation": None,
             "dtype": header["dtype"], "opinfo": header}
    records = []
    values = ValueTable(records.append)
    recorder = ProgramRecorder(lambda f, a, k: f(*a, **k), values, ModuleStack(), records.append, None)
    try:
        with recorder:
            recorder.recording = True
            op.op(sample.input, *sample.args, **sample.kwargs)
            recorder.recording = False
    except Exception as e:  # noqa: BLE001 - the sample's own failure is the reason
        return [start, error_record("run", e)]
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    records.append({"type": "end", "calls": recorder.calls, "values": values.count,
                    "seconds": round(time.time() - t0, 4), "peak_rss_mb": round(peak, 1)})
    return [start] + records


def run(opinfos, dtypes, seed: int, done: set, write) -> None:
    """Writes the records of every sample of `opinfos` for each of `dtypes`
    (torch dtypes) through `write(record)`."""
    import torch

    from .encode import dtype_name
    from .trace import one_line

    for op in opinfos:
        variant = op.variant_test_name or ""
        for dtype in dtypes:
            dname = dtype_name(dtype)
            base = {"name": op.name, "variant": variant, "dtype": dname}
            if (op.name, variant, dname) in done:
                write({"type": "opinfo_before", **base})
                continue
            if dtype not in op.supported_dtypes("cpu"):
                write({"type": "opinfo_skip", **base, "reason": f"{full_name(op)} does not support {dname} on CPU"})
                continue
            torch.manual_seed(seed)
            try:
                samples = list(op.sample_inputs("cpu", dtype))
            except Exception as e:  # noqa: BLE001
                write({"type": "opinfo_skip", **base,
                       "reason": one_line(f"making its samples raised {type(e).__name__}: {e}")})
                continue
            failed = 0
            for i, sample in enumerate(samples):
                header = {**base, "sample": i, "sample_name": str(getattr(sample, "name", "") or "")}
                records = trace_sample(op, sample, header)
                failed += records[-1]["type"] == "error"
                for r in records:
                    write(r)
            write({"type": "opinfo_done", **base, "samples": len(samples), "failed": failed})


def main(argv) -> int:
    parser = _parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:
        return int(e.code) if isinstance(e.code, int) else EXIT_USAGE

    # Only records may reach stdout: whatever torch or a sample prints goes to stderr.
    sys.stdout.flush()
    records_fd = os.dup(1)
    os.dup2(2, 1)
    out = os.fdopen(records_fd, "w", buffering=1 << 16)
    sys.stdout = sys.stderr

    import warnings

    warnings.simplefilter("ignore")  # the samples' deprecation notices are not records
    import torch

    from .encode import DTYPE_NAMES

    by_name = {v: k for k, v in DTYPE_NAMES.items()}
    dtypes = []
    for d in args.dtype or ["f32"]:
        if d not in by_name or by_name[d].is_complex:
            print(f"python -m coverage_tracer opinfo: error: --dtype: unknown dtype {d!r} "
                  f"(known: {', '.join(n for n, t in sorted(by_name.items()) if not t.is_complex)})", file=sys.stderr)
            return EXIT_USAGE
        if by_name[d] not in dtypes:
            dtypes.append(by_name[d])
    done = set()
    if args.done:
        try:
            text = sys.stdin.read() if args.done == "-" else open(args.done).read()
            done = {tuple(x) for x in json.loads(text)}
        except (OSError, ValueError, TypeError) as e:
            print(f"python -m coverage_tracer opinfo: error: --done: {e}", file=sys.stderr)
            return EXIT_USAGE
    try:
        from torch.testing._internal.common_methods_invocations import op_db
    except ImportError as e:
        print(f"python -m coverage_tracer opinfo: error: cannot import PyTorch's OpInfo database "
              f"(torch {torch.__version__}): {e}", file=sys.stderr)
        return 1
    try:
        opinfos = select_opinfos(op_db, args.opinfo)
    except KeyError as e:
        print(f"python -m coverage_tracer opinfo: error: --opinfo: no OpInfo is named {e.args[0]!r} "
              f"(--list prints the names)", file=sys.stderr)
        return EXIT_USAGE
    if args.list:
        for op in opinfos:
            out.write(full_name(op) + "\n")
        out.flush()
        return 0

    def write(record):
        out.write(json.dumps(record, separators=(",", ":"), allow_nan=False))
        out.write("\n")

    run(opinfos, dtypes, args.seed, done, write)
    out.flush()
    return 0
