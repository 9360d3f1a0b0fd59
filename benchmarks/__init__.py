"""Benchmark suites and the one shared training loop."""
