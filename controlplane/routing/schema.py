"""Validation of routing tables against the JSON Schema plus the rules a schema can't say.

Pure (jsonschema only). :func:`validate_table` returns a list of human-readable problems;
empty means valid.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator

SCHEMA_PATH = Path(__file__).resolve().parent / "schema" / "routing-table-v1.json"


@cache
def table_schema() -> dict[str, Any]:
    return json.loads(SCHEMA_PATH.read_text())


@cache
def _validator() -> Draft202012Validator:
    return Draft202012Validator(table_schema())


def validate_table(table: Any) -> list[str]:
    problems = []
    for error in sorted(_validator().iter_errors(table), key=lambda e: list(e.absolute_path)):
        where = "/".join(str(p) for p in error.absolute_path) or "(root)"
        problems.append(f"{where}: {error.message}")
    if problems:
        return problems
    return _semantic_problems(table)


def _semantic_problems(table: dict[str, Any]) -> list[str]:
    problems = []
    names = [m["name"] for m in table["models"]]
    if len(set(names)) != len(names):
        problems.append("models: model names must be unique")
    for i, model in enumerate(table["models"]):
        ids = [w["id"] for w in model["workers"]]
        if len(set(ids)) != len(ids):
            problems.append(f"models/{i}/workers: worker ids must be unique")
        known = set(ids)
        for worker in model["workers"]:
            for path in worker["kv_paths"]:
                if path["to"] not in known:
                    problems.append(
                        f"models/{i}: kv path of {worker['id']} goes to unknown {path['to']}"
                    )
    return problems
