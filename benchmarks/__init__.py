"""Speed and memory of graphtrace's capture against a plain forward and transformers' tracer.

Run ``python -m benchmarks`` (or ``make benchmark``); ``python -m benchmarks --help`` lists the options. The goals
and the measured table live in docs/performance.md.
"""
