"""Engine adapters: how the gateway speaks one engine's prefill→decode (P/D) handshake.

One interface, :class:`PdHandshake`; one module per protocol. vLLM's NixlConnector
``kv_transfer_params`` is :mod:`gateway.engines.vllm_nixl`. Adding SGLang's bootstrap
protocol is one new module registered in :data:`HANDSHAKES` under the table's ``engine``
name; the gateway picks the adapter by the decode worker's ``engine`` field.
"""

from __future__ import annotations

from typing import Any, Protocol

from .vllm_nixl import NixlHandshake


class PdHandshake(Protocol):
    name: str

    def prefill_request(self, body: dict[str, Any], *, chat: bool) -> dict[str, Any]:
        """The copy of the client's request sent to the prefill worker."""

    def transfer_params(self, prefill_answer: Any) -> dict[str, Any] | None:
        """What the decode worker needs from the prefill answer (None: nothing usable)."""

    def decode_request(self, body: dict[str, Any],
                       params: dict[str, Any] | None) -> dict[str, Any]:
        """The client's request as sent to the decode worker, carrying ``params``."""

    def is_transfer_refusal(self, status: int, payload: bytes) -> bool:
        """Did the decode worker refuse the transfer (not the request itself)?"""


HANDSHAKES: dict[str, PdHandshake] = {"vllm": NixlHandshake(), "sim": NixlHandshake()}


def handshake_for(engine: str | None) -> PdHandshake:
    """The adapter for an engine kind; vLLM's when the kind has none of its own."""
    return HANDSHAKES.get(engine or "vllm", HANDSHAKES["vllm"])
