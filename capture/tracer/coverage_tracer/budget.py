"""A rough, deliberately generous estimate of the bytes a CPU run needs.

It decides whether a CPU run fits --max-gb before one is attempted. It is
computed from the meta-built model (exact parameter and buffer bytes) and
the config's dimensions, for the kept layers:

  inference: weights + KV cache + live activations of ~2 layers
             + attention scores + logits
  training:  4 x weights (weights, grads, AdamW's two moments)
             + saved activations of every kept layer + scores + 3 x logits
"""

from __future__ import annotations

GB = 1 << 30


def _first(configs, *keys, default=0):
    for c in configs:
        for k in keys:
            v = getattr(c, k, None)
            if isinstance(v, int) and not isinstance(v, bool) and v > 0:
                return v
    return default


def _dims(config):
    subs = [config]
    get_text = getattr(config, "get_text_config", None)
    if get_text is not None:
        subs.append(get_text(decoder=True))
    for key in ("vision_config", "audio_config", "encoder_config"):
        if getattr(config, key, None) is not None:
            subs.append(getattr(config, key))
    hidden = _first(subs, "hidden_size", "d_model", "n_embd", "embed_dim", default=1024)
    inter = _first(subs, "intermediate_size", "d_ff", "ffn_dim", "encoder_ffn_dim", "n_inner", default=4 * hidden)
    heads = _first(subs, "num_attention_heads", "n_head", "encoder_attention_heads", "num_heads", default=16)
    vocab = _first(subs, "vocab_size", "num_labels", default=2)
    layers = sum(_first([c], "num_hidden_layers", "num_layers", "n_layer", "encoder_layers", default=0)
                 + _first([c], "decoder_layers", "num_decoder_layers", default=0) for c in subs) or 2
    return hidden, inter, heads, vocab, layers


def tokens_of(profile, config) -> tuple[int, int]:
    """(tokens this step per sequence, tokens attended to) for the estimate."""
    if profile.name == "image":
        size = getattr(getattr(config, "vision_config", None) or config, "image_size", 224)
        size = size if isinstance(size, int) else max(size) if isinstance(size, (list, tuple)) else 224
        patch = getattr(getattr(config, "vision_config", None) or config, "patch_size", 16)
        patch = patch if isinstance(patch, int) and patch > 0 else 16
        n = (size // patch) ** 2 + 1
        return n, n
    if profile.name == "audio":
        n = 2 * (getattr(config, "max_source_positions", 0) or 0) or max(profile.seq_len // 320, 1)
        return n, n
    return profile.seq_len, profile.seq_len + profile.past_len


def estimate_bytes(model, config, profile) -> int:
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    weights += sum(b.numel() * b.element_size() for b in model.buffers())
    hidden, inter, heads, vocab, layers = _dims(config)
    b = max(profile.batch, 1)
    s, ctx = tokens_of(profile, config)
    elem = 2 if profile.dtype in ("bf16", "f16") else 4
    per_layer = b * s * (8 * hidden + 3 * inter) * elem
    scores = b * heads * s * ctx * elem * 2
    logits = b * s * vocab * 4
    if profile.training:
        return 4 * weights + layers * (2 * per_layer + scores) + 3 * logits
    kv = 2 * layers * b * ctx * hidden * elem
    return weights + kv + 2 * per_layer + scores + logits
