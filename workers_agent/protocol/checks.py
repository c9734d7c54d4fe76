"""The pieces every message check is made of: the typed error (code, reason, path) and the
checker that collects them. Checks return errors; nothing here raises on bad input."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from .limits import MAX_ID_LEN


class ErrorCode:
    BAD_JSON = "bad_json"
    TOO_LARGE = "too_large"
    BAD_SCHEMA = "bad_schema"
    OUT_OF_RANGE = "out_of_range"
    UNKNOWN_TYPE = "unknown_type"
    UNKNOWN_GPU = "unknown_gpu"
    UNKNOWN_ENGINE = "unknown_engine"
    UNKNOWN_NIC = "unknown_nic"
    HELLO_REQUIRED = "hello_required"
    UNSUPPORTED_VERSION = "unsupported_version"
    FORBIDDEN = "forbidden"
    RATE_LIMITED = "rate_limited"
    UNKNOWN_COMMAND = "unknown_command"
    INTERNAL = "internal"


@dataclass(frozen=True)
class ProtocolError:
    code: str
    reason: str
    path: str = ""

    def frame(self, ref: Any = None) -> dict:
        out = {"type": "error", "code": self.code, "reason": self.reason}
        if self.path:
            out["path"] = self.path
        if ref is not None:
            out["ref"] = ref
        return out


@dataclass
class Checker:
    errors: list[ProtocolError] = field(default_factory=list)

    def fail(self, code: str, reason: str, path: str) -> None:
        self.errors.append(ProtocolError(code, reason, path))

    # Each helper returns True when the value is acceptable (None allowed if optional).
    def number(
        self,
        obj: dict,
        key: str,
        path: str,
        *,
        lo: float | None = 0.0,
        hi: float | None = None,
        optional: bool = True,
        integer: bool = False,
    ) -> bool:
        value = obj.get(key)
        where = f"{path}.{key}"
        if value is None:
            if optional:
                return True
            self.fail(ErrorCode.BAD_SCHEMA, "required number is missing", where)
            return False
        if isinstance(value, bool) or not isinstance(value, int | float):
            self.fail(ErrorCode.BAD_SCHEMA, "must be a number", where)
            return False
        if integer and not isinstance(value, int):
            self.fail(ErrorCode.BAD_SCHEMA, "must be an integer", where)
            return False
        if isinstance(value, float) and not math.isfinite(value):
            self.fail(ErrorCode.OUT_OF_RANGE, "must be finite (no NaN or infinity)", where)
            return False
        if lo is not None and value < lo:
            self.fail(ErrorCode.OUT_OF_RANGE, f"must be ≥ {lo:g}", where)
            return False
        if hi is not None and value > hi:
            self.fail(ErrorCode.OUT_OF_RANGE, f"must be ≤ {hi:g}", where)
            return False
        return True

    def string(
        self, obj: dict, key: str, path: str, *, optional: bool = False, choices=None,
        max_len: int = MAX_ID_LEN,
    ) -> bool:
        value = obj.get(key)
        where = f"{path}.{key}"
        if value is None:
            if optional:
                return True
            self.fail(ErrorCode.BAD_SCHEMA, "required string is missing", where)
            return False
        if not isinstance(value, str):
            self.fail(ErrorCode.BAD_SCHEMA, "must be a string", where)
            return False
        if len(value) > max_len:
            self.fail(ErrorCode.OUT_OF_RANGE, f"longer than {max_len} characters", where)
            return False
        if choices is not None and value not in choices:
            self.fail(ErrorCode.OUT_OF_RANGE, f"must be one of {', '.join(choices)}", where)
            return False
        return True

    def objects(self, obj: dict, key: str, path: str, limit: int) -> list[dict]:
        value = obj.get(key, [])
        where = f"{path}.{key}"
        if not isinstance(value, list):
            self.fail(ErrorCode.BAD_SCHEMA, "must be a list", where)
            return []
        if len(value) > limit:
            self.fail(ErrorCode.OUT_OF_RANGE, f"more than {limit} entries", where)
            return []
        good = []
        for i, item in enumerate(value):
            if isinstance(item, dict):
                good.append(item)
            else:
                self.fail(ErrorCode.BAD_SCHEMA, "must be an object", f"{where}[{i}]")
        return good

    def boolean(self, obj: dict, key: str, path: str) -> bool:
        value = obj.get(key)
        if value is None or isinstance(value, bool):
            return True
        self.fail(ErrorCode.BAD_SCHEMA, "must be true or false", f"{path}.{key}")
        return False
