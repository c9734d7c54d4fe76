"""Running control-plane commands through operator-configured hooks.

A hook is a shell command template (split into arguments first, then each argument
filled in — no shell, so argument values cannot inject commands) or an HTTP call
(``{method, url, json}``). Placeholders: ``{engine}``, ``{role}``, ``{generation}`` and
any other argument of the command; values must match ``SAFE_VALUE``. A command without a
hook, an unknown command, or arguments that do not fit are *refused*, never guessed.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import shlex
import urllib.parse
import urllib.request

from .protocol import COMMANDS, ROLES

log = logging.getLogger(__name__)

SAFE_VALUE = re.compile(r"^[A-Za-z0-9_.:@/-]{1,128}$")
DEFAULT_TIMEOUT_S = 30.0


class Refused(Exception):
    pass


def check_args(command: str, args: dict, engine_ids: set[str]) -> dict[str, str]:
    """The placeholder values for ``command``; raises Refused when they do not fit."""
    if command not in COMMANDS:
        raise Refused(f"unknown command {command!r}")
    values: dict[str, str] = {}
    for key, value in args.items():
        if isinstance(value, bool) or not isinstance(value, str | int):
            raise Refused(f"argument {key!r} must be a string or integer")
        text = str(value)
        if not SAFE_VALUE.match(text) or not SAFE_VALUE.match(str(key)):
            raise Refused(f"argument {key!r} has characters hooks do not accept")
        values[key] = text
    if "engine" not in values and "worker" in values:  # the control plane's other name
        values["engine"] = values["worker"]
    engine = values.get("engine")
    if engine is None:
        raise Refused(f"{command} needs an 'engine' argument")
    if engine not in engine_ids:
        raise Refused(f"no engine {engine!r} on this node")
    if command == "set_role" and values.get("role") not in ROLES:
        raise Refused(f"set_role needs role in {', '.join(ROLES)}")
    values.setdefault("generation", "")
    values.setdefault("role", "")
    return values


def _fill(template, values: dict[str, str]):
    if isinstance(template, str):
        try:
            return template.format(**values)
        except (KeyError, IndexError, ValueError) as exc:
            raise Refused(f"hook template needs a missing argument: {exc}") from None
    if isinstance(template, dict):
        return {k: _fill(v, values) for k, v in template.items()}
    if isinstance(template, list):
        return [_fill(v, values) for v in template]
    return template


async def run_shell(template: str, values: dict[str, str], timeout_s: float) -> str:
    argv = [_fill(part, values) for part in shlex.split(template)]
    proc = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), timeout_s)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise RuntimeError(f"hook timed out after {timeout_s:g}s") from None
    text = out.decode("utf-8", "replace")[-2000:]
    if proc.returncode != 0:
        raise RuntimeError(f"hook exited {proc.returncode}: {text}")
    return text


def _http(spec: dict, values: dict[str, str], timeout_s: float) -> str:
    quoted = {k: urllib.parse.quote(v, safe="") for k, v in values.items()}
    url = _fill(spec["url"], quoted)
    if not url.startswith(("http://", "https://")):
        raise Refused("hook URL must be http(s)")
    body = None
    headers = {}
    if "json" in spec:
        body = json.dumps(_fill(spec["json"], values)).encode()
        headers["Content-Type"] = "application/json"
    req = urllib.request.Request(url, data=body, method=spec.get("method", "POST"),  # noqa: S310
                                 headers=headers)
    with urllib.request.urlopen(req, timeout=timeout_s) as resp:  # noqa: S310
        return resp.read().decode("utf-8", "replace")[-2000:]


class CommandRunner:
    def __init__(self, hooks: dict[str, dict], engine_ids):
        self.hooks = hooks
        self.engine_ids = engine_ids  # callable → set of engine ids, or a set

    def _engines(self) -> set[str]:
        ids = self.engine_ids() if callable(self.engine_ids) else self.engine_ids
        return set(ids)

    async def run(self, command: str, args: dict) -> tuple[str, str, dict]:
        """Returns (status, detail, values): status succeeded | failed | refused."""
        try:
            values = check_args(command, args if isinstance(args, dict) else {},
                                self._engines())
            hook = self.hooks.get(command)
            if hook is None:
                raise Refused(f"no hook configured for {command}")
        except Refused as exc:
            return "refused", str(exc), {}
        timeout = float(hook.get("timeout_s", DEFAULT_TIMEOUT_S))
        try:
            if "shell" in hook:
                detail = await run_shell(hook["shell"], values, timeout)
            else:
                detail = await asyncio.to_thread(_http, hook["http"], values, timeout)
        except Refused as exc:
            return "refused", str(exc), {}
        except Exception as exc:
            log.warning("command %s failed: %s", command, exc)
            return "failed", f"{type(exc).__name__}: {exc}"[:2000], values
        return "succeeded", detail, values
