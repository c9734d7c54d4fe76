"""Real-time simulated engines: vLLM-0.32-compatible HTTP, metrics, KV events and P/D."""

from workers_agent.sim.server.engine_server import EngineServer, SimClock

__all__ = ["EngineServer", "SimClock"]
