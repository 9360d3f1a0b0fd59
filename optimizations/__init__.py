"""Pluggable pod-scale optimizations, chosen by name (see issue 3)."""
