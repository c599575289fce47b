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

# A backbone's stage fields (_cut_stages), not per-layer lists.
_STAGE_FIELDS = {"stage_names", "out_features", "out_indices"}

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


def _per_layer_name(key: str) -> bool:
    return "layer" in key or "block" in key


# Layer kinds whose layers share one set of weights, by model type: the
# library ties every such layer to the first, and a model with only one of
# them has nothing to tie ("There is an issue with your definition of
# `tie_weights_keys` ... to tie into []"). A cut keeps two of each.
_SHARED_KINDS = {"zamba": {"hybrid"}, "zamba2": {"hybrid"}}


def _kept_indices(d: dict, of: int, max_layers: int) -> list:
    """Which of `of` layers to keep: the first `max_layers`, and where the
    config gives each layer a kind (layer_types, layers_block_type, ...),
    also the first layer of every kind, so a hybrid keeps one layer of each
    (Qwen3-Next's full attention is its fourth layer, Nemotron-H's attention
    its sixth), and the first two of a kind whose layers share weights
    (Zamba's hybrid layers, _SHARED_KINDS)."""
    keep = set(range(min(of, max_layers)))
    shared = _SHARED_KINDS.get(d.get("model_type"), set())
    for key, v in d.items():
        if (isinstance(v, list) and len(v) == of and _per_layer_name(key)
                and all(isinstance(x, str) for x in v)):
            seen: dict = {}
            for i, x in enumerate(v):
                if seen.get(x, 0) < (2 if x in shared else 1):
                    seen[x] = seen.get(x, 0) + 1
                    keep.add(i)
    return sorted(keep)


def _cut_stages(d: dict, of: int, kept: list) -> None:
    """A backbone's stages follow its layers (DINOv2, ViT, BEiT as
    backbones: stage_names is "stem" and one "stageN" per layer, out_features
    and out_indices pick some). Stage N is layer N-1: the picked stages that
    still exist keep their place, renumbered; when none does, the last kept
    stage is picked, so the cut model is a valid backbone of the same kind
    (before: "out_features must be a subset of stage_names ... got
    ['stage12']")."""
    names = d.get("stage_names")
    if not (isinstance(names, list) and len(names) == of + 1 and names[:1] == ["stem"]):
        return
    renumber = {old + 1: new + 1 for new, old in enumerate(kept)}
    renumber[0] = 0
    d["stage_names"] = ["stem"] + [f"stage{i}" for i in range(1, len(kept) + 1)]
    features, indices = d.get("out_features"), d.get("out_indices")
    picked = None
    if isinstance(indices, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in indices):
        picked = [i % (of + 1) for i in indices]
    elif isinstance(features, list) and all(isinstance(f, str) and f in names for f in features):
        picked = [names.index(f) for f in features]
    if picked is None:
        return
    new = [renumber[i] for i in picked if i in renumber] or [len(kept)]
    if isinstance(indices, list):
        d["out_indices"] = new
    if isinstance(features, list):
        d["out_features"] = [d["stage_names"][i] for i in new]


def reduce_layers(d: dict, max_layers: int, prefix: str = "") -> dict:
    """Cuts every repeated stack in `d` (in place) to `max_layers` layers
    (more where one layer of each kind needs more; see _kept_indices).

    Returns {field path: {"kept": n, "of": N}}; list fields (Swin's depths)
    give lists. Per-layer lists (layer_types and the like, recognised by
    having one entry per layer) keep the kept layers' entries; lists of
    layer indices keep the indices that still exist, renumbered.
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
        counts[key] = v
    if not counts:
        # A depth given only by a per-layer list (Nemotron-H's layers_block_type).
        for key, v in d.items():
            if isinstance(v, list) and len(v) > max_layers and _per_layer_name(key) and key != "depths" and all(
                    isinstance(x, str) for x in v):
                of = len(v)
                kept = _kept_indices(d, of, max_layers)
                for k2, v2 in list(d.items()):
                    if isinstance(v2, list) and len(v2) == of and _per_layer_name(k2):
                        d[k2] = [v2[i] for i in kept]
                        layers[prefix + k2] = {"kept": len(kept), "of": of}
                break
    depths = d.get("depths")
    if isinstance(depths, list) and depths and all(isinstance(x, int) for x in depths):
        kept_depths = [min(x, max_layers) for x in depths]
        d["depths"] = kept_depths
        layers[prefix + "depths"] = {"kept": kept_depths, "of": list(depths)}
    if counts:
        of = next(iter(counts.values()))
        kept = _kept_indices(d, of, max_layers)
        for key, v in counts.items():
            # Encoder and decoder stacks of different depths are cut alike.
            n = len(kept) if v == of else min(v, max_layers)
            d[key] = n
            layers[prefix + key] = {"kept": n, "of": v}
        renumber = {old: new for new, old in enumerate(kept)}
        _cut_stages(d, of, kept)
        for key, v in list(d.items()):
            if key in LAYER_FIELDS or key in _STAGE_FIELDS or key == "depths" or not isinstance(v, list) or not v:
                continue
            if len(v) == of and len(kept) != of and _per_layer_name(key):
                d[key] = [v[i] for i in kept]
                layers[prefix + key] = {"kept": len(kept), "of": of}
            elif ("layer" in key and all(isinstance(x, int) and not isinstance(x, bool) for x in v)
                  and all(0 <= x < of for x in v)):
                d[key] = [renumber[x] for x in v if x in renumber]
        for key, v in list(d.items()):
            # Settings keyed by layer index (Gemma 4's per_layer_config: {"05": {...}}).
            if (isinstance(v, dict) and v and "layer" in key and len(kept) != of
                    and all(isinstance(k, str) and k.isdigit() and int(k) < of for k in v)):
                d[key] = {str(renumber[int(k)]).zfill(len(k)): x for k, x in v.items() if int(k) in renumber}
    for key, v in d.items():
        if _is_subconfig(key, v):
            layers.update(reduce_layers(v, max_layers, prefix + key + "."))
    return layers


# The experts of a mixture-of-experts layer: every expert has the same
# shapes, so the count is a repeated width, like depth, not a dimension.
EXPERT_FIELDS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts")
# How many experts the router picks per token (its top-k): never changed.
_TOP_K_FIELDS = ("num_experts_per_tok", "num_experts_per_token", "experts_per_token", "top_k_experts",
                 "moe_topk", "moe_k")
# Group-limited routing (DeepSeek-V3: the experts fall in n_group groups, a
# group scores as its best two experts, topk_group groups are kept).
_GROUP_FIELDS = ("n_group", "n_groups", "num_expert_group")


def _positive(d: dict, fields) -> int:
    for key in fields:
        v = d.get(key)
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            return v
    return 0


def kept_experts(of: int, max_experts: int, top_k: int, groups: int, topk_group: int) -> int:
    """How many of `of` experts a cut to `max_experts` keeps: at least the
    router's top-k; with group-limited routing, the same number in every
    group, at least two per group (a group scores as its best two), and
    enough in the groups kept to hold the top-k."""
    want = max(max_experts, top_k, 1)
    if groups > 1 and of % groups == 0:
        per = max(2, -(-want // groups), -(-top_k // max(topk_group or groups, 1)))
        want = per * groups
    return min(of, want)


def reduce_experts(d: dict, max_experts: int, prefix: str = "") -> dict:
    """Cuts the expert count of every MoE config in `d` (in place) to
    `max_experts` (see kept_experts); the router's top-k, the experts'
    widths and shared experts are kept. Returns {field path: {"kept": n,
    "of": N}} like reduce_layers; max_experts <= 0 keeps every expert."""
    cuts: dict = {}
    if max_experts > 0:
        top_k = _positive(d, _TOP_K_FIELDS)
        groups = _positive(d, _GROUP_FIELDS)
        topk_group = _positive(d, ("topk_group",))
        for key in EXPERT_FIELDS:
            of = d.get(key)
            if not isinstance(of, int) or isinstance(of, bool) or of <= 0:
                continue
            n = kept_experts(of, max_experts, top_k, groups, topk_group)
            if n < of:
                d[key] = n
                cuts[prefix + key] = {"kept": n, "of": of}
    for key, v in d.items():
        if _is_subconfig(key, v):
            cuts.update(reduce_experts(v, max_experts, prefix + key + "."))
    return cuts


def zero_dropout(d: dict) -> None:
    """Sets every dropout-like probability in `d` (recursively) to 0."""
    for key, v in d.items():
        if not isinstance(key, str) or key in _NOT_SUBCONFIGS:
            continue
        if isinstance(v, dict):
            zero_dropout(v)
        elif _DROPOUT.search(key) and isinstance(v, (int, float)) and not isinstance(v, bool):
            d[key] = 0.0


def prepare_config(config_dict: dict, max_layers: int, model_id: str, max_experts: int = 0):
    """(config object, cuts record) for the reduced, dropout-free config:
    the cuts of depth and of experts, each {"kept": n, "of": N}."""
    first = load_config(config_dict, model_id)
    full = first.to_dict()
    for key in ("_name_or_path", "transformers_version"):
        full.pop(key, None)
    layers = reduce_layers(full, max_layers)
    layers.update(reduce_experts(full, max_experts))
    zero_dropout(full)
    # Outputs as objects (BLOOMChat's config asks for tuples, which the
    # library's own code then fails to read); no call changes.
    full["return_dict"] = True
    return load_config(full, model_id), layers


# Model kinds are the structures of selection/features.h, the families of configs/capture_profiles.json.
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
