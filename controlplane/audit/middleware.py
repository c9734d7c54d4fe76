"""Request id and audit actor for every HTTP request.

``X-Request-Id`` from the client is kept when sane (else one is generated) and echoed in
the response; every change record written while handling the request carries it.
"""

from .context import bind_lazy, clean_request_id, user_actor


class AuditContextMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        request.id = clean_request_id(request.headers.get("X-Request-Id"))

        def resolve():
            # DRF copies the authenticated user and token onto the Django request.
            user = getattr(request, "user", None)
            token = getattr(request, "auth", None)
            from controlplane.accounts.models import APIToken

            return user_actor(user, token if isinstance(token, APIToken) else None)

        with bind_lazy(resolve, request.id):
            response = self.get_response(request)
        response["X-Request-Id"] = request.id
        return response
