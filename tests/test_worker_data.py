"""Per-worker input: under multi-worker each process reads only its replicas' contiguous shares of every
global batch, in the order one device would see them (accum/data.py)."""

import numpy as np
import pytest
from accum_train.data import worker_batches, worker_order, worker_part
from accum_train.datasets.base import ArraySplit
from accum_train.engine import micro_bounds


@pytest.mark.parametrize(
    "n, replicas, ids, part",
    [
        (4, 2, [0], (0, 2)),
        (4, 2, [1], (2, 4)),
        (3, 2, [0], (0, 1)),
        (3, 2, [1], (1, 3)),
        (1, 2, [0], (0, 0)),  # a one-example batch leaves replica 0 nothing
        (10, 4, [2, 3], (5, 10)),
        (10, 4, [0, 1, 2, 3], (0, 10)),
        (7, 1, [0], (0, 7)),
    ],
)
def test_a_process_takes_the_shares_of_its_replicas(n, replicas, ids, part):
    assert worker_part(n, replicas, ids) == part
    # the same cut the engine makes inside the graph, replica by replica
    assert part == (micro_bounds(ids[0], n, replicas)[0], micro_bounds(ids[-1], n, replicas)[1])


@pytest.mark.parametrize(
    "n_examples, batch, replicas, ids, order",
    [
        (11, 4, 2, [0], [0, 1, 4, 5, 8]),
        (11, 4, 2, [1], [2, 3, 6, 7, 9, 10]),
        (9, 4, 2, [0], [0, 1, 4, 5]),  # the last batch of one example goes to replica 1 only
        (9, 4, 2, [1], [2, 3, 6, 7, 8]),
        (9, 4, 1, [0], list(range(9))),  # one device reads the order itself
    ],
)
def test_worker_order_is_its_part_of_every_batch(n_examples, batch, replicas, ids, order):
    assert worker_order(np.arange(n_examples), batch, replicas, ids).tolist() == order


@pytest.mark.parametrize("ids", [[0], [1]])
def test_the_workers_together_read_each_example_of_a_shuffled_epoch_once(ids):
    rng = np.random.default_rng(0)
    order = rng.permutation(9)
    split = ArraySplit(np.arange(9, dtype=np.uint8).reshape(9, 1, 1) * 10, np.arange(9))
    got = [(n, y.numpy().tolist()) for n, _, y in worker_batches(split, order, 4, 2, ids)]
    assert [n for n, _ in got] == [4, 4, 1]  # every global batch, even where this worker has nothing
    expected = [order[s : s + 4][slice(*worker_part(len(order[s : s + 4]), 2, ids))].tolist() for s in (0, 4, 8)]
    assert [labels for _, labels in got] == expected
    assert got[2][1] == ([] if ids == [0] else [int(order[8])])
