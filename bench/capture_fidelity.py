#!/usr/bin/env python3
"""Fidelity of the C++ model builder's capture against the capture tracer.

Reads two registries made from the same configs (bench_capture_scale with
--engine tracer and --engine builder) and compares, per (model, profile)
that both captured, the op cases each recorded: the share of the tracer's
cases (what transformers really dispatches) that the builder also produced,
and the ops only one side has. Cases are compared by op, overload and every
argument with tensors as dtype, shape, strides and offset; value domains are
left out, since a meta trace knows none for weight-derived tensors while the
builder's CPU runs do. The exact-key share (domains included) is printed too.

    python3 bench/capture_fidelity.py TRACER.db BUILDER.db
"""

import collections
import json
import sqlite3
import sys


def signature(case_json):
    c = json.loads(case_json)

    def arg(a):
        a = dict(a)
        if "tensor" in a:
            a["tensor"] = {k: v for k, v in a["tensor"].items() if k != "domain"}
        if "items" in a:
            a["items"] = [None if t is None else {k: v for k, v in t.items() if k != "domain"} for t in a["items"]]
        return a

    return json.dumps([c["op"], c["overload"], [arg(a) for a in c["args"]]], sort_keys=True)


def cases(db, query):
    out = collections.defaultdict(lambda: (set(), set()))
    for model, profile, key, case_json in db.execute(query):
        sig, keys = out[(model, profile)]
        sig.add(signature(case_json))
        keys.add(key)
    return out


def main(tracer_path, builder_path):
    t = sqlite3.connect(tracer_path)
    b = sqlite3.connect(builder_path)
    traced = cases(t, "SELECT p.model_id, p.profile, c.key, c.case_json FROM programs p "
                      "JOIN program_calls pc ON pc.program_id = p.program_id JOIN op_cases c ON c.case_id = pc.case_id "
                      "WHERE p.status = 'captured'")
    built = cases(b, "SELECT s.model_id, s.profile, c.key, c.case_json FROM case_sources s "
                     "JOIN op_cases c ON c.case_id = s.case_id JOIN builds d ON d.model_id = s.model_id "
                     "AND d.profile = s.profile WHERE d.status = 'built'")
    family = dict(((m, p), f) for m, p, f in b.execute("SELECT model_id, profile, family FROM builds"))
    kind = dict(((m, p), k) for m, p, k in t.execute("SELECT model_id, profile, kind FROM programs"))
    both = sorted(set(traced) & set(built))
    rows = collections.defaultdict(lambda: {"pairs": 0, "t": 0, "shared": 0, "shared_keys": 0, "tkeys": 0,
                                            "only_t": collections.Counter(), "only_b": collections.Counter()})
    for pair in both:
        (tsig, tkeys), (bsig, bkeys) = traced[pair], built[pair]
        r = rows[family.get(pair) or kind.get(pair, "?")]
        r["pairs"] += 1
        r["t"] += len(tsig)
        r["shared"] += len(tsig & bsig)
        r["tkeys"] += len(tkeys)
        r["shared_keys"] += len(tkeys & bkeys)
        top = lambda sigs: {json.loads(s)[0] for s in sigs}
        for op in top(tsig) - top(bsig):
            r["only_t"][op] += 1
        for op in top(bsig) - top(tsig):
            r["only_b"][op] += 1
    print(f"(model, profile) pairs captured by both: {len(both)} "
          f"(tracer captured {len(traced)}, builder built {len(built)})\n")
    print("| family | pairs | tracer cases | also built (shapes) | also built (exact keys) | ops only traced (pairs) | ops only built (pairs) |")
    print("|---|---|---|---|---|---|---|")
    total = {"pairs": 0, "t": 0, "shared": 0, "tkeys": 0, "shared_keys": 0}
    for fam, r in sorted(rows.items(), key=lambda x: -x[1]["pairs"]):
        for k in total:
            total[k] += r[k]
        fmt_ops = lambda c: ", ".join(f"`{op.replace('aten::', '')}` ({n})" for op, n in c.most_common(6)) or "-"
        print(f"| {fam} | {r['pairs']} | {r['t']} | {100 * r['shared'] / max(r['t'], 1):.0f}% | "
              f"{100 * r['shared_keys'] / max(r['tkeys'], 1):.0f}% | {fmt_ops(r['only_t'])} | {fmt_ops(r['only_b'])} |")
    print(f"| all | {total['pairs']} | {total['t']} | {100 * total['shared'] / max(total['t'], 1):.0f}% | "
          f"{100 * total['shared_keys'] / max(total['tkeys'], 1):.0f}% | | |")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
