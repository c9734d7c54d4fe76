"""Websocket routes for browsers (live dashboard fragments)."""

browser_websocket_urlpatterns: list = []
