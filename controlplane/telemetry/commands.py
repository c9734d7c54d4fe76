"""Sending commands to node agents and recording their results.

``send_command`` stores an :class:`AgentCommand` (the durable record) and pokes the
node's current connection through the channel layer. Channel-layer messages are lossy
hints (reference/RELIABILITY.md), so a command that is not delivered now stays *pending*
and is delivered when the agent next says hello, until it expires. Delivery is claimed
with a conditional update (pending → sent), so a command is sent at most once.
"""

from __future__ import annotations

import logging
from datetime import timedelta

from asgiref.sync import async_to_sync
from django.utils import timezone

from workers_agent.protocol import COMMANDS

from . import hotstate
from .models import AgentCommand, CommandStatus

log = logging.getLogger(__name__)

DEFAULT_TTL_S = 120


class CommandError(ValueError):
    """The command cannot be sent (unknown command, unknown node, bad arguments)."""


def _layer_message(cmd: AgentCommand) -> dict:
    return {"type": "agent.command", "id": str(cmd.id), "command": cmd.command,
            "args": cmd.args, "expires_at": cmd.expires_at.timestamp()}


def _create(node_id: int, command: str, args: dict | None, ttl_s: float) -> AgentCommand:
    from controlplane.topology.models import Node

    if command not in COMMANDS:
        raise CommandError(f"unknown command {command!r}; known: {', '.join(COMMANDS)}")
    if args is not None and not isinstance(args, dict):
        raise CommandError("args must be an object")
    if not Node.objects.filter(pk=node_id).exists():
        raise CommandError(f"no node {node_id}")
    args = dict(args or {})
    # The agent addresses engines by their id (= Worker.name); accept "worker" for it too.
    if "engine" not in args and isinstance(args.get("worker"), str):
        args["engine"] = args["worker"]
    return AgentCommand.objects.create(
        node_id=node_id, command=command, args=args,
        expires_at=timezone.now() + timedelta(seconds=ttl_s))


def send_command(node_id: int, command: str, args: dict | None = None,
                 ttl_s: float = DEFAULT_TTL_S) -> str:
    """Queue ``command`` for the agent of ``node_id``; returns the command id (a UUID string).

    Follow it with ``command_status(id)`` or the AgentCommand row. Raises CommandError.
    """
    cmd = _create(node_id, command, args, ttl_s)
    channel = hotstate.live_connection(node_id).get("channel")
    if channel:
        from channels.layers import get_channel_layer

        try:
            async_to_sync(get_channel_layer().send)(channel, _layer_message(cmd))
        except Exception as exc:  # stays pending; delivered on the next hello
            log.warning("could not poke node %s for command %s: %s", node_id, cmd.id, exc)
    return str(cmd.id)


async def asend_command(node_id: int, command: str, args: dict | None = None,
                        ttl_s: float = DEFAULT_TTL_S) -> str:
    from channels.db import database_sync_to_async
    from channels.layers import get_channel_layer

    cmd = await database_sync_to_async(_create)(node_id, command, args, ttl_s)
    raw = await hotstate.async_redis().hget(hotstate.Keys().live(node_id), "channel")
    if raw:
        try:
            await get_channel_layer().send(raw.decode(), _layer_message(cmd))
        except Exception as exc:
            log.warning("could not poke node %s for command %s: %s", node_id, cmd.id, exc)
    return str(cmd.id)


def command_status(command_id: str) -> dict | None:
    cmd = AgentCommand.objects.filter(pk=command_id).first()
    if cmd is None:
        return None
    return {"id": str(cmd.id), "node_id": cmd.node_id, "command": cmd.command,
            "args": cmd.args, "status": cmd.status, "detail": cmd.detail,
            "created": cmd.created, "sent_at": cmd.sent_at, "finished_at": cmd.finished_at}


def mark_sent(command_id: str) -> bool:
    """Claim delivery of a pending, unexpired command; False if someone else did."""
    now = timezone.now()
    return bool(AgentCommand.objects.filter(
        pk=command_id, status=CommandStatus.PENDING, expires_at__gt=now
    ).update(status=CommandStatus.SENT, sent_at=now))


def pending_frames(node_id: int) -> list[dict]:
    """Claim and return the command frames waiting for ``node_id`` (on hello)."""
    frames = []
    now = timezone.now()
    for cmd in AgentCommand.objects.filter(node_id=node_id, status=CommandStatus.PENDING,
                                           expires_at__gt=now).order_by("created"):
        if mark_sent(str(cmd.id)):
            frames.append({"type": "command", "id": str(cmd.id), "command": cmd.command,
                           "args": cmd.args, "expires_at": cmd.expires_at.timestamp()})
    return frames


def record_result(node_id: int, command_id: str, status: str, detail: str) -> bool:
    """Store an agent's result; only the node the command was for may answer it."""
    try:
        return bool(AgentCommand.objects.filter(
            pk=command_id, node_id=node_id,
            status__in=[CommandStatus.SENT, CommandStatus.PENDING],
        ).update(status=status, detail=detail[:4000], finished_at=timezone.now()))
    except Exception:  # not a UUID
        return False


def expire_commands() -> int:
    """Pending or sent commands past their expiry become expired."""
    return AgentCommand.objects.filter(
        status__in=[CommandStatus.PENDING, CommandStatus.SENT], expires_at__lte=timezone.now()
    ).update(status=CommandStatus.EXPIRED, finished_at=timezone.now())
