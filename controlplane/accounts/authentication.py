"""DRF authentication with pdplane API tokens: ``Authorization: Bearer pdp_…``.

``Token pdp_…`` is accepted too, for clients written against DRF's TokenAuthentication.
"""

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import authentication, exceptions

from .models import APIToken

KEYWORDS = ("bearer", "token")


class APITokenAuthentication(authentication.BaseAuthentication):
    def authenticate(self, request):
        header = authentication.get_authorization_header(request).split()
        if not header or header[0].decode("latin-1").lower() not in KEYWORDS:
            return None
        if len(header) != 2:
            raise exceptions.AuthenticationFailed(
                "Malformed Authorization header: expected 'Bearer <token>'."
            )
        try:
            raw = header[1].decode("ascii")
        except UnicodeDecodeError:
            raise exceptions.AuthenticationFailed("Invalid characters in the token.") from None
        token = APIToken.authenticate(raw)
        if token is None:
            raise exceptions.AuthenticationFailed("Invalid, expired or revoked token.")
        return token.user, token

    def authenticate_header(self, request):
        return 'Bearer realm="pdplane"'


class APITokenAuthenticationScheme(OpenApiAuthenticationExtension):
    target_class = "controlplane.accounts.authentication.APITokenAuthentication"
    name = "tokenAuth"

    def get_security_definition(self, auto_schema):
        return {
            "type": "http",
            "scheme": "bearer",
            "description": "pdplane API token: `Authorization: Bearer pdp_<prefix>_<secret>`",
        }
