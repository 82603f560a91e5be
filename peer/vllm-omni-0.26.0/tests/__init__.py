"""
Test suite for vLLM-Omni.

This package contains unit tests, integration tests, and benchmarks
for vLLM-Omni.
"""
