"""One trace: a config and a profile in, the program's records out."""

from __future__ import annotations

import contextlib
import logging
import resource
import time
from dataclasses import dataclass

import torch

from . import TRACER_VERSION
from .budget import GB, estimate_bytes
from .composites import WholeComposites
from .config import model_kind, prepare_config
from .encode import dtype_name
from .metafunctions import MetaFunctions
from .models import ProfileError, build, choose_class, loss_class
from .profiles import Inputs, ProfileRun, load_profiles
from .recorder import AutogradModules, ModuleStack, ProgramRecorder, ValueTable
from .shadow import ShadowStore

log = logging.getLogger("coverage_tracer")

REASON_LIMIT = 2000
EXIT_OK = 0
EXIT_FAILED = 3


@dataclass
class Options:
    profile: str
    model_id: str = ""
    max_layers: int = 2
    max_experts: int = 8  # 0 keeps every expert
    device: str = "auto"  # auto | meta | cpu
    max_gb: float = 4.0
    seed: int = 0
    profiles_path: str | None = None


def one_line(text: str) -> str:
    return " ".join(str(text).split())[:REASON_LIMIT]


def error_record(stage: str, exc: BaseException | None = None, reason: str | None = None,
                 exception: str | None = None) -> dict:
    if reason is None:
        reason = one_line(str(exc)) or type(exc).__name__
    return {"type": "error", "stage": stage, "reason": one_line(reason),
            "exception": exception or (type(exc).__name__ if exc is not None else "")}


class _Failed(Exception):
    def __init__(self, record):
        super().__init__(record["reason"])
        self.record = record


def _run_call_for(device: str, shadows: ShadowStore | None):
    if device == "meta":
        return shadows.run
    return lambda func, args, kwargs: func(*args, **kwargs)


def _placer(device: str, shadows: ShadowStore | None):
    def place(cpu: torch.Tensor) -> torch.Tensor:
        if device != "meta":
            return cpu
        meta = torch.empty_strided(cpu.shape, cpu.stride(), dtype=cpu.dtype, device="meta")
        shadows.put(meta, cpu)
        return meta

    return place


def _run_once(model, init_rules, config, kind, profile, opts, device, shadows, start):
    """All records of one run on `device` (raises on the first failure)."""
    records = [start]
    emit = records.append
    values = ValueTable(emit, shadows)
    for name, p in model.named_parameters():
        values.register_leaf(p, "parameter", name, init_rules.rule_for(p))
    for name, b in model.named_buffers():
        values.register_leaf(b, "buffer", name, init_rules.rule_for(b))
    modules = ModuleStack()
    autograd = AutogradModules() if profile.training else None
    recorder = ProgramRecorder(_run_call_for(device, shadows), values, modules, emit, autograd)
    inputs = Inputs(opts.seed, _placer(device, shadows),
                    lambda t, name, domain=None: values.register_leaf(t, "input", name, domain=domain))
    run = ProfileRun(profile, kind, model, config, inputs, recorder,
                     lambda t, name: values.register_leaf(t, "input", name))
    if profile.training:
        model.train()
    else:
        model.eval()
    functions = MetaFunctions(shadows, values.alias) if device == "meta" else contextlib.nullcontext()
    modules.attach(model)
    try:
        # WholeComposites is entered last, so it sees a composite before
        # MetaFunctions takes the CPU's way for it on meta.
        with torch.device(device), functions, WholeComposites(recorder), recorder:
            out = run.run()
        del out
    finally:
        modules.detach()
        if autograd is not None:
            autograd.clear()
    return records, recorder.calls, values.count


_NOT_TEXT = ("vision", "visual", "image", "audio", "patch", "vit")


def _check_positions(model, kind, profile) -> None:
    """A learned position table shorter than the profile's positions makes
    the real model raise (index out of range); on meta nothing checks an
    index, so the trace would record a program no device can run. Refuse the
    profile with the table's name and size instead."""
    needed = profile.seq_len + profile.past_len
    if needed <= 0 or kind in ("speech", "vision", "conv"):
        return
    for name, module in model.named_modules():
        leaf = name.rsplit(".", 1)[-1]
        if not isinstance(module, torch.nn.Embedding) or not ("pos" in leaf or leaf == "wpe"):
            continue
        if any(word in name for word in _NOT_TEXT):  # a vision or audio tower's own positions
            continue
        # OPT and BART tables hold 2 rows more than their positions.
        rows = module.num_embeddings - int(getattr(module, "offset", 0) or 0)
        if rows < needed:
            raise ProfileError(f"profile {profile.name} needs {needed} positions; the model's position table "
                               f"{name} has {rows}")


def trace(config_dict: dict, opts: Options) -> tuple[list[dict], int]:
    """(records, exit code) for one config and profile; never raises for a
    model's or the library's failure, which becomes an error record."""
    t0 = time.time()
    try:
        records = _trace(config_dict, opts, t0)
        return records, EXIT_OK
    except _Failed as f:
        return [f.record], EXIT_FAILED


def _trace(config_dict, opts, t0):
    import transformers

    profiles = load_profiles(opts.profiles_path)
    profile = profiles[opts.profile]
    if not isinstance(config_dict, dict):
        raise _Failed(error_record("config", reason="config.json must hold a JSON object", exception="ValueError"))
    model_id = opts.model_id or config_dict.get("_name_or_path", "")
    try:
        config, layers = prepare_config(config_dict, opts.max_layers, model_id, opts.max_experts)
    except Exception as e:  # noqa: BLE001 - the library's message is the reason
        raise _Failed(error_record("config", e))

    try:
        cls, kind = choose_class(config, model_kind)
        if kind not in profile.families:
            raise ProfileError(f"profile {profile.name} applies to {', '.join(profile.families)} models; "
                               f"{cls.__name__} is a model of kind {kind}")
        if profile.training:
            cls = loss_class(config, cls, kind)
    except ProfileError as e:
        raise _Failed(error_record("profile", e))
    except Exception as e:  # noqa: BLE001
        raise _Failed(error_record("build", e))

    dtype = profile.torch_dtype
    shadows = ShadowStore()
    try:
        meta_model, meta_rules = build(cls, config, "meta", dtype, opts.seed, shadows.run, MetaFunctions(shadows))
    except Exception as e:  # noqa: BLE001
        raise _Failed(error_record("build", e))
    try:
        _check_positions(meta_model, kind, profile)
    except ProfileError as e:
        raise _Failed(error_record("profile", e))
    estimate = estimate_bytes(meta_model, config, profile)

    if opts.device == "auto":
        # Training too: autograd and the optimizer run on meta tensors (the
        # gradients and AdamW's moments are meta tensors, shapes only).
        attempts = ["meta", "cpu"]
    else:
        attempts = [opts.device]

    fallback = None
    for device in attempts:
        if device == "cpu" and estimate > opts.max_gb * GB:
            why = f"a CPU run is needed ({fallback})" if fallback else "a CPU run is needed"
            raise _Failed(error_record(
                "budget", reason=f"{why} but the estimated parameter+activation size {estimate / GB:.2f} GB "
                                 f"exceeds --max-gb {opts.max_gb:g}", exception="MemoryError"))
        if device == "meta":
            model, rules, device_shadows = meta_model, meta_rules, shadows
        else:
            meta_model = None
            try:
                model, rules = build(cls, config, "cpu", dtype, opts.seed, _run_call_for("cpu", None))
            except Exception as e:  # noqa: BLE001
                raise _Failed(error_record("build", e))
            device_shadows = None
        start = {
            "type": "start", "tracer_version": TRACER_VERSION, "model": model_id, "profile": profile.name,
            "class": type(model).__name__, "model_type": getattr(config, "model_type", ""), "kind": kind,
            "torch": torch.__version__, "transformers": transformers.__version__, "device": device,
            "layers": layers, "attn_implementation": getattr(model.config, "_attn_implementation", None),
            "dtype": dtype_name(dtype), "estimated_gb": round(estimate / GB, 4),
        }
        if fallback:
            start["fallback"] = fallback
        try:
            records, calls, values = _run_once(model, rules, config, kind, profile, opts, device, device_shadows,
                                               start)
        except Exception as e:  # noqa: BLE001
            if device == "meta" and device != attempts[-1]:
                fallback = one_line(f"meta run failed: {type(e).__name__}: {e}")
                log.info("%s; retrying on cpu", fallback)
                del model, rules
                continue
            log.debug("run failed", exc_info=True)
            raise _Failed(error_record("run", e))
        break
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    records.append({"type": "end", "calls": calls, "values": values, "seconds": round(time.time() - t0, 3),
                    "peak_rss_mb": round(peak, 1)})
    return records
