"""Layout predictions on distributions: aggregated, P:D split, and pools side by side.

Pure arithmetic over :mod:`.costmodel` (hardware, links, the per-step cost of a worker). What
this module adds is that it works on the *distribution* of the load, not its mean:

* **Prompt lengths** are a :class:`LengthDist` — a lognormal fitted to the mean and p95
  (and p50 when known), or a point mass when only the mean is known — evaluated at eight
  equal-probability quantiles. Each quantile prompt gets its own prefill service time, KV
  bytes and transfer time; the queue sees their mean and spread (M/G/c with the service
  time's own squared coefficient of variation); TTFT p95 is solved from the mixture
  P(wait + service ≤ x) = 0.95, so the long-prompt tail sets it, not the mean.
* **Decode** step time is affine in the batch's total context; the batch is a Poisson
  count of sequences whose contexts follow the prompt distribution plus part of the answer.
  The ITL p95 is the 95th percentile of the step time under those fluctuations
  (aggregated: of the mixture of pure decode steps and steps carrying a prefill chunk of
  each quantile's size). A request's mean ITL is taken to move with the batch (a batch
  changes on the timescale of a request's life), so the share within the ITL target uses
  the same spread.
* **KV occupancy**: the decode pool's held tokens have mean B × E[context] and variance
  B × E[context²] (compound Poisson); the chance that they exceed the pool's capacity is
  the **preemption risk** (reported; requests at risk count as missing the targets).
* **KV transfer** per request over the path it takes: the path shares from placement, the
  quantile prompt's bytes, NIC queueing on cross-node paths.

Independent of the simulator (no import either way): the simulator is the check
(``bench/prediction_accuracy.py``), not the source of these formulas.
"""

from __future__ import annotations

import math

from .costmodel import (
    DEFAULT_PARAMS,
    GB,
    CostParams,
    ModelSpec,
    PathMix,
    Prediction,
    Timing,
    WorkerShape,
    Workload,
    _clamp,
    effective_gbs,
    kv_capacity_tokens,
    layout_name,
    mgc_wait,
    transfer_time_s,
)
from .dispatch import (
    IdMemo,
    dispatch_wait,
    exposure,
    p95_length,
    prompt_points,
    remote_service,
    tail_work,
)
from .distributions import (
    POINTS,
    Z95,
    busy_stall_share,
)
from .distributions import mixture_p95 as _mixture_p95
from .distributions import normal_tail as _normal_tail
from .distributions import wait_over as _wait_cdf_inv
from .distributions import weighted_quantile as _weighted_quantile
from .horizon import horizon_of, with_bursts
from .kvlinks import affine_transfer
from .pools import decode_local

# Per worker kind (model, shape, params) and by identity: KV capacity and bytes per token,
# and the step model (Timing.of hashes every field of the model and the GPU on each call).
_WORKER = IdMemo(64)
_TIMING = IdMemo(64)


def _worker(model: ModelSpec, shape: WorkerShape, params: CostParams) -> tuple[float, int]:
    return (kv_capacity_tokens(model, shape.gpu, shape.tp, params), model.kv_bytes_per_token)


def _preempt_risk(batch: float, ctx_pts: tuple[float, ...], cap_tokens: float,
                  extra_tokens: float = 0.0) -> float:
    """P(the batch's KV exceeds the capacity): compound Poisson, normal approximation."""
    if batch <= 0 or cap_tokens <= 0:
        return 0.0
    m1 = sum(ctx_pts) / len(ctx_pts)
    m2 = sum([c * c for c in ctx_pts]) / len(ctx_pts)
    need = batch * m1 + extra_tokens
    sd = math.sqrt(batch * m2)
    return _normal_tail((cap_tokens - need) / sd) if sd > 0 else float(need > cap_tokens)


def _capacity(rate: float, util: float) -> float:
    if util <= 0 or math.isinf(util) or math.isnan(util):
        return 0.0 if util and util > 0 else math.inf
    return rate / util


def _overloaded(layout: str, np_: int, nd: int, w: Workload, util: float, where: str,
                gpus: int, **extra) -> Prediction:
    # Overloaded: queues grow without bound, so in the long run nearly nothing meets the
    # targets. Goodput 0; layouts still rank among themselves by capacity_rps.
    base = {
        "layout": layout, "n_prefill": np_, "n_decode": nd, "rate_rps": w.rate_rps,
        "ttft_p95_s": math.inf, "itl_p95_s": extra.pop("itl_p95_s", math.inf),
        "itl_mean_s": extra.pop("itl_mean_s", math.inf), "prefill_s": extra.pop("prefill_s", 0.0),
        "queue_p95_s": math.inf, "transfer_s": extra.pop("transfer_s", 0.0),
        "transfer_mean_s": extra.pop("transfer_mean_s", 0.0),
        "decode_batch": extra.pop("decode_batch", 0.0),
        "kv_capacity_seqs": extra.pop("kv_capacity_seqs", 0),
        "kv_used": extra.pop("kv_used", 1.0), "utilisation": util, "bottleneck": where,
        "attainment": 0.0, "goodput_rps": 0.0, "gpus": gpus,
        "capacity_rps": _capacity(w.rate_rps, util), "overloaded": True,
    }
    base.update(extra)
    return Prediction(**base)


# Aggregated predictions by their inputs' identity: a planning cycle prices the layout as
# it is (all 'both': aggregated) and the aggregated candidate on the same Workload object,
# at the load now and at the planned load. Every input is frozen, so the same objects give
# the same prediction; an entry holds them, so their ids are not reused while it lives.
_AGG_CACHE: dict[tuple, tuple] = {}
_AGG_CACHE_MAX = 512


def predict_aggregated(
    model: ModelSpec, shape: WorkerShape, workers: int, w: Workload,
    params: CostParams = DEFAULT_PARAMS,
) -> Prediction:
    """Every worker prefills (in chunks mixed into decode steps) and decodes."""
    key = (id(model), id(shape), id(w), id(params), type(workers), workers)
    hit = _AGG_CACHE.get(key)
    if (hit is not None and hit[0] is model and hit[1] is shape and hit[2] is w
            and hit[3] is params):
        return hit[4]
    pred = with_bursts(w, lambda x: _aggregated(model, shape, workers, x, params)[0])
    if len(_AGG_CACHE) >= _AGG_CACHE_MAX:
        _AGG_CACHE.clear()
    _AGG_CACHE[key] = (model, shape, w, params, pred)
    return pred


def _aggregated(
    model: ModelSpec, shape: WorkerShape, workers: int, w: Workload, params: CostParams,
    remote_above: float | None = None,
) -> tuple[Prediction, float, float]:
    """(prediction, share within the TTFT target, share within the ITL target).

    ``remote_above``: the pool is a conditional P/D decode pool — quantile prompts whose
    uncached part is longer are prefilled in the prefill pool (they only decode here), and
    the TTFT share is over the prompts prefilled here."""
    gpus = workers * shape.tp
    cap_tokens, _kvb = _WORKER.get((model, shape, params), lambda: _worker(model, shape, params))
    cap_seqs = int(workers * (cap_tokens // max(w.context_full, 1.0)))
    name = "aggregated"
    if cap_tokens <= 0 or workers <= 0:
        return (_overloaded(name, 0, workers, w, math.inf, "weights do not fit", gpus,
                            fits=False), 0.0, 0.0)
    r = w.rate_rps / workers
    isl_pts, ctx_pts, work = prompt_points(w, split=remote_above is not None)
    here = [remote_above is None or u <= remote_above for u, _c in work]
    # Prompts prefilled elsewhere do no prefill work here (their KV arrives whole).
    work = [(u, c) if h else (0.0, u + c) for (u, c), h in zip(work, here, strict=True)]
    share_here = sum(here) / POINTS
    timing = _TIMING.get((model, shape), lambda: Timing.of(model, shape.gpu, shape.tp))
    ctx = w.context_mean
    chunk = float(params.chunk_tokens)
    batch = 0.0
    t_d = timing.step(0, ctx)
    rho_p = f = 0.0
    itl_mean = t_d
    services: list[float] = []
    steps: list[list[float]] = []
    # The batch's fixed point is found on the mean prompt (cheap), then every quantile
    # prompt is priced at that batch.
    # The loop's one prompt stands for those prefilled here, arriving at share_here × r.
    u_mean = (sum(u for (u, _c), h in zip(work, here, strict=True) if h) / sum(here)
              if remote_above is not None and any(here) else w.uncached_mean)
    for it in range(13):
        t_d = timing.step(batch, ctx)
        final = it == 12
        lengths = work if final else [(u_mean, w.isl_mean - u_mean)]
        services, steps = [], []
        for u, c in lengths:
            mine = _chunk_steps(timing, batch, ctx, u, c, chunk)
            steps.append(mine)
            services.append(sum(mine))
        weight = 1.0 if final else share_here
        mean_s = weight * sum(services) / len(lengths)
        mean_n = weight * sum([len(s) for s in steps]) / len(lengths)
        rho_p = r * mean_s
        if final:
            break
        if rho_p >= 1:
            break
        mixed = r * mean_n  # mixed steps per second
        pure = (1.0 - rho_p) / t_d
        f = mixed / (mixed + pure) if mixed + pure > 0 else 0.0
        mixed_mean = mean_s / mean_n if mean_n else t_d
        seen = exposure(w, batch, workers, params)
        itl_mean = t_d + seen * f * (mixed_mean - t_d)
        batch = r * w.osl_mean * itl_mean
    if len(services) != POINTS:  # stopped early (overloaded): price the quantiles anyway
        steps = [_chunk_steps(timing, batch, ctx, u, c, chunk) for u, c in work]
        services = [sum(x) for x in steps]
    mean_s = sum(services) / POINTS if services else 0.0
    rho_p = r * mean_s
    mean_n = sum([len(x) for x in steps]) / POINTS
    if rho_p < 1 and mean_n:
        mixed = r * mean_n
        pure = (1.0 - rho_p) / t_d
        f = mixed / (mixed + pure) if mixed + pure > 0 else 0.0
    seen = exposure(w, batch, workers, params)
    f_gap = seen * f  # share of a request's token gaps that carry a chunk
    if rho_p < 1 and mean_n:
        itl_mean = t_d + f_gap * (mean_s / mean_n - t_d)
    mean_u = u_mean
    kv_need = batch * w.context_mean + rho_p * w.isl_mean
    kv_used = kv_need / cap_tokens
    util = max(rho_p, kv_used)
    extra = {"kv_capacity_seqs": cap_seqs, "decode_batch": batch, "mixed_step_share": f,
             "itl_mean_s": itl_mean * params.itl_factor}
    if rho_p >= 1 or kv_used >= 1:
        where = "prefill (chunks mixed into decode steps)" if rho_p >= kv_used else "KV cache"
        return _overloaded(name, 0, workers, w, max(util, 1.0), where, gpus, **extra), 0.0, 0.0
    k = params.ttft_factor
    var_s = sum([(s - mean_s) ** 2 for s in services]) / POINTS
    cv2 = var_s / mean_s ** 2 if mean_s > 0 else 0.0
    over, wait_p95, queue_p95 = dispatch_wait(w, mean_s, workers, cv2, params)
    # Nothing to prefill (every prompt fully cached, or no prompt at all): one point, the
    # first token is one decode step. Averaged over its own points, not over POINTS: a
    # one-point list divided by eight scored a no-prompt load 12.5 % within targets, and
    # the demo's idle 8B model split for it (issue 17).
    fixed = services if mean_u > 0 else [t_d]
    # Eight points resolve a queue's tail, not the p95 of the service itself: that is the
    # p95 prompt's own prefill (what sets TTFT p95 when nobody waits).
    p95_len = p95_length(w, isl_pts)
    s95 = _chunked_service(timing, batch, ctx, *tail_work(w, p95_len), chunk)
    if remote_above is not None:  # TTFT of the prompts prefilled here only
        fixed = [x for x, h in zip(services, here, strict=True) if h] or [t_d]
        s95 = 0.0
    # A prompt that arrives while its worker is in a decode step waits for that step to end
    # (the residual, uniform over a step): P(in a step) = 1 − e^(−batch) (Poisson batch),
    # so the residual's p95 is t_d (1 − 0.05 ÷ P) when P ≥ 5 %, its mean t_d ÷ 2 × P.
    # (Light load: RTX chat-low-concurrency aggregated TTFT p95 0.097 s predicted without it,
    # 0.127 s simulated; t_d = 34 ms.)
    stepping = 1.0 - math.exp(-batch)
    res95 = t_d * (1.0 - 0.05 / stepping) if stepping > 0.05 else 0.0
    ttft_p95 = (max(_mixture_p95(fixed, over, wait_p95), s95 if mean_u > 0 else 0.0)
                + res95) * k
    slo_left = w.ttft_slo_s / k - t_d * stepping / 2.0
    p_ttft = sum([1.0 - over(slo_left - s) if s < slo_left else 0.0 for s in fixed]) / len(fixed)
    # Token gaps: pure decode steps, and steps carrying a chunk of each quantile's prompt.
    n_all = sum([len(s) for s in steps]) or 1
    gaps = [(t_d, 1.0 - f_gap)] + [(x, f_gap / n_all) for mine in steps for x in mine]
    jitter = _step_sd(timing, batch, ctx_pts)
    itl_p95 = (_weighted_quantile(gaps, 0.95) + Z95 * jitter) * params.itl_factor
    chunk_s = (mean_s / (n_all / POINTS) - t_d) if steps else 0.0
    # A request's mean ITL (what goodput counts): its life is an M/G/1 busy period started
    # by its own decode work (osl × t_d) and lengthened by every prompt prefilled on its
    # worker meanwhile (arrivals at r, each adding X = its chunks' time beyond t_d), which
    # lengthens the life further. Mean t_d + f × t_c (= t_d ÷ (1 − r E[X])); variance
    # r E[X²] t_d ÷ (osl (1 − r E[X])³) (Takács) — a stall lets more prompts in, so the
    # spread grows faster than the Poisson count of stalls alone — on top of the batch's.
    t_d_k, t_c_k = t_d * params.itl_factor, max(chunk_s, 0.0) * params.itl_factor
    sd_k = jitter * params.itl_factor
    n_out = max(w.osl_mean, 1.0)
    extra = [max(sum(x) - len(x) * t_d, 0.0) * params.itl_factor for x in steps]
    r_seen = r * seen  # prompts prefilled beside a given decoding request, per second
    rho_x = r_seen * sum(extra) / POINTS / params.itl_factor
    exact = (busy_stall_share(w.itl_slo_s, t_d_k, sd_k, n_out, r_seen, extra)
             if rho_x < 1 else None)
    if f_gap <= 0 or t_c_k <= 0 or rho_x >= 1:
        p_itl = 1.0 - _normal_tail((w.itl_slo_s - t_d_k) / max(sd_k, 1e-9)) if rho_x < 1 else 0.0
    elif exact is not None:  # few stalls: their skewed law, not its normal form (below)
        p_itl = exact
    else:
        mean_req = t_d_k + f_gap * t_c_k
        var_x = r_seen * sum([x * x for x in extra]) / POINTS * t_d / (n_out * (1 - rho_x) ** 3)
        sd_req = math.sqrt(sd_k ** 2 + var_x)
        p_itl = 1.0 - _normal_tail((w.itl_slo_s - mean_req) / max(sd_req, 1e-9))
    risk = _preempt_risk(batch, ctx_pts, cap_tokens, rho_p * w.isl_mean)
    attainment = _clamp(p_ttft * p_itl * (1.0 - risk), 0.0, 1.0)
    tail_service = max(fixed)
    return (Prediction(
        layout=name, n_prefill=0, n_decode=workers, rate_rps=w.rate_rps,
        ttft_p95_s=ttft_p95, itl_p95_s=itl_p95, itl_mean_s=itl_mean * params.itl_factor,
        prefill_s=tail_service * k, queue_p95_s=queue_p95 * k, transfer_s=0.0,
        transfer_mean_s=0.0, decode_batch=batch, kv_capacity_seqs=cap_seqs, kv_used=kv_used,
        utilisation=util, bottleneck="prefill" if rho_p >= kv_used else "KV cache",
        attainment=attainment, goodput_rps=w.rate_rps * attainment, gpus=gpus,
        mixed_step_share=f, chunk_s=max(chunk_s, 0.0), capacity_rps=_capacity(w.rate_rps, util),
        preempt_risk=risk,
    ), p_ttft, p_itl)


def _chunk_steps(timing: Timing, batch: float, ctx: float, u: float, cached: float,
                 chunk: float) -> list[float]:
    """The decode steps a prompt's uncached tokens ride on, one chunk each."""
    mine, done = [], 0.0
    while u - done > 1e-9:
        c = min(chunk, u - done)
        mine.append(timing.step(batch, ctx, c, cached + done))
        done += c
    return mine


def _chunked_service(timing, batch, ctx, u, cached, chunk) -> float:
    return sum(_chunk_steps(timing, batch, ctx, u, cached, chunk))


def _step_sd(timing: Timing, batch: float, ctx_pts: tuple[float, ...]) -> float:
    """Spread of a decode step's time from the batch's Poisson count and context mix: each
    sequence adds (context × KV bytes ÷ bandwidth + per-sequence cost)."""
    if batch <= 0:
        return 0.0
    per = [c * timing.kv_bytes_per_token / timing.mem_bw + timing.per_seq_s for c in ctx_pts]
    m2 = sum([x * x for x in per]) / len(per)
    return math.sqrt(batch * m2)


def predict_split(
    model: ModelSpec, shape: WorkerShape, n_prefill: int, n_decode: int, w: Workload,
    paths: PathMix, params: CostParams = DEFAULT_PARAMS,
) -> Prediction:
    """``n_prefill`` workers prefill whole prompts, ship the KV, ``n_decode`` workers decode."""
    return with_bursts(w, lambda x: _split(model, shape, n_prefill, n_decode, x, paths, params))


# What a split's prediction reads of its Workload and its links, whatever the counts: the
# remote prompts' prefill times, each link's rate and transfer coefficients (by identity).
_REMOTE = IdMemo(256)
_LINK_RATE = IdMemo(64)
_LINK_AFFINE = IdMemo(64)


def _split(model: ModelSpec, shape: WorkerShape, n_prefill: int, n_decode: int, w: Workload,
           paths: PathMix, params: CostParams) -> Prediction:
    name = layout_name(n_prefill, n_decode)
    gpus = (n_prefill + n_decode) * shape.tp
    cap_tokens, kvb = _WORKER.get((model, shape, params), lambda: _worker(model, shape, params))
    cap_seqs = int(n_decode * (cap_tokens // max(w.context_full, 1.0)))
    if cap_tokens <= 0:
        return _overloaded(name, n_prefill, n_decode, w, math.inf, "weights do not fit", gpus,
                           fits=False)
    if n_prefill <= 0 or n_decode <= 0:
        return _overloaded(name, n_prefill, n_decode, w, math.inf, "empty pool", gpus,
                           kv_capacity_seqs=cap_seqs)
    isl_pts, ctx_pts, work = prompt_points(w)
    timing = _TIMING.get((model, shape), lambda: Timing.of(model, shape.gpu, shape.tp))
    # Conditional P/D: short uncached prompts are prefilled by their decode worker, in its
    # decode steps (gateway.router "pd_local_prefill"), so that pool is aggregated for them.
    lim = w.local_prefill_max_tokens
    remote = [i for i, (u, _c) in enumerate(work) if lim <= 0 or u > lim]
    local_share = 1.0 - len(remote) / POINTS
    local = None
    if local_share > 0:
        local, p_ttft_local, p_itl_local = _aggregated(
            model, shape, n_decode, w, params, remote_above=float(lim))
        if not remote or local.overloaded:
            return decode_local(local, name, n_prefill, n_decode, gpus, local_share)
    services, isl_pts_r, mean_s, cs2 = _REMOTE.get(
        (w, timing, params), lambda: remote_service(w, timing, params, remote))
    remote_rate = w.rate_rps * (1.0 - local_share)
    wait = mgc_wait(remote_rate, mean_s, n_prefill, cs2, w.arrival_cv2)
    hw = horizon_of(w, remote_rate, mean_s, n_prefill, cs2)  # None: the steady state
    nbytes_mean = w.isl_mean * kvb
    # Transfer per quantile prompt: the share-weighted path time, and for the tail the
    # slowest path carrying ≥ 5 % of transfers; NIC paths queue (M/M/1 inflation).
    inflate: dict[int, float] = {}
    link_util = 0.0
    shares = paths.shares()
    for i, (share, link) in enumerate(shares):
        if share <= 0:
            continue
        if link is None or link.gbs <= 0:
            return _overloaded(name, n_prefill, n_decode, w, math.inf, "no KV path", gpus,
                               kv_capacity_seqs=cap_seqs)
        inflate[i] = 1.0
        if link.kind in ("rdma", "tcp"):
            per_nic = remote_rate * share * nbytes_mean / max(paths.network_nodes, 1)
            link_util = per_nic / _LINK_RATE.get((link, params),
                                                 lambda lk=link: effective_gbs(lk, params) * GB)
            if link_util >= 1:
                t_one = transfer_time_s(max(isl_pts) * kvb, link, params)
                return _overloaded(name, n_prefill, n_decode, w,
                                   max(link_util, wait.utilisation),
                                   f"KV transfer over {link.describe()}", gpus,
                                   network_share=paths.network, network_link=link.describe(),
                                   transfer_s=t_one, transfer_mean_s=t_one,
                                   transfer_bytes=nbytes_mean, kv_capacity_seqs=cap_seqs)
            inflate[i] = 1.0 / (1.0 - link_util)
    slow = None
    acc = 0.0
    for i in sorted(inflate, reverse=True):  # network, then PCIe, then NVLink
        slow = i
        acc += shares[i][0]
        if acc >= 0.05:
            break

    # Transfer time is affine in the bytes (set-up latency + bytes ÷ rate): one pair of
    # coefficients per path, so eight quantile prompts cost eight multiply-adds.
    coef = {}
    for i in inflate:
        lk = shares[i][1]
        lat, per_byte = _LINK_AFFINE.get((lk, params), lambda lk=lk: affine_transfer(lk, params))
        coef[i] = ((lat - per_byte) * inflate[i], per_byte * inflate[i])

    def xfer(nbytes: float, i: int) -> float:
        a, b = coef[i]
        return a + b * nbytes if nbytes > 0 else 0.0

    mean_a = sum([shares[i][0] * coef[i][0] for i in coef])
    mean_b = sum([shares[i][0] * coef[i][1] for i in coef])
    t_pts_mean = [mean_a + mean_b * x * kvb if x > 0 else 0.0 for x in isl_pts_r]
    t_pts_tail = [xfer(x * kvb, slow) if slow is not None else 0.0 for x in isl_pts_r]
    t_mean = sum(t_pts_mean) / len(remote)
    # Decode pool: batch b solves b = r × osl × step(b) (Little's law).
    r = w.rate_rps / n_decode
    step = timing.decode_affine(w.context_mean)
    load = r * w.osl_mean * step.per_seq_s
    rho_pre = wait.utilisation
    k = params.ttft_factor
    common = {
        "prefill_s": max(services) * k, "transfer_s": max(t_pts_tail), "transfer_mean_s": t_mean,
        "kv_capacity_seqs": cap_seqs, "network_share": paths.network,
        "network_link": paths.network_link.describe() if paths.network_link else "",
        "transfer_bytes": nbytes_mean,
    }
    if load >= 1:
        return _overloaded(name, n_prefill, n_decode, w, max(load, rho_pre, 1.0), "decode",
                           gpus, **common)
    batch = r * w.osl_mean * step.fixed_s / (1.0 - load)
    t_d = step.at(batch)
    kv_used = batch * w.context_mean / cap_tokens
    if (rho_pre >= 1 and hw is None) or kv_used >= 1:
        where = "prefill" if rho_pre >= kv_used else "decode KV cache"
        return _overloaded(name, n_prefill, n_decode, w, max(rho_pre, kv_used), where, gpus,
                           decode_batch=batch, kv_used=kv_used, itl_p95_s=t_d,
                           itl_mean_s=t_d, **common)
    over, q95 = _wait_cdf_inv(wait.p_wait, wait.mean_s), wait.p95_s
    if hw is not None:  # a finite horizon: the transient wait (any ρ), not the stationary one
        over, q95 = hw.over, hw.p95_s
    # TTFT of quantile i: wait + prefill + transfer (the tail path for the p95) + the
    # decode worker's first step.
    fixed_tail = [s + (t / k) + t_d for s, t in zip(services, t_pts_tail, strict=True)]
    fixed_mean = [s + (t / k) + t_d for s, t in zip(services, t_pts_mean, strict=True)]
    p95_len = p95_length(w, isl_pts)
    tail_u = tail_work(w, p95_len)
    s95 = (timing.prefill(*tail_u, params.chunk_tokens)
           + t_d + (xfer(p95_len * kvb, slow) / k if slow is not None else 0.0)
           if lim <= 0 or tail_u[0] > lim else 0.0)
    ttft_p95 = max(_mixture_p95(fixed_tail, over, q95), s95) * k
    slo_left = w.ttft_slo_s / k
    p_ttft = sum([1.0 - over(slo_left - s) if s < slo_left else 0.0
                  for s in fixed_mean]) / len(remote)
    sd = _step_sd(timing, batch, ctx_pts)
    itl = t_d * params.itl_factor
    itl_p95 = (t_d + Z95 * sd) * params.itl_factor
    p_itl = 1.0 - _normal_tail((w.itl_slo_s - itl) / max(sd * params.itl_factor, 1e-9))
    risk = _preempt_risk(batch, ctx_pts, cap_tokens)
    if local is not None:
        # The decode pool also prefills the short prompts: its steps, batch and KV are the
        # aggregated pool's; TTFT mixes both paths (a mixture's p95 is at most the larger
        # p95 of parts carrying ≥ 5 %).
        p_ttft = (1.0 - local_share) * p_ttft + local_share * p_ttft_local
        p_itl, risk = p_itl_local, local.preempt_risk
        itl, itl_p95, batch = local.itl_mean_s, local.itl_p95_s, local.decode_batch
        kv_used = max(kv_used, local.kv_used)
        parts = [x for x, sh in ((ttft_p95, 1.0 - local_share), (local.ttft_p95_s, local_share))
                 if sh >= 0.05]
        ttft_p95 = max(parts)
        load = max(load, local.utilisation)
    attainment = _clamp(p_ttft * p_itl * (1.0 - risk), 0.0, 1.0)
    util = max(rho_pre, load, kv_used, link_util)
    bottleneck = max(
        [("prefill", rho_pre), ("decode", load), ("decode KV cache", kv_used),
         ("KV transfer", link_util)],
        key=lambda x: x[1],
    )[0]
    return Prediction(
        layout=name, n_prefill=n_prefill, n_decode=n_decode, rate_rps=w.rate_rps,
        ttft_p95_s=ttft_p95, itl_p95_s=itl_p95, itl_mean_s=itl, queue_p95_s=q95 * k,
        decode_batch=batch, kv_used=kv_used, utilisation=util, bottleneck=bottleneck,
        attainment=attainment, goodput_rps=w.rate_rps * attainment, gpus=gpus,
        capacity_rps=_capacity(w.rate_rps, util), preempt_risk=risk,
        local_prefill_share=local_share, overloaded=rho_pre >= 1, **common,
    )

