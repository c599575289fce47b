"""Configs the library rejects, and the command line end to end."""

import json
import os
import subprocess
import sys

from conftest import CONFIGS

from coverage_tracer import Options, trace

TRACER_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_unknown_model_type_is_a_config_error():
    records, code = trace({"model_type": "not_a_model", "hidden_size": 32}, Options(profile="prefill"))
    assert code == 3 and len(records) == 1
    (err,) = records
    assert err["type"] == "error" and err["stage"] == "config" and err["exception"] == "ValueError"
    assert "not_a_model" in err["reason"] and "\n" not in err["reason"] and len(err["reason"]) <= 2000


def test_heads_not_dividing_hidden_size_is_reported_with_the_library_message():
    bad = dict(CONFIGS["bert"], hidden_size=50, num_attention_heads=3)
    records, code = trace(bad, Options(profile="prefill"))
    assert code == 3 and records[0]["stage"] == "build" and records[0]["exception"] == "ValueError"
    assert "hidden size (50)" in records[0]["reason"] and "attention heads (3)" in records[0]["reason"]
    bad = dict(CONFIGS["llama"], hidden_size=50, num_attention_heads=3)
    records, code = trace(bad, Options(profile="prefill"))
    assert code == 3 and records[0]["stage"] == "config" and "attention heads" in records[0]["reason"]


def test_a_position_table_shorter_than_the_profile_refuses_the_profile():
    # On meta nothing checks 512 positions against a 64-row table; the real
    # model would raise, so the pair is refused with the table named.
    short = {"model_type": "gpt2", "n_positions": 64, "n_embd": 32, "n_layer": 1, "n_head": 2, "vocab_size": 100}
    records, code = trace(short, Options(profile="prefill"))
    assert code == 3 and records[0]["stage"] == "profile", records
    assert "needs 512 positions" in records[0]["reason"] and "transformer.wpe has 64" in records[0]["reason"]
    records, code = trace(dict(short, n_positions=1024), Options(profile="prefill"))
    assert code == 0 and records[0]["type"] == "start"


def test_remote_code_is_not_run():
    config = {"model_type": "my_custom_lm", "auto_map": {"AutoConfig": "configuration_x.XConfig"}}
    records, code = trace(config, Options(profile="prefill", model_id="someone/custom"))
    assert code == 3 and records[0]["stage"] == "config"
    assert "trust_remote_code" in records[0]["reason"] and "someone/custom" in records[0]["reason"]


def _cli(*args, stdin=None):
    env = dict(os.environ, PYTHONPATH=TRACER_DIR, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    return subprocess.run([sys.executable, "-m", "coverage_tracer", *args], input=stdin, capture_output=True,
                          text=True, env=env, timeout=120)


def test_command_line_writes_only_json_lines():
    done = _cli("--config", "-", "--profile", "image", "--model-id", "tiny/vit", stdin=json.dumps(CONFIGS["vit"]))
    assert done.returncode == 0, done.stderr
    records = [json.loads(line) for line in done.stdout.splitlines()]
    assert records[0]["type"] == "start" and records[0]["model"] == "tiny/vit" and records[-1]["type"] == "end"
    assert sum(r["type"] == "call" for r in records) == records[-1]["calls"]


def test_command_line_exit_codes(tmp_path):
    bad = tmp_path / "config.json"
    bad.write_text('{"model_type": "llama",')
    done = _cli("--config", str(bad), "--profile", "prefill")
    assert done.returncode == 3 and json.loads(done.stdout)["stage"] == "config"
    done = _cli("--config", str(bad), "--profile", "prefill", "--max-layers", "0")
    assert done.returncode == 2 and "--max-layers" in done.stderr and done.stdout == ""
    done = _cli("--config", str(bad), "--profile", "prefill", "--max-experts", "-1")
    assert done.returncode == 2 and "--max-experts" in done.stderr and done.stdout == ""
    done = _cli("--config", str(bad), "--profile", "prefill", "--max-gb", "inf")
    assert done.returncode == 2 and "--max-gb" in done.stderr and done.stdout == ""
    done = _cli("--config", str(bad), "--profile", "nope")
    assert done.returncode == 2 and "--profile" in done.stderr
    done = _cli("--config", str(tmp_path / "missing.json"), "--profile", "prefill")
    assert done.returncode == 2 and "--config" in done.stderr
