"""Command line: python -m coverage_tracer --config CONFIG.json --profile NAME ..."""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sys

EXIT_USAGE = 2


def _parser(profile_names):
    p = argparse.ArgumentParser(
        prog="python -m coverage_tracer", allow_abbrev=False,
        description="Record the ATen program a Hugging Face model runs for one input profile, as JSON lines.")
    p.add_argument("--config", required=True, help="the model's config.json ('-' reads it from stdin)")
    p.add_argument("--profile", required=True, help="input profile: " + ", ".join(profile_names))
    p.add_argument("--model-id", default="", help="model id written in the records (default: the config's _name_or_path)")
    p.add_argument("--max-layers", type=int, default=2, help="cut every repeated stack to this many layers (default 2)")
    p.add_argument("--max-experts", type=int, default=8,
                   help="cut every mixture-of-experts layer to this many experts, at least the router's top-k; "
                        "0 keeps them all (default 8)")
    p.add_argument("--device", default="auto", choices=["auto", "meta", "cpu"],
                   help="auto: meta when every call runs there, else cpu (default)")
    p.add_argument("--max-gb", type=float, default=4.0, help="memory budget for a CPU run, in GB (default 4)")
    p.add_argument("--seed", type=int, default=0, help="seed for inputs and CPU weights (default 0)")
    p.add_argument("--profiles", default=None, help="profile definitions (default: configs/capture_profiles.json)")
    p.add_argument("-v", "--verbose", action="store_true", help="log progress to stderr")
    return p


def _usage_error(parser, message):
    parser.print_usage(sys.stderr)
    print(f"{parser.prog}: error: {message}", file=sys.stderr)
    return EXIT_USAGE


def _die_with_parent() -> None:
    """Started by `coverage capture` (COVERAGE_PARENT_PID set): ask the
    kernel to kill this process when that parent dies, so a killed capture
    leaves no tracer behind."""
    parent = os.environ.get("COVERAGE_PARENT_PID")
    if not parent or not sys.platform.startswith("linux"):
        return
    try:
        import ctypes
        import signal

        libc = ctypes.CDLL(None, use_errno=True)
        PR_SET_PDEATHSIG = 1
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        return
    if str(os.getppid()) != parent:  # the parent died before the request took effect
        os._exit(1)


def serve(sock_fd: int = 3) -> int:
    """Note [Tracer server]
    `python -m coverage_tracer --serve`: a tracer that imports torch and
    transformers once and then forks a child per request, so a (model,
    profile) trace no longer pays the interpreter's start and those imports
    (about 3 s of a 4.4 s meta trace). The parent (`coverage capture`) holds
    the other end of a SOCK_SEQPACKET socket on fd `sock_fd`. A request is one
    message: the JSON array of tracer arguments, with the child's stdin,
    stdout and stderr as three attached descriptors. The server forks; the
    child puts itself in a process group of its own, takes the three
    descriptors as 0, 1 and 2 and runs main() on the arguments, exactly as a
    freshly started tracer would. The server answers "<pid>\n" at once (the
    parent watches and, on a deadline or its memory limit, kills that
    process group) and "<wait status>\n" when the child has ended. It says
    "ready\n" once its imports are done, before the first request, so a
    server that hangs while starting is told from a trace that does. Nothing
    runs an op before the fork, so no thread pool is copied half-held. An
    empty message or a closed socket ends the server."""
    _die_with_parent()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    import socket

    import transformers  # noqa: F401  (the imports every trace needs, paid once)
    from transformers.models.auto import modeling_auto  # noqa: F401

    from . import trace as _trace  # noqa: F401

    sock = socket.socket(fileno=sock_fd)
    try:
        sock.send(b"ready\n")
    except OSError:
        return 0
    while True:
        try:
            message, fds, _, _ = socket.recv_fds(sock, 1 << 20, 3)
        except (OSError, InterruptedError):
            return 0
        if not message:
            return 0
        try:
            argv = json.loads(message)
            if len(fds) != 3 or not isinstance(argv, list) or not all(isinstance(a, str) for a in argv):
                raise ValueError("a request is a JSON array of strings with three descriptors")
        except ValueError as e:
            for fd in fds:
                os.close(fd)
            print(f"python -m coverage_tracer --serve: bad request: {e}", file=sys.stderr)
            return EXIT_USAGE
        pid = os.fork()
        if pid == 0:
            code = 70
            try:
                os.setpgid(0, 0)
                sock.close()
                for target, fd in enumerate(fds):
                    os.dup2(fd, target)
                    os.close(fd)
                os.environ["COVERAGE_PARENT_PID"] = str(os.getppid())
                code = main(argv)
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else 1
            except BaseException:  # noqa: BLE001  (the child must never return into the server loop)
                import traceback

                traceback.print_exc()
            finally:
                try:
                    sys.stdout.flush()
                    sys.stderr.flush()
                finally:
                    os._exit(code)
        for fd in fds:
            os.close(fd)
        try:
            sock.sendall(f"{pid}\n".encode())
            _, status = os.waitpid(pid, 0)
            sock.sendall(f"{status}\n".encode())
        except OSError:
            return 0


def opinfo(argv) -> int:
    """`python -m coverage_tracer opinfo ...` (coverage_tracer/opinfo.py)."""
    _die_with_parent()
    from .opinfo import main as opinfo_main

    return opinfo_main(argv)


def main(argv=None) -> int:
    _die_with_parent()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    from .profiles import DEFAULT_PROFILES_PATH, load_profiles

    argv = sys.argv[1:] if argv is None else argv
    # Profile names come from the definitions file; read it before validating --profile.
    pre = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    pre.add_argument("--profiles", default=None)
    known, _ = pre.parse_known_args(argv)
    try:
        profiles = load_profiles(known.profiles or DEFAULT_PROFILES_PATH)
    except (OSError, ValueError, KeyError) as e:
        print(f"python -m coverage_tracer: error: --profiles: cannot read profile definitions: {e}", file=sys.stderr)
        return EXIT_USAGE
    parser = _parser(sorted(profiles))
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:
        return int(e.code) if isinstance(e.code, int) else EXIT_USAGE
    if args.profile not in profiles:
        return _usage_error(parser, f"--profile: unknown profile {args.profile!r} (known: {', '.join(sorted(profiles))})")
    if args.max_layers < 1:
        return _usage_error(parser, "--max-layers must be at least 1")
    if args.max_experts < 0:
        return _usage_error(parser, "--max-experts must be 0 (keep every expert) or positive")
    if not (args.max_gb > 0 and math.isfinite(args.max_gb)):
        return _usage_error(parser, f"--max-gb must be a positive finite number, not {args.max_gb}")
    try:
        text = sys.stdin.read() if args.config == "-" else open(args.config).read()
    except OSError as e:
        return _usage_error(parser, f"--config: cannot read {args.config}: {e.strerror or e}")

    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, stream=sys.stderr,
                        format="coverage_tracer: %(message)s")

    # Only records may reach stdout: anything the library or torch prints
    # (from Python or C) goes to stderr while the trace runs.
    sys.stdout.flush()
    records_fd = os.dup(1)
    os.dup2(2, 1)
    saved_stdout = sys.stdout
    sys.stdout = sys.stderr
    try:
        from .trace import EXIT_FAILED, Options, error_record, trace

        try:
            config = json.loads(text)
        except json.JSONDecodeError as e:
            records, code = [error_record("config", e)], EXIT_FAILED
        else:
            opts = Options(profile=args.profile, model_id=args.model_id, max_layers=args.max_layers,
                           max_experts=args.max_experts, device=args.device, max_gb=args.max_gb, seed=args.seed,
                           profiles_path=args.profiles)
            records, code = trace(config, opts)
    finally:
        sys.stdout.flush()
        sys.stdout = saved_stdout
        os.dup2(records_fd, 1)
        os.close(records_fd)
    out = sys.stdout
    for r in records:
        out.write(json.dumps(r, separators=(",", ":"), allow_nan=False))
        out.write("\n")
    out.flush()
    return code
