"""Distributions the cost model works on: prompt lengths as eight equal-probability
quantiles of a lognormal, the normal tail, weighted quantiles and the p95 of a sum of a fixed
part and a queue's wait. Pure numbers, no dependency on the rest of the planner.
"""

from __future__ import annotations

import math
from functools import lru_cache


def _clamp(x: float, lo: float, hi: float) -> float:
    return lo if x < lo else hi if x > hi else x


Z95 = 1.6448536269514722
POINTS = 8


def normal_tail(z: float) -> float:
    return 0.5 * math.erfc(z / math.sqrt(2.0))


def _inv_normal(p: float) -> float:
    """Standard normal quantile (Acklam's rational approximation, |error| < 1.2e-9)."""
    a = (-39.69683028665376, 220.9460984245205, -275.9285104469687, 138.3577518672690,
         -30.66479806614716, 2.506628277459239)
    b = (-54.47609879822406, 161.5858368580409, -155.6989798598866, 66.80131188771972,
         -13.28068155288572)
    c = (-0.007784894002430293, -0.3223964580411365, -2.400758277161838, -2.549732539343734,
         4.374664141464968, 2.938163982698783)
    d = (0.007784695709041462, 0.3224671290700398, 2.445134137142996, 3.754408661907416)
    p = _clamp(p, 1e-12, 1 - 1e-12)
    if p < 0.02425:
        q = math.sqrt(-2 * math.log(p))
        return (((((c[0] * q + c[1]) * q + c[2]) * q + c[3]) * q + c[4]) * q + c[5]) / (
            (((d[0] * q + d[1]) * q + d[2]) * q + d[3]) * q + 1)
    if p > 1 - 0.02425:
        return -_inv_normal(1 - p)
    q = p - 0.5
    r = q * q
    return (((((a[0] * r + a[1]) * r + a[2]) * r + a[3]) * r + a[4]) * r + a[5]) * q / (
        ((((b[0] * r + b[1]) * r + b[2]) * r + b[3]) * r + b[4]) * r + 1)


_MID = tuple(_inv_normal((i + 0.5) / POINTS) for i in range(POINTS))


# The fit pins the two numbers the predictions rest on: the mean (work, utilisation) and the
# p95 (the tail that sets TTFT p95). Where a lognormal has that mean and p95, a median adds
# nothing to either, and where the lengths are not lognormal it moves the tail: fed the
# trace's true median, the Mooncake cells' TTFT p95 median error went 0.5 % -> 22 %
# (docs/benchmarks.md, prediction accuracy), and every such window passed a consistency
# check at the histogram's resolution, so no such check separates them. The median sets σ
# only where no lognormal has that mean and p95: p95 ÷ mean >= exp(z₉₅² ÷ 2) ≈ 3.87, where
# the mean + p95 σ stops at z₉₅ (e.g. a what-if given p50 and p95 far apart).
MEAN_P95_MAX_RATIO = math.exp(Z95 * Z95 / 2)


def _sigma_mean_p95(mean: float, p95: float) -> float:
    """σ of the lognormal with this mean and p95: p95 ÷ mean = exp(Z σ − σ²/2), increasing
    in σ up to σ = Z (the largest ratio any lognormal reaches, where σ stops); bisection."""
    target = math.log(p95 / mean)
    lo, hi = 0.0, Z95
    if target >= Z95 * Z95 / 2:
        lo = hi
    for _ in range(40):
        if lo >= hi:
            break
        mid = (lo + hi) / 2
        if Z95 * mid - mid * mid / 2 < target:
            lo = mid
        else:
            hi = mid
    return lo


def median_sets_sigma(mean: float, p95: float, p50: float | None) -> bool:
    """Whether the p50 fixes σ: only where no lognormal has this mean and p95 (see
    :data:`MEAN_P95_MAX_RATIO`) and the p50 lies below the p95."""
    return bool(p50) and 0 < p50 < p95 and mean > 0 and p95 >= mean * MEAN_P95_MAX_RATIO


@lru_cache(maxsize=4096)
def length_points(mean: float, p95: float | None, p50: float | None = None) -> tuple[float, ...]:
    """Eight equal-probability lengths of a lognormal with this mean and p95, rescaled so
    their average is the mean; σ from p95 ÷ p50 instead where no lognormal has that mean and
    p95 (:func:`median_sets_sigma`); a point mass when the spread is unknown."""
    mean = max(mean, 0.0)
    if mean <= 0 or not p95 or p95 <= mean * 1.0001:
        return (mean,) * POINTS
    if median_sets_sigma(mean, p95, p50):
        sigma = math.log(p95 / p50) / Z95
    else:
        sigma = _sigma_mean_p95(mean, p95)
    pts = [math.exp(sigma * z) for z in _MID]
    scale = mean / (sum(pts) / POINTS)
    return tuple(x * scale for x in pts)


def weighted_quantile(pairs: list[tuple[float, float]], q: float) -> float:
    pairs = sorted(pairs)
    total = sum(w for _v, w in pairs)
    if total <= 0:
        return pairs[-1][0] if pairs else 0.0
    acc = 0.0
    for v, w in pairs:
        acc += w
        if acc >= q * total - 1e-12:
            return v
    return pairs[-1][0]


def wait_over(p_wait: float, mean_w: float):
    """P(W > t) = p_wait × exp(−t p_wait / mean_w): the queue model's waiting tail.

    The function carries ``at(x, fixed)``: the same values at t = x − f for every f in
    ``fixed``, in one call (what :func:`mixture_p95`'s bisection asks, step after step)."""
    dead = p_wait <= 0 or mean_w <= 0
    exp = math.exp

    def over(t: float) -> float:
        if t < 0:
            return 1.0
        if dead:
            return 0.0
        if t == 0:
            return p_wait
        return p_wait * exp(-t * p_wait / mean_w)

    def at(x: float, fixed: list[float]) -> list[float]:
        if dead:
            return [1.0 if x - f < 0 else 0.0 for f in fixed]
        return [1.0 if (t := x - f) < 0 else p_wait if t == 0
                else p_wait * exp(-t * p_wait / mean_w) for f in fixed]

    over.at = at
    return over


def over_at(wait_over):
    """``wait_over.at`` where it has one (:func:`wait_over`), else one call per point."""
    at = getattr(wait_over, "at", None)
    if at is not None:
        return at
    return lambda x, fixed: [wait_over(x - f) for f in fixed]


def mixture_p95(fixed: list[float], wait_over, wait_p95: float = 0.0) -> float:
    """x with mean_i P(W + fixed_i > x) = 0.05 (bisection). The answer lies between the
    largest fixed part alone and that plus the wait's own p95 (P(W > W95) = 5 %)."""
    if math.isinf(wait_p95):
        return math.inf
    lo, hi = min(fixed), max(fixed) + wait_p95 + 1e-9
    at = over_at(wait_over)
    n = len(fixed)
    if sum(at(hi, fixed)) / n > 0.05:  # numerical safety
        return hi
    for _ in range(18):
        mid = (lo + hi) / 2
        if sum(at(mid, fixed)) / n > 0.05:
            lo = mid
        else:
            hi = mid
    return hi


STALL_GRID = 64  # grid cells over the stall budget
STALL_MAX_COUNT = 12.0  # beyond this many expected stalls the normal (CLT) form is used


def busy_stall_share(target: float, base: float, base_sd: float, steps: float,
                     rate: float, jumps: list[float]) -> float | None:
    """P(a request's mean token gap ≤ ``target``) when its gaps are ``base`` (± ``base_sd``,
    normal: the batch's fluctuation) plus the stalls of the prompts prefilled beside it.

    Its decode life is a busy period started by its own work τ = ``steps`` × ``base``:
    prompts arrive at ``rate`` (Poisson), each adds a stall of one of the equally likely
    ``jumps`` (seconds beyond the pure steps), and a stall lengthens the life, so more
    prompts arrive. The total stall S has Takács's law: for n prompts of total stall y,
    P(S ∈ dy, n) = τ ÷ (τ + y) × Poisson(n; rate (τ + y)) × P(X₁ + … + Xₙ ∈ dy). The mean gap
    is base + S ÷ steps. Computed on a grid of :data:`STALL_GRID` cells when stalls are few
    (a handful of large jumps: most requests see none, a few see one — far from normal);
    None when the expected count exceeds :data:`STALL_MAX_COUNT` (the caller's normal form
    of the same law, mean and Takács variance, is then accurate)."""
    steps = max(steps, 1.0)
    tau = max(base, 0.0) * steps
    if tau <= 0 or rate < 0 or not jumps:
        return None
    # A prompt that stalls nothing (prefilled elsewhere) is no arrival here.
    positive = [x for x in jumps if x > 0]
    rate *= len(positive) / len(jumps)
    jumps = positive or [0.0]
    sd_span = 4.0 * max(base_sd, 0.0) * steps
    top = (target - base) * steps + sd_span  # stall beyond which the share is ~0
    if top <= 0:
        return 0.0
    if rate * (tau + top) > STALL_MAX_COUNT:
        return None
    h = top / STALL_GRID
    # Each jump's mass is split between the two grid cells around it, in the proportions
    # that keep its mean exact (rounding every jump the same way would shift a sum of n).
    per = 1.0 / len(jumps)
    moves: dict[int, float] = {}
    for x in jumps:
        lo = int(x // h)
        frac = x / h - lo
        for cell, share in ((lo, 1.0 - frac), (lo + 1, frac)):
            if share > 0 and cell <= STALL_GRID:
                moves[cell] = moves.get(cell, 0.0) + per * share
    if rate > 0 and moves.get(0, 0.0) > 0.5 * per:
        return None  # stalls too small to resolve on the grid: the normal form is better
    # The share of a jump that fell in cell 0 stalls nothing on the grid: those arrivals
    # are thinned out (a thinned Poisson stream is Poisson at the lower rate).
    kept = 1.0 - moves.pop(0, 0.0)
    if kept <= 1e-12:  # no prompt stalls anything on the grid (all jumps ~0): no arrivals
        rate, moves = 0.0, {}
    else:
        rate *= kept
        moves = {c: m / kept for c, m in moves.items()}

    # Per grid cell, what the sum below reads (computed once, not once per count n): the
    # busy-period factor τ ÷ (τ + y), the Poisson mean and its log, the share within target.
    cells = range(STALL_GRID + 1)
    ys = [cell * h for cell in cells]
    lams = [rate * (tau + y) for y in ys]
    factor = [tau / (tau + y) for y in ys]
    neg_lam = [-lam for lam in lams]
    log_lam = [math.log(lam) if lam > 0 else 0.0 for lam in lams]
    positive_lam = [lam > 0 for lam in lams]
    if base_sd <= 0:
        within = [1.0 if target - base - y / steps >= -1e-12 else 0.0 for y in ys]
    else:
        within = [normal_tail(-(target - base - y / steps) / base_sd) for y in ys]
    # The moves from each cell that stay on the grid, in the order of ``moves``.
    move_list = list(moves.items())
    reach: list[list[tuple[int, float]] | None] = [None] * (STALL_GRID + 1)
    exp, lgamma = math.exp, math.lgamma

    dist = {0: 1.0}  # P(X₁ + … + Xₙ = cell × h, the sum still on the grid), n = 0
    total = 0.0
    n = 0
    while dist:
        lg = lgamma(n + 1)
        nxt: dict[int, float] = {}
        get = nxt.get
        for cell, mass in dist.items():
            if positive_lam[cell]:
                poisson = exp(neg_lam[cell] + n * log_lam[cell] - lg)
            else:
                poisson = 1.0 if n == 0 else 0.0
            total += factor[cell] * poisson * mass * within[cell]
            to = reach[cell]
            if to is None:
                to = reach[cell] = [(cell + c, p) for c, p in move_list
                                    if cell + c <= STALL_GRID]
            for k, p in to:
                nxt[k] = get(k, 0.0) + mass * p
        dist = nxt
        n += 1
    return _clamp(total, 0.0, 1.0)


def miss_mixture(isl_pts: tuple[float, ...], hit: float, uncached_p95: float,
                 isl_p95: float) -> list[tuple[float, float]] | None:
    """(uncached, cached) tokens of the quantile prompts when the p95 of uncached tokens is
    a whole p95 prompt: the tail prompts miss the cache in full. A hit is per request (its
    prefix is cached where it lands, or not), so the prompts split into misses and hits,
    not a smooth spread around the mean share (a lognormal fitted to the uncached mean and
    p95 puts some prompts *below* any hit: 32k-token prompts with a 20 % shared prefix,
    uncached 21k–32k where every request computes 25.6k or 32k). The longest point misses
    (one in eight, the fewest misses the points resolve, and ≥ 5 % as the p95 says); the
    others hit the share that keeps the mean hit. None when that is not the case or the
    shares do not work out (then the caller's fit stands)."""
    if not isl_pts or uncached_p95 < 0.99 * isl_p95 or not 0 < hit < 1:
        return None
    total = sum(isl_pts)
    longest = max(range(len(isl_pts)), key=lambda i: (isl_pts[i], i))
    rest = total - isl_pts[longest]
    if rest <= 0:
        return None
    h = 1.0 - ((1.0 - hit) * total - isl_pts[longest]) / rest
    if not 0.0 <= h < 1.0:
        return None
    return [(x, 0.0) if i == longest else (x * (1.0 - h), x * h) for i, x in enumerate(isl_pts)]


def balanced_victims(batch: float, workers: int) -> float:
    """Decoding sequences a prompt stalls when dispatch sends it to the least-loaded of
    ``workers`` workers, ``batch`` decoding each on average: the pool's decoders D are a
    Poisson count (mean workers × batch), and balanced dispatch puts the prompt beside the
    fewest, ⌊D ÷ workers⌋ (perfect balance; random placement would give ``batch``).
    E⌊D/c⌋ = Σₖ P(D ≥ k c): exact Poisson tails up to a mean of 50, the normal form above,
    and once D spreads over many multiples of c its remainder is uniform: μ/c − (c − 1)/2c."""
    c = max(int(workers), 1)
    mu = max(batch, 0.0) * c
    if c == 1 or mu <= 0:
        return max(batch, 0.0)
    sd = math.sqrt(mu)
    if sd > 4 * c:
        return min(max(mu / c - (c - 1) / (2 * c), 0.0), batch)
    k_lo = max(1, int((mu - 10.0 * sd - 10.0) // c))
    out = float(k_lo - 1)  # P(D ≥ k c) = 1 to many decimals below k_lo
    k = k_lo
    # P(D < kc) = Σ_{j<kc} e^(−μ) μ^j / j!, carried from one k to the next (each k adds the
    # terms from the last k's kc up), not summed again from j = 0.
    term = cdf = math.exp(-mu)
    j = 1
    while k * c <= mu + 10.0 * sd + 10.0:
        if mu > 50:
            tail = normal_tail((k * c - 0.5 - mu) / sd)
        else:
            while j < k * c:
                term *= mu / j
                cdf += term
                j += 1
            tail = max(1.0 - cdf, 0.0)
        out += tail
        k += 1
    return min(out, batch)


def local_share_points(work: list[tuple[float, float]], limit: float,
                       share: float) -> list[tuple[float, float]]:
    """(uncached, cached) quantile prompts moved across the conditional-P/D threshold so that
    round(points × ``share``) of them have at most ``limit`` uncached tokens: the measured
    share of prompts prefilled on their decode worker. A lognormal fitted to mean and p95
    places the low end of a two-humped distribution badly (Mooncake: 40 % of its prompts
    are ≤ 512 tokens, the mean + p95 fit puts none of eight points there, and every split's
    decode pool is priced as if it prefilled nothing itself). The shortest points cross
    (down to the threshold, or just above it), each keeping its hit share; the prompt tokens
    they gain or lose go to or come from the points that stay remote, in proportion, so the
    mean prompt holds. Unchanged when the points already agree, or nothing can absorb it."""
    n = len(work)
    if n == 0 or limit <= 0 or share is None:
        return work
    k = min(max(round(n * _clamp(share, 0.0, 1.0)), 0), n)
    order = sorted(range(n), key=lambda i: (work[i][0], i))
    out = list(work)
    moved = set()
    for rank, i in enumerate(order):
        u, c = work[i]
        want = limit if rank < k else limit * (1.0 + 1e-6) + 1.0
        if (rank < k and u > limit) or (rank >= k and u <= limit and u > 0):
            scale = want / u
            out[i] = (want, c * scale)
            moved.add(i)
    if not moved:
        return work
    delta = sum(u + c for u, c in work) - sum(u + c for u, c in out)
    free = [i for i in order[k:] if i not in moved]
    mass = sum(out[i][0] + out[i][1] for i in free)
    if mass <= 0 or mass + delta <= 0:
        return work
    f = (mass + delta) / mass
    if f < 1 and any(out[i][0] * f <= limit for i in free):
        return work  # the remote points cannot give up that much and stay remote
    for i in free:
        out[i] = (out[i][0] * f, out[i][1] * f)
    return out
