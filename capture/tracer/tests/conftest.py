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

# Tiny configs of real architectures, shared with the C++ capture test
# (tests/cli/capture_test.sh): one {"id", "name", "config", "source"} per line.
TINY_MODELS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tiny_models.jsonl")
with open(TINY_MODELS) as f:
    CONFIGS = {m["name"]: m["config"] for m in map(json.loads, filter(str.strip, f))}


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
