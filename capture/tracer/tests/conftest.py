"""Shared fixtures: tiny configs of real architectures and cached traces.

Traces run in-process (one import of torch and transformers for the whole
suite) and are cached per (config, profile, options), so several tests can
look at the same program.
"""

import functools
import json
import os
import sys

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import pytest  # noqa: E402

from coverage_tracer import Options, trace  # noqa: E402

CONFIGS = {
    "llama": {
        "model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 128,
        "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 4, "vocab_size": 128,
        "max_position_embeddings": 4096, "_name_or_path": "tiny/llama",
    },
    "bert": {
        "model_type": "bert", "architectures": ["BertForMaskedLM"], "hidden_size": 32, "intermediate_size": 64,
        "num_attention_heads": 4, "num_hidden_layers": 2, "vocab_size": 200, "max_position_embeddings": 512,
        "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1,
    },
    "t5": {
        "model_type": "t5", "architectures": ["T5ForConditionalGeneration"], "d_model": 32, "d_ff": 64, "d_kv": 8,
        "num_heads": 4, "num_layers": 2, "num_decoder_layers": 2, "vocab_size": 200, "decoder_start_token_id": 0,
        "pad_token_id": 0, "eos_token_id": 1,
    },
    "vit": {
        "model_type": "vit", "architectures": ["ViTForImageClassification"], "hidden_size": 32,
        "intermediate_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2, "image_size": 32,
        "patch_size": 8, "num_channels": 3, "num_labels": 10,
    },
    "whisper": {
        "model_type": "whisper", "architectures": ["WhisperForConditionalGeneration"], "d_model": 32,
        "encoder_layers": 2, "decoder_layers": 2, "encoder_attention_heads": 4, "decoder_attention_heads": 4,
        "encoder_ffn_dim": 64, "decoder_ffn_dim": 64, "num_mel_bins": 16, "max_source_positions": 1500,
        "max_target_positions": 64, "vocab_size": 200, "decoder_start_token_id": 1, "pad_token_id": 0,
        "bos_token_id": 1, "eos_token_id": 2,
    },
    "mixtral": {
        "model_type": "mixtral", "architectures": ["MixtralForCausalLM"], "hidden_size": 32, "intermediate_size": 64,
        "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2, "num_local_experts": 4,
        "num_experts_per_tok": 2, "vocab_size": 200, "max_position_embeddings": 1024,
    },
}


@functools.lru_cache(maxsize=None)
def _cached(name, profile, options):
    return trace(json.loads(json.dumps(CONFIGS[name])), Options(profile=profile, **dict(options)))


def run(name, profile, **options):
    """(records, exit code); the same call returns the same cached objects."""
    return _cached(name, profile, tuple(sorted(options.items())))


def calls(records, **match):
    return [r for r in records if r["type"] == "call" and all(r.get(k) == v for k, v in match.items())]


def values(records, **match):
    return [r for r in records if r["type"] == "value" and all(r.get(k) == v for k, v in match.items())]


@pytest.fixture
def tracer():
    return run
