"""Websocket routes for browsers (live dashboard fragments)."""

from django.urls import path

from .consumers import LiveTopologyConsumer

browser_websocket_urlpatterns: list = [
    path("ws/live/", LiveTopologyConsumer.as_asgi()),
]
