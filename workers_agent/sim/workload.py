"""Workloads for the simulator and the player: traces and synthetic scenarios.

- Mooncake jsonl (``timestamp`` ms, ``input_length``, ``output_length``, ``hash_ids``): every
  hash id stands for a fixed pseudo-random 512-token block, so equal hash-id prefixes give
  equal prompt prefixes; the prompt is cut to ``input_length``.
- Azure LLM inference CSV (``TIMESTAMP``, ``ContextTokens``, ``GeneratedTokens``): lengths
  only, so every prompt is fresh random tokens.
- Synthetic scenarios from ``scenarios.json`` (``isl``, ``osl``, ``shared_prefix_fraction``,
  ``rate_rps``): Poisson arrivals from a seed; a shared prefix of ``isl × fraction`` tokens.

Prompts are not stored: a :class:`WorkloadRequest` builds its token ids (and, faster, its
block hashes — memoised per 512-token Mooncake block) on demand, so a 60-million-token trace
costs only its lengths in memory.
"""

from __future__ import annotations

import csv
import hashlib
import json
import random
from array import array
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from . import tokens
from .blocks import chain_hashes

MOONCAKE_BLOCK_TOKENS = 512


class WorkloadError(ValueError):
    """A trace or scenario could not be parsed; the message names the line or field."""


def _seed_of(*parts: object) -> int:
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8, person=b"pdplane-wl").digest()
    return int.from_bytes(digest, "little")


def random_tokens(seed: int, count: int) -> list[int]:
    """``count`` pseudo-random ordinary-word token ids from ``seed`` (fast: one C call for
    the randomness)."""
    if count <= 0:
        return []
    raw = array("H", random.Random(seed).randbytes(2 * count))
    first = tokens.FIRST_WORD_ID
    n = tokens.NUM_WORD_IDS
    return [first + value % n for value in raw]


@dataclass(slots=True)
class WorkloadRequest:
    request_id: str
    arrival: float  # seconds from the workload's start
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...] | None = None  # Mooncake blocks
    seed: int = 0  # fresh tokens after the shared prefix
    shared_prefix_len: int = 0
    prefix_seed: int = 0


class PromptFactory:
    """Builds token ids and block hashes of workload requests, memoising shared parts."""

    def __init__(self, block_tokens: int = MOONCAKE_BLOCK_TOKENS) -> None:
        self.block_tokens = block_tokens
        self._block_hash_memo: dict[tuple[int | None, int, int], list[int]] = {}
        self._prefix_memo: dict[tuple[int, int], list[int]] = {}

    def mooncake_block(self, hash_id: int) -> list[int]:
        return random_tokens(_seed_of("mooncake", hash_id), self.block_tokens)

    def token_ids(self, req: WorkloadRequest) -> list[int]:
        if req.hash_ids is not None:
            out: list[int] = []
            for hash_id in req.hash_ids:
                if len(out) >= req.input_length:
                    break
                out.extend(self.mooncake_block(hash_id))
            if len(out) < req.input_length:  # fewer hash ids than the length needs
                out.extend(random_tokens(req.seed, req.input_length - len(out)))
            del out[req.input_length :]
            return out
        prefix = self._prefix_tokens(req)
        return prefix + random_tokens(req.seed, req.input_length - len(prefix))

    def _prefix_tokens(self, req: WorkloadRequest) -> list[int]:
        if req.shared_prefix_len <= 0:
            return []
        key = (req.prefix_seed, req.shared_prefix_len)
        cached = self._prefix_memo.get(key)
        if cached is None:
            cached = self._prefix_memo[key] = random_tokens(req.prefix_seed, req.shared_prefix_len)
        return cached

    def block_hashes(self, req: WorkloadRequest, block_size: int) -> list[int]:
        """Equal to ``chain_hashes(self.token_ids(req), block_size)``, computed faster."""
        if req.hash_ids is None or self.block_tokens % block_size:
            return chain_hashes(self.token_ids(req), block_size)
        full_blocks = req.input_length // block_size
        out: list[int] = []
        parent: int | None = None
        memo = self._block_hash_memo
        for hash_id in req.hash_ids:
            if len(out) >= full_blocks:
                break
            key = (parent, hash_id, block_size)
            chunk = memo.get(key)
            if chunk is None:
                chunk = memo[key] = chain_hashes(self.mooncake_block(hash_id), block_size, parent)
            out.extend(chunk)
            parent = chunk[-1]
        if len(out) < full_blocks:
            return chain_hashes(self.token_ids(req), block_size)
        del out[full_blocks:]
        return out


@dataclass
class Workload:
    name: str
    requests: list[WorkloadRequest]
    prompts: PromptFactory

    def __len__(self) -> int:
        return len(self.requests)

    def __iter__(self) -> Iterator[WorkloadRequest]:
        return iter(self.requests)

    @property
    def duration(self) -> float:
        return self.requests[-1].arrival - self.requests[0].arrival if self.requests else 0.0

    def head(self, count: int) -> Workload:
        return Workload(self.name, self.requests[:count], self.prompts)


def _check_speedup(speedup: float) -> None:
    if speedup <= 0:
        raise WorkloadError("speedup must be positive")


def load_mooncake(
    path: str | Path, speedup: float = 1.0, limit: int | None = None
) -> Workload:
    _check_speedup(speedup)
    requests = []
    with open(path, encoding="utf-8") as handle:
        for line_no, line in enumerate(handle, 1):
            if not line.strip():
                continue
            if limit is not None and len(requests) >= limit:
                break
            try:
                row = json.loads(line)
                req = WorkloadRequest(
                    request_id=f"mc-{line_no}",
                    arrival=float(row["timestamp"]) / 1000.0 / speedup,
                    input_length=int(row["input_length"]),
                    output_length=max(int(row["output_length"]), 1),
                    hash_ids=tuple(int(h) for h in row.get("hash_ids", ())),
                    seed=_seed_of("mooncake-tail", line_no),
                )
            except (ValueError, KeyError, TypeError) as exc:
                raise WorkloadError(f"{path}:{line_no}: {exc!r}") from exc
            if req.input_length < 1:
                raise WorkloadError(f"{path}:{line_no}: input_length must be positive")
            requests.append(req)
    requests.sort(key=lambda r: r.arrival)
    return Workload(Path(path).stem, requests, PromptFactory())


def load_azure(
    path: str | Path, speedup: float = 1.0, limit: int | None = None, seed: int = 0
) -> Workload:
    _check_speedup(speedup)
    requests = []
    start = None
    with open(path, encoding="utf-8", newline="") as handle:
        for line_no, row in enumerate(csv.DictReader(handle), 2):
            if limit is not None and len(requests) >= limit:
                break
            try:
                stamp = row["TIMESTAMP"].strip()
                # Seven fractional digits: trim to the six datetime accepts.
                if "." in stamp:
                    head, frac = stamp.split(".", 1)
                    stamp = f"{head}.{frac[:6]}"
                moment = datetime.fromisoformat(stamp)
                start = start or moment
                req = WorkloadRequest(
                    request_id=f"az-{line_no}",
                    arrival=(moment - start).total_seconds() / speedup,
                    input_length=max(int(row["ContextTokens"]), 1),
                    output_length=max(int(row["GeneratedTokens"]), 1),
                    seed=_seed_of("azure", seed, line_no),
                )
            except (ValueError, KeyError, TypeError, AttributeError) as exc:
                raise WorkloadError(f"{path}:{line_no}: {exc!r}") from exc
            requests.append(req)
    requests.sort(key=lambda r: r.arrival)
    return Workload(Path(path).stem, requests, PromptFactory())


def load_scenarios(path: str | Path) -> dict:
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)


def synthetic(
    scenario: dict,
    num_requests: int,
    rate_rps: float | None = None,
    seed: int = 0,
    speedup: float = 1.0,
    name: str = "synthetic",
    num_prefixes: int = 1,
) -> Workload:
    """Poisson arrivals of ``isl``-token prompts generating ``osl`` tokens; the first
    ``isl × shared_prefix_fraction`` tokens are one of ``num_prefixes`` shared prefixes."""
    _check_speedup(speedup)
    try:
        isl = int(scenario["isl"])
        osl = int(scenario["osl"])
        fraction = float(scenario.get("shared_prefix_fraction", 0.0))
        rate = float(rate_rps if rate_rps is not None else scenario.get("rate_rps", 1.0))
    except (KeyError, TypeError, ValueError) as exc:
        raise WorkloadError(f"scenario {name!r}: {exc!r}") from exc
    if isl < 1 or osl < 1 or rate <= 0 or not 0 <= fraction <= 1 or num_prefixes < 1:
        raise WorkloadError(f"scenario {name!r}: isl, osl, rate must be positive, fraction 0–1")
    rng = random.Random(seed)
    shared = int(isl * fraction)
    if shared >= isl:
        shared = isl - 1
    requests = []
    now = 0.0
    for index in range(num_requests):
        now += rng.expovariate(rate)
        requests.append(
            WorkloadRequest(
                request_id=f"{name}-{index}",
                arrival=now / speedup,
                input_length=isl,
                output_length=osl,
                seed=_seed_of("synthetic", name, seed, index),
                shared_prefix_len=shared,
                prefix_seed=_seed_of("prefix", name, seed, rng.randrange(num_prefixes)),
            )
        )
    return Workload(name, requests, PromptFactory())


def scenario_workload(
    scenarios_path: str | Path,
    workload_name: str,
    num_requests: int,
    rate_rps: float | None = None,
    seed: int = 0,
    speedup: float = 1.0,
) -> Workload:
    data = load_scenarios(scenarios_path)
    try:
        scenario = data["workloads"][workload_name]
    except KeyError as exc:
        known = ", ".join(data.get("workloads", {}))
        raise WorkloadError(f"unknown workload {workload_name!r}; known: {known}") from exc
    return synthetic(scenario, num_requests, rate_rps, seed, speedup, name=workload_name)


def load_trace(path: str | Path, speedup: float = 1.0, limit: int | None = None) -> Workload:
    """Mooncake (.jsonl) or Azure (.csv) by file extension."""
    suffix = Path(path).suffix.lower()
    if suffix in (".jsonl", ".json"):
        return load_mooncake(path, speedup, limit)
    if suffix == ".csv":
        return load_azure(path, speedup, limit)
    raise WorkloadError(f"unknown trace format {suffix!r} (expected .jsonl or .csv)")
