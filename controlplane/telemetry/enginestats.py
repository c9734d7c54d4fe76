"""Glue: engine counter/histogram snapshots in hot state, and the planner's fleet figures.

Writes (from ingest, in the same pipeline as the report): per worker the newest snapshot
``P es:w:<worker>`` and a ring ``P esr:w:<worker>`` of one snapshot per HISTORY_STEP_S
(RING_POINTS kept, five minutes), both expiring when the engine stops reporting. So a delta
over any window up to five minutes can be taken from two snapshots (the newest, and the
ring's newest one old enough). Reads: :func:`fleet_engine_stats`, which the planner's
inputs call — Prometheus when ``PROMETHEUS_URL`` is set and answers, the agents otherwise.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

import orjson
from django.conf import settings

from . import hotstate
from .histograms import EngineSnapshot, FleetEngineStats, fleet_stats, window_delta

log = logging.getLogger(__name__)

RING_POINTS = 31  # at HISTORY_STEP_S (10 s): five minutes of windows
EXPIRE_S = 900
DEFAULT_WINDOW_S = 60.0


def latest_key(keys: hotstate.Keys, worker_id: int) -> str:
    return f"{keys.p}es:w:{worker_id}"


def ring_key(keys: hotstate.Keys, worker_id: int) -> str:
    return f"{keys.p}esr:w:{worker_id}"


def snapshot_commands(keys: hotstate.Keys, worker_id: int, ts: float, engine: dict,
                      now: float, history_due) -> list[tuple]:
    """Redis commands storing one engine's counters/histograms (none if it sent neither).

    Stored straight from the validated report (numbers and lists already checked by the
    protocol) in the shape :meth:`EngineSnapshot.from_json` reads: no per-bucket conversion
    on the ingest path."""
    counters, hists = engine.get("counters") or {}, engine.get("histograms") or {}
    if not counters and not hists:
        return []
    raw = orjson.dumps({"t": ts, "c": counters, "h": {
        name: {"le": h["le"], "counts": h["counts"], "sum": h.get("sum", 0.0)}
        for name, h in hists.items()}})
    latest = latest_key(keys, worker_id)
    cmds: list[tuple] = [("SET", latest, raw, "EX", EXPIRE_S)]
    ring = ring_key(keys, worker_id)
    if history_due(ring, now):
        cmds += [("RPUSH", ring, raw), ("LTRIM", ring, -RING_POINTS, -1),
                 ("EXPIRE", ring, EXPIRE_S)]
    return cmds


def report_snapshot_commands(workers: Mapping[str, int | None], report: dict, now: float,
                             keys: hotstate.Keys, history_due) -> list[tuple]:
    """:func:`snapshot_commands` for every engine of a validated report that maps to a
    worker (``workers``: engine id → worker id, as the consumer learned on hello)."""
    cmds: list[tuple] = []
    for eng in report.get("engines", ()):
        wid = workers.get(eng["id"])
        if wid is not None and ("counters" in eng or "histograms" in eng):
            cmds += snapshot_commands(keys, wid, report["ts"], eng, now, history_due)
    return cmds


def read_snapshots(worker_ids) -> dict[int, list[EngineSnapshot]]:
    """worker id → its snapshots, oldest first (ring, then the newest)."""
    ids = list(worker_ids)
    if not ids:
        return {}
    keys = hotstate.Keys()
    pipe = hotstate.sync_redis().pipeline(transaction=False)
    for wid in ids:
        pipe.lrange(ring_key(keys, wid), 0, -1)
        pipe.get(latest_key(keys, wid))
    raw = pipe.execute()
    out = {}
    for i, wid in enumerate(ids):
        snaps = [EngineSnapshot.from_json(orjson.loads(r)) for r in raw[2 * i]]
        if raw[2 * i + 1]:
            latest = EngineSnapshot.from_json(orjson.loads(raw[2 * i + 1]))
            if not snaps or latest.t > snaps[-1].t:
                snaps.append(latest)
        out[wid] = snaps
    return out


def agents_fleet_stats(workers: Mapping[int, str], window_s: float = DEFAULT_WINDOW_S
                       ) -> FleetEngineStats:
    """Fleet figures from the agents' snapshots; ``workers`` maps worker id → role."""
    series = read_snapshots(workers)
    return fleet_stats(((workers[wid], window_delta(snaps, window_s))
                        for wid, snaps in series.items()), window_s)


def fleet_engine_stats(model_name: str, workers: Mapping[int, str],
                       window_s: float = DEFAULT_WINDOW_S) -> FleetEngineStats:
    """Request rate, token rates, prompt/answer length p50/p95/mean and TTFT/ITL p50/p95
    of one served model over ``window_s``; ``source`` says where they came from.

    ``workers``: the model's worker ids → role ("prefill", "decode" or "both"). With
    ``PROMETHEUS_URL`` set the figures come from Prometheus (same quantities, same merge);
    if it fails or has no data, from the agents' snapshots in hot state.
    """
    url = getattr(settings, "PROMETHEUS_URL", None)
    if url:
        from controlplane.observability.promread import reader_for

        try:
            figures = reader_for(url).engine_stats(model_name, window_s)
        except Exception as exc:  # a bug or outage there must not stop planning
            log.warning("prometheus engine stats failed: %s", exc)
            figures = None
        if figures is not None:
            return figures
    try:
        return agents_fleet_stats(workers, window_s)
    except Exception as exc:  # Redis down: "no data", not an exception in the planner
        log.warning("engine snapshots unreadable: %s", exc)
        return FleetEngineStats(source="agents", window_s=window_s)
