"""Websocket routes for node agents (protocol in docs/agent-protocol.md)."""

agent_websocket_urlpatterns: list = []
