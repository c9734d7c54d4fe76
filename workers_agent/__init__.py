"""pdplane node agent (no Django imports) and the simulated node."""
