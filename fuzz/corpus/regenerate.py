#!/usr/bin/env python3
"""Writes the seed corpus of each fuzz target (fuzz/corpus/<target>/) from
the project's own data: the traced tiny-Llama programs of
tests/fixtures/programs, the Hub records and config.json files of data/hub,
and configs/; files named found_* (inputs a target once failed on) stay. Deterministic; run from anywhere:

    python3 fuzz/corpus/regenerate.py

Seeds stay small (a few KiB) so that libFuzzer's default input length, taken
from the largest seed, stays short and executions fast."""
import hashlib
import json
import os
import shutil

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
OUT = os.path.join(ROOT, "fuzz", "corpus")
MAX_SEED = 6000  # bytes


def compact(obj):
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def write(target, name, text):
    data = text.encode() if isinstance(text, str) else text
    assert len(data) <= MAX_SEED * 2, (target, name, len(data))
    path = os.path.join(OUT, target, name)
    with open(path, "wb") as f:
        f.write(data)


def jsonl(path):
    with open(os.path.join(ROOT, path)) as f:
        return [json.loads(line) for line in f if line.strip()]


# --- op cases: tracer call records in the registry's canonical form (core/op_case.h)

DOMAIN = {"non_negative": "nonneg", "integer": "int"}
KIND = {"tensor": "tensor", "tensor_list": "tensor[]", "int": "int", "double": "float", "bool": "bool",
        "string": "str", "int_list": "int[]", "double_list": "float[]", "bool_list": "bool[]",
        "none": "none", "device": "device"}
VALUE = {"int": "i", "double": "d", "bool": "b", "string": "s", "int_list": "ints", "double_list": "doubles",
         "bool_list": "bools"}


def canonical_tensor(holder):
    t = holder["tensor"]
    dom = holder.get("domain") or ({"kind": "bool"} if t["dtype"] == "b8" else {"kind": "real"})
    d = {"kind": DOMAIN.get(dom["kind"], dom["kind"])}
    if dom["kind"] == "integer":
        d.update(lo=dom["lo"], hi=dom["hi"])
    return {"dtype": t["dtype"], "shape": t["shape"], "strides": t["strides"], "offset": t["storage_offset"],
            "domain": d}


def canonical_case(call):
    args = []
    for a in call["args"]:
        out = {"name": a["name"], "type": KIND[a["kind"]]}
        if a["kind"] == "tensor":
            out["tensor"] = canonical_tensor(a)
        elif a["kind"] == "tensor_list":
            out["items"] = [None if i is None else canonical_tensor(i) for i in a["items"]]
        elif a["kind"] in VALUE:
            out["value"] = a[VALUE[a["kind"]]]
        args.append(out)
    return {"v": 1, "op": call["op"], "overload": call["overload"], "args": args}


def program_records(name):
    return jsonl(f"tests/fixtures/programs/{name}.jsonl")


def op_cases():
    """One case per (op, overload, argument kinds) of the fixture programs."""
    seen, cases = set(), []
    for name in ("tiny_llama_prefill", "tiny_llama_train"):
        for r in program_records(name):
            if r["type"] != "call" or r.get("unsupported"):
                continue
            shape = (r["op"], r["overload"], tuple(a["kind"] for a in r["args"]))
            if shape in seen:
                continue
            seen.add(shape)
            cases.append(canonical_case(r))
    return cases


def program_prefix(records, calls):
    """The start record, the first `calls` calls with the values they read, and an end record."""
    start = records[0]
    call_records = [r for r in records if r["type"] == "call"][:calls]
    needed = {a.get("value") for c in call_records for a in c["args"]}
    for c in call_records:
        for a in c["args"]:
            needed.update(i.get("value") for i in a.get("items") or [] if i)
    values = [r for r in records if r["type"] == "value" and r["id"] in needed]
    end = {"type": "end", "calls": len(call_records), "values": len(values) + len(call_records), "seconds": 0.5,
           "peak_rss_mb": 300.0}
    return "\n".join(json.dumps(r, separators=(",", ":")) for r in [start, *values, *call_records, end]) + "\n"


def main():
    targets = ["op_case", "worker_protocol", "hub_listing", "hub_headers", "config_features", "program",
               "expectations", "tolerances", "terminal_text"]
    for t in targets:  # inputs a target once failed on (found_*) are kept
        os.makedirs(os.path.join(OUT, t), exist_ok=True)
        for name in os.listdir(os.path.join(OUT, t)):
            if not name.startswith("found_"):
                os.remove(os.path.join(OUT, t, name))

    cases = [c for c in op_cases() if len(compact(c)) <= MAX_SEED]
    for c in cases:
        text = compact(c)
        write("op_case", f"{c['op'].split('::')[1]}_{hashlib.sha256(text.encode()).hexdigest()[:8]}.json", text)
    # A recorded constant (a Python number for a Tensor argument), which the
    # version 1 fixtures lack: a finite one and one JSON has no number for.
    for name, op, overload, value in (("mul__const_domain", "aten::mul_", "Tensor", 0.99999),
                                      ("add_const_inf_domain", "aten::add", "Tensor", "-inf")):
        tensor = {"domain": {"kind": "real"}, "dtype": "f32", "offset": 0, "shape": [8], "strides": [1]}
        const = {"domain": {"kind": "const", "value": value}, "dtype": "f64", "offset": 0, "shape": [], "strides": []}
        write("op_case", f"{name}.json", compact({"args": [{"name": "self", "tensor": tensor, "type": "tensor"},
                                                           {"name": "other", "tensor": const, "type": "tensor"}],
                                                  "op": op, "overload": overload, "v": 1}))

    # Programs: prefixes of the two traced programs, and an error record.
    prefill, train = program_records("tiny_llama_prefill"), program_records("tiny_llama_train")
    for name, records, calls in (("prefill", prefill, 1), ("prefill", prefill, 4), ("train", train, 3)):
        write("program", f"{name}_{calls}_calls.jsonl", program_prefix(records, calls))
    backward = [r for r in train if r["type"] == "call" and r["phase"] == "backward"][:2]
    for c in backward:  # a backward call, renumbered as the first
        write("program", f"backward_{c['op'].split('::')[1]}.jsonl",
              "\n".join(json.dumps(r, separators=(",", ":")) for r in
                        [train[0], {**c, "index": 0}, {"type": "end", "calls": 1, "values": 0}]) + "\n")
    write("program", "error_record.jsonl", json.dumps(
        {"type": "error", "stage": "config", "reason": "The checkpoint you are trying to load has model type "
         "`not_a_model` but Transformers does not recognize this architecture.", "exception": "ValueError"}) + "\n")

    # The worker protocol: requests (configs/tolerances.json's per-dtype
    # rules in the setup: the whole file is over a seed's size) and replies.
    with open(os.path.join(ROOT, "configs", "tolerances.json")) as f:
        shipped = json.load(f)
    tolerances = json.dumps({k: shipped[k] for k in ("default_multiplier", "dtypes") if k in shipped}, indent=2)
    setup = {"backend": "sim", "registry": "out/main.db", "tolerances_json": tolerances,
             "tolerances_source": "configs/tolerances.json", "warm_iterations": 3, "golden": "auto", "seed": 0,
             "checks": {"seed": 0, "min_cosine": 0.99, "top_k": 5, "min_topk_agreement": 0.99, "train_steps": 2,
                        "loss_rtol": 0.01, "grad_norm_rtol": 0.05, "param_update_rtol": 0.05}}
    lines = {
        "setup_request": {"setup": setup},
        "model_request": {"model": {"stage": "model", "model_id": "tiny/llama", "profile": "prefill"}},
        "ready_reply": {"ready": True, "backend_version": "sim 0.1 (libtorch 2.13.0)"},
        "error_reply": {"error": "unknown backend 'nope' (known: cpu, cuda, sim)"},
        "unit_result_reply": {"result": {
            "outcome": "mismatch", "error": "output 0: 12 of 4096 elements outside rtol=1.3e-06 atol=1e-05",
            "max_abs_err": 0.0034, "max_rel_err": 0.0127, "mismatch_frac": 0.0029, "cosine": 0.99999,
            "error_ratio": 41.5, "first_call_us": 812.0, "warm_us": 95.5, "warm_spread_us": 4.0,
            "counters": {"allocations": 3, "fallbacks": 0},
            "timing": {"materialize_us": 40.0, "golden_us": 120.0, "reference_us": 88.0, "backend_us": 1100.0,
                       "compare_us": 30.0, "total_us": 1400.0},
            "detail": {"outputs": [{"index": 0}]}, "attempts": 2, "flaky": False,
            "attempt_outcomes": ["mismatch", "mismatch"]}},
        "unit_pass_reply": {"result": {"outcome": "pass", "error": "", "max_abs_err": 0, "cosine": 1,
                                       "timing": {"total_us": 210.5}}},
        "model_items_reply": {"items": [
            {"item": "forward", "outcome": "mismatch", "error": "cosine 0.93 below 0.99", "max_abs_err": 0.41,
             "max_rel_err": 2.5, "cosine": 0.93, "error_ratio": "inf", "values_compared": True,
             "detail": {"first_divergent_call": 17, "top1_agreement": 0.87}, "seconds": 1.25},
            {"item": "model.layers.0.mlp", "outcome": "pass", "max_abs_err": 0, "max_rel_err": 0, "cosine": 1,
             "values_compared": True, "detail": {}, "seconds": 0.1, "attempts": 1}]},
    }
    for name, obj in lines.items():
        write("worker_protocol", name + ".json", json.dumps(obj, separators=(",", ":")))
    for c in cases[:4]:
        write("worker_protocol", f"unit_request_{c['op'].split('::')[1]}.json",
              json.dumps({"unit": c, "again": c is cases[0]}, sort_keys=True, separators=(",", ":")))

    # Hub listing pages and entries in the wire format (tools/hub-replay/catalog.cc).
    models = jsonl("data/hub/models.jsonl")

    def wire(m):
        e = {"_id": m["_id"], "id": m["id"], "author": m.get("author"), "sha": m.get("sha"),
             "createdAt": m.get("created_at"), "lastModified": m.get("last_modified"), "private": m["private"],
             "gated": m["gated"], "disabled": m.get("disabled", False), "downloads": m["downloads"],
             "likes": m["likes"], "library_name": m.get("library_name"), "tags": m.get("tags", [])[:8],
             "pipeline_tag": m.get("pipeline_tag")}
        if m.get("config"):
            e["config"] = m["config"]
        return {k: v for k, v in e.items() if v is not None}

    picks = [m for m in models if len(json.dumps(wire(m))) < 1500]
    by_gated = {}
    for m in picks:
        by_gated.setdefault(str(m["gated"]), m)
    chosen = list(by_gated.values()) + picks[:: max(1, len(picks) // 8)][:8]
    for i, m in enumerate(chosen):
        write("hub_listing", f"entry_{i}.json", json.dumps(wire(m)))
    for i in range(3):
        page = [wire(m) for m in chosen[i * 3:i * 3 + 3]]
        write("hub_listing", f"page_{i}.json", json.dumps(page))
    write("hub_listing", "empty_page.json", "[]")

    # Header values as the Hub (and hub-replay) send them, and model ids.
    headers = [
        '<https://huggingface.co/api/models?limit=1000&full=true&cursor=eyIkb3IiOlt7Il9pZCI6eyIkZ3QiOiI2NzE0In19XX0%3D>; rel="next"',
        '<http://127.0.0.1:8123/api/models?sort=downloads&direction=-1&limit=100&cursor=Mg>; rel="next", '
        '<http://127.0.0.1:8123/api/models?limit=100>; rel="first"',
        '<https://huggingface.co/api/models?p=2>; rel="next prev"; title="page"',
        '"api";r=0;t=55', '"resolvers";r=2980;t=300', '"pages";r=99;t=1',
        "120", "0", "Wed, 21 Oct 2015 07:28:00 GMT", "Sun, 06 Nov 1994 08:49:37 GMT",
    ]
    headers += [m["id"] for m in models[:: len(models) // 6][:6]]
    for i, h in enumerate(headers):
        write("hub_headers", f"header_{i}.txt", h)

    # config.json files of different model types from data/hub (the Python literals kept).
    seen_types = set()
    with open(os.path.join(ROOT, "data", "hub", "configs.jsonl")) as f:
        for line in f:
            if not line.strip():
                continue
            raw = json.loads(line.replace("NaN", "null").replace("Infinity", "1e999"))
            cfg = raw.get("config")
            if not isinstance(cfg, dict):
                continue
            text = json.dumps(cfg, indent=2)
            kind = cfg.get("model_type", "?")
            if kind in seen_types or len(text) > MAX_SEED:
                continue
            seen_types.add(kind)
            write("config_features", f"{kind}.json", text)
            if len(seen_types) >= 40:
                break
    write("config_features", "python_literals.json",
          '{"model_type": "llama", "hidden_size": 64, "rope_theta": Infinity, "initializer_range": NaN}')

    # Expectations and tolerances: the shipped files.
    for name in sorted(os.listdir(os.path.join(ROOT, "configs", "expectations"))):
        shutil.copy(os.path.join(ROOT, "configs", "expectations", name), os.path.join(OUT, "expectations", name))
    write("expectations", "model_items.json", json.dumps({
        "backend": "mydev", "_comment": "model-stage entries",
        "expected_failures": [
            {"stage": "model", "model": "Qwen/*", "item": "forward", "outcomes": ["mismatch", "crash"],
             "reason": "fused rotary embedding is not bit-exact on this device"},
            {"stage": "train", "reason": "no optimizer kernels yet"},
            {"op": "aten::mm.out", "key": "0123456789abcdef", "reason": "out= variants unsupported"}]}, indent=2))
    shutil.copy(os.path.join(ROOT, "configs", "tolerances.json"), os.path.join(OUT, "tolerances", "tolerances.json"))
    write("tolerances", "per_op.json", json.dumps({
        "default_multiplier": 4, "dtypes": {"bf16": {"rtol": 0.02}},
        "ops": {"aten::softmax": {"f32": {"rtol": 1e-5, "atol": 1e-6}},
                "aten::add.Tensor": {"dtypes": {"f16": {"multiplier": 8}}, "reason": "fused kernel"}}}, indent=2))

    # Text from outside, as printed: model ids of data/hub (a few), and what a
    # hostile one or a broken tracer holds.
    for m in jsonl("data/hub/configs.jsonl")[:3]:
        write("terminal_text", "id_" + hashlib.sha256(m["id"].encode()).hexdigest()[:8], m["id"])
    write("terminal_text", "escapes", "evil/\x1b[2Jclear\x00\r\n\x7f")
    write("terminal_text", "mixed", b"caf\xc3\xa9 \xc2\x9b2J \xff\xed\xa0\x80 <a href=\"x\">&</a> \xef\xbf\xbe")

    for t in targets:
        files = os.listdir(os.path.join(OUT, t))
        size = sum(os.path.getsize(os.path.join(OUT, t, n)) for n in files)
        print(f"{t}: {len(files)} seeds, {size} bytes")


if __name__ == "__main__":
    main()
