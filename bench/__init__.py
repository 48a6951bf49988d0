"""Benchmark harness: our daemon against llama-server and llama-cpp-python's server.

Not part of the package and not run in CI. Entry point: `python -m bench run`.
"""
