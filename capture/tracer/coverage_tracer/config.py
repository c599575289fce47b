"""Reading a model's config.json: depth reduction, dropout off, model kind.

The config goes through the library's own loader (AutoConfig.from_pretrained
on a private directory holding only that config.json, offline, without
remote code), so whatever transformers rejects is rejected with its own
message. It is loaded twice: once as given, to see every field the config
class fills in by default (a config.json may omit num_hidden_layers, and
layer_types is often derived from it), then from that full dictionary with
the depth reduced and every dropout probability set to 0.
"""

from __future__ import annotations

import json
import os
import re
import tempfile

LAYER_FIELDS = (
    "num_hidden_layers",
    "num_layers",
    "n_layer",
    "n_layers",
    "encoder_layers",
    "decoder_layers",
    "num_encoder_layers",
    "num_decoder_layers",
    "depth",
)

# Dictionaries inside a config that are settings, not sub-model configs.
_NOT_SUBCONFIGS = {"rope_scaling", "rope_parameters", "quantization_config", "id2label", "label2id",
                   "task_specific_params", "auto_map", "attn_config", "torch_dtype"}

_DROPOUT = re.compile(r"(dropout|pdrop|drop_path|layerdrop|drop_rate)", re.IGNORECASE)


class ConfigError(Exception):
    """A config the library would not load; the message is the library's."""


def load_config(config_dict: dict, model_id: str):
    """The library's config object for `config_dict` (AutoConfig, offline)."""
    import transformers

    with tempfile.TemporaryDirectory(prefix="coverage-tracer-") as tmp:
        with open(os.path.join(tmp, "config.json"), "w") as f:
            json.dump(config_dict, f)
        try:
            return transformers.AutoConfig.from_pretrained(tmp, trust_remote_code=False, local_files_only=True)
        except Exception as e:  # noqa: BLE001 - reported with the library's message
            # The private directory's name means nothing to the reader.
            e.args = tuple(a.replace(tmp, model_id or "config.json") if isinstance(a, str) else a for a in e.args)
            raise


def _is_subconfig(key: str, value) -> bool:
    return isinstance(value, dict) and key not in _NOT_SUBCONFIGS and (
        "model_type" in value or any(k in value for k in LAYER_FIELDS) or key.endswith("_config")
    )


def reduce_layers(d: dict, max_layers: int, prefix: str = "") -> dict:
    """Cuts every repeated stack in `d` (in place) to `max_layers`.

    Returns {field path: {"kept": n, "of": N}}; list fields (Swin's depths)
    give lists. Per-layer lists (layer_types and the like, recognised by
    having one entry per layer) are cut to match; lists of layer indices keep
    the indices that still exist.
    """
    layers: dict = {}
    counts: dict = {}
    for key in LAYER_FIELDS:
        v = d.get(key)
        if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
            continue
        # Swin-like configs derive num_layers (the stage count) from depths.
        if key == "num_layers" and isinstance(d.get("depths"), list):
            continue
        kept = min(v, max_layers)
        d[key] = kept
        counts[key] = (kept, v)
        layers[prefix + key] = {"kept": kept, "of": v}
    depths = d.get("depths")
    if isinstance(depths, list) and depths and all(isinstance(x, int) for x in depths):
        kept_depths = [min(x, max_layers) for x in depths]
        d["depths"] = kept_depths
        layers[prefix + "depths"] = {"kept": kept_depths, "of": list(depths)}
    if counts:
        primary = next(iter(counts.values()))
        kept, of = primary
        for key, v in list(d.items()):
            if key in LAYER_FIELDS or key == "depths" or not isinstance(v, list) or not v:
                continue
            per_layer_name = "layer" in key or "block" in key
            if len(v) == of and of != kept and per_layer_name:
                d[key] = v[:kept]
                layers[prefix + key] = {"kept": kept, "of": of}
            elif ("layer" in key and all(isinstance(x, int) and not isinstance(x, bool) for x in v)
                  and all(0 <= x < of for x in v)):
                d[key] = [x for x in v if x < kept]
    for key, v in d.items():
        if _is_subconfig(key, v):
            layers.update(reduce_layers(v, max_layers, prefix + key + "."))
    return layers


def zero_dropout(d: dict) -> None:
    """Sets every dropout-like probability in `d` (recursively) to 0."""
    for key, v in d.items():
        if not isinstance(key, str) or key in _NOT_SUBCONFIGS:
            continue
        if isinstance(v, dict):
            zero_dropout(v)
        elif _DROPOUT.search(key) and isinstance(v, (int, float)) and not isinstance(v, bool):
            d[key] = 0.0


def prepare_config(config_dict: dict, max_layers: int, model_id: str):
    """(config object, layers record) for the reduced, dropout-free config."""
    first = load_config(config_dict, model_id)
    full = first.to_dict()
    for key in ("_name_or_path", "transformers_version"):
        full.pop(key, None)
    layers = reduce_layers(full, max_layers)
    zero_dropout(full)
    return load_config(full, model_id), layers


# Model kinds are the model-builder structures of configs/capture_profiles.json.
_SSM = {"mamba", "mamba2", "falcon_mamba", "rwkv", "xlstm"}
_HYBRID = {"jamba", "zamba", "zamba2", "bamba", "falcon_h1", "granitemoehybrid", "nemotron_h", "lfm2",
           "qwen3_next", "recurrent_gemma", "minimax", "plamo2"}
_CONV_IMAGE = {"resnet", "convnext", "convnextv2", "regnet", "efficientnet", "mobilenet_v1", "mobilenet_v2",
               "bit", "van", "poolformer", "levit", "mobilevit", "mobilevitv2", "textnet", "hgnet_v2"}


def model_kind(config, cls) -> str:
    """decoder, encoder, encoder-decoder, vision, conv, speech, hybrid, ssm or multimodal."""
    from transformers.models.auto import modeling_auto as auto

    mt = getattr(config, "model_type", "")
    main = getattr(cls, "main_input_name", "input_ids") if cls is not None else "input_ids"
    if main in ("input_features", "input_values") or (
        cls is None and (mt in auto.MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES or mt in auto.MODEL_FOR_CTC_MAPPING_NAMES)
    ):
        return "speech"
    if main == "pixel_values" or (cls is None and mt in auto.MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES
                                  and mt not in auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES):
        return "conv" if mt in _CONV_IMAGE else "vision"
    if hasattr(config, "vision_config") and (hasattr(config, "text_config") or mt in
                                             auto.MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES):
        return "multimodal"
    if mt in _SSM:
        return "ssm"
    if mt in _HYBRID:
        return "hybrid"
    if getattr(config, "is_encoder_decoder", False):
        return "encoder-decoder"
    name = cls.__name__ if cls is not None else ""
    if name.endswith(("ForCausalLM", "LMHeadModel")):
        return "decoder"
    if mt in auto.MODEL_FOR_MASKED_LM_MAPPING_NAMES:
        return "encoder"
    if mt in auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        return "decoder"
    return "encoder"
