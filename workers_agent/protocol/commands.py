"""The command frames: the server's ``command`` (checked on the agent) and the agent's
``command_result``."""

from __future__ import annotations

from typing import Any

from .checks import Checker, ErrorCode, ProtocolError
from .limits import COMMAND_STATUSES, COMMANDS


def validate_command_result(msg: Any) -> list[ProtocolError]:
    c = Checker()
    if not isinstance(msg, dict) or msg.get("type") != "command_result":
        return [ProtocolError(ErrorCode.BAD_SCHEMA, "expected a command_result object", "")]
    c.string(msg, "id", "command_result", max_len=64)
    c.string(msg, "status", "command_result", choices=COMMAND_STATUSES)
    c.string(msg, "detail", "command_result", optional=True, max_len=4000)
    return c.errors


def validate_command(msg: Any) -> list[ProtocolError]:
    """Agent-side check of a server ``command`` frame."""
    c = Checker()
    if not isinstance(msg, dict) or msg.get("type") != "command":
        return [ProtocolError(ErrorCode.BAD_SCHEMA, "expected a command object", "")]
    c.string(msg, "id", "command", max_len=64)
    if c.string(msg, "command", "command", max_len=64) and msg["command"] not in COMMANDS:
        c.fail(ErrorCode.UNKNOWN_COMMAND, f"unknown command {msg['command']!r}", "command.command")
    args = msg.get("args", {})
    if not isinstance(args, dict):
        c.fail(ErrorCode.BAD_SCHEMA, "must be an object", "command.args")
    return c.errors
