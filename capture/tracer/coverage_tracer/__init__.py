"""coverage_tracer: records the ATen program a Hugging Face model runs.

See README.md beside this package for the command line and record format.
"""

TRACER_VERSION = 5

from .trace import Options, trace  # noqa: E402

__all__ = ["Options", "trace", "TRACER_VERSION"]
