"""Choosing the model class for a config and profile, and building it."""

from __future__ import annotations

import contextlib
import inspect
import logging

import torch

from .initrules import InitRecorder

log = logging.getLogger("coverage_tracer")

# Auto classes to try, per model kind, when the config names no class the
# library has (or, for train, when the named class computes no loss).
AUTO_FOR_KIND = {
    "decoder": ["AutoModelForCausalLM", "AutoModel"],
    "hybrid": ["AutoModelForCausalLM", "AutoModel"],
    "ssm": ["AutoModelForCausalLM", "AutoModel"],
    "multimodal": ["AutoModelForImageTextToText", "AutoModelForCausalLM", "AutoModel"],
    "encoder": ["AutoModel", "AutoModelForMaskedLM"],
    "encoder-decoder": ["AutoModelForSeq2SeqLM", "AutoModel"],
    "vision": ["AutoModelForImageClassification", "AutoModel"],
    "conv": ["AutoModelForImageClassification", "AutoModel"],
    "speech": ["AutoModelForSpeechSeq2Seq", "AutoModelForCTC", "AutoModel"],
}
LOSS_HEADS = {
    "decoder": ["AutoModelForCausalLM"],
    "hybrid": ["AutoModelForCausalLM"],
    "ssm": ["AutoModelForCausalLM"],
    "multimodal": ["AutoModelForImageTextToText", "AutoModelForCausalLM"],
    "encoder": ["AutoModelForMaskedLM"],
    "encoder-decoder": ["AutoModelForSeq2SeqLM"],
}
# Kinds guessed from the config alone, only to pick the first auto class.
_CONFIG_ONLY_ORDER = ["speech", "vision", "encoder-decoder", "decoder", "encoder"]


class ProfileError(Exception):
    """The profile cannot run on this model; the message says why."""


def named_class(config):
    """The class config.architectures[0] names, if transformers has it."""
    import transformers

    archs = getattr(config, "architectures", None) or []
    if not archs:
        return None
    cls = getattr(transformers, archs[0], None)
    if isinstance(cls, type) and issubclass(cls, transformers.PreTrainedModel):
        return cls
    log.info("architectures[0]=%s is not a transformers class; using an auto class", archs[0])
    return None


def auto_class(config, names):
    import transformers

    for name in names:
        auto = getattr(transformers, name, None)
        if auto is None:
            continue
        try:
            return auto._model_mapping[type(config)]
        except (KeyError, ValueError):
            continue
    return None


def takes(cls, name: str) -> bool:
    """Whether cls.forward names the argument `name` explicitly."""
    try:
        return name in inspect.signature(cls.forward).parameters
    except (TypeError, ValueError):
        return False


def choose_class(config, kind_of):
    """(class, kind): the named class, else the first auto class that maps
    this config; `kind_of(config, cls)` classifies the model."""
    cls = named_class(config)
    if cls is None:
        for guess in _CONFIG_ONLY_ORDER:
            cls = auto_class(config, AUTO_FOR_KIND[guess])
            if cls is not None and kind_of(config, cls) == guess:
                break
        else:
            cls = auto_class(config, ["AutoModel"])
    if cls is None:
        raise ProfileError(f"no transformers model class for model_type {getattr(config, 'model_type', '?')!r}")
    return cls, kind_of(config, cls)


def loss_class(config, cls, kind: str):
    """The class to train: `cls` if its forward takes labels, else the kind's LM head."""
    if takes(cls, "labels"):
        return cls
    head = auto_class(config, LOSS_HEADS.get(kind, []))
    if head is None:
        raise ProfileError(f"{cls.__name__} computes no loss (its forward takes no labels) and no "
                           f"{'/'.join(LOSS_HEADS.get(kind, ['loss head']))} class maps this config")
    return head


def build(cls, config, device: str, dtype: torch.dtype, seed: int, run_call, functions=None):
    """(model, init recorder): random weights, built on `device`.

    Building runs under an InitRecorder so each parameter's init rule can be
    read back. On meta the library skips initialisation (there is nothing to
    write), so it is run here explicitly: on meta it costs nothing and shows
    the same calls a CPU build makes.
    """
    torch.manual_seed(seed)
    recorder = InitRecorder(run_call)
    functions = functions or contextlib.nullcontext()
    with recorder.named_inits(), torch.device(device), functions, recorder:
        model = cls._from_config(config, dtype=dtype)
    if device == "meta":
        try:
            with recorder.named_inits(), torch.device(device), functions, recorder, torch.no_grad():
                model.initialize_weights()
        except Exception as e:  # noqa: BLE001 - rules fall back to "other"
            log.warning("initialize_weights on meta failed (%s); init rules may read 'other'", e)
    return model, recorder
