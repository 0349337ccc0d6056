"""Eventer benchmark harness (see e2e/bench/eventer.py and docs/performance.md)."""
