"""ASGI entry point: HTTP goes to Django; websockets split by audience.

Agents authenticate with a bearer token and send no Origin header, so their routes sit
outside the origin check. Browser routes are behind the session and
``AllowedHostsOriginValidator`` (websockets have no CSRF protection).
"""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
django_asgi_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402

from controlplane.dashboard.routing import browser_websocket_urlpatterns  # noqa: E402
from controlplane.telemetry.routing import agent_websocket_urlpatterns  # noqa: E402


class WebsocketByAudience:
    """Send /ws/agent/… to the token-authenticated agent router, the rest to the browser one."""

    def __init__(self, agent_app, browser_app):
        self.agent_app = agent_app
        self.browser_app = browser_app

    async def __call__(self, scope, receive, send):
        if scope["path"].startswith("/ws/agent/"):
            return await self.agent_app(scope, receive, send)
        return await self.browser_app(scope, receive, send)


application = ProtocolTypeRouter(
    {
        "http": django_asgi_app,
        "websocket": WebsocketByAudience(
            URLRouter(agent_websocket_urlpatterns),
            AllowedHostsOriginValidator(AuthMiddlewareStack(URLRouter(browser_websocket_urlpatterns))),
        ),
    }
)
