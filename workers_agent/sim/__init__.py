"""Simulated GPU node: vLLM-compatible engine model, real-time servers and virtual-time fleet."""
