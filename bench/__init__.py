"""Benchmark harness: our daemon against llama-server and llama-cpp-python's server.

Not part of the package; CI runs only its own tests (test_harness.py), never the benchmarks.
Entry point: `python -m bench run`.
"""
