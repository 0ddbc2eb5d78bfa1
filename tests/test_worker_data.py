"""Per-worker input: under multi-worker each process holds only its replicas' contiguous shares of every
global batch (accum/data.py; the feed's layout of those shares is tested in test_feed.py)."""

import pytest
from accum_train.batching import micro_bounds
from accum_train.data import worker_part


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
