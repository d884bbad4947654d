"""Reading and writing traces: the transformers spec files, graphtrace's own file, full tensor values."""

from graphtrace.io.trace_files import load_trace, save_trace

__all__ = ["load_trace", "save_trace"]
