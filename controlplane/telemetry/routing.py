"""Websocket routes for node agents (protocol in docs/agent-protocol.md)."""

from django.urls import path

from .consumers import AgentConsumer

agent_websocket_urlpatterns: list = [
    path("ws/agent/v1/", AgentConsumer.as_asgi()),
]
