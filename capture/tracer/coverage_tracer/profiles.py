"""The input profiles: what each one feeds the model and which calls it records.

Definitions (batch, tokens, cached tokens, dtype, training, the model kinds
each applies to) come from configs/capture_profiles.json, the file the C++
capture reads too.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch

DEFAULT_PROFILES_PATH = Path(__file__).resolve().parents[3] / "configs" / "capture_profiles.json"

_DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16, "f64": torch.float64}


@dataclass
class Profile:
    name: str
    families: list = field(default_factory=list)
    batch: int = 1
    seq_len: int = 0
    past_len: int = 0
    dtype: str = "f32"
    training: bool = False

    @property
    def torch_dtype(self) -> torch.dtype:
        return _DTYPES[self.dtype]


def load_profiles(path: Path | str | None = None) -> dict:
    with open(path or DEFAULT_PROFILES_PATH) as f:
        data = json.load(f)
    profiles = {}
    for p in data["profiles"]:
        profiles[p["name"]] = Profile(
            name=p["name"], families=list(p.get("families", [])), batch=int(p.get("batch", 1)),
            seq_len=int(p.get("seq_len", 0)), past_len=int(p.get("past_len", 0)), dtype=p.get("dtype", "f32"),
            training=bool(p.get("training", False)))
    return profiles


DECODER_LIKE = ("decoder", "hybrid", "ssm", "multimodal")
IMAGE_SIZE_DEFAULT = 224


class Inputs:
    """Makes the profile's input tensors: real CPU values (made on the CPU
    explicitly: the run is inside a torch.device context) from a seeded
    generator, placed on the trace device (on meta as a meta tensor whose
    CPU shadow holds those values) and registered as named input leaves."""

    def __init__(self, seed: int, place, register):
        self._gen = torch.Generator().manual_seed(seed)
        self._place = place
        self._register = register

    def tokens(self, name, batch, seq, vocab, leaf=True):
        return self.leaf(name, torch.randint(0, vocab, (batch, seq), generator=self._gen, dtype=torch.long, device="cpu"),
                         leaf, domain=integer_domain(0, vocab))

    def ones(self, name, batch, seq, leaf=True):
        return self.leaf(name, torch.ones(batch, seq, dtype=torch.long, device="cpu"), leaf)

    def normal(self, name, shape, dtype):
        return self.leaf(name, torch.randn(*shape, generator=self._gen, device="cpu").to(dtype))

    def randint(self, name, hi, shape):
        return self.leaf(name, torch.randint(0, hi, shape, generator=self._gen, dtype=torch.long, device="cpu"),
                         domain=integer_domain(0, hi))

    def leaf(self, name, cpu, register=True, domain=None):
        """`cpu` on the trace device; registered as input `name` unless the
        tensor only feeds an unrecorded call (decode's cache-filling prefill).
        `domain`: the range the input is drawn from (token ids: [0, vocab)),
        recorded as its domain instead of one coarsened from the values drawn,
        so that a replay reaches the whole range (the top token id too)."""
        t = self._place(cpu)
        if register:
            self._register(t, name, domain)
        return t


def integer_domain(lo: int, hi: int) -> dict:
    return {"kind": "integer", "lo": int(lo), "hi": int(hi)}


def _text_config(config):
    get = getattr(config, "get_text_config", None)
    return get(decoder=True) if get else config


def vocab_size(config) -> int:
    for c in (config, _text_config(config)):
        v = getattr(c, "vocab_size", None)
        if isinstance(v, int) and v > 0:
            return v
    raise ValueError("the config has no vocab_size to draw token ids from")


def _decoder_start(config) -> int:
    for key in ("decoder_start_token_id", "bos_token_id", "pad_token_id"):
        v = getattr(config, key, None)
        if isinstance(v, int):
            return v
    return 0


def image_shape(config, batch: int):
    vision = getattr(config, "vision_config", None) or config
    size = getattr(vision, "image_size", None) or getattr(config, "image_size", None) or IMAGE_SIZE_DEFAULT
    if isinstance(size, dict):
        size = [size.get("height", IMAGE_SIZE_DEFAULT), size.get("width", IMAGE_SIZE_DEFAULT)]
    h, w = (size, size) if isinstance(size, int) else (int(size[0]), int(size[-1]))
    channels = getattr(vision, "num_channels", None) or 3
    return [batch, channels, h, w]


def cache_leaves(cache, prefix="past_key_values", depth=0):
    """(name, tensor) for every tensor a cache object holds."""
    if isinstance(cache, torch.Tensor):
        yield prefix, cache
    elif isinstance(cache, (list, tuple)):
        for i, x in enumerate(cache):
            yield from cache_leaves(x, f"{prefix}.{i}", depth + 1)
    elif isinstance(cache, dict):
        for k, x in cache.items():
            yield from cache_leaves(x, f"{prefix}.{k}", depth + 1)
    elif depth < 6 and hasattr(cache, "__dict__") and type(cache).__module__.startswith("transformers"):
        for k, x in vars(cache).items():
            if not k.startswith("_"):
                yield from cache_leaves(x, f"{prefix}.{k}", depth + 1)


def _cache_of(out):
    for key in ("past_key_values", "cache_params"):
        cache = getattr(out, key, None)
        if cache is not None:
            return key, cache
    raise ValueError("the model returned no cache from the prefill (past_key_values / cache_params)")


def _dual_tower(model) -> bool:
    """A text tower and an image tower that one forward runs together
    (SiglipModel, CLIPModel: `text_model` and `vision_model`, and a forward
    that takes pixel_values beside input_ids)."""
    import inspect

    if not (hasattr(model, "text_model") and hasattr(model, "vision_model")):
        return False
    params = inspect.signature(type(model).forward).parameters
    return "pixel_values" in params and "input_ids" in params


class ProfileRun:
    """Runs one profile; `recorder.recording` is on only for the calls the
    profile records, and `recorder.set_phase` marks train's phases."""

    def __init__(self, profile: Profile, kind: str, model, config, inputs: Inputs, recorder, register_input):
        self.p = profile
        self.kind = kind
        self.model = model
        self.config = config
        self.inputs = inputs
        self.recorder = recorder
        self.register_input = register_input

    def run(self):
        name = self.p.name
        if self.p.training:
            return self._train()
        with torch.no_grad():
            if name == "image":
                pixels = self.inputs.normal("pixel_values", image_shape(self.config, self.p.batch), self.p.torch_dtype)
                return self._record(lambda: self.model(pixel_values=pixels))
            if name == "audio":
                return self._audio()
            if self.p.past_len > 0:
                return self._decode()
            return self._prefill()

    def _record(self, step):
        self.recorder.recording = True
        try:
            return step()
        finally:
            self.recorder.recording = False

    def _text_inputs(self, batch, seq, prefix=""):
        v = vocab_size(self.config)
        kw = {prefix + "input_ids": self.inputs.tokens(prefix + "input_ids", batch, seq, v)}
        if prefix == "":
            kw["attention_mask"] = self.inputs.ones("attention_mask", batch, seq)
        return kw

    def _prefill(self):
        b, s = self.p.batch, self.p.seq_len
        kw = self._text_inputs(b, s)
        if _dual_tower(self.model):
            # A contrastive text and image pair (SigLIP, CLIP) runs both towers
            # on every call: an image beside the text, and no cache.
            kw["pixel_values"] = self.inputs.normal("pixel_values", image_shape(self.config, b), self.p.torch_dtype)
            return self._record(lambda: self.model(**kw))
        if self.kind == "encoder-decoder":
            kw.update(self._text_inputs(b, s, "decoder_"), use_cache=True)
        elif self.kind in DECODER_LIKE:
            kw["use_cache"] = True
        return self._record(lambda: self.model(**kw))

    def _decode(self):
        b, s, past = self.p.batch, self.p.seq_len, self.p.past_len
        v = vocab_size(self.config)
        if self.kind == "encoder-decoder":
            src = past + s
            enc_ids = self.inputs.tokens("input_ids", b, src, v, leaf=False)
            mask = self.inputs.ones("attention_mask", b, src)
            out = self.model(input_ids=enc_ids, attention_mask=mask,
                             decoder_input_ids=self.inputs.tokens("decoder_input_ids", b, past, v, leaf=False), use_cache=True)
            key, cache = _cache_of(out)
            encoder_hidden = out.encoder_last_hidden_state
            del out
            from transformers.modeling_outputs import BaseModelOutput

            self.register_input(encoder_hidden, "encoder_outputs.last_hidden_state")
            self._register_cache(cache, key)
            kw = {"encoder_outputs": BaseModelOutput(last_hidden_state=encoder_hidden), "attention_mask": mask,
                  "decoder_input_ids": self.inputs.tokens("decoder_input_ids", b, s, v), key: cache,
                  "use_cache": True}
            return self._record(lambda: self.model(**kw))
        out = self.model(input_ids=self.inputs.tokens("input_ids", b, past, v, leaf=False),
                         attention_mask=self.inputs.ones("attention_mask", b, past, leaf=False), use_cache=True)
        key, cache = _cache_of(out)
        del out
        self._register_cache(cache, key)
        kw = {"input_ids": self.inputs.tokens("input_ids", b, s, v),
              "attention_mask": self.inputs.ones("attention_mask", b, past + s), key: cache, "use_cache": True}
        if key == "cache_params":
            # State-space models take the step's position explicitly.
            kw["cache_position"] = self.inputs.leaf("cache_position", torch.arange(past, past + s, device="cpu"))
        return self._record(lambda: self.model(**kw))

    def _register_cache(self, cache, key):
        for name, t in cache_leaves(cache, key):
            self.register_input(t, name)

    def _audio(self):
        c = self.config
        kw = {}
        main = getattr(type(self.model), "main_input_name", "input_values")
        if main == "input_features":
            mels = getattr(c, "num_mel_bins", None)
            if mels is not None and getattr(c, "max_source_positions", None):
                # Whisper's encoder takes exactly 2 * max_source_positions frames (30 s of audio).
                shape = [self.p.batch, mels, 2 * c.max_source_positions]
            else:
                feat = getattr(c, "input_feat_per_channel", None) or getattr(c, "feature_size", None) or 80
                feat *= getattr(c, "input_channels", 1) or 1
                # 10 ms frames: the seq_len samples at 16 kHz.
                shape = [self.p.batch, max(1, self.p.seq_len // 160), feat]
            kw["input_features"] = self.inputs.normal("input_features", shape, self.p.torch_dtype)
        else:
            kw["input_values"] = self.inputs.normal("input_values", [self.p.batch, self.p.seq_len], self.p.torch_dtype)
        if getattr(c, "is_encoder_decoder", False):
            start = torch.full((self.p.batch, 1), _decoder_start(c), dtype=torch.long, device="cpu")
            kw["decoder_input_ids"] = self.inputs.leaf("decoder_input_ids", start)
        return self._record(lambda: self.model(**kw))

    def _labels(self, b, s):
        cls = type(self.model).__name__
        num_labels = getattr(self.config, "num_labels", 2) or 2
        if cls.endswith("ForSequenceClassification"):
            return self.inputs.randint("labels", num_labels, (b,))
        if cls.endswith("ForTokenClassification"):
            return self.inputs.randint("labels", num_labels, (b, s))
        return self.inputs.tokens("labels", b, s, vocab_size(self.config))

    def _train(self):
        b, s = self.p.batch, self.p.seq_len
        kw = self._text_inputs(b, s)
        kw["labels"] = self._labels(b, s)
        if self.kind in DECODER_LIKE or self.kind == "encoder-decoder":
            kw["use_cache"] = False
        # AdamW as torch.optim makes it for parameters on an accelerator:
        # the default picks the foreach implementation (_foreach_* calls over
        # all parameters at once) for every device but the CPU, where it
        # takes the single-tensor loop; the trace runs on the CPU, so the
        # choice is made for the device. Its state is created lazily by the
        # step, so the step records that too.
        optimizer = torch.optim.AdamW(self.model.parameters(), foreach=True)

        def step():
            self.recorder.set_phase("forward")
            out = self.model(**kw)
            loss = out.loss
            del out
            self.recorder.set_phase("backward")
            loss.backward()
            self.recorder.set_phase("optimizer")
            optimizer.step()
            self.recorder.set_phase("forward")

        return self._record(step)
