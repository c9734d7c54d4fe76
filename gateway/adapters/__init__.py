"""Adapters that drive other routers from a pdplane routing table."""
