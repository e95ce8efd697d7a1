"""Fang et al.'s llfd / mintable / minmig / mixed: hand-computed examples, a slow pure-Python
reference of the documented rules, and properties of plans on random statistics."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from operators import registry
from operators.base import KeyStatistics, RoutingTable, SchemeError
from operators.keys import KeyBatch
from operators.schemes import fang
from operators.schemes.fang import migration_priority, rebalance

# §2.2 / Fig. 4: k1..k6 with costs 7, 4, 5, 2, 1, 1. h puts k1, k2, k6 on d1 (0) and k3, k4, k5
# on d2 (1); the old table holds (k3, d1) and (k6, d2), so d1 carries 16 and d2 carries 4.
FIG4_COST = np.array([7.0, 4, 5, 2, 1, 1])
FIG4_HASHED = np.array([0, 0, 1, 1, 1, 0])
FIG4_CURRENT = np.array([0, 0, 0, 1, 1, 1])


def fig4(strategy: str, max_table_size: int | None = None) -> fang.Rebalanced:
    return rebalance(
        FIG4_COST,
        FIG4_COST,  # w = 1: a key's state is its tuples of the interval
        FIG4_CURRENT,
        FIG4_HASHED,
        2,
        theta_max=0.0,
        strategy=strategy,
        max_table_size=max_table_size,
    )


def moved_state(result: fang.Rebalanced) -> float:
    return float(FIG4_COST[result.assignment != FIG4_CURRENT].sum())


# --- the paper's worked example, by hand ---------------------------------------------------


def test_llfd_worked_example() -> None:
    # Phase II takes k1 off d1 (16 -> 9). k1 fits nowhere (4 + 7 > 10): Adjust on d2 displaces
    # k4 (2, the heaviest cheaper key). k4 ties d1 at 9 vs 9, fails there (no key cheaper than
    # 2 on d1), and returns to d2 by displacing k5; k5 then fits d1: 10 and 10.
    result = fig4("llfd")
    assert result.assignment.tolist() == [1, 0, 0, 1, 0, 1]
    assert result.loads.tolist() == [10.0, 10.0]
    assert (result.candidates, result.displaced, result.fallbacks) == (1, 2, 0)
    assert result.feasible and result.triggered
    assert int(np.sum(result.assignment != FIG4_HASHED)) == 4  # Fig. 4: four entries
    assert moved_state(result) == 7 + 1  # k1 and k5 move


def test_mintable_worked_example() -> None:
    # Cleaning: d1 = k1 k2 k6 = 12, d2 = k3 k4 k5 = 8. k1 leaves d1 (5); k1 back on d1 needs
    # k2 displaced (12 - 4 = 8); k2 fails on d1 (only k6 = 1 cheaper, need 2), goes to d2 by
    # displacing k4; k4 fits d1 (8 + 2 = 10).
    result = fig4("mintable")
    assert result.assignment.tolist() == [0, 1, 1, 0, 1, 0]
    assert result.loads.tolist() == [10.0, 10.0]
    assert int(np.sum(result.assignment != FIG4_HASHED)) == 2  # Fig. 4: two entries
    assert moved_state(result) == 4 + 5 + 2 + 1  # k2, k3, k4, k6


def test_minmig_equals_llfd_when_state_is_cost() -> None:
    # w = 1 and s = c make γ = c^0.5, the same order as cost.
    assert fig4("minmig").assignment.tolist() == fig4("llfd").assignment.tolist()


def test_mixed_cleans_only_what_the_budget_needs() -> None:
    # R_max = 3: n = 0 gives MinMig's 4 entries, 1 too many; n = 1 moves back k6 (smallest
    # state): d1 = 17, k1 leaves (10) and fits d2 (3 + 7). Two entries, state moved 8 < 12.
    mixed = fig4("mixed", max_table_size=3)
    assert mixed.trials == [(0, 4), (1, 2)]
    assert mixed.assignment.tolist() == [1, 0, 0, 1, 1, 0]
    assert mixed.loads.tolist() == [10.0, 10.0]
    assert moved_state(mixed) == 7 + 1
    assert not mixed.degenerated and mixed.capped == 0


def test_mixed_accumulates_the_overrun() -> None:
    # R_max = 2: n = 0 overruns by 2, so n = 2 cleans both entries: MinTable's answer.
    mixed = fig4("mixed", max_table_size=2)
    assert mixed.trials == [(0, 4), (2, 2)]
    assert mixed.assignment.tolist() == fig4("mintable").assignment.tolist()
    assert mixed.feasible


def test_mixed_degenerates_to_mintable_then_caps() -> None:
    # R_max = 1: n would reach 3 > 2 entries, so MinTable runs (2 entries) and the cap keeps the
    # costlier entry (k2 -> d2), sending k4 back to h = d2: loads 8 and 12, infeasible.
    mixed = fig4("mixed", max_table_size=1)
    assert mixed.trials == [(0, 4), (2, 2)]
    assert mixed.degenerated and mixed.capped == 1
    assert mixed.assignment.tolist() == [0, 1, 1, 1, 1, 0]
    assert mixed.loads.tolist() == [8.0, 12.0]
    assert not mixed.feasible


def test_llfd_capped_keeps_costliest_entries() -> None:
    result = fig4("llfd", max_table_size=2)
    # LLFD's four entries are k1 (7), k3 (5), k5 (1), k6 (1); k1 and k3 stay.
    assert result.capped == 2
    assert result.assignment.tolist() == [1, 0, 0, 1, 1, 0]
    assert result.loads.tolist() == [10.0, 10.0]


def test_balanced_input_is_not_replanned() -> None:
    result = rebalance(
        np.array([5.0, 5]), np.array([5.0, 5]), np.array([0, 1]), np.array([1, 1]), 2,
        theta_max=0.0, strategy="mixed", max_table_size=1,
    )  # fmt: skip
    assert not result.triggered and result.assignment.tolist() == [0, 1]


def test_table_over_budget_triggers_even_when_balanced() -> None:
    result = rebalance(
        np.array([5.0, 5]), np.array([5.0, 5]), np.array([1, 0]), np.array([0, 1]), 2,
        theta_max=0.0, strategy="mintable", max_table_size=0,
    )  # fmt: skip
    assert result.triggered and result.assignment.tolist() == [0, 1]


def test_fallback_to_least_loaded_when_no_worker_accepts() -> None:
    # One key of cost 10 on 2 workers: bound 5, nothing cheaper to displace.
    result = rebalance(
        np.array([10.0, 0]), np.array([10.0, 1]), np.array([1, 1]), np.array([1, 1]), 2,
        theta_max=0.0, strategy="llfd",
    )  # fmt: skip
    assert result.assignment.tolist() == [0, 1]
    assert result.fallbacks == 1 and not result.feasible


def test_migration_priority() -> None:
    # §3.2: equal weights (β = 1) and w = 1 (S = c) give γ = 1 for every key.
    cost = np.array([7.0, 4.0])
    assert migration_priority(cost, cost, 1.0).tolist() == [1.0, 1.0]
    gamma = migration_priority(np.array([4.0, 9.0, 3.0, 0.0]), np.array([2.0, 3.0, 0.0, 0.0]), 1.5)
    assert gamma.tolist() == [4.0, 9.0, np.inf, 0.0]


def test_gamma_order_prefers_cheap_state() -> None:
    # Worker 0 carries k0 (cost 4, state 40) and k1 (cost 3, state 1), worker 1 k2 (1, 1):
    # loads 7 and 1, bound 4. MinMig takes k1 first (γ = 3^1.5 > 1 > 4^1.5/40) and it fits
    # worker 1; LLFD takes the costliest, k0, which fits worker 1 only by displacing k2.
    args = (np.array([4.0, 3, 1]), np.array([40.0, 1, 1]), np.array([0, 0, 1]), np.array([0, 0, 1]))
    minmig = rebalance(*args, 2, theta_max=0.0, strategy="minmig")
    llfd = rebalance(*args, 2, theta_max=0.0, strategy="llfd")
    assert minmig.assignment.tolist() == [0, 1, 1] and minmig.loads.tolist() == [4.0, 4.0]
    assert llfd.assignment.tolist() == [1, 0, 0] and llfd.loads.tolist() == [4.0, 4.0]
    assert (llfd.displaced, minmig.displaced) == (1, 0)


# --- a slow, literal reference of the documented rules --------------------------------------


def reference_rebalance(cost, state, current, hashed, W, theta, strategy, rmax, beta, max_trials):
    K = len(cost)
    bound = (1.0 + theta) * sum(cost) / W
    bound += 1e-9 * max(bound, 1.0)

    def loads_of(a):
        out = [0.0] * W
        for k in range(K):
            out[a[k]] += cost[k]
        return out

    entries = [k for k in range(K) if current[k] != hashed[k]]
    if max(loads_of(current)) <= bound and (rmax is None or len(entries) <= rmax):
        return list(current), [], False, 0

    def gamma(k):
        if state[k] > 0:
            return cost[k] ** beta / state[k]
        return 0.0 if cost[k] <= 0 else float("inf")

    by_cost = sorted(range(K), key=lambda k: (-cost[k], k))
    by_gamma = sorted(range(K), key=lambda k: (-gamma(k), k))
    clean = sorted(entries, key=lambda k: (state[k], k))

    def trial(n, phi):
        a = list(current)
        for k in clean[:n]:
            a[k] = hashed[k]
        L = loads_of(a)
        C = []
        for k in phi:
            if all(x <= bound for x in L):
                break
            d = a[k]
            if cost[k] > 0 and L[d] > bound:
                L[d] -= cost[k]
                a[k] = None
                C.append(k)
        rank = {k: i for i, k in enumerate(phi)}
        original = {d: [k for k in phi if a[k] == d] for d in range(W)}
        displaceable = {k for k in range(K) if a[k] is not None}
        pending = sorted(C, key=rank.get)
        while pending:
            k = pending.pop(0)
            c = cost[k]
            workers = sorted(range(W), key=lambda d: (L[d], d))
            for d in workers:
                if L[d] + c <= bound:
                    break
                need = L[d] + c - bound
                E, found = [], 0.0
                for other in original[d]:
                    if found >= need:
                        break
                    if other in displaceable and 0 < cost[other] < c:
                        E.append(other)
                        found += cost[other]
                if found >= need:
                    for other in E:
                        displaceable.discard(other)
                        a[other] = None
                        L[d] -= cost[other]
                        pending.append(other)
                    pending.sort(key=rank.get)
                    break
            else:
                d = workers[0]
            a[k] = d
            L[d] += c
        return a

    def size(a):
        return sum(a[k] != hashed[k] for k in range(K))

    trials = []
    if strategy == "mintable":
        a = trial(len(entries), by_cost)
        trials.append((len(entries), size(a)))
    elif strategy != "mixed" or rmax is None:
        a = trial(0, by_cost if strategy == "llfd" else by_gamma)
        trials.append((0, size(a)))
    else:
        n = 0
        while True:
            a = trial(n, by_gamma)
            trials.append((n, size(a)))
            if size(a) <= rmax:
                break
            n += size(a) - rmax
            if n >= len(entries) or len(trials) >= max_trials:
                a = trial(len(entries), by_cost)
                trials.append((len(entries), size(a)))
                break
    capped = 0
    if rmax is not None and size(a) > rmax:
        table = sorted((k for k in range(K) if a[k] != hashed[k]), key=lambda k: (-cost[k], k))
        for k in table[rmax:]:
            a[k] = hashed[k]
            capped += 1
    return a, trials, True, capped


@st.composite
def instances(draw):
    W = draw(st.integers(1, 5))
    K = draw(st.integers(1, 25))
    cost = draw(st.lists(st.integers(0, 20), min_size=K, max_size=K))
    state = draw(st.lists(st.integers(0, 30), min_size=K, max_size=K))
    hashed = draw(st.lists(st.integers(0, W - 1), min_size=K, max_size=K))
    override = draw(st.lists(st.one_of(st.none(), st.integers(0, W - 1)), min_size=K, max_size=K))
    current = [h if o is None else o for h, o in zip(hashed, override, strict=True)]
    return {
        "cost": [float(c) for c in cost],
        "state": [float(s) for s in state],
        "current": current,
        "hashed": hashed,
        "W": W,
        "theta": draw(st.sampled_from([0.0, 0.05, 0.2, 1.0])),
        "strategy": draw(st.sampled_from(fang.STRATEGIES)),
        "rmax": draw(st.sampled_from([None, 0, 1, 3, 10])),
        "beta": draw(st.sampled_from([1.0, 1.5, 2.0])),
        "max_trials": draw(st.sampled_from([1, 2, 10])),
    }


@settings(max_examples=400, deadline=None)
@given(instances())
def test_compiled_planner_matches_reference(case) -> None:
    result = rebalance(
        np.array(case["cost"]),
        np.array(case["state"]),
        np.array(case["current"]),
        np.array(case["hashed"]),
        case["W"],
        theta_max=case["theta"],
        strategy=case["strategy"],
        max_table_size=case["rmax"],
        beta=case["beta"],
        max_trials=case["max_trials"],
    )
    assignment, trials, triggered, capped = reference_rebalance(**case)
    assert result.assignment.tolist() == assignment
    assert result.trials == trials
    assert result.triggered == triggered
    assert result.capped == capped
    loads = np.bincount(result.assignment, weights=case["cost"], minlength=case["W"])
    assert result.loads.tolist() == loads.tolist()
    assert result.feasible == bool(loads.max() <= result.bound)
    if case["rmax"] is not None and triggered:
        assert np.sum(result.assignment != np.array(case["hashed"])) <= case["rmax"]


# --- the scheme objects: routing, statistics, plan ------------------------------------------


def stream(counts: dict[int, int], seed: int = 0) -> KeyBatch:
    keys = np.repeat(np.array(list(counts), dtype=np.int64), list(counts.values()))
    return KeyBatch.from_ints(np.random.default_rng(seed).permutation(keys))


def test_route_is_hash_then_table() -> None:
    scheme = registry.create("mixed", 4, replicas=50)
    keys = KeyBatch.from_ints(np.arange(1000))
    base = scheme.ring.owners(keys.key_ids())
    assert scheme.route(keys).tolist() == base.tolist()
    assert scheme.base_workers(keys).tolist() == base.tolist()
    moved = keys.key_ids()[:3]
    scheme.install(RoutingTable(moved, (base[:3] + 1) % 4))
    routed = scheme.route(keys)
    assert routed[:3].tolist() == ((base[:3] + 1) % 4).tolist()
    assert routed[3:].tolist() == base[3:].tolist()


def test_statistics_count_the_window(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fang, "_COUNTER_SLOTS", 2)  # make the key counter grow, and rehash
    scheme = registry.create("minmig", 3, window=2)
    intervals = [{1: 5, 2: 3}, {2: 4, 3: 1}, {3: 2, 4: 6}]
    for i, counts in enumerate(intervals):
        keys = stream(counts, seed=i)
        half = len(keys) // 2
        workers = np.concatenate([scheme.route(keys.slice(0, half)),
                                  scheme.route(keys.slice(half, len(keys)))])  # fmt: skip
        stats = scheme.statistics(reset=(i < 2))
    routed = np.bincount(workers, minlength=3)
    # last interval: frequency from interval 3, state from intervals 2 and 3
    ids = KeyBatch.from_ints(np.array([2, 3, 4])).key_ids()
    expected = {int(ids[0]): (0, 4), int(ids[1]): (2, 3), int(ids[2]): (6, 6)}
    got = {
        int(k): (f, s)
        for k, f, s in zip(stats.key_ids, stats.frequency, stats.state_size, strict=True)
    }
    assert got == expected
    assert stats.cost.tolist() == stats.frequency.tolist()
    assert stats.worker_loads.tolist() == routed.tolist() and stats.records == 8
    again = scheme.statistics(reset=True)  # reset=False above kept the interval open
    assert again.records == 8
    assert scheme.statistics().records == 0


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(-(2**63), 2**63 - 1), max_size=300), st.integers(0, 3))
def test_key_counter_counts_like_unique(pool, seed) -> None:
    rng = np.random.default_rng(seed)
    ids = np.array([*pool, 0, -1, 2**63 - 1], dtype=np.int64)
    stream = rng.choice(ids, size=3 * ids.size)
    counter = fang._KeyCounter(2)
    for part in np.array_split(stream, 4):
        counter.add(part)
    keys, counts = counter.items()
    expected_keys, expected_counts = np.unique(stream, return_counts=True)
    assert keys.tolist() == expected_keys.tolist()
    assert counts.tolist() == expected_counts.tolist()
    assert counter.slots.shape[0] >= 2 * keys.size


def test_plan_predicts_what_routing_then_does() -> None:
    counts = {k: int(300 / (k + 1) ** 0.8) + 1 for k in range(400)}
    scheme = registry.create("mixed", 5, theta_max=0.01, max_table_size=40, window=1)
    keys = stream(counts)
    scheme.route(keys)
    stats = scheme.statistics()
    table_before = scheme.table
    frozen = {f: getattr(stats, f).copy() for f in ("key_ids", "cost", "state_size")}
    plan = scheme.plan(stats)
    # purity: nothing installed, statistics untouched
    assert scheme.table is table_before and len(scheme.table) == 0
    for f, values in frozen.items():
        assert getattr(stats, f).tolist() == values.tolist()
    assert 10 <= len(plan.table) <= 40 and plan.table.version == 1
    scheme.install(plan.table)
    loads = np.bincount(scheme.route(keys), minlength=5)
    assert loads.tolist() == plan.details["loads_after"].tolist()
    assert plan.feasible and loads.max() <= 1.01 * loads.mean() * (1 + 1e-9)
    # entries only where the table disagrees with the hash (Eq. 1)
    base = scheme.ring.owners(plan.table.key_ids)
    assert np.all(base != plan.table.workers)
    # migration cost is the state of the keys whose worker changed
    moved = set(plan.moved_keys.tolist())
    state = dict(zip(stats.key_ids.tolist(), stats.state_size.tolist(), strict=True))
    assert plan.migration_cost == sum(state[k] for k in moved)
    assert moved == set(plan.table.key_ids.tolist())  # from an empty table, moved = entries


def test_plan_drops_dead_entries_and_keeps_balanced_tables() -> None:
    scheme = registry.create("mintable", 2, theta_max=1.0)
    keys = stream({1: 3, 2: 3})
    base = scheme.base_workers(keys)
    dead = KeyBatch.from_strings(["gone"]).key_ids()
    scheme.install(RoutingTable(dead, np.array([0])))
    scheme.route(keys)
    plan = scheme.plan(scheme.statistics())
    assert not plan.details["triggered"]
    # The dead entry is dropped, and reported as moved (back to its hash worker), with no cost.
    assert len(plan.table) == 0 and plan.moved_keys.tolist() == dead.tolist()
    assert plan.migration_cost == 0
    assert base.size == 6


def test_merged_sources_plan_like_one_source() -> None:
    counts = {k: int(500 / (k + 1) ** 0.9) + 1 for k in range(300)}
    keys = stream(counts)
    single = registry.create("minmig", 4, theta_max=0.02)
    single.route(keys)
    sources = [registry.create("minmig", 4, source=s, n_sources=2, theta_max=0.02) for s in (0, 1)]
    for s, source in enumerate(sources):
        source.route(keys.take(np.arange(s, len(keys), 2)))
    merged = KeyStatistics.merge([source.statistics() for source in sources])
    one, two = single.plan(single.statistics()), sources[0].plan(merged)
    assert one.table.as_dict() == two.table.as_dict()
    assert one.migration_cost == two.migration_cost
    assert len(one.table) >= 3 and one.feasible and one.details["imbalance_before"] > 1.1


def random_stats(draw_ids, costs, states) -> KeyStatistics:
    order = np.argsort(draw_ids)
    ids = np.asarray(draw_ids, dtype=np.int64)[order]
    cost = np.asarray(costs, dtype=np.float64)[order]
    return KeyStatistics(ids, cost, cost, np.asarray(states, np.float64)[order], np.zeros(3), 0)


@settings(max_examples=60, deadline=None)
@given(
    st.sampled_from(["llfd", "mintable", "minmig", "mixed"]),
    st.lists(
        st.tuples(st.integers(-(2**63), 2**63 - 1), st.integers(0, 50), st.integers(0, 80)),
        min_size=1,
        max_size=60,
        unique_by=lambda t: t[0],
    ),
    st.lists(st.integers(-(2**63), 2**63 - 1), max_size=30, unique=True),
    st.sampled_from([0, 2, 8, None]),
    st.sampled_from([0.0, 0.1, 0.5]),
)
def test_plan_properties_on_random_statistics(name, keys, table_keys, rmax, theta) -> None:
    ids, costs, states = zip(*keys, strict=True)
    stats = random_stats(ids, costs, states)
    scheme = registry.create(name, 3, theta_max=theta, max_table_size=rmax, replicas=20)
    existing = np.array(sorted(set(table_keys) | set(ids[: len(ids) // 3])), dtype=np.int64)
    targets = (scheme.ring.owners(existing) + 1) % 3
    scheme.install(RoutingTable(existing, targets, version=4))
    plan = scheme.plan(stats)
    again = registry.create(name, 3, theta_max=theta, max_table_size=rmax, replicas=20)
    again.install(RoutingTable(existing, targets, version=4))
    assert again.plan(stats).table.as_dict() == plan.table.as_dict()  # deterministic
    assert len(scheme.table) == existing.size  # pure
    if rmax is not None:
        assert len(plan.table) <= rmax
    assert np.all(scheme.ring.owners(plan.table.key_ids) != plan.table.workers)
    assert set(plan.table.key_ids.tolist()) <= set(ids)
    old = scheme.table.apply(stats.key_ids, scheme.ring.owners(stats.key_ids))
    new = plan.table.apply(stats.key_ids, scheme.ring.owners(stats.key_ids))
    dead = np.setdiff1d(existing, stats.key_ids)  # dropped entries move too (choice 11)
    assert plan.moved_keys.tolist() == stats.key_ids[old != new].tolist() + dead.tolist()
    assert plan.migration_cost == pytest.approx(stats.state_size[old != new].sum(), abs=0)
    loads = np.bincount(new, weights=stats.cost, minlength=3)
    assert plan.details["loads_after"].tolist() == loads.tolist()
    if plan.feasible:
        assert loads.max() <= (1 + theta) * loads.mean() * (1 + 1e-9) + 1e-9


def test_parameters_are_validated() -> None:
    with pytest.raises(SchemeError, match="theta_max"):
        registry.create("mixed", 4, theta_max=-0.1)
    with pytest.raises(SchemeError, match="window"):
        registry.create("llfd", 4, window=0)
    with pytest.raises(SchemeError, match="max_table_size"):
        registry.create("mintable", 4, max_table_size=-1)
    with pytest.raises(SchemeError, match="max_trials"):
        registry.create("mixed", 4, max_trials=0)
    with pytest.raises(SchemeError, match=r"valid: .*beta"):
        registry.create("mixed", 4, gamma=2)
    with pytest.raises(SchemeError, match="beta"):
        registry.create("llfd", 4, beta=2)  # LLFD orders by cost only
    assert registry.create("mixed", 4).params()["max_table_size"] == 3000


def test_planning_a_million_keys_is_feasible_and_balanced() -> None:
    # How fast is `skewer bench speed`'s to measure (bench/speed.py), not a test's.
    rng = np.random.default_rng(0)
    n_keys = 10**6
    ids = np.sort(rng.integers(-(2**63), 2**63 - 1, n_keys, dtype=np.int64))
    p = 1.0 / np.arange(1, n_keys + 1) ** 0.85
    cost = rng.multinomial(10**7, rng.permutation(p / p.sum())).astype(np.float64)
    stats = KeyStatistics(ids, cost, cost, cost, np.zeros(10), 10**7)
    scheme = registry.create("mixed", 10, theta_max=0.01)
    plan = scheme.plan(stats)
    assert plan.feasible and plan.details["imbalance_after"] <= 1.01 + 1e-9


def test_experiment_quick() -> None:
    from bench.experiments import fang as experiment
    from bench.fang_report import _pick

    result = experiment.run(quick=True)
    setup = experiment.QUICK
    assert result.name == "fang" and set(result.figures) == {"theta", "fluctuation", "tables"}
    fang_rows = [r for r in result.data["theta"] if r["scheme"] in experiment.FANG]
    assert len(fang_rows) == len(setup.thetas) * len(setup.windows) * 3
    for row in fang_rows + result.data["rate"]:
        assert 0.0 <= row["migration"] <= 100.0 and row["skew_after"] >= 1.0
    for row in fang_rows:
        assert row["table"] <= setup.table_limit
    for row in result.data["limit"]:
        if row["limit"] is not None:
            assert row["table_final"] <= row["limit"]
    # a stationary stream (f = 0): every Fang plan ends within θ_max
    for name in experiment.FANG:
        still = _pick(result.data["rate"], scheme=name, rate=0.0)
        assert still["skew_after"] <= 1 + setup.theta + 1e-9
    assert "### Where we agree with the paper" in result.markdown
    for figure in result.figures.values():
        figure.clf()


def test_readj_alpha_matches_gedik_allowance() -> None:
    from bench.experiments.fang import readj_alpha

    # Eq. 15: (α - 1) / (1 + α / (N - 1)) must give back θ.
    for theta, workers in [(0.08, 10), (0.3, 4)]:
        alpha = readj_alpha(theta, workers)
        assert (alpha - 1) / (1 + alpha / (workers - 1)) == pytest.approx(theta, rel=1e-12)
