"""Per-node agent tokens: generated once, shown once, stored as a SHA-256 digest."""

import hashlib
import secrets

TOKEN_PREFIX = "pdpa_"


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def new_token() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def issue_token(node) -> str:
    """Give ``node`` a fresh token (the old one stops working) and return it in clear."""
    token = new_token()
    node.agent_token_hash = hash_token(token)
    node.save(update_fields=["agent_token_hash", "updated"])
    return token


def node_for_token(token: str):
    """The node owning ``token``, or None. Lookup by digest: constant-time by construction."""
    from controlplane.topology.models import Node

    if not token or len(token) > 256:
        return None
    return Node.objects.select_related("cluster").filter(agent_token_hash=hash_token(token)).first()
