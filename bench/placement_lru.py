"""Offline: how placing unmatched requests affects prefix hits when engines' caches evict.

Replays the Mooncake trace's hash ids (prompts shrunk 16× as in gateway_bench.py: one
512-token trace block = two 16-token engine blocks) over N engines with LRU caches of
C blocks, no timing. A request whose prefix some engine holds for ≥ 30 % of its blocks goes
there (the peers' and pdplane's prefix affinity); the others go by the placement rule:

- ``rr``: round robin (what a load-only rule amounts to with even load);
- ``inflow``: the engine that took the fewest new blocks so far (pdplane's
  ``cache_balance_band`` rule without the load bound; vllm-router's "smallest tree");
- ``random``.

    .venv/bin/python bench/placement_lru.py --window 600
"""

from __future__ import annotations

import argparse
import json
import random
from collections import OrderedDict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TRACE = ROOT.parent / "shared" / "data" / "traces" / "mooncake_synthetic.jsonl"


def engine_blocks(request: dict, prompt_scale: int = 16) -> tuple[list, int]:
    tokens = max(request["input_length"] // prompt_scale, 1)
    keys = []
    for i in range(len(request["hash_ids"])):
        prefix = tuple(request["hash_ids"][: i + 1])
        keys += [(prefix, 0), (prefix, 1)]
    return keys[: tokens // 16], tokens


def replay(requests: list[dict], rule: str, engines: int, capacity: int, seed: int = 0) -> float:
    rng = random.Random(seed)
    caches = [OrderedDict() for _ in range(engines)]
    inflow = [0] * engines
    hit = total = turn = 0
    for request in requests:
        keys, tokens = engine_blocks(request)
        match = []
        for cache in caches:
            k = 0
            while k < len(keys) and keys[k] in cache:
                k += 1
            match.append(k)
        best = max(match)
        if best > 0 and best >= 0.3 * len(keys):
            chosen = max(range(engines), key=lambda i: (match[i], -inflow[i]))
        elif rule == "rr":
            chosen, turn = turn % engines, turn + 1
        elif rule == "inflow":
            chosen = min(range(engines), key=lambda i: inflow[i])
        else:
            chosen = rng.randrange(engines)
        hit += match[chosen] * 16
        total += tokens
        cache = caches[chosen]
        for key in keys:
            if key in cache:
                cache.move_to_end(key)
            else:
                cache[key] = None
                inflow[chosen] += 1
                if len(cache) > capacity:
                    cache.popitem(last=False)
    return hit / total if total else 0.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", default=str(TRACE))
    ap.add_argument("--window", type=int, default=600)
    ap.add_argument("--engines", type=int, default=4)
    ap.add_argument("--capacity", type=int, default=5000, help="blocks per engine")
    args = ap.parse_args()
    with open(args.trace) as f:
        requests = [json.loads(line) for line in f]
    for start in range(0, len(requests) - args.window + 1, args.window):
        window = requests[start : start + args.window]
        row = {rule: replay(window, rule, args.engines, args.capacity)
               for rule in ("rr", "inflow", "random")}
        print(f"requests {start}–{start + args.window - 1}: "
              + ", ".join(f"{k} {v:.2%}" for k, v in row.items()))


if __name__ == "__main__":
    main()
