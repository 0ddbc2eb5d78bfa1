"""The accumulator over the devices of ``keras.distribution.DataParallel``: its mesh as JAX's, and the update's one
jitted call mapped over it with ``jax.shard_map``. The mesh may span processes joined by ``jax.distributed``: each
process is handed the same arrays and lays its own devices' shares into the global batch (``placed``).

Each device takes its contiguous share of the batch cut into ``k`` micro-batches (batching.py's ``pieces``, the
TensorFlow backend's cut over replicas): whole micro-batches, so that a micro-step's forward pass sees the rows it
sees on one device and every row counts once in ``S`` and ``D``; only the order of the additions differs. Each
device scans its micro-batches into its own float32 cache, one ``psum`` adds the caches and totals once per update,
and every device applies the optimizer to that sum alike: the variables stay replicated (DataParallel's layout). A
share with no rows (a batch smaller than the mesh) is all padding and adds nothing. ``accumulate``/``finish`` run
replicated, unshared. A Dropout draws its mask from its seed state, the same on every device: each device moves its
seed states apart (a counter offset by its index) for its micro-steps and back after them, so that devices draw
different masks and the state stays replicated, moved on by the micro-steps of one device. ``check_vma=False``:
with it, JAX would psum the replicated weights' gradient inside every micro-step (the transpose of its implicit
``pvary``), an all-reduce per micro-batch.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import keras
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from ... import keras_private
from ...errors import Refused
from .engine import Accumulator


def mesh(where: str) -> jax.sharding.Mesh | None:
    """The devices of the Keras distribution in force as a JAX mesh (None: no distribution, one device)."""
    given = keras.distribution.distribution()
    if given is None:
        return None
    kind, processes = type(given).__name__, given.num_processes
    if kind != "DataParallel":  # a model cut over devices
        raise Refused(
            "jax-distribution",
            f"{where}: keras.distribution.{kind} over {processes} process(es) is not supported: use "
            f"keras.distribution.DataParallel",
        )
    named = {f"{device.platform}:{device.id}": device for device in jax.devices()}
    devices = np.vectorize(named.__getitem__, otypes=[object])(given.device_mesh.devices)
    return jax.sharding.Mesh(devices, given.device_mesh.axis_names)


class DataParallelAccumulator(Accumulator):
    """engine.py's Accumulator with each update's micro-batches shared over ``mesh``'s devices."""

    def __init__(self, model, objective, optimizer, *, subdivisions: int, mesh: jax.sharding.Mesh, **options):
        self.mesh, (self.axis,) = mesh, mesh.axis_names
        self.replicas, self.replica_ids = mesh.size, list(range(mesh.size))
        states = {id(state) for state in keras_private.seed_states(model)}
        self.seeds = [i for i, v in enumerate(model.non_trainable_variables) if id(v) in states]
        super().__init__(model, objective, optimizer, subdivisions=subdivisions, **options)

    def mapped(self, update):
        # state and n replicated, the stacked micro-batches cut on their leading axis: each device's k in a row
        specs = (PartitionSpec(),) * 3 + (PartitionSpec(self.axis), PartitionSpec())
        return jax.shard_map(update, mesh=self.mesh, in_specs=specs, out_specs=PartitionSpec(), check_vma=False)

    def placed(self, batches, n):
        # every process holds the whole batch (each was given the same arrays) and hands its own devices their
        # shares: one global array, cut on its leading axis, however many processes the mesh spans
        cut, whole = NamedSharding(self.mesh, PartitionSpec(self.axis)), NamedSharding(self.mesh, PartitionSpec())
        laid = lambda values: jax.make_array_from_callback(values.shape, cut, lambda index: values[index])  # noqa: E731
        return jax.tree.map(laid, batches), jax.make_array_from_callback((), whole, lambda index: np.asarray(n))

    def spread(self, held):
        return self._offset(held[0], 1), *held[1:]

    def summed(self, cache, totals, moved, held):
        # the metrics as each device moved them: their changes summed, on the state every device started from
        changes = [new - old for new, old in zip(moved[1], held[1])]
        cache, totals, changes, pending = jax.lax.psum((cache, totals, changes, moved[2]), self.axis)
        metrics = [old + change for old, change in zip(held[1], changes)]
        return cache, totals, (self._offset(moved[0], -1), metrics, pending)

    def _offset(self, non_trainable, sign: int):
        """The seed states' counters moved by ``sign`` times this device's index times 2**20 (apart from every draw
        an update of any device makes)."""
        shift = (jax.lax.axis_index(self.axis) * (1 << 20)).astype("uint32")
        moved = list(non_trainable)
        for i in self.seeds:
            step = jnp.stack([jnp.zeros((), "uint32"), shift])
            moved[i] = moved[i] + step if sign > 0 else moved[i] - step
        return moved
