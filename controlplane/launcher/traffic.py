"""Demo traffic whose mix changes over time, so the planner has something to react to.

Phases repeat: chat (short prompts sharing a system prompt), RAG (long prompts over a few
shared documents), quiet. Requests stream through the gateway, alternating between the
demo's two models. Bounded: at most ``max_inflight`` requests at once.

Run: ``python -m controlplane.launcher.traffic --url http://127.0.0.1:8080``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import time
from dataclasses import dataclass

import aiohttp

# A small vocabulary is enough: the simulator tokenises one word per token.
WORDS = (
    "fleet", "gpu", "prefill", "decode", "cache", "token", "route", "latency", "model",
    "batch", "queue", "node", "link", "memory", "block", "prompt", "answer", "stream",
    "planner", "worker", "drain", "table", "version", "signal",
)


@dataclass(frozen=True)
class Phase:
    name: str
    seconds: float
    rate_rps: float
    prompt_words: int
    shared_words: int
    answer_tokens: int
    documents: int  # distinct shared prefixes
    only_model: str = ""  # send this phase's requests to one model ("" = alternate)


# Chat is light for 24 GPUs. RAG goes to the 70B model only: its long, mostly uncached
# prompts queue for prefill while aggregated (12 H200, 5 req/s of 10,000 tokens: TTFT p95
# predicted 3.5 s against the 2.5 s target, 69 % within targets; 10P:2D 100 %) — the case
# where a split pays. At 6,000 tokens aggregated served RAG within both targets (predicted
# and measured: TTFT p95 0.74 s, ITL p95 24 ms), so the planner rightly kept it and the
# demo's only split was a defect splitting the idle 8B model (issue 17).
PHASES = (
    Phase("chat", 60, 4.0, 600, 300, 150, 1),
    Phase("rag", 300, 5.0, 10000, 1500, 250, 8, only_model="llama-3.3-70b-fp8"),
    Phase("quiet", 60, 0.2, 400, 200, 50, 1),
)


def _text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


def _prefix(phase: Phase, doc: int) -> str:
    return _text(random.Random(f"{phase.name}-{doc}"), phase.shared_words)


class Traffic:
    def __init__(self, url: str, models: list[str], phases=PHASES, max_inflight: int = 48,
                 seed: int = 7):
        self.url = url.rstrip("/")
        self.models = models
        self.phases = phases
        self.max_inflight = max_inflight
        self.rng = random.Random(seed)
        self.inflight = 0
        self.counts = {"ok": 0, "error": 0, "skipped": 0}
        self.phase = phases[0].name
        self.stats_path = None

    async def run(self, stop: asyncio.Event) -> None:
        timeout = aiohttp.ClientTimeout(total=300, sock_connect=5)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            tasks: set[asyncio.Task] = set()
            n = 0
            while not stop.is_set():
                for phase in self.phases:
                    self.phase = phase.name
                    end = time.monotonic() + phase.seconds
                    while time.monotonic() < end and not stop.is_set():
                        await asyncio.sleep(self.rng.expovariate(phase.rate_rps))
                        if self.inflight >= self.max_inflight:
                            self.counts["skipped"] += 1
                            continue
                        n += 1
                        task = asyncio.create_task(self._one(session, phase, n))
                        tasks.add(task)
                        task.add_done_callback(tasks.discard)
                        self._write_stats()
                    if stop.is_set():
                        break
            for task in tasks:
                task.cancel()

    async def _one(self, session: aiohttp.ClientSession, phase: Phase, n: int) -> None:
        self.inflight += 1
        doc = self.rng.randrange(phase.documents)
        prompt = _prefix(phase, doc) + " " + _text(self.rng, phase.prompt_words -
                                                   phase.shared_words)
        model = (phase.only_model if phase.only_model in self.models
                 else self.models[n % len(self.models)])
        body = {"model": model, "prompt": prompt,
                "max_tokens": phase.answer_tokens, "stream": True}
        try:
            async with session.post(f"{self.url}/v1/completions", json=body) as resp:
                if resp.status != 200:
                    self.counts["error"] += 1
                    return
                async for _ in resp.content:
                    pass
                self.counts["ok"] += 1
        except (TimeoutError, aiohttp.ClientError):
            self.counts["error"] += 1
        finally:
            self.inflight -= 1
            self._write_stats()

    def _write_stats(self) -> None:
        if self.stats_path:
            # Write then rename: readers (the launcher, tests) never see a half-written file.
            tmp = self.stats_path.with_suffix(".tmp")
            tmp.write_text(json.dumps({"phase": self.phase, **self.counts,
                                       "inflight": self.inflight}))
            os.replace(tmp, self.stats_path)


def parse_phases(spec: str) -> tuple[Phase, ...]:
    """``chat=30,rag=60,quiet=10``: override phase durations (seconds), keep the order."""
    wanted = dict(item.split("=") for item in spec.split(",") if item)
    by_name = {p.name: p for p in PHASES}
    out = []
    for name, seconds in wanted.items():
        base = by_name[name]
        out.append(Phase(name, float(seconds), base.rate_rps, base.prompt_words,
                         base.shared_words, base.answer_tokens, base.documents,
                         base.only_model))
    return tuple(out)


def main(argv=None) -> int:
    from pathlib import Path

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--url", required=True, help="gateway base URL")
    parser.add_argument("--model", action="append", required=True)
    parser.add_argument("--phases", default="", help="e.g. chat=90,rag=120,quiet=60")
    parser.add_argument("--stats-file", default="")
    args = parser.parse_args(argv)
    traffic = Traffic(args.url, args.model, parse_phases(args.phases) if args.phases else PHASES)
    if args.stats_file:
        traffic.stats_path = Path(args.stats_file)

    async def runner():
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await traffic.run(stop)

    asyncio.run(runner())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
