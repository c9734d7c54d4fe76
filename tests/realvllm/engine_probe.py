"""An independent, test-only client for a real vLLM engine: /metrics, KV events, requests.

Written from vLLM's own wire format (vllm/distributed/kv_events.py in the 0.32 venv), not
from pdplane's collectors, so the tier can check pdplane's parsers against a second reading
of the same engine rather than against themselves.
"""

from __future__ import annotations

import json
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, field

import msgpack
import requests
import zmq
from prometheus_client.parser import text_string_to_metric_families

END_SEQ = -1


# --- /metrics -----------------------------------------------------------------------------


def scrape(metrics_url: str) -> dict[str, list]:
    """Family name -> samples, from vLLM's Prometheus text."""
    text = requests.get(metrics_url, timeout=5).text
    return {family.name: family.samples for family in text_string_to_metric_families(text)}


def value(families: dict, sample_name: str, **labels: str) -> float:
    """Sum of the samples called ``sample_name`` whose labels include ``labels``."""
    total, found = 0.0, False
    for samples in families.values():
        for sample in samples:
            if sample.name == sample_name and all(
                sample.labels.get(k) == v for k, v in labels.items()
            ):
                total += sample.value
                found = True
    if not found:
        raise KeyError(f"{sample_name}{labels or ''} not in /metrics")
    return total


def cache_config(families: dict) -> dict[str, str]:
    samples = families.get("vllm:cache_config_info") or []
    if not samples:
        raise KeyError("vllm:cache_config_info not in /metrics")
    return dict(samples[0].labels)


# --- requests -----------------------------------------------------------------------------


def unique_prompt(words: int = 100, tag: str | None = None) -> str:
    """A prompt whose first block is new to the engine (the nonce leads)."""
    nonce = tag or uuid.uuid4().hex
    body = " ".join(["prefill decode cache block token engine gateway router"] * (words // 8 + 1))
    return f"{nonce} {body}"


def complete(base_url: str, prompt: str, max_tokens: int = 8, **extra) -> dict:
    body = {
        "model": "tiny",
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "return_token_ids": True,
        **extra,
    }
    response = requests.post(f"{base_url}/v1/completions", json=body, timeout=60)
    response.raise_for_status()
    return response.json()


@contextmanager
def request_in_flight(base_url: str, prompt: str, max_tokens: int = 800):
    """A streaming request that is running (its first token arrived) for the body of the
    ``with``; leaving it closes the stream, which aborts the request in the engine."""
    body = {
        "model": "tiny",
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "return_token_ids": True,
    }
    with requests.post(f"{base_url}/v1/completions", json=body, stream=True, timeout=60) as resp:
        resp.raise_for_status()
        lines = resp.iter_lines()
        for line in lines:
            if line.startswith(b"data: "):
                chunk = json.loads(line[len(b"data: ") :])
                yield chunk["choices"][0]["prompt_token_ids"]
                return
        raise RuntimeError("stream ended before its first token")


def stream_token_ids(response: requests.Response) -> list[int]:
    """Token ids from an OpenAI SSE stream that asked for ``return_token_ids``."""
    tokens: list[int] = []
    for line in response.iter_lines():
        if not line.startswith(b"data: ") or line == b"data: [DONE]":
            continue
        chunk = json.loads(line[len(b"data: ") :])
        for choice in chunk.get("choices", []):
            tokens.extend(choice.get("token_ids") or [])
    return tokens


# --- KV events ----------------------------------------------------------------------------


def decode_batch(payload: bytes) -> list[dict]:
    """Events of one batch as dicts with a "type" key (0.32 maps; old tagged arrays too)."""
    batch = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    events = batch.get("events", []) if isinstance(batch, dict) else batch[1]
    out = []
    for event in events:
        if isinstance(event, dict):
            out.append(event)
        elif isinstance(event, list) and event and isinstance(event[0], str):
            kind = event[0]
            if kind == "BlockStored":
                keys = ["block_hashes", "parent_block_hash", "token_ids", "block_size"]
            elif kind == "BlockRemoved":
                keys = ["block_hashes"]
            else:
                keys = []
            out.append({"type": kind, **dict(zip(keys, event[1:], strict=False))})
    return out


@dataclass
class KVState:
    """Blocks the engine holds, rebuilt from events: hash -> token ids of that block."""

    live: dict[int, list[int]] = field(default_factory=dict)
    stored: int = 0
    removed: int = 0
    cleared: int = 0

    def apply(self, events: list[dict]) -> None:
        for event in events:
            kind = event.get("type")
            if kind == "BlockStored":
                size = event["block_size"]
                tokens = event["token_ids"]
                for i, block_hash in enumerate(event["block_hashes"]):
                    self.live[block_hash] = tokens[i * size : (i + 1) * size]
                    self.stored += 1
            elif kind == "BlockRemoved":
                for block_hash in event["block_hashes"]:
                    self.live.pop(block_hash, None)
                    self.removed += 1
            elif kind == "AllBlocksCleared":
                self.live.clear()
                self.cleared += 1


class KVEventTap:
    """SUB socket on the publisher plus a DEALER on its ROUTER replay socket."""

    def __init__(self, endpoint: str, replay_endpoint: str, topic: str = "kv-events"):
        self.endpoint = endpoint
        self.replay_endpoint = replay_endpoint
        self.topic = topic.encode()
        self.ctx = zmq.Context()
        self.sub: zmq.Socket | None = None
        self.batches: dict[int, list[dict]] = {}

    def connect(self, settle_s: float = 0.5) -> None:
        self.sub = self.ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.LINGER, 0)
        self.sub.setsockopt(zmq.SUBSCRIBE, self.topic)
        self.sub.connect(self.endpoint)
        time.sleep(settle_s)  # PUB/SUB slow joiner: let the subscription reach the publisher

    def disconnect(self) -> None:
        if self.sub is not None:
            self.sub.close(linger=0)
            self.sub = None

    def drain(self, quiet_s: float = 0.7, limit_s: float = 10.0) -> list[int]:
        """Receive until nothing arrives for ``quiet_s``; returns the sequence numbers read."""
        assert self.sub is not None
        seqs = []
        deadline = time.monotonic() + limit_s
        while time.monotonic() < deadline and self.sub.poll(int(quiet_s * 1000)):
            _topic, seq_bytes, payload = self.sub.recv_multipart()
            seq = int.from_bytes(seq_bytes, "big", signed=True)
            self.batches[seq] = decode_batch(payload)
            seqs.append(seq)
        return seqs

    def replay(self, start_seq: int, timeout_s: float = 5.0) -> list[tuple[int, list[dict]]]:
        """Ask the ROUTER for every buffered batch from ``start_seq`` until the end marker."""
        dealer = self.ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.connect(self.replay_endpoint)
        try:
            dealer.send_multipart([b"", start_seq.to_bytes(8, "big")])
            out = []
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline:
                if not dealer.poll(int((deadline - time.monotonic()) * 1000) + 1):
                    break
                frames = dealer.recv_multipart()
                _empty, _topic, seq_bytes, payload = frames
                seq = int.from_bytes(seq_bytes, "big", signed=True)
                if seq == END_SEQ:
                    return out
                out.append((seq, decode_batch(payload)))
            raise TimeoutError("replay: no end-of-sequence marker")
        finally:
            dealer.close(linger=0)

    def close(self) -> None:
        self.disconnect()
        self.ctx.term()
