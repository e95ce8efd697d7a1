"""The migration protocol's Redis steps against a real Redis, one step at a time.

Workers' applies (with TABLE_SWITCH bookkeeping and hold-back), MIGRATE, COMPLETE, the
aggregator's close of a window with held records, and a controller restarted in the middle of
a migration -- each with exact counts, so nothing lost and nothing counted twice is checked
record by record (pipeline/stages/control_plane.py has the protocol and its diagram).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping

import numpy as np
import pytest
from worker_batches import SUMS, batch

from operators import registry
from operators.aggregates import StateField
from operators.base import RoutingTable
from operators.keys import KeyBatch
from pipeline.io.control_store import (
    HISTORY_SECONDS,
    ControlPlane,
    PublishedTable,
    StatisticsReport,
)
from pipeline.io.records import END_OF_STREAM
from pipeline.io.state_store import StateStore
from pipeline.stages.control_plane import compact_report
from pipeline.stages.controller import Controller, ControllerOptions

pytestmark = pytest.mark.integration

W, S = 3, 2


@pytest.fixture
def run_id() -> str:
    return f"test-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def store(redis, run_id: str) -> StateStore:
    return StateStore(redis, run_id)


@pytest.fixture
def plane(redis, run_id: str) -> ControlPlane:
    return ControlPlane(redis, run_id)


def apply(
    store: StateStore,
    worker: int,
    batch_id: int,
    counts: Mapping[tuple[int, bytes], int],
    switches: Mapping[int, int] | None = None,
    marks: Mapping[int, int] | None = None,
) -> None:
    assert store.apply(batch(worker, batch_id, counts, marks, switches=switches), n_sources=S)


def publish_move(plane: ControlPlane, key: bytes, old: int, new: int, version: int = 1) -> None:
    table = RoutingTable(KeyBatch.from_bytes([key]).key_ids(), [new], version=version)
    plane.publish(PublishedTable(table, [key]), {old: {key: new}}, {"workers": W})


def test_a_moved_key_is_held_until_its_old_worker_drains_then_moved_once(store, plane) -> None:
    apply(store, 0, 1, {(0, b"k"): 5, (0, b"j"): 2, (10_000, b"k"): 4})
    apply(store, 1, 1, {(0, b"m"): 1})
    publish_move(plane, b"k", old=0, new=1)
    assert plane.current().version == 1 and plane.current().migrating == 1

    # Source 0 switched: its records of k now reach worker 1, which holds them back.
    apply(store, 1, 2, {(0, b"k"): 3, (0, b"m"): 1}, switches={0: 1})
    assert store.partial(1, 0) == {b"m": 2}
    assert store.client.hgetall(store.keys.held(1, 0)) == {b"k": b"3"}
    assert plane.migration(1)["held_records"] == 3
    assert store.per_worker("held", W).tolist() == [0, 3, 0]

    # Worker 0 has seen no marker yet: not drained, nothing moves.
    moved = plane.migrate(1, 0, S)
    assert (moved.status, moved.waiting_for_source) == (-2, 0)
    # Source 1 still routes by version 0: its records of k still reach worker 0.
    apply(store, 0, 2, {(0, b"k"): 2}, switches={0: 1})
    assert plane.migrate(1, 0, S).waiting_for_source == 1
    apply(store, 0, 3, {(0, b"k"): 1}, switches={1: 1})  # the last marker: drained

    moved = plane.migrate(1, 0, S)
    assert (moved.status, moved.keys, moved.state_entries, moved.released_records) == (
        1,
        1,
        2,
        3,
    )
    assert moved.state_bytes == len(b"k") + len(b"8") + len(b"k") + len(b"4")
    assert store.partial(0, 0) == {b"j": 2} and store.partial(0, 10_000) == {}
    # 5 + 2 + 1 counted at worker 0, 3 held at worker 1: 11, once.
    assert store.partial(1, 0) == {b"m": 2, b"k": 11}
    assert store.partial(1, 10_000) == {b"k": 4}
    assert store.client.exists(store.keys.held(1, 0)) == 0
    assert plane.migrate(1, 0, S).status == 0  # guarded: a second call moves nothing
    assert plane.old_workers(1, W) == []

    assert plane.complete(1) is True
    assert plane.complete(1) is False
    assert plane.current().migrating is None
    (record,) = plane.rebalances()
    assert record["version"] == 1 and record["phase"] == "done"
    assert (record["keys_moved"], record["state_entries_moved"], record["held_records"]) == (
        1,
        2,
        3,
    )
    assert record["released_records"] == 3 and record["state_entries_total"] == 4
    assert record["completed_ms"] >= record["published_ms"]
    assert 0 <= record["longest_hold_s"] <= record["duration_s"] + 1  # clocks: Redis', ours
    assert record["first_held_ms"] >= record["published_ms"] - 1000
    assert plane.keys_on_several_workers(W) == {}

    # After the migration, k's records count at worker 1 directly.
    apply(store, 1, 3, {(0, b"k"): 1})
    assert store.partial(1, 0)[b"k"] == 12


def test_a_moved_key_takes_its_sums_along_and_releases_its_held_sums(store, plane) -> None:
    """A run with --sum: sums are held, moved and released exactly like the counts."""
    counts = {(0, b"k"): 5, (10_000, b"k"): 4}
    assert store.apply(
        batch(0, 1, counts, fields=[(SUMS, {(0, b"k"): 500, (10_000, b"k"): 40})]), n_sources=S
    )
    publish_move(plane, b"k", old=0, new=1)
    held = batch(1, 1, {(0, b"k"): 3}, switches={0: 1}, fields=[(SUMS, {(0, b"k"): 30})])
    assert store.apply(held, n_sources=S)
    assert store.client.hgetall(store.keys.held_field(0, 1, 0)) == {b"k": b"30"}
    assert store.client.hgetall(store.keys.field(0, 1, 0)) == {}
    apply(store, 0, 2, {}, switches={0: 1, 1: 1})
    assert plane.migrate(1, 0, S).status == 1
    assert store.client.hgetall(store.keys.field(0, 1, 0)) == {b"k": b"530"}
    assert store.client.hgetall(store.keys.field(0, 1, 10_000)) == {b"k": b"40"}
    assert store.partial(1, 0) == {b"k": 8}
    for key in (
        store.keys.field(0, 0, 0),
        store.keys.field(0, 0, 10_000),
        store.keys.held_field(0, 1, 0),
    ):
        assert store.client.exists(key) == 0
    partials = store.close_window(0, W)
    assert partials.fields == [[{}, {b"k": 530}, {}]] and partials.counts == [{}, {b"k": 8}, {}]


def test_a_moved_keys_least_and_greatest_merge_with_what_its_new_worker_held(store, plane) -> None:
    """A query's min and max: the moved state and the held values merge as least and
    greatest, not as sums."""
    low, high = StateField("min(ms)", "min", "ms"), StateField("max(ms)", "max", "ms")
    extremes = [(low, {(0, b"k"): -7}), (high, {(0, b"k"): 9})]
    assert store.apply(batch(0, 1, {(0, b"k"): 2}, fields=extremes), n_sources=S)
    publish_move(plane, b"k", old=0, new=1)
    held = [(low, {(0, b"k"): -3}), (high, {(0, b"k"): 2**62})]
    assert store.apply(batch(1, 1, {(0, b"k"): 1}, switches={0: 1}, fields=held), n_sources=S)
    apply(store, 0, 2, {}, switches={0: 1, 1: 1})
    assert plane.migrate(1, 0, S).status == 1
    assert store.client.hgetall(store.keys.field(0, 1, 0)) == {b"k": b"-7"}
    assert store.client.hgetall(store.keys.field(1, 1, 0)) == {b"k": str(2**62).encode()}
    assert store.close_window(0, W).fields == [[{}, {b"k": -7}, {}], [{}, {b"k": 2**62}, {}]]


def test_a_window_closed_during_a_migration_keeps_its_held_sums(store, plane) -> None:
    assert store.apply(batch(0, 1, {(0, b"k"): 5}, fields=[(SUMS, {(0, b"k"): 50})]), n_sources=S)
    publish_move(plane, b"k", old=0, new=1)
    held = batch(1, 1, {(0, b"k"): 3}, switches={0: 1}, fields=[(SUMS, {(0, b"k"): 30})])
    assert store.apply(held, n_sources=S)
    assert store.close_window(0, W).fields == [[{b"k": 50}, {b"k": 30}, {}]]


def test_an_ended_source_counts_as_switched(store, plane) -> None:
    apply(store, 0, 1, {(0, b"k"): 1}, marks={1: END_OF_STREAM})
    publish_move(plane, b"k", old=0, new=2)
    assert plane.migrate(1, 0, S).waiting_for_source == 0
    apply(store, 0, 2, {}, switches={0: 1})
    assert plane.migrate(1, 0, S).status == 1
    assert store.partial(2, 0) == {b"k": 1}


def test_a_window_closed_during_a_migration_keeps_its_held_records(store, plane) -> None:
    apply(store, 0, 1, {(0, b"k"): 5})
    publish_move(plane, b"k", old=0, new=1)
    apply(store, 1, 1, {(0, b"k"): 3}, switches={0: 1})
    # The aggregator closes window 0 before worker 0 drained: the held 3 are part of it.
    partials = store.close_window(0, W)
    assert partials.counts == [{b"k": 5}, {b"k": 3}, {}]
    apply(store, 0, 2, {(0, b"k"): 1}, switches={0: 1, 1: 1})  # late: window 0 is closed
    assert plane.migrate(1, 0, S).state_entries == 0  # closed windows never move
    assert store.finalize_window(0, W, {b"k": 8}, [(b"k", 8)], state_entries=2)
    assert store.state_keys() == []
    assert store.per_worker("late", W).tolist() == [1, 0, 0]
    assert plane.complete(1)


def test_a_restarted_controller_finishes_the_migration_its_predecessor_started(
    redis, store, plane, run_id
) -> None:
    options = ControllerOptions(
        scheme="mixed", workers=W, sources=1, run_id=run_id, redis_url="", interval=60
    )
    first = Controller(options, redis)
    first.start()
    # One source's interval: key "hot" far above the others, all on the ring's worker of "hot".
    source = registry.create("mixed", W)
    keys = KeyBatch.from_bytes([b"hot"] * 90 + [b"a", b"b", b"c"] * 10)
    source.route(keys)
    report = compact_report(source.statistics(), [keys], {}, source=0, round_=1, table_version=0)
    assert sorted(report.names) == [b"a", b"b", b"c", b"hot"]
    outcome = first.close_round(1, [report])
    assert outcome in ("rebalanced", "infeasible")
    version = plane.current().migrating
    assert version == 1
    (old_worker,) = plane.old_workers(1, W)
    moving = {k: int(v) for k, v in redis.hgetall(plane.keys.ctl_out(old_worker)).items()}
    apply(store, old_worker, 1, {(0, key): 7 for key in moving})
    # The controller dies here; a new one adopts the running migration ...
    second = Controller(options, redis)
    second.start()
    assert second.migrating == 1 and second.planner.table.version == 1
    assert second.drive_migration() is False  # old worker not drained yet
    apply(store, old_worker, 2, {}, switches={0: 1})
    assert second.drive_migration() is True
    assert plane.current().migrating is None
    for key, new_worker in moving.items():
        assert store.partial(new_worker, 0)[key] == 7
        assert key not in store.partial(old_worker, 0)
    # ... and its next round plans against the published table (version 2 next).
    assert second.planner.table.version == 1
    assert plane.rebalances()[0]["keys_moved"] == len(moving)


def test_the_control_planes_past_expires_and_what_is_in_force_stays(redis, store, plane) -> None:
    """Over rounds and migrations the control plane's keys stay flat: a round's reports, a
    table two versions old, a completed migration's record and done set expire within
    :data:`HISTORY_SECONDS`; the table in force, its predecessor and ``ctl:current`` never do.
    (Migration records used to stay for good and reports for an hour: an hour-long run grew
    Redis by thousands of keys.)"""
    for version in (1, 2, 3):
        plane.report(
            StatisticsReport(
                source=0, round=version, table_version=version - 1, key_ids=np.array([7]),
                frequency=np.array([1.0]), cost=np.array([1.0]), state_size=np.array([1.0]),
                worker_loads=np.zeros(W, np.int64), records=1, names=[b"k"],
            )
        )  # fmt: skip
        old, new = (version - 1) % W, version % W
        publish_move(plane, b"k", old=old, new=new, version=version)
        apply(store, old, version, {}, switches={0: version, 1: version})
        assert plane.migrate(version, old, S).status == 1
        assert plane.complete(version)
    keys = plane.keys
    expiring = [
        *(keys.ctl_report(r, 0) for r in (1, 2, 3)),
        keys.ctl_table(1),
        *(name for v in (1, 2, 3) for name in (keys.ctl_migration(v), keys.ctl_done(v))),
    ]
    ttls = {name: redis.ttl(name) for name in expiring}
    assert all(0 < ttl <= HISTORY_SECONDS for ttl in ttls.values()), ttls
    kept = [keys.ctl_table(2), keys.ctl_table(3), keys.ctl_current, keys.ctl_rebalances]
    assert {name: redis.ttl(name) for name in kept} == dict.fromkeys(kept, -1)
    assert [r["version"] for r in plane.rebalances()] == [1, 2, 3]


def test_a_feasible_readj_table_keeps_max_over_min_within_alpha(redis, plane, run_id) -> None:
    """Gedik's READJ through the controller: three hot keys that hash to one worker trigger a
    rebalance; the published table, applied to the interval's statistics (every key tracked
    here), keeps max/min load within alpha, recomputed independently of the plan."""
    alpha = 1.5
    options = ControllerOptions(
        scheme="readj", workers=W, sources=1, run_id=run_id, redis_url="", interval=60,
        params={"alpha": alpha},
    )  # fmt: skip
    controller = Controller(options, redis)
    controller.start()
    source = registry.create("readj", W, alpha=alpha)
    candidates = KeyBatch.from_bytes([f"hot{i}".encode() for i in range(100)])
    owners = source.base_workers(candidates)
    hot = [candidates[i] for i in np.flatnonzero(owners == 0)[:W].tolist()]
    cold = [f"cold{i}".encode() for i in range(60)]
    keys = KeyBatch.from_bytes(hot * 60 + cold)
    source.route(keys)
    report = compact_report(source.statistics(), [keys], {}, source=0, round_=1, table_version=0)
    stats = report.statistics()
    assert not controller.planner.within_tolerance(stats.worker_loads)
    assert controller.close_round(1, [report]) == "rebalanced"
    table = plane.table(1).table
    loads = np.bincount(
        table.apply(stats.key_ids, controller.planner.base_workers_of_ids(stats.key_ids)),
        weights=stats.frequency,
        minlength=W,
    )
    assert loads.max() / loads.min() <= alpha
    (record,) = [i for i in plane.intervals() if i["outcome"] == "rebalanced"]
    assert record["planned_imbalance"] == pytest.approx(loads.max() / loads.min())


def test_counted_rounds_cut_each_sources_statistics_at_its_share_and_close_in_order(
    redis, plane, run_id
) -> None:
    """Rounds every 20 records of S = 2 sources: each source reports right after every 10th
    record it routes, in the middle of a batch if need be; the controller closes round r once
    both reported it (or ``report_wait`` after the first), and a restarted one goes on."""
    from pipeline.stages.table_follower import TableFollower

    now = [0.0]
    options = ControllerOptions(
        scheme="mixed", workers=W, sources=S, run_id=run_id, redis_url="", every=20,
        report_wait=5.0,
    )  # fmt: skip
    controller = Controller(options, redis, clock=lambda: now[0])
    controller.start()
    followers = []
    for source in range(S):
        scheme = registry.create("mixed", W, source=source, n_sources=S)
        follower = TableFollower(plane, scheme, source, 0.1, 100, report_every=10)
        follower.start(0)
        followers.append(follower)
    keys = KeyBatch.from_bytes([f"k{i}".encode() for i in range(25)])
    assert followers[0].route(keys).shape == (25,)  # reports rounds 1 and 2, mid-batch
    assert [len(plane.reports(r, S)) for r in (1, 2, 3)] == [1, 1, 0]
    assert plane.reports(1, S)[0].statistics().records == 10
    controller.step()
    assert plane.intervals() == []  # round 1 waits for source 1
    followers[1].route(keys.slice(0, 9))
    controller.step()
    assert plane.intervals() == []
    followers[1].route(keys.slice(9, 10))
    controller.step()
    (first,) = plane.intervals()
    assert (first["round"], first["sources"], first["records"]) == (1, [0, 1], 20)
    # Round 2: source 1 is late; report_wait after source 0's report it closes without it.
    controller.step()
    now[0] += 4.9
    controller.step()
    assert len(plane.intervals()) == 1
    now[0] += 0.2
    controller.step()
    assert [(i["round"], i["sources"]) for i in plane.intervals()] == [(1, [0, 1]), (2, [0])]
    # A restarted controller waits for round 3, and skips a round nobody reported once the
    # next one has reports (a source restarted past it).
    again = Controller(options, redis, clock=lambda: now[0])
    again.start()
    followers[1].route(keys.slice(0, 20))  # source 1: its reports of rounds 2 and 3
    followers[0].routed = 40  # source 0 restarted past round 3: its next report is round 5
    followers[0].route(keys.slice(0, 10))
    for _ in range(3):
        again.step()
    now[0] += 5.1
    again.step()
    rounds = [(i["round"], i["sources"]) for i in plane.intervals()]
    assert rounds == [(1, [0, 1]), (2, [0]), (3, [1])]
