"""Map-Guided Caching planners: a Temporal Variation Map in, a compute/reuse plan out.

Notation (docs/caching.md): ``T`` denoising steps, ``G`` block groups, ``V[t, g] >= 0`` the map
(how much group ``g``'s contribution changed from step ``t-1`` to ``t``). A plan is a boolean
``compute[t, g]``; where it is False the group's cached contribution from its last computed step
(its *anchor*) is reused.

- :func:`orientation_plan` (the *orientation planner*) decides, for every group and every number
  ``k`` of computed steps, *on which steps* to compute: dynamic programming over the map that
  minimises the accumulated drift of reused contributions (a global plan over all steps, not a
  per-step threshold).
- :func:`quantity_plan` (the *quantity planner*) turns a requested speedup into a compute budget
  and splits it over groups (Lagrangian bisection, then greedy top-up on marginal gains).
- :func:`nested_plan` plans the groups in execution order, each only on the steps where the group before
  it is computed, so a computed group never runs on an input built from reused (stale) contributions;
  the budget is split by one Lagrange multiplier over all groups (the default planner).
- :func:`threshold_plan` is the greedy per-step rule used as the ablation baseline.

Error model (our reading; the paper body is not public): reusing the anchor ``s`` at step ``u``
costs the drift accumulated since the anchor, ``D(s, u) = sum_{v=s+1..u} V[v]``, weighted by how much
an error made at step ``u`` moves the final output, ``w[u]`` (the step-sensitivity profile measured at
calibration; 1 everywhere when there is none); a segment that computes ``s`` and reuses ``s+1 .. e-1``
costs ``c(s, e) = sum_{u=s+1..e-1} w[u] D(s, u)``.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ..errors import ConfigError

INF = float("inf")


@dataclasses.dataclass(frozen=True)
class Guards:
    """Rules every plan keeps (the usual guard rails of step caches).

    ``warmup`` first steps and ``cooldown`` last steps are always computed (at least the first
    and the last); a group reuses its cache on at most ``max_reuse`` consecutive steps.
    """

    warmup: int = 1
    cooldown: int = 1
    max_reuse: int = 3

    def forced(self, steps: int) -> np.ndarray:
        f = np.zeros(steps, dtype=bool)
        f[: max(1, self.warmup)] = True
        f[steps - max(1, self.cooldown):] = True
        return f


@dataclasses.dataclass
class Plan:
    """``compute[t, g]`` with the costs it was planned under."""

    compute: np.ndarray  # [T, G] bool
    group_costs: np.ndarray  # [G], relative cost of one group evaluation
    predicted_error: float  # sum of segment costs under the map it was planned on

    @property
    def compute_fraction(self) -> float:
        """Executed over dense block compute."""
        total = self.group_costs.sum() * self.compute.shape[0]
        return float((self.compute * self.group_costs[None]).sum() / total)

    def to_dict(self) -> dict:
        return {"compute": self.compute.astype(int).tolist(), "group_costs": self.group_costs.tolist(),
                "compute_fraction": self.compute_fraction, "predicted_error": self.predicted_error}


def segment_costs(v: np.ndarray, guards: Guards, weights: np.ndarray | None = None) -> np.ndarray:
    """``C[g, s, e]``: cost of computing ``s``, reusing ``s+1..e-1`` and computing ``e`` next, per group.

    ``v`` is ``[T, G]``, ``weights`` ``[T]`` (the step sensitivity, default 1). Invalid segments
    (``e <= s``, longer than ``max_reuse`` reuses, or skipping a forced step) are ``inf``.
    """
    steps, groups = v.shape
    w = np.ones(steps) if weights is None else np.asarray(weights, dtype=np.float64)
    p = np.cumsum(v, axis=0)  # P[u] = sum_{v<=u} V[v]
    q = np.cumsum(w[:, None] * p, axis=0)  # Q[u] = sum_{x<=u} w[x] P[x]
    wc = np.cumsum(w)  # W[u] = sum_{x<=u} w[x]
    s = np.arange(steps)[:, None]
    e = np.arange(steps)[None, :]
    n_reused = e - s - 1
    # c(s, e) = sum_{u=s+1}^{e-1} w[u] (P[u] - P[s]) = (Q[e-1] - Q[s]) - (W[e-1] - W[s]) P[s]
    em1 = np.clip(e - 1, 0, None)[0]
    w_span = wc[em1][None, :] - wc[:, None]  # [s, e]
    cost = (q[em1][None, :, :] - q[:, None, :]) - w_span[:, :, None] * p[:, None, :]
    cost = np.where((n_reused >= 0)[:, :, None], np.maximum(cost, 0.0), INF)
    valid = (n_reused >= 0) & (n_reused <= guards.max_reuse)
    forced = guards.forced(steps)
    # a segment may not skip over a forced step: no forced u with s < u < e
    fc = np.cumsum(forced.astype(int))
    between = fc[np.clip(e - 1, 0, None)] - fc[s]
    valid &= ~((n_reused > 0) & (between > 0))
    cost[~valid] = INF
    return np.transpose(cost, (2, 0, 1))  # [G, s, e]


def orientation_plan(v: np.ndarray, guards: Guards, weights: np.ndarray | None = None
                     ) -> tuple[np.ndarray, np.ndarray]:
    """The orientation planner: for each group and each count ``k`` of computed steps, the best steps.

    Dynamic programming ``F[k][e] = min_s F[k-1][s] + c(s, e)`` with step 0 computed (``F[1][0] = 0``)
    and the last step computed. Returns ``best[g, k]`` (minimal accumulated drift with ``k`` computed
    steps; ``inf`` if impossible) and ``choice[g, k, T]`` (the computed steps as a boolean mask).
    """
    v = np.asarray(v, dtype=np.float64)
    steps, groups = v.shape
    cost = segment_costs(v, guards, weights)  # [G, s, e]
    f = np.full((steps + 1, groups, steps), INF)
    back = np.zeros((steps + 1, groups, steps), dtype=np.int64)
    f[1, :, 0] = 0.0
    for k in range(2, steps + 1):
        tot = f[k - 1][:, :, None] + cost  # [G, s, e]
        back[k] = np.argmin(tot, axis=1)
        f[k] = np.take_along_axis(tot, back[k][:, None, :], axis=1)[:, 0, :]
    best = f[:, :, steps - 1].T  # [G, k]
    choice = np.zeros((groups, steps + 1, steps), dtype=bool)
    for g in range(groups):
        for k in range(1, steps + 1):
            if not np.isfinite(best[g, k]):
                continue
            e = steps - 1
            for kk in range(k, 0, -1):
                choice[g, k, e] = True
                e = back[kk, g, e]
    return best, choice


def min_compute_steps(steps: int, guards: Guards) -> int:
    """The fewest computed steps any group can have under ``guards``."""
    forced = guards.forced(steps)
    count, run = 0, 0
    for t in range(steps):
        if forced[t] or run == guards.max_reuse:
            count, run = count + 1, 0
        else:
            run += 1
    return count


def max_speedup(steps: int, guards: Guards, overhead: float = 0.0) -> float:
    """The highest speedup a plan can reach (every group at its fewest computed steps)."""
    frac = min_compute_steps(steps, guards) / steps
    return 1.0 / (overhead + (1.0 - overhead) * frac)


def compute_budget(speedup: float, overhead: float) -> float:
    """Fraction of dense block compute that gives ``speedup`` when ``overhead`` of the time is outside blocks.

    ``overhead + (1 - overhead) * f = 1 / speedup``  =>  ``f = (1/speedup - overhead) / (1 - overhead)``.
    """
    return (1.0 / speedup - overhead) / (1.0 - overhead)


def _allocate(best: np.ndarray, costs: np.ndarray, budget_units: float) -> np.ndarray:
    """Split ``budget_units`` of compute over groups: Lagrangian bisection, then greedy top-up."""
    groups, kmax = best.shape[0], best.shape[1] - 1
    ks = np.arange(kmax + 1)

    def pick(lam: float) -> np.ndarray:
        obj = best + lam * ks[None, :] * costs[:, None]
        return np.argmin(obj, axis=1)

    lo, hi = 0.0, 1.0
    while (pick(hi) * costs).sum() > budget_units and hi < 1e12:
        hi *= 4.0
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        if (pick(mid) * costs).sum() > budget_units:
            lo = mid
        else:
            hi = mid
    k = pick(hi)
    # greedy top-up: spend what is left where one more computed step removes the most drift per cost
    used = float((k * costs).sum())
    while True:
        gains = np.full(groups, -INF)
        for g in range(groups):
            if k[g] < kmax and used + costs[g] <= budget_units + 1e-9:
                nxt = best[g, k[g] + 1:]
                finite = np.isfinite(nxt)
                if finite.any():
                    j = int(np.argmax(finite))  # next feasible count
                    if used + (j + 1) * costs[g] <= budget_units + 1e-9:
                        gains[g] = (best[g, k[g]] - nxt[j]) / ((j + 1) * costs[g])
        g = int(np.argmax(gains))
        if not np.isfinite(gains[g]):
            break
        j = int(np.argmax(np.isfinite(best[g, k[g] + 1:])))
        k[g] += j + 1
        used += (j + 1) * costs[g]
    return k


def _check_speedup(speedup: float, steps: int, guards: Guards, overhead: float) -> None:
    if speedup < 1.0:
        raise ConfigError(f"mapguided: speedup={speedup} is below 1; ask for 1 (no caching) or more.")
    top = max_speedup(steps, guards, overhead)
    if speedup > top * (1 + 1e-9):
        raise ConfigError(
            f"mapguided: speedup={speedup:g} is not reachable with {steps} steps: computing the first "
            f"{max(1, guards.warmup)} and last {max(1, guards.cooldown)} steps, reusing at most {guards.max_reuse} "
            f"steps in a row and {overhead:.0%} of the time outside the cached blocks, the most is {top:.2f}x. "
            "Lower the speedup, raise max_reuse, or use more steps.")


def _setup(v, speedup: float, guards: Guards, group_costs, overhead: float):
    """The map as float64, the group costs, and the compute budget in group-cost units (``None`` for a
    speedup of 1: compute everything). Raises :class:`ConfigError` for an impossible speedup."""
    v = np.asarray(v, dtype=np.float64)
    steps, groups = v.shape
    costs = np.ones(groups) if group_costs is None else np.asarray(group_costs, dtype=np.float64)
    _check_speedup(speedup, steps, guards, overhead)
    budget = None if speedup == 1.0 else compute_budget(speedup, overhead) * steps * costs.sum()
    return v, costs, budget


def quantity_plan(v: np.ndarray, speedup: float, guards: Guards, group_costs: np.ndarray | None = None,
                  overhead: float = 0.0, weights: np.ndarray | None = None) -> Plan:
    """The quantity planner: a requested ``speedup`` -> a budget -> computed steps per group -> a plan.

    ``overhead`` is the share of transformer time spent outside the planned blocks (embedders, final
    layer, hooks), measured by the cache itself. Raises :class:`ConfigError` for an impossible speedup.
    """
    v, costs, budget = _setup(v, speedup, guards, group_costs, overhead)
    steps, groups = v.shape
    if budget is None:
        return Plan(np.ones((steps, groups), dtype=bool), costs, 0.0)
    best, choice = orientation_plan(v, guards, weights)
    k = _allocate(best, costs, budget)
    compute = np.stack([choice[g, k[g]] for g in range(groups)], axis=1)
    err = float(sum(best[g, k[g]] for g in range(groups)))
    return Plan(compute, costs, err)


def lagrangian_path(cost: np.ndarray, allowed: np.ndarray, price: float) -> tuple[np.ndarray, float]:
    """One group's computed steps minimising ``drift + price * (computed steps)``, on allowed steps only.

    ``cost`` is the group's ``[s, e]`` segment cost (:func:`segment_costs`); ``allowed`` marks the steps
    it may be computed on (the first and last must be allowed). Dynamic programming over the end of the
    last segment, ``F[e] = min_s F[s] + c(s, e) + price``; returns the computed mask and its drift.
    """
    steps = cost.shape[0]
    if not (allowed[0] and allowed[-1]):
        raise ValueError("lagrangian_path: the first and the last step must be allowed")
    f = np.full(steps, INF)
    back = np.zeros(steps, dtype=np.int64)
    f[0] = 0.0
    blocked = np.where(allowed, 0.0, INF)
    for e in range(1, steps):
        if not allowed[e]:
            continue
        tot = f[:e] + blocked[:e] + cost[:e, e]
        back[e] = int(np.argmin(tot))
        f[e] = tot[back[e]] + price
    mask = np.zeros(steps, dtype=bool)
    e, drift = steps - 1, 0.0
    mask[e] = True
    while e > 0:
        s = back[e]
        drift += cost[s, e]
        mask[s] = True
        e = s
    return mask, float(drift)


def nested_frontier(v: np.ndarray, guards: Guards, group_costs: np.ndarray | None = None,
                    weights: np.ndarray | None = None):
    """The nested plans as a function of one price per unit of compute: ``price -> Plan``.

    Group ``g`` may be computed only on steps where group ``g-1`` is computed: at every step the computed
    groups form a prefix of the network and the reused ones a suffix, so no computed group reads an input
    assembled from cached contributions (with independent plans, a block computed after a reused one
    refreshes its cache from a stale input and carries that error forward). Each group is planned by
    :func:`lagrangian_path` under the same price per unit of compute (times the group's cost). Price 0
    computes every step; a higher price trades compute for predicted error; the plans of all prices are the
    planner's frontier, which :func:`nested_plan` searches for a budget and :func:`fastest_within` for a bound.
    """
    v = np.asarray(v, dtype=np.float64)
    steps, groups = v.shape
    costs = np.ones(groups) if group_costs is None else np.asarray(group_costs, dtype=np.float64)
    seg = segment_costs(v, guards, weights)  # [G, s, e]

    def at(price: float) -> Plan:
        allowed = np.ones(steps, dtype=bool)
        compute = np.zeros((steps, groups), dtype=bool)
        err = 0.0
        for g in range(groups):
            allowed, e = lagrangian_path(seg[g], allowed, price * costs[g])
            compute[:, g] = allowed
            err += e
        return Plan(compute, costs, err)

    at.price_scale = max(float(v.sum()), 1e-12) * steps  # a price of this order already reuses a lot
    return at


def price_edge(at, holds, iters: int = 40) -> tuple[float, float]:
    """Where along a frontier ``at(price) -> Plan`` the property ``holds(plan)`` stops holding.

    ``holds`` is true at price 0 (every step computed) and false from some price on (both searches below: "uses
    more than the budget", "within the error bound"). Returns ``(lo, hi)``: a price where it holds and one where it
    does not, ``iters`` halvings apart; ``(hi, hi)`` if it still holds at a price of 1e12.
    """
    hi = at.price_scale
    while holds(at(hi)):
        if hi >= 1e12:
            return hi, hi
        hi *= 4.0
    lo = 0.0
    for _ in range(iters):
        mid = 0.5 * (lo + hi)
        if holds(at(mid)):
            lo = mid
        else:
            hi = mid
    return lo, hi


def nested_plan(v: np.ndarray, speedup: float, guards: Guards, group_costs: np.ndarray | None = None,
                overhead: float = 0.0, weights: np.ndarray | None = None) -> Plan:
    """The orientation and quantity planners with groups nested in execution order (the default).

    The frontier of :func:`nested_frontier` searched for the cheapest price whose plan fits the compute budget
    of the requested speedup (the plan with the most compute within the budget).
    """
    v, costs, budget = _setup(v, speedup, guards, group_costs, overhead)
    steps, groups = v.shape
    if budget is None:
        return Plan(np.ones((steps, groups), dtype=bool), costs, 0.0)
    at = nested_frontier(v, guards, costs, weights)
    _, hi = price_edge(at, lambda plan: float((plan.compute * costs[None]).sum()) > budget + 1e-9)
    return at(hi)


nested_plan.frontier = nested_frontier


def plan_error(v: np.ndarray, compute: np.ndarray, weights: np.ndarray | None = None) -> float:
    """Weighted accumulated drift of a plan under a map (the quantity the orientation planner minimises)."""
    v = np.asarray(v, dtype=np.float64)
    w = np.ones(v.shape[0]) if weights is None else np.asarray(weights, dtype=np.float64)
    total = 0.0
    for g in range(v.shape[1]):
        drift = 0.0
        for t in range(v.shape[0]):
            if compute[t, g]:
                drift = 0.0
            else:
                drift += v[t, g]
                total += w[t] * drift
    return total


def threshold_plan(v: np.ndarray, speedup: float, guards: Guards, group_costs: np.ndarray | None = None,
                   overhead: float = 0.0, weights: np.ndarray | None = None) -> Plan:
    """Ablation baseline: a greedy per-step rule with the same budget.

    Walking the steps, a group reuses while the drift accumulated since its anchor stays under a
    threshold ``tau`` (and the guards allow); ``tau`` is bisected so the plan spends the same
    budget as :func:`quantity_plan`. This is how threshold caches (TeaCache, FBCache) decide.
    """
    v = np.asarray(v, dtype=np.float64)
    steps, groups = v.shape
    costs = np.ones(groups) if group_costs is None else np.asarray(group_costs, dtype=np.float64)
    if speedup <= 1.0:
        return Plan(np.ones((steps, groups), dtype=bool), costs, 0.0)
    budget = compute_budget(speedup, overhead) * steps * costs.sum()
    forced = guards.forced(steps)
    w = np.ones(steps) if weights is None else np.asarray(weights, dtype=np.float64)

    def walk(tau: float) -> np.ndarray:
        compute = np.zeros((steps, groups), dtype=bool)
        for g in range(groups):
            drift, run = 0.0, 0
            for t in range(steps):
                nxt = drift + v[t, g]
                if forced[t] or run == guards.max_reuse or w[t] * nxt > tau:
                    compute[t, g], drift, run = True, 0.0, 0
                else:
                    drift, run = nxt, run + 1
        return compute

    lo, hi = 0.0, float(v.sum()) * float(w.max()) + 1.0
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        if (walk(mid) * costs[None]).sum() > budget:
            lo = mid
        else:
            hi = mid
    compute = walk(hi)
    return Plan(compute, costs, plan_error(v, compute, weights))


# ---------------------------------------------------------------------------- the fidelity bound


def error_per_step(plan: Plan) -> float:
    """A plan's predicted error divided by its step count: the unit of ``mapguided:max_error``.

    The segment costs sum, over reused steps, the drift since the anchor; a denoising step moves the latents
    by about ``1 / steps`` of the way, so the error a plan makes in the output grows like the sum divided by
    the step count. Measured on the bundled model (benchmarks/caching.md): the same bound holds at 20 and 50
    steps, not at 10 (hence ``MIN_BOUND_STEPS`` in the cache's config).
    """
    return plan.predicted_error / plan.compute.shape[0]


def transformer_speedup(plan: Plan, overhead: float) -> float:
    """The transformer speedup a plan stands for when ``overhead`` of the time is spent outside the blocks."""
    return 1.0 / (overhead + (1.0 - overhead) * plan.compute_fraction)


def fastest_within(planner, v: np.ndarray, max_error: float, guards: Guards, group_costs: np.ndarray | None = None,
                   overhead: float = 0.0, weights: np.ndarray | None = None, tol: float = 0.01) -> tuple[Plan, float]:
    """The fastest plan whose :func:`error_per_step` stays within ``max_error``, and the speedup it stands for.

    A planner with a price frontier (``planner.frontier``, the nested planner's :func:`nested_frontier`) is
    searched along it directly: one bisection on the price, as cheap as planning one requested speedup.
    Any other planner is bisected on the requested speedup, between 1 (every block computed, no error) and the
    most the guards allow, to ``tol`` (a planner's predicted error grows as its budget shrinks); that costs one
    plan per halving. ``planner`` is one of :data:`PLANNERS`.
    """
    v = np.asarray(v, dtype=np.float64)
    top = max_speedup(v.shape[0], guards, overhead)
    frontier = getattr(planner, "frontier", None)
    if frontier is not None:
        at = frontier(v, guards, group_costs, weights)
        lo, _ = price_edge(at, lambda p: error_per_step(p) <= max_error)
        plan = at(lo)  # the largest price within the bound (the guards' fastest plan when even 1e12 is within)
        return plan, min(top, transformer_speedup(plan, overhead))

    def at(speedup: float) -> Plan:
        return planner(v, speedup, guards, group_costs, overhead, weights)

    plan = at(top)
    if error_per_step(plan) <= max_error:
        return plan, top
    lo, hi, best = 1.0, top, at(1.0)
    while hi - lo > tol:
        mid = 0.5 * (lo + hi)
        plan = at(mid)
        if error_per_step(plan) <= max_error:
            lo, best = mid, plan
        else:
            hi = mid
    return best, lo


# ---------------------------------------------------------------------------- planners by name


PLANNERS = {"nested": nested_plan, "dp": quantity_plan, "threshold": threshold_plan}
"""``planner=`` of Map-Guided Caching -> the function that makes the plan. Every planner has the signature
``plan(v, speedup, guards, group_costs, overhead, weights) -> Plan``."""


def fixed_plan(compute: np.ndarray):
    """A planner that ignores the map and returns ``compute`` (``[T, G]`` bool), e.g. for sensitivity probes."""
    fixed = np.asarray(compute, dtype=bool)

    def plan(v, speedup: float, guards: Guards, group_costs: np.ndarray | None = None, overhead: float = 0.0,
             weights: np.ndarray | None = None) -> Plan:
        costs = np.ones(fixed.shape[1]) if group_costs is None else np.asarray(group_costs, dtype=np.float64)
        return Plan(fixed, costs, 0.0)

    plan.compute = fixed
    return plan


def resample_profile(profile: np.ndarray, steps: int) -> np.ndarray:
    """A per-step weight profile (the step sensitivity) stored on its own step grid, read at ``steps``
    points of normalised time."""
    profile = np.asarray(profile, dtype=np.float64)
    if len(profile) == steps:
        return profile
    return np.interp(np.linspace(0, 1, steps), np.linspace(0, 1, len(profile)), profile)
