"""pdplane reference gateway: OpenAI-compatible, KV-aware, P/D-capable; no Django import."""
