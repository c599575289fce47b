"""Traces of tiny real-architecture models: what the recorded programs hold."""

import json

import pytest
import torch

from conftest import CONFIGS, calls, run, values

from coverage_tracer.recorder import ModuleStack, ProgramRecorder, ValueTable

# Attention is recorded whole (composites.py); the CPU's kernel for it is its decomposition.
SDPA = "aten::scaled_dot_product_attention"
SDPA_CPU = "aten::_scaled_dot_product_flash_attention_for_cpu"
SDPA_BACKWARD = "coverage::scaled_dot_product_attention_backward"


def _schema_names(op, overload):
    packet = getattr(getattr(torch.ops, op.split("::")[0]), op.split("::")[1])
    return [a.name for a in getattr(packet, overload or "default")._schema.arguments]


def check_well_formed(records):
    """Every record has its shape; ids are defined before use; every call
    lists every schema argument in order."""
    assert records[0]["type"] == "start" and records[-1]["type"] == "end"
    defined, n_calls = set(), 0
    for r in records[1:-1]:
        if r["type"] == "value":
            assert r["id"] not in defined
            defined.add(r["id"])
            continue
        assert r["type"] == "call" and r["index"] == n_calls
        n_calls += 1
        if "args" in r:
            assert [a["name"] for a in r["args"]] == _schema_names(r["op"], r["overload"])
            for a in r["args"]:
                items = [a] if a["kind"] == "tensor" else a.get("items", []) if a["kind"] == "tensor_list" else []
                for item in items:
                    if item is not None:
                        assert item["value"] in defined, (r["op"], a["name"])
        for o in r["outputs"]:
            if "value" in o:
                defined.add(o["value"])
    assert records[-1]["calls"] == n_calls
    json.dumps(records, allow_nan=False)


def test_decoder_prefill_program():
    records, code = run("llama", "prefill")
    assert code == 0
    check_well_formed(records)
    start = records[0]
    assert start["class"] == "LlamaForCausalLM" and start["model_type"] == "llama"
    assert start["device"] == "meta" and start["dtype"] == "f32" and start["attn_implementation"] == "sdpa"
    assert start["layers"] == {"num_hidden_layers": {"kept": 2, "of": 4}}
    assert start["torch"] == torch.__version__ and start["model"] == "tiny/llama"
    attention = calls(records, op=SDPA)
    assert [c["module"] for c in attention] == ["model.layers.0.self_attn", "model.layers.1.self_attn"]
    q, k = attention[0]["args"][0], attention[0]["args"][1]
    assert q["tensor"]["shape"] == [1, 4, 512, 16] and k["tensor"]["shape"] == [1, 2, 512, 16]
    # As the model passed it: no mask (all ones, so causal instead), 4 query heads on 2 key heads.
    flags = {a["name"]: a for a in attention[0]["args"][3:]}
    assert flags["attn_mask"]["kind"] == "none" and flags["is_causal"]["b"] is True
    assert flags["enable_gqa"]["b"] is True and flags["scale"]["d"] == 0.25
    # The CPU's kernel is named beside it, and is not a call of the program.
    assert attention[0]["decomposition"] == [SDPA_CPU]
    assert not calls(records, op=SDPA_CPU)
    assert not any(c["module"].startswith("model.layers.2") for c in calls(records))
    assert {c["phase"] for c in calls(records)} == {"forward"}


def test_token_ids_carry_integer_domains():
    records, _ = run("llama", "prefill")
    (ids,) = values(records, kind="input", name="input_ids")
    assert ids["tensor"]["shape"] == [1, 512] and ids["tensor"]["dtype"] == "i64"
    assert ids["domain"] == {"kind": "integer", "lo": 0, "hi": 128}
    (embedding,) = calls(records, op="aten::embedding")
    assert embedding["args"][1]["domain"] == {"kind": "integer", "lo": 0, "hi": 128}
    (mask,) = values(records, kind="input", name="attention_mask")
    assert mask["domain"] == {"kind": "integer", "lo": 1, "hi": 2}


def test_unwritten_memory_carries_no_domain():
    """torch.empty* memory holds the allocator's leftovers, which differ from
    run to run: a call reading it (or a view of it) before anything wrote it
    gets no domain, so the same model captures the same cases every time."""
    records = []
    table = ValueTable(records.append)
    recorder = ProgramRecorder(lambda f, a, k: f(*a, **k), table, ModuleStack(), records.append, None)
    order = torch.arange(8)
    with recorder:
        recorder.recording = True
        unwritten = torch.empty_like(order)
        view = unwritten.detach()
        view.index_put_((order,), order)
        view.clone()
    by_op = {c["op"]: c for c in calls(records)}
    assert "domain" not in by_op["aten::detach"]["args"][0]
    assert "domain" not in by_op["aten::index_put_"]["args"][0]
    assert by_op["aten::index_put_"]["args"][1]["items"][0]["domain"] == {"kind": "integer", "lo": 0, "hi": 8}
    # Written: the clone reads real values again.
    assert by_op["aten::clone"]["args"][0]["domain"] == {"kind": "integer", "lo": 0, "hi": 8}


def test_parameters_carry_init_rules():
    records, _ = run("llama", "prefill")
    by_name = {v["name"]: v for v in values(records, kind="parameter")}
    assert by_name["model.layers.0.mlp.up_proj.weight"]["init"] == {"rule": "normal", "mean": 0.0, "std": 0.02}
    assert by_name["model.layers.0.input_layernorm.weight"]["init"] == {"rule": "ones"}
    assert by_name["model.embed_tokens.weight"]["tensor"]["shape"] == [128, 64]


def test_meta_and_cpu_record_the_same_program():
    meta, _ = run("llama", "prefill")
    cpu, code = run("llama", "prefill", device="cpu")
    assert code == 0 and cpu[0]["device"] == "cpu"

    def strip(o):
        if isinstance(o, dict):
            return {k: strip(v) for k, v in o.items() if k != "domain"}
        return [strip(x) for x in o] if isinstance(o, list) else o

    assert strip(meta[1:-1]) == strip(cpu[1:-1])
    # Where meta knows a domain (values derived from the inputs alone), it is the CPU's.
    for m, c in zip(meta, cpu):
        for a, b in zip(m.get("args", []), c.get("args", [])):
            if "domain" in a:
                assert a["domain"] == b["domain"]


def test_same_config_twice_gives_the_same_records():
    first, _ = run("llama", "prefill", seed=0)
    from coverage_tracer import Options, trace

    second, _ = trace(json.loads(json.dumps(CONFIGS["llama"])), Options(profile="prefill", seed=0))
    assert first[:-1] == second[:-1]
    assert {k: v for k, v in first[-1].items() if k not in ("seconds", "peak_rss_mb")} == {
        k: v for k, v in second[-1].items() if k not in ("seconds", "peak_rss_mb")}


def test_max_layers_is_recorded():
    records, code = run("llama", "prefill", max_layers=1)
    assert code == 0
    assert records[0]["layers"] == {"num_hidden_layers": {"kept": 1, "of": 4}}
    assert len(calls(records, op=SDPA)) == 1


def test_decode_runs_over_a_511_token_cache():
    records, code = run("llama", "decode")
    assert code == 0
    check_well_formed(records)
    assert records[0]["device"] == "meta"
    cache = values(records, kind="input", name="past_key_values.layers.0.keys")
    assert cache and cache[0]["tensor"]["shape"] == [8, 2, 511, 16]
    attention = calls(records, op=SDPA)
    assert len(attention) == 2
    assert attention[0]["args"][0]["tensor"]["shape"] == [8, 4, 1, 16]
    assert attention[0]["args"][1]["tensor"]["shape"] == [8, 2, 512, 16]
    # Only the decode step is recorded: the first call embeds the 8 new tokens.
    assert calls(records)[0]["op"] == "aten::embedding"
    assert calls(records)[0]["args"][1]["tensor"]["shape"] == [8, 1]
    (mask,) = values(records, kind="input", name="attention_mask")
    assert mask["tensor"]["shape"] == [8, 512]


def test_decode_bf16_builds_the_model_in_bf16():
    records, code = run("llama", "decode_bf16")
    assert code == 0 and records[0]["dtype"] == "bf16"
    weights = [v for v in values(records, kind="parameter")]
    assert weights and all(v["tensor"]["dtype"] == "bf16" for v in weights)
    assert calls(records, op=SDPA)[0]["args"][0]["tensor"]["dtype"] == "bf16"


def test_train_records_forward_backward_and_adamw():
    records, code = run("llama", "train")
    assert code == 0
    check_well_formed(records)
    # Autograd and AdamW run on meta tensors: no weights, gradients or moments allocated.
    assert records[0]["device"] == "meta"
    program = calls(records)
    phases = [c["phase"] for c in program]
    assert phases == sorted(phases, key=["forward", "backward", "optimizer"].index)
    assert set(phases) == {"forward", "backward", "optimizer"}
    backward = [c for c in program if c["phase"] == "backward"]
    # Attention's backward is one call too; the CPU's backward kernel is its decomposition.
    attention = [c for c in backward if c["op"] == SDPA_BACKWARD]
    assert [c["module"] for c in attention] == ["model.layers.1.self_attn", "model.layers.0.self_attn"]
    assert attention[0]["decomposition"] == ["aten::_scaled_dot_product_flash_attention_for_cpu_backward"]
    assert not any("flash" in c["op"] for c in program)
    # Its gradients reach the projections' backward: the ids connect.
    used = {a["value"] for c in backward for a in c["args"] if a.get("kind") == "tensor"}
    assert all(o["value"] in used for o in attention[0]["outputs"][:3])
    assert any(c["module"] == "model.layers.0.self_attn" for c in backward)
    assert any(c["module"] == "model.layers.1.mlp.down_proj" for c in backward)
    optimizer = {c["op"] for c in program if c["phase"] == "optimizer"}
    # AdamW's step as an accelerator runs it: the foreach implementation.
    assert {"aten::_foreach_lerp_", "aten::_foreach_addcmul_", "aten::_foreach_addcdiv_", "aten::_foreach_sqrt"} <= optimizer
    assert not {"aten::lerp_", "aten::addcdiv_"} & optimizer
    assert calls(records, op="aten::nll_loss_forward")
    (labels,) = values(records, kind="input", name="labels")
    assert labels["tensor"]["shape"] == [4, 256]
    # The step's numbers are recorded as themselves: the decay of every
    # parameter, param.mul_(1 - lr * weight_decay), and exp_avg_sq.mul_(beta2).
    params = {v["id"] for v in values(records, kind="parameter")}
    muls = calls(records, op="aten::_foreach_mul_", phase="optimizer")
    decay = [c for c in muls if {i["value"] for i in c["args"][0]["items"]} == params]
    assert len(decay) == 1 and decay[0]["args"][1] == {"name": "scalar", "kind": "double",
                                                       "d": pytest.approx(1 - 1e-3 * 1e-2)}
    assert sorted(c["args"][1]["d"] for c in muls) == [0.999, pytest.approx(1 - 1e-3 * 1e-2)]


def test_encoder_prefill_and_train():
    records, code = run("bert", "prefill")
    assert code == 0 and records[0]["class"] == "BertForMaskedLM" and records[0]["device"] == "meta"
    check_well_formed(records)
    assert any(c["module"] == "bert.encoder.layer.0.attention.self" for c in calls(records, op=SDPA))
    # Token ids keep the range they were drawn from, [0, vocab) for a vocabulary
    # of 200 (not [0, 128), the values' range coarsened), in calls too.
    (ids,) = values(records, kind="input", name="input_ids")
    assert ids["domain"] == {"kind": "integer", "lo": 0, "hi": 200}
    (embedding,) = [c for c in calls(records, op="aten::embedding") if c["args"][1]["value"] == ids["id"]]
    assert embedding["args"][1]["domain"] == {"kind": "integer", "lo": 0, "hi": 200}
    records, code = run("bert", "train")
    assert code == 0 and {c["phase"] for c in calls(records)} == {"forward", "backward", "optimizer"}
    (labels,) = values(records, kind="input", name="labels")
    assert labels["domain"] == {"kind": "integer", "lo": 0, "hi": 200}
    # Dropout is off, even in train mode.
    assert not calls(records, op="aten::native_dropout") and not calls(records, op="aten::bernoulli_")


def test_profile_that_does_not_apply():
    records, code = run("bert", "decode")
    assert code == 3 and len(records) == 1
    assert records[0]["type"] == "error" and records[0]["stage"] == "profile"
    assert "encoder" in records[0]["reason"]
    records, code = run("vit", "prefill")
    assert code == 3 and records[0]["stage"] == "profile"


def test_encoder_decoder_prefill_and_decode():
    records, code = run("t5", "prefill")
    assert code == 0 and records[0]["kind"] == "encoder-decoder"
    assert records[0]["layers"] == {"num_layers": {"kept": 2, "of": 2}, "num_decoder_layers": {"kept": 2, "of": 2}}
    modules = {c["module"] for c in calls(records)}
    assert "encoder.block.0.layer.0.SelfAttention" in modules and "decoder.block.1.layer.1.EncDecAttention" in modules
    records, code = run("t5", "decode")
    assert code == 0
    check_well_formed(records)
    names = {v["name"] for v in values(records, kind="input")}
    # Cross-attention reads the keys and values the prefill cached from the encoder.
    assert "past_key_values.cross_attention_cache.layers.0.keys" in names
    self_keys = [v for v in values(records, kind="input") if v["name"].startswith("past_key_values.self_attention_cache")]
    assert self_keys and self_keys[0]["tensor"]["shape"][2] == 511
    assert not any(c["module"].startswith("encoder.") for c in calls(records))


def test_vision_image():
    records, code = run("vit", "image")
    assert code == 0 and records[0]["kind"] == "vision"
    check_well_formed(records)
    (pixels,) = values(records, kind="input", name="pixel_values")
    assert pixels["tensor"]["shape"] == [1, 3, 32, 32] and pixels["domain"] == {"kind": "real"}
    (conv,) = calls(records, op="aten::convolution")
    assert conv["module"] == "vit.embeddings.patch_embeddings.projection"
    params = {v["name"]: v["init"] for v in values(records, kind="parameter")}
    assert params["vit.embeddings.cls_token"]["rule"] == "normal"


def test_a_dual_tower_gets_an_image_beside_its_text():
    # SigLIP runs its text and image towers in one forward: a prefill of
    # text alone made the tracer fail ("'NoneType' object has no attribute
    # 'shape'").
    from coverage_tracer import Options, trace

    tower = {"hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 2, "num_hidden_layers": 2}
    config = {"model_type": "siglip", "architectures": ["SiglipModel"], "_name_or_path": "tiny/siglip",
              "text_config": dict(tower, vocab_size=128, max_position_embeddings=512),
              "vision_config": dict(tower, image_size=32, patch_size=8)}
    records, code = trace(config, Options(profile="prefill"))
    assert code == 0, records[-1]
    assert records[0]["kind"] == "multimodal"
    check_well_formed(records)
    inputs = {v["name"]: v for v in values(records, kind="input")}
    assert inputs["pixel_values"]["tensor"]["shape"] == [1, 3, 32, 32]
    assert inputs["input_ids"]["tensor"]["shape"] == [1, 512]
    modules = {c["module"].split(".")[0] for c in calls(records)}
    assert {"text_model", "vision_model"} <= modules


def test_speech_audio():
    records, code = run("whisper", "audio")
    assert code == 0 and records[0]["kind"] == "speech"
    check_well_formed(records)
    (features,) = values(records, kind="input", name="input_features")
    assert features["tensor"]["shape"] == [1, 16, 3000]
    assert records[0]["layers"] == {"encoder_layers": {"kept": 2, "of": 2}, "decoder_layers": {"kept": 2, "of": 2}}
    assert calls(records, op="aten::convolution")


def _strip_domains(o):
    if isinstance(o, dict):
        return {k: _strip_domains(v) for k, v in o.items() if k != "domain"}
    return [_strip_domains(x) for x in o] if isinstance(o, list) else o


def test_moe_experts_trace_on_meta_as_on_cpu():
    # transformers' grouped-mm experts call aten::_grouped_mm, whose meta
    # kernel takes bf16 only; the tracer takes its shapes from bf16 twins.
    meta, code = run("mixtral", "prefill")
    assert code == 0 and meta[0]["device"] == "meta"
    check_well_formed(meta)
    experts = [c for c in calls(meta) if c["module"] == "model.layers.0.mlp.experts"]
    grouped = [c for c in experts if c["op"] == "aten::_grouped_mm"]
    assert grouped and all(c["outputs"][0]["tensor"]["dtype"] == "f32" for c in grouped)
    cpu, code = run("mixtral", "prefill", device="cpu")
    assert code == 0
    # The same program but for one device-dependent branch of the library:
    # histc takes float input on CPU, int32 elsewhere (on meta as on an
    # accelerator), so its conversion, histc and the cumsum of its counts
    # differ in dtype.
    m, c = _strip_domains(meta[1:-1]), _strip_domains(cpu[1:-1])
    assert [r.get("op") for r in m] == [r.get("op") for r in c]
    differing = {r["op"] for r, q in zip(m, c) if r != q}
    assert differing <= {"aten::_to_copy", "aten::histc", "aten::cumsum"}, differing
    # Routing computed from real values carries real domains: softmax
    # probabilities are in the unit interval, expert indices index the experts.
    (topk,) = [c for c in calls(cpu, op="aten::topk") if c["module"] == "model.layers.0.mlp.gate"]
    assert topk["args"][0]["domain"] == {"kind": "unit"}


def _without_meta_overrides(monkeypatch):
    from coverage_tracer import shadow

    monkeypatch.setattr(shadow, "_META_OVERRIDES", {})


def test_a_meta_failure_falls_back_to_cpu(monkeypatch):
    from coverage_tracer import Options, trace

    _without_meta_overrides(monkeypatch)
    records, code = trace(json.loads(json.dumps(CONFIGS["mixtral"])), Options(profile="prefill"))
    assert code == 0
    check_well_formed(records)
    assert records[0]["device"] == "cpu" and records[0]["fallback"].startswith("meta run failed")
    assert "BF16" in records[0]["fallback"]


def test_forced_meta_failure_is_a_run_error(monkeypatch):
    from coverage_tracer import Options, trace

    _without_meta_overrides(monkeypatch)
    records, code = trace(json.loads(json.dumps(CONFIGS["mixtral"])), Options(profile="prefill", device="meta"))
    assert code == 3 and records[0]["stage"] == "run" and records[0]["exception"]


def test_budget_refusal_names_budget_and_estimate():
    records, code = run("llama", "train", max_gb=1e-6, device="cpu")
    assert code == 3 and records[0]["stage"] == "budget"
    assert "--max-gb 1e-06" in records[0]["reason"] and "GB" in records[0]["reason"]
    # On meta the budget does not apply: nothing is allocated.
    records, code = run("llama", "train", max_gb=1e-6)
    assert code == 0 and records[0]["device"] == "meta"


def test_train_on_meta_records_the_cpus_program():
    meta, code = run("llama", "train")
    cpu, cpu_code = run("llama", "train", device="cpu")
    assert code == 0 and cpu_code == 0 and cpu[0]["device"] == "cpu"
    assert _strip_domains(meta[1:-1]) == _strip_domains(cpu[1:-1])


def test_t5_train_on_meta_takes_the_cpus_attention_kernel():
    # T5's learned position bias is the attention mask and needs a gradient:
    # the CPU's chooser then refuses the flash kernel. On meta the chooser is
    # asked on stand-ins that need a gradient too, so both record the math path.
    meta, code = run("t5", "train")
    cpu, cpu_code = run("t5", "train", device="cpu")
    assert code == 0 and cpu_code == 0 and meta[0]["device"] == "meta"
    check_well_formed(meta)
    decompositions = lambda records: [c.get("decomposition") for c in calls(records, op=SDPA)]
    assert decompositions(meta) == decompositions(cpu) and decompositions(meta)
    # Self-attention takes the bias: the math path; cross-attention has none: flash.
    for c in calls(meta, op=SDPA):
        flash = any("flash" in d for d in c["decomposition"])
        assert flash == c["module"].endswith("EncDecAttention"), c["module"]
    # The rest is the CPU's program but for _shift_right's write of a Python
    # number into a slice: lift_fresh + fill_ on CPU, scalar_tensor + view +
    # expand + copy_ elsewhere.
    ops = lambda records: [c["op"] for c in calls(records) if c["module"] != ""]
    assert ops(meta) == ops(cpu)


def test_experts_cut_keeps_each_experts_shapes():
    records, code = run("mixtral", "prefill", max_experts=2)
    assert code == 0
    assert records[0]["layers"]["num_local_experts"] == {"kept": 2, "of": 4}
    full, _ = run("mixtral", "prefill")
    assert "num_local_experts" not in full[0]["layers"]  # 4 experts: under the default cut of 8

    def expert_weights(records):
        return {v["name"]: v["tensor"]["shape"] for v in values(records, kind="parameter") if ".mlp." in v["name"]}

    cut, whole = expert_weights(records), expert_weights(full)
    assert cut.keys() == whole.keys()
    for name, shape in cut.items():
        # The router has one row per expert, the stacked expert weights one
        # slab per expert; every other dimension is the real one.
        assert shape[0] == (2 if whole[name][0] == 4 else whole[name][0]) and shape[1:] == whole[name][1:], name
    # The router's top-k is the config's.
    (topk,) = [c for c in calls(records, op="aten::topk") if c["module"] == "model.layers.0.mlp.gate"]
    assert topk["args"][1]["i"] == 2


def test_a_config_that_returns_tuples_still_trains():
    # BLOOMChat's config says "return_dict": false: the loss is the tuple's first element.
    from coverage_tracer import Options, trace

    config = {**json.loads(json.dumps(CONFIGS["llama"])), "return_dict": False}
    records, code = trace(config, Options(profile="train"))
    assert code == 0, records[0]
    assert {c["phase"] for c in calls(records)} == {"forward", "backward", "optimizer"}
