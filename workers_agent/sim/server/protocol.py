"""OpenAI request parsing and response shapes, as vLLM 0.32's OpenAI server produces them.

Parsing is strict about what matters (types, ranges, the model name) and ignores sampling
knobs the simulator cannot honour (temperature, top_p, seed, …), as vLLM accepts them.
Every problem is a :class:`ApiError` carrying the HTTP status and an OpenAI-shaped body.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

_log = logging.getLogger("workers_agent.sim.server.engine_server")

# Defaults when the client gives no max_tokens: OpenAI's 16 for completions; for chat vLLM
# would generate up to the context limit, which a simulator with no end-of-sequence token
# would take literally, so it stops at 256.
DEFAULT_COMPLETION_MAX_TOKENS = 16
DEFAULT_CHAT_MAX_TOKENS = 256


class ApiError(Exception):
    def __init__(self, status: int, message: str, *, type_: str | None = None,
                 param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type_ or {
            400: "BadRequestError",
            404: "NotFoundError",
            409: "ConflictError",
            413: "RequestEntityTooLarge",
            502: "BadGatewayError",
            503: "ServiceUnavailableError",
        }.get(status, "InternalServerError")
        self.param = param
        self.code = code

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code or self.status,
            }
        }


@dataclass
class GenerationRequest:
    kind: str  # "completion" or "chat"
    model: str
    prompt_token_ids: list[int]
    max_tokens: int
    stream: bool
    include_usage: bool
    continuous_usage: bool
    kv_transfer_params: dict[str, Any] | None
    echo_prompt: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def do_remote_decode(self) -> bool:
        return bool(self.kv_transfer_params and self.kv_transfer_params.get("do_remote_decode"))

    @property
    def do_remote_prefill(self) -> bool:
        return bool(self.kv_transfer_params and self.kv_transfer_params.get("do_remote_prefill"))


def parse_json_object(raw: bytes) -> dict[str, Any]:
    try:
        body = json.loads(raw or b"")
    except (ValueError, UnicodeDecodeError) as exc:
        raise ApiError(400, f"Request body is not valid JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise ApiError(400, "Request body must be a JSON object")
    return body


def _int_field(body: dict, name: str, minimum: int) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ApiError(400, f"{name} must be an integer >= {minimum}", param=name)
    return value


def _common(body: dict, served_model: str) -> tuple[str, bool, bool, bool, dict | None]:
    model = body.get("model", served_model)
    if model is None:
        model = served_model
    if not isinstance(model, str):
        raise ApiError(400, "model must be a string", param="model")
    if model != served_model:
        raise ApiError(404, f"The model `{model}` does not exist.", param="model",
                       code="model_not_found")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise ApiError(400, "stream must be a boolean", param="stream")
    options = body.get("stream_options")
    include_usage = continuous = False
    if options is not None:
        if not isinstance(options, dict):
            raise ApiError(400, "stream_options must be an object", param="stream_options")
        if not stream:
            raise ApiError(400, "Stream options can only be defined when `stream=True`.",
                           param="stream_options")
        include_usage = bool(options.get("include_usage", False))
        continuous = bool(options.get("continuous_usage_stats", False))
    n = body.get("n", 1)
    if n != 1:
        raise ApiError(400, "The simulator supports n=1 only", param="n")
    params = body.get("kv_transfer_params")
    if params is not None and not isinstance(params, dict):
        raise ApiError(400, "kv_transfer_params must be an object", param="kv_transfer_params")
    if params and params.get("do_remote_decode") and params.get("do_remote_prefill"):
        raise ApiError(400, "kv_transfer_params cannot ask for both do_remote_decode and "
                       "do_remote_prefill", param="kv_transfer_params")
    return model, stream, include_usage, continuous, params


def parse_completion(body: dict, *, served_model: str, encode) -> GenerationRequest:
    model, stream, include_usage, continuous, params = _common(body, served_model)
    if "prompt" not in body:
        raise ApiError(400, "prompt is required", param="prompt")
    prompt = body["prompt"]
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        ids = encode(prompt)
        text = prompt
    elif isinstance(prompt, list) and all(
        isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in prompt
    ):
        ids = list(prompt)
        text = ""
    else:
        raise ApiError(400, "prompt must be a string or a list of token ids (batches of "
                       "several prompts are not supported)", param="prompt")
    if not ids:
        raise ApiError(400, "The prompt is empty", param="prompt")
    max_tokens = _int_field(body, "max_tokens", 1)
    return GenerationRequest(
        kind="completion",
        model=model,
        prompt_token_ids=ids,
        max_tokens=max_tokens or DEFAULT_COMPLETION_MAX_TOKENS,
        stream=stream,
        include_usage=include_usage,
        continuous_usage=continuous,
        kv_transfer_params=params,
        echo_prompt=text if body.get("echo") else "",
    )


def message_text(messages: Any) -> list[dict[str, str]]:
    """Validate chat messages; returns [{role, content}] with content flattened to text."""
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "messages must be a non-empty list", param="messages")
    out = []
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict) or not isinstance(msg.get("role"), str):
            raise ApiError(400, f"messages[{i}] must be an object with a string role",
                           param="messages")
        content = msg.get("content", "")
        if content is None:
            content = ""
        if isinstance(content, list):
            parts = []
            for part in content:
                if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(
                    part.get("text"), str
                ):
                    raise ApiError(400, f"messages[{i}]: only text content parts are supported",
                                   param="messages")
                parts.append(part["text"])
            content = "\n".join(parts)
        if not isinstance(content, str):
            raise ApiError(400, f"messages[{i}].content must be a string or text parts",
                           param="messages")
        out.append({"role": msg["role"], "content": content})
    return out


def parse_chat(body: dict, *, served_model: str, encode_chat) -> GenerationRequest:
    model, stream, include_usage, continuous, params = _common(body, served_model)
    if "messages" not in body:
        raise ApiError(400, "messages is required", param="messages")
    ids = encode_chat(message_text(body["messages"]))
    max_tokens = _int_field(body, "max_completion_tokens", 1) or _int_field(body, "max_tokens", 1)
    return GenerationRequest(
        kind="chat",
        model=model,
        prompt_token_ids=ids,
        max_tokens=max_tokens or DEFAULT_CHAT_MAX_TOKENS,
        stream=stream,
        include_usage=include_usage,
        continuous_usage=continuous,
        kv_transfer_params=params,
    )


def new_request_id(kind: str, header_id: str | None) -> str:
    prefix = "cmpl" if kind == "completion" else "chatcmpl"
    suffix = uuid.uuid4().hex[:16]
    if header_id:
        # vLLM keeps the client's X-Request-Id inside its own id.
        safe = "".join(ch for ch in header_id if ch.isalnum() or ch in "-_.")[:64]
        return f"{prefix}-{safe}-{suffix}"
    return f"{prefix}-{suffix}"


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }


def full_response(req: GenerationRequest, rid: str, text: str, finish_reason: str | None,
                  usage_body: dict, kv_transfer_params: dict | None) -> dict[str, Any]:
    created = int(time.time())
    if req.kind == "completion":
        choice = {"index": 0, "text": req.echo_prompt + text, "logprobs": None,
                  "finish_reason": finish_reason, "stop_reason": None,
                  "prompt_logprobs": None}
        obj = "text_completion"
    else:
        choice = {"index": 0, "message": {"role": "assistant", "content": text,
                                          "refusal": None, "tool_calls": []},
                  "logprobs": None, "finish_reason": finish_reason, "stop_reason": None}
        obj = "chat.completion"
    return {
        "id": rid, "object": obj, "created": created, "model": req.model,
        "choices": [choice], "usage": usage_body, "system_fingerprint": None,
        "kv_transfer_params": kv_transfer_params,
    }


def stream_chunk(req: GenerationRequest, rid: str, created: int, *, text: str | None = None,
                 role: bool = False, finish_reason: str | None = None,
                 usage_body: dict | None = None, usage_only: bool = False) -> dict[str, Any]:
    if usage_only:
        choices: list = []
    elif req.kind == "completion":
        choices = [{"index": 0, "text": text or "", "logprobs": None,
                    "finish_reason": finish_reason, "stop_reason": None}]
    else:
        delta: dict[str, Any] = {}
        if role:
            delta["role"] = "assistant"
        if text is not None:
            delta["content"] = text
        choices = [{"index": 0, "delta": delta, "logprobs": None,
                    "finish_reason": finish_reason, "stop_reason": None}]
    chunk = {
        "id": rid,
        "object": "text_completion" if req.kind == "completion" else "chat.completion.chunk",
        "created": created, "model": req.model, "choices": choices,
    }
    if usage_body is not None:
        chunk["usage"] = usage_body
    return chunk


def sse(data: dict[str, Any] | str) -> bytes:
    payload = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    return f"data: {payload}\n\n".encode()


@web.middleware
async def error_middleware(request: web.Request, handler):
    try:
        return await handler(request)
    except ApiError as exc:
        return web.json_response(exc.body(), status=exc.status)
    except web.HTTPException as exc:
        if exc.status >= 400:
            err = ApiError(exc.status, exc.reason or "error")
            return web.json_response(err.body(), status=exc.status)
        raise
    except (asyncio.CancelledError, ConnectionResetError):
        raise
    except Exception as exc:  # never a bare 500 page: log and answer OpenAI-shaped
        _log.exception("unhandled error in %s %s", request.method, request.path)
        err = ApiError(500, f"internal error: {exc.__class__.__name__}")
        return web.json_response(err.body(), status=500)
