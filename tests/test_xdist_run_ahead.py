"""xdist's workers kept running ahead: a shard queued behind the rows in flight, each
queued row started once (pytest_osmosis/plugin/xdist_scheduler.py, xdist.py)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest
from test_faults import _Node


def test_a_worker_is_sent_its_next_shard_while_one_is_still_queued_behind_its_rows(
    pytester: pytest.Pytester,
) -> None:
    """Its rows in flight are one shard; the next must already be there when they finish.

    Sent when it held a single shard, the next came back only after the worker's in-flight
    rows had started finishing, and their free slots stayed empty until it arrived.
    """
    from pytest_osmosis.plugin.xdist_scheduler import EvalScheduling

    config = pytester.parseconfig("--tx", "2*popen", "-p", "xdist")
    sched = EvalScheduling(config, None, shard_rows=3)
    nodeids = [f"configs/eval/calc.toml::row_{i}_run_0" for i in range(24)]  # 8 shards
    gw0, gw1 = _Node("gw0"), _Node("gw1")
    for node in (gw0, gw1):
        sched.add_node(node)
        sched.add_node_collection(node, nodeids)
    sched.schedule()

    def done(node: _Node, *, shard: int, row: int) -> int:
        sched.mark_test_complete(node, node.sent[shard][row])
        return len(node.sent)

    assert (len(gw0.sent), len(gw1.sent)) == (2, 2)  # one in flight, one queued behind it
    assert done(gw0, shard=0, row=0) == 3  # it holds less than two shards now
    assert done(gw0, shard=0, row=1) == 3  # two shards' items are queued behind its rows
    assert done(gw1, shard=0, row=0) == 3
    assert done(gw0, shard=0, row=2) == 4  # its first shard done: two left, the next sent
    # Near the end (fewer shards queued than workers) a shard waits for whoever is free.
    assert len(sched.workqueue) == 1
    assert [done(gw1, shard=0, row=row) for row in (1, 2)] == [3, 3]
    handed = sorted(i for node in (gw0, gw1) for batch in node.sent for i in batch)
    assert handed == list(range(21))


class WorkerInteractor:
    """Stands in for xdist's worker-side plugin: the item running, the next, the queue."""

    def __init__(self) -> None:
        self.item_index: int | None = None
        self.nextitem_index: int | None = None
        self.torun = self

    queue: list[object]

    @contextlib.contextmanager
    def lock(self) -> Iterator[list[object]]:
        yield self.queue


def test_each_queued_row_is_handed_out_to_start_once(pytester: pytest.Pytester) -> None:
    """The running item and the next come first, then the queue; later calls (one per item
    the worker runs) return only what xdist sent since."""
    from pytest_osmosis.plugin.xdist import newly_queued_indices

    config = pytester.parseconfig()
    interactor = WorkerInteractor()
    interactor.item_index, interactor.nextitem_index = 0, 1
    interactor.queue = [2, 3, "shutdown"]
    config.pluginmanager.register(interactor, "workerinteractor")
    assert newly_queued_indices(config) == [0, 1, 2, 3]
    interactor.item_index, interactor.nextitem_index = 1, 2
    interactor.queue = [3]
    assert newly_queued_indices(config) == []
    interactor.queue = [3, 4, 5]  # a shard arrived
    assert newly_queued_indices(config) == [4, 5]
    interactor.item_index, interactor.nextitem_index, interactor.queue = 2, 3, [4, 5]
    assert newly_queued_indices(config) == []
