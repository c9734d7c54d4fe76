"""Deliverers by kind: what the worker loop calls to send one claimed message.

Each domain app registers its deliverer in ``AppConfig.ready()``; the outbox never imports
domain code, so domain → outbox is the only direction of the arrows.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from .backoff import Backoff
from .models import Message


@dataclass
class Result:
    """One attempt's answer, as the deliverer reads it."""

    outcome: str  # the deliverer's word: ack, nack, delivered, retry, superseded, …
    # Final status (models.Status) or None: transient, try again when the backoff says.
    status: str | None = None
    status_code: int | None = None
    latency_ms: float = 0.0
    error: str = ""
    response_excerpt: str = ""
    retry_after_s: float | None = None  # a floor for the next delay (429/503 answers)
    detail: dict = field(default_factory=dict)
    # Domain writes committed in the same transaction as the attempt (gateway state,
    # disabling an endpoint).
    then: Callable[[], None] | None = None


class Deliverer:
    """Subclass per kind of message; register an instance with :func:`register`."""

    kind: str = ""
    # Optional Django setting naming the Celery queue its kicks go to (tests use it to
    # give their worker a private queue).
    queue_setting: str | None = None

    def lease_s(self) -> float:
        """How long a claim holds; must exceed the longest send (its HTTP timeout)."""
        raise NotImplementedError

    def backoff(self) -> Backoff:
        raise NotImplementedError

    def load(self, pk: int) -> Message:
        """The claimed row, as the child model ``deliver`` reads (one query: override
        with ``select_related``)."""
        return Message.objects.get(pk=pk)

    def deliver(self, message, worker: str) -> Result:
        """Send one message this worker has claimed (as :meth:`load` returned it).
        Should not raise on I/O errors; an exception is recorded as a transient failure."""
        raise NotImplementedError


_deliverers: dict[str, Deliverer] = {}


def register(deliverer: Deliverer) -> None:
    if not deliverer.kind:
        raise ValueError(f"{deliverer!r} has no kind")
    _deliverers[deliverer.kind] = deliverer


def get(kind: str) -> Deliverer:
    try:
        return _deliverers[kind]
    except KeyError:
        raise LookupError(f"no outbox deliverer for kind {kind!r}") from None


def kinds() -> tuple[str, ...]:
    return tuple(sorted(_deliverers))
