"""Runs `accum-train run` counting what each update costs, for test_distribute.py.

Counts the calls from Python into TensorFlow graphs outside evaluation, writing the records and checkpoints
(one per update is the claim), and the collective ops in the traced graph of the update (one all-reduce is the
claim; under MultiWorkerMirroredStrategy a collective is an op in the graph). The last line of stdout is
{"graph_calls": N, "collectives": {op: count}}; under --workers the launcher echoes the chief's.

``RUNNER worker ARGS`` runs the core's worker entry point (``accum_train.worker``) instead, as the
``--workers`` launcher starts one (tests/launch_runner.py).
"""

import collections
import json
import sys

from accum_train import worker
from accum_train.backends.tensorflow.update import Update
from accum_train.cli.main import main
from helpers import GraphCalls

graph, engines = GraphCalls(setattr), []


def collectives(function) -> dict:
    """Collective ops in the graph a tf.function traced and in every function it calls (loops, conds); the same
    in every trace the run made (one per micro-batch size it met)."""
    found = []
    for traced in function._list_all_concrete_functions():
        definition = traced.graph.as_graph_def()
        nodes = list(definition.node) + [node for f in definition.library.function for node in f.node_def]
        found.append(dict(collections.Counter(node.op for node in nodes if node.op.startswith("Collective"))))
    return found[0] if found and all(f == found[0] for f in found) else {"traces disagree": found}


real_init = Update.__init__


def init(self, *args, **kwargs):  # the base of both engines: the subdivided update and the baseline
    real_init(self, *args, **kwargs)
    engines.append(self)


Update.__init__ = init

if __name__ == "__main__":
    worker.main(sys.argv[2:]) if sys.argv[1] == "worker" else main(sys.argv[1:], standalone_mode=False)
    print(json.dumps({"graph_calls": graph.calls, "collectives": collectives(engines[0]._update_pulled)}))
