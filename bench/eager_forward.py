"""The eager side of bench_program_replay: one model, built as the capture
tracer builds it (the same config cut to --max-layers, random weights, the
library's default attention), run forward in PyTorch from Python on CPU
under inference mode, timed over --repeats runs after one warm-up run.
Prints one JSON line: {"seconds": [...], "median": s, "threads": n,
"peak_rss_mb": m}.

Run from the repository root: PYTHONPATH=capture/tracer .venv/bin/python
bench/eager_forward.py --config CONFIG.json --seq-len 512 --threads 2
"""
import argparse
import json
import resource
import statistics
import time

import torch

from coverage_tracer.config import model_kind, prepare_config
from coverage_tracer.models import choose_class
from coverage_tracer.profiles import vocab_size


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", required=True)
    ap.add_argument("--max-layers", type=int, default=2)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=0)
    args = ap.parse_args()
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    with open(args.config) as f:
        config_dict = json.load(f)
    config, _ = prepare_config(config_dict, args.max_layers, config_dict.get("_name_or_path", ""))
    cls, _ = choose_class(config, model_kind)
    torch.manual_seed(0)
    # The tracer builds in the profile's dtype (prefill: float32), not the config's torch_dtype.
    model = cls._from_config(config, dtype=torch.float32).eval()
    ids = torch.randint(0, vocab_size(config), (args.batch, args.seq_len))
    mask = torch.ones_like(ids)
    times = []
    with torch.inference_mode():
        for i in range(args.repeats + 1):
            t0 = time.perf_counter()
            model(input_ids=ids, attention_mask=mask)
            if i > 0:
                times.append(time.perf_counter() - t0)
    print(json.dumps({"seconds": times, "median": statistics.median(times), "threads": torch.get_num_threads(),
                      "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))


if __name__ == "__main__":
    main()
