"""vLLM's NixlConnector P/D handshake, driven by a proxy (ENGINES.md, "prefill/decode
disaggregation"):

1. the prefill worker gets a non-streaming copy with one output token and
   ``kv_transfer_params = {"do_remote_decode": true, ...}``;
2. its answer carries ``kv_transfer_params`` (opaque to us: block ids, engine id, host…);
3. the decode worker gets the original request plus those params and streams the answer.

A decode worker that cannot fetch the KV (the prefill side is gone, the params expired)
answers 4xx naming ``kv_transfer_params``: that is a refusal of the *pair*, retried on
another pair, not an error of the client's request.
"""

from __future__ import annotations

import copy
from typing import Any

REMOTE_DECODE_PARAMS = {
    "do_remote_decode": True,
    "do_remote_prefill": False,
    "remote_engine_id": None,
    "remote_block_ids": None,
    "remote_host": None,
    "remote_port": None,
}
REFUSAL_STATUSES = (400, 404, 409, 410, 422)


def prefill_body(body: dict[str, Any], *, chat: bool) -> dict[str, Any]:
    """The prefill copy: one token, not streamed, asking the engine to keep the KV."""
    out = copy.copy(body)
    out["max_tokens"] = 1
    if chat or "max_completion_tokens" in out:
        out["max_completion_tokens"] = 1
    for key in ("stream", "stream_options", "min_tokens"):
        out.pop(key, None)
    out["kv_transfer_params"] = dict(REMOTE_DECODE_PARAMS)
    return out


def decode_body(body: dict[str, Any], kv_transfer_params: dict[str, Any] | None) -> dict:
    out = copy.copy(body)
    if kv_transfer_params:
        out["kv_transfer_params"] = kv_transfer_params
    else:
        out.pop("kv_transfer_params", None)
    return out


class NixlHandshake:
    name = "vllm-nixl"

    def prefill_request(self, body: dict[str, Any], *, chat: bool) -> dict[str, Any]:
        return prefill_body(body, chat=chat)

    def transfer_params(self, prefill_answer: Any) -> dict[str, Any] | None:
        params = prefill_answer.get("kv_transfer_params") if isinstance(
            prefill_answer, dict) else None
        return params if isinstance(params, dict) else None

    def decode_request(self, body: dict[str, Any],
                       params: dict[str, Any] | None) -> dict[str, Any]:
        return decode_body(body, params)

    def is_transfer_refusal(self, status: int, payload: bytes) -> bool:
        return status in REFUSAL_STATUSES and b"kv_transfer" in payload
