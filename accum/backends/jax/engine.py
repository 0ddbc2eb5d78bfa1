"""The accumulator on JAX: an update is one jitted function over the model's state, as Keras' ``JAXTrainer`` runs
its train_step (keras/src/backend/jax/trainer.py): ``stateless_call`` for each micro-step's forward pass,
``optimizer.stateless_apply`` once for the update, the new state written back to the Keras variables after it.

A batch of ``n`` examples is cut into ``k`` contiguous micro-batches whose sizes differ by at most one (batching.py, as
on TensorFlow). ``lax.scan`` runs the micro-steps inside the update's one jitted call (unrolled where that measures
faster: ``unrolled_here``), so the micro-batches are stacked on a leading axis of ``k``: each padded to the largest, its
padding marked invalid (objective.py counts it nowhere). The objective gives a micro-batch's loss sums ``S`` and
normalisers ``D``, one per normaliser group; each micro-step adds the gradient of each group's ``S``, divided by ``n``
(the magnitude of a batch mean), to that group's float32 cache (one backward pass per group: a group's ``D`` is known
only once the whole batch is seen), and the ``D`` to the totals. Once per update each group's cache is multiplied by ``n
/ D`` (a ``D`` of 0 read as 1, as objective.py says), the groups added, and the optimizer applied once: its clipping,
its learning-rate schedule and its step count see the whole batch's gradient, once. An update whose gradient is not
finite is skipped, as accum_train.fit skips it on TensorFlow (state kept, the optimizer's step count too).

``accumulate``/``finish`` are the same pieces called apart (one jitted micro-step into the cache, one jitted
apply); ``update_from`` pulls an update's micro-batches from an iterator of ``(x, y, sample_weight)``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import keras
import numpy as np

from ... import keras_private
from ...trainer.noise import terms_size
from . import noise
from .checkpoints import Counter

# what each jitted call replaces is donated, as Keras' JAXTrainer donates its state: the weights and the optimizer's
# slots (and the cache, between micro-steps) are written in place, so an update holds one copy of them beside the
# micro-batch's activations, not two
DONATED = {"update": (0, 1, 2), "micro": (1, 2, 3), "apply": (0, 1)}


class DeviceOutOfMemory(RuntimeError):
    """An update that XLA could not fit in the device's memory (its RESOURCE_EXHAUSTED): the backend's
    ``OUT_OF_MEMORY``, which the memory guard retries at twice the micro-batches. Any other failure of an update
    stays jax.errors.JaxRuntimeError (``OP_ERROR``)."""


def stacked(micro_batches: list, least: int = 1):
    """``(x, y, sample_weight, valid)`` with a leading axis of ``k``: each micro-batch padded with zeros to the
    largest, and to at least ``least`` rows; ``valid`` 1 for its rows, 0 for the padding."""
    rows = [len(keras.tree.flatten(batch[0])[0]) for batch in micro_batches]
    largest = max(*rows, least, 1)

    def stack(*parts):
        out = np.zeros((len(parts), largest, *np.shape(parts[0])[1:]), dtype=np.asarray(parts[0]).dtype)
        for i, part in enumerate(parts):
            out[i, : len(part)] = part
        return out

    data = [
        None if parts[0] is None else keras.tree.map_structure(stack, *parts)  # no sample weights: None
        for parts in zip(*[tuple(batch) for batch in micro_batches])
    ]
    valid = np.zeros((len(rows), largest), dtype="float32")
    for i, size in enumerate(rows):
        valid[i, :size] = 1.0
    return (*data, valid)


def unrolled_here(model) -> bool:
    """Whether an update runs its micro-steps unrolled rather than in a ``lax.scan``: for a model with convolutions on
    a CPU, where XLA runs a convolution inside a loop's body many times slower than outside one (jax-ml/jax#12868:
    in a loop's body the filter gradient's convolution keeps a layout the CPU's convolution library does not take;
    measured here on the README's convnet, benchmarks/peers_jax.py). ``after`` keeps the unrolled micro-steps one
    micro-batch's buffers apart, as the scan does."""
    if jax.default_backend() != "cpu":
        return False
    return any("Conv" in type(layer).__name__ for layer in keras_private.all_layers(model))


def after(cache: list, batch):
    """``batch`` with its inputs made to depend on ``cache``, so that an unrolled micro-step starts only once the one
    before it has added its gradient. Without it XLA's CPU scheduler runs the micro-steps side by side, layer by layer,
    and holds every micro-batch's activations at once: on the README's convnet at k=8, 48 MiB of temporary buffers,
    over glibc's 32 MiB ceiling for reusing a freed block, so that each update mapped its buffers anew (about 11,900
    page faults, and 1.3x the CPU time of Keras' accumulation). An optimization barrier does not order them: XLA
    removes barriers before it schedules. The dependency is a test that is always true, on the bits of the cache (so
    that no value, NaN included, changes it), which XLA cannot fold away; the inputs pass through it unchanged."""
    bits = sum(jax.lax.bitcast_convert_type(c.reshape(-1)[0], "int32") for c in cache)
    ready = (bits | 1) != 0
    return (jax.tree.map(lambda a: jnp.where(ready, a, jnp.zeros((), a.dtype)), batch[0]), *batch[1:])


class Accumulator:
    """``objective`` (objective.py) trained by ``optimizer`` over ``subdivisions`` micro-batches per update, on one
    device: the ``Engine`` of accum/backends/__init__.py."""

    replicas, replica_ids, one_pass, norm_layers, dynamic = 1, [0], False, [], False

    def __init__(self, model, objective, optimizer, *, subdivisions: int, metrics=None, retried=False):
        self.model, self.objective, self.optimizer = model, objective, optimizer
        # ``retried``: an update that runs out of memory is tried again (micro_batch_size="auto") from the state it
        # started from, which donating it to the failed call would lose: a second copy of the state instead
        self.donated = {} if retried else DONATED
        # evaluation.KerasMetrics: model.fit's logs after each update (None: no logs, the record alone)
        self.metrics, self.strategy = metrics, None
        optimizer.build(model.trainable_variables)
        # a LossScaleOptimizer's (mixed_float16) dynamic scale, which each micro-step's loss is multiplied by so that
        # float16 gradients do not underflow; its stateless_apply unscales the summed gradient and moves the scale
        scale = getattr(optimizer, "dynamic_scale", None)
        self.scale_at = next((i for i, v in enumerate(optimizer.variables) if v is scale), None)
        self._k = int(subdivisions)
        self.unrolled = unrolled_here(model)
        # a model that draws random numbers (Dropout) draws them for the shape it is given: see update_from
        self.draws = bool(keras_private.seed_states(model))
        self.retrace()
        # updates skipped in a row and in all: not read back unless max_bad_steps, a summary or a checkpoint asks
        self.begin()

    @property
    def k(self) -> int:
        return self._k

    @property
    def one_process(self) -> bool:
        return True

    @property
    def skipped_updates(self):
        """The updates skipped so far, as summary.json reads them (``numpy()``)."""
        return Counter(self, "_skipped")

    @property
    def subdivisions(self):
        """k as a run directory checkpoints it (``numpy()``, ``assign``): a resume goes on at the k it had."""
        return Counter(self, "_k", dtype=None)

    def set_subdivisions(self, k: int) -> None:
        self._k = int(k)

    def retrace(self) -> None:
        donated = self.donated
        self._update = jax.jit(self.mapped(self._update_fn), donate_argnums=donated.get("update", ()))
        self._micro = jax.jit(self._micro_fn, donate_argnums=donated.get("micro", ()))
        self._apply = jax.jit(self._apply_fn, donate_argnums=donated.get("apply", ()))

    def placed(self, batches, n):
        """The update's stacked micro-batches and ``n`` where its call takes them: on one device, as they are
        (devices.py lays them over the mesh's devices, of every process)."""
        return batches, n

    def mapped(self, update):
        """The update's function as it runs over the devices: on one, itself (devices.py maps it over a mesh)."""
        return update

    def restored(self) -> None:
        """Nothing held apart from the Keras variables: the state is read from them at each call."""

    def largest_over_workers(self, value: int) -> int:
        return value

    def begin(self) -> None:
        """A later call of fit on this accumulator: its counters from zero, nothing accumulated."""
        self._bad, self._skipped = jnp.zeros((), "int32"), jnp.zeros((), "int32")
        self.reset()

    def reset(self) -> None:
        """The cache and totals cleared: nothing accumulated (created at the first micro-batch, which tells the
        objective's groups)."""
        self._cache, self._totals, self._n, self._pending = None, None, 0, None

    def _empty(self, trainable, held, batch):
        """A zero cache and totals for the normaliser groups the objective gives ``batch`` (traced, not run): the
        totals are each group's S and D, the noise scale's terms (noise.py) and each loss's own S and D."""
        sums, _, _, extra = jax.eval_shape(self.objective.parts, trainable, held, *batch)
        groups, outputs = sums.shape[0], extra["outputs"].shape
        totals = (jnp.zeros((2, groups), "float32"), jnp.zeros(terms_size(groups), "float32"))
        totals += (jnp.zeros(outputs, "float32"),)
        return [jnp.zeros((groups, *v.shape), "float32") for v in trainable], totals

    def _state(self):
        """(trainable, held, optimizer's) values; held: the non-trainable variables' and the compiled metrics',
        which the micro-steps carry from one to the next."""
        model, read = self.model, lambda variables: [v.value for v in variables]
        pending = self.objective.norms.zeros() if self._pending is None else self._pending
        held = (read(model.non_trainable_variables), read(self.objective.metric_variables), pending)
        return read(model.trainable_variables), held, read(self.optimizer.variables)

    def _write(self, trainable, held, optimizer_values) -> None:
        model = self.model
        for variables, values in (
            (model.trainable_variables, trainable),
            (model.non_trainable_variables, held[0]),
            (self.objective.metric_variables, held[1]),
            (self.optimizer.variables, optimizer_values),
        ):
            keras_private.write(variables, values)

    def _scale(self, optimizer_values):
        return 1.0 if self.scale_at is None else optimizer_values[self.scale_at]

    def _micro_fn(self, trainable, held, cache, totals, batch, n, scale):
        """One micro-step: (held as it left them: _state's, cache, totals); the cache holds ``scale`` times the
        gradient (a LossScaleOptimizer's scale, else 1)."""

        def scaled(values):
            sums, counts, moved, extra = self.objective.parts(values, held, *batch)
            return sums * scale / n, (sums, counts, moved, extra)

        scaled_sums, pull, (sums, counts, moved, extra) = jax.vjp(scaled, trainable, has_aux=True)
        one_hot = jnp.eye(scaled_sums.shape[0], dtype=scaled_sums.dtype)
        grads = [pull(one_hot[g])[0] for g in range(scaled_sums.shape[0])]  # each group's gradient, apart
        cache = [c + jnp.stack([g[i] for g in grads]).astype("float32") for i, c in enumerate(cache)]
        terms = noise.micro_terms(grads, extra["size"])
        return moved, cache, (totals[0] + jnp.stack([sums, counts]), totals[1] + terms, totals[2] + extra["outputs"])

    def _apply_fn(self, trainable, optimizer_values, cache, totals, n):
        """(weights, optimizer's, loss, finite, the noise scale's record) after the update's one apply."""
        (sums, counts), terms, (output_sums, output_counts) = totals
        counts = jnp.where(counts == 0, 1.0, counts)  # a sum's D, or a mean over nothing (divide_no_nan's 0)
        factor = n / counts  # each group's whole-batch normaliser, once: D/n micro-batch means would be biased
        summed = [jnp.tensordot(factor, c, axes=1) for c in cache]
        grads = [g.astype(v.dtype) for g, v in zip(summed, trainable)]
        finite = jnp.all(jnp.stack([jnp.all(jnp.isfinite(g)) for g in grads]))
        scale = self._scale(optimizer_values)
        measured = noise.update_terms(terms, factor, scale, summed)  # before any clipping
        measured["output_losses"] = output_sums / jnp.where(output_counts == 0, 1.0, output_counts)
        # metrics.jsonl's figures of the update: its gradient's global norm before clipping, the rate it is applied at
        measured["grad_norm"] = jnp.sqrt(sum(jnp.vdot(g, g) for g in summed)) / scale
        with keras.StatelessScope(state_mapping=list(zip(self.optimizer.variables, optimizer_values))):
            measured["learning_rate"] = jnp.asarray(self.optimizer.learning_rate, "float32")
        new_trainable, new_optimizer = self.optimizer.stateless_apply(optimizer_values, grads, trainable)
        if self.scale_at is not None:  # the LossScaleOptimizer skips a non-finite update itself and halves its scale
            return list(new_trainable), list(new_optimizer), jnp.sum(sums / counts), finite, measured
        kept = lambda new, old: jnp.where(finite, new, old)  # noqa: E731
        return (
            jax.tree.map(kept, list(new_trainable), list(trainable)),
            jax.tree.map(kept, list(new_optimizer), list(optimizer_values)),
            jnp.sum(sums / counts),
            finite,
            measured,
        )

    def _update_fn(self, trainable, held, optimizer_values, batches, n):
        def step(carry, batch):
            return self._micro_fn(trainable, *carry, batch, n, self._scale(optimizer_values)), None

        carry = (self.spread(held), *self._empty(trainable, held, jax.tree.map(lambda a: a[0], batches)))
        if self.unrolled:  # one micro-step after another in the function itself (``unrolled_here``)
            for i in range(jax.tree.leaves(batches)[0].shape[0]):
                carry = step(carry, after(carry[1], jax.tree.map(lambda a, i=i: a[i], batches)))[0]
        else:  # XLA reuses the loop body's buffers: the update holds one micro-batch's activations
            carry = jax.lax.scan(step, carry, batches)[0]
        moved, cache, totals = carry
        cache, totals, moved = self.summed(cache, totals, moved, held)
        new, optimizer_new, loss, finite, measured = self._apply_fn(trainable, optimizer_values, cache, totals, n)
        return self._folded(moved, finite), new, optimizer_new, loss, finite, measured

    def _folded(self, held, finite):
        """``held`` with BatchNormalization's moving statistics moved once by its pooled sums (norm.Pooled.fold)."""
        non_trainable, metrics, pending = held
        return self.objective.norms.fold(non_trainable, pending, finite), metrics, self.objective.norms.zeros()

    def spread(self, held):
        """What the micro-steps carry (``_state``'s held) as this device starts them: one device's as they are
        (devices.py sets each device's seed states apart)."""
        return held

    def summed(self, cache, totals, moved, held):
        """The cache, totals and carried state over the update's devices, from this device's and the state it started
        from (``held``): one device's are the batch's (devices.py sums them)."""
        return cache, totals, moved

    def update_from(self, iterator, n: int, pulls: int, stop=0, size=None, held=False) -> dict:
        """The update of the batch whose ``pulls`` micro-batches per replica ``iterator`` yields (in batching.py's
        ``pieces`` order), in one call; stacked replica by replica, each replica's in a row. Its examples are counted
        from what is pulled (``n``, the batch size in force, may be more: a short last batch, a stream's); none, at
        the end of a feed's data, is no update. ``stop``: a signal's number, handed back in the record."""
        pulled = [next(iterator) for _ in range(pulls * self.replicas)]
        # A short last batch is padded to the micro-batches of the batch in force (``n``), never past them: a run
        # compiles one update, not a second for its last batch (where it holds k examples or more). A model that
        # draws random numbers keeps the short shape, as its draws for a shape differ in every row from its draws
        # for a smaller one: at k=1 they are model.fit's.
        least = 1 if self.draws else -(-int(n) // max(len(pulled), self.k * self.replicas))
        n = sum(len(keras.tree.flatten(part[0])[0]) for part in pulled)
        if n == 0:
            return {"examples": 0, "stop": stop}
        trainable, held, optimizer_values = self._state()
        # micro-batches of several lengths (trim_padding cuts each to its own): ``_by_steps``
        shapes = {tuple(np.shape(a)[1:] for a in keras.tree.flatten(part)) for part in pulled}
        try:
            if len(shapes) > 1:
                held, new, optimizer_new, loss, finite, measured = self._by_steps(
                    pulled, n, trainable, held, optimizer_values
                )
            else:
                batches = stacked([part for r in range(self.replicas) for part in pulled[r :: self.replicas]], least)
                batches, total = self.placed(batches, np.float32(n))
                held, new, optimizer_new, loss, finite, measured = self._update(
                    trainable, held, optimizer_values, batches, total
                )
        except jax.errors.JaxRuntimeError as err:
            if "RESOURCE_EXHAUSTED" in str(err):
                raise DeviceOutOfMemory(str(err).splitlines()[0]) from None
            raise
        self._write(new, held, optimizer_new)
        self._bad = jnp.where(finite, 0, self._bad + 1)
        self._skipped = self._skipped + jnp.where(finite, 0, 1)
        out = {"loss": loss, "applied": finite, "examples": n, "stop": stop, "bad_updates_in_a_row": self._bad}
        out.update(measured)
        if self.metrics is not None:
            out["logs"] = self.metrics.logged(out)
        return out

    def _by_steps(self, pulled: list, n: int, trainable, held, optimizer_values):
        """An update of micro-batches of several lengths on one device (trim_padding cuts each to its own): each
        micro-step a jitted call of its own, compiled once per length, then the one apply; what ``_update`` gives."""
        scale, total = self._scale(optimizer_values), np.float32(n)
        cache = totals = None
        for part in pulled:
            held, cache, totals = self._micro_step(trainable, held, cache, totals, part, total, scale)
        return self._applied(trainable, held, optimizer_values, cache, totals, total)

    def _micro_step(self, trainable, held, cache, totals, part, n, scale):
        """One micro-batch ``part`` (x, y, sample_weight) into ``cache`` and ``totals`` (None: made for its groups);
        (held, cache, totals) after it."""
        batch = jax.tree.map(lambda a: a[0], stacked([part]))  # one micro-batch, unstacked
        if cache is None:
            cache, totals = self._empty(trainable, held, batch)
        return self._micro(trainable, held, cache, totals, batch, n, scale)

    def _applied(self, trainable, held, optimizer_values, cache, totals, n):
        """(held with the moving statistics folded, weights, optimizer's, loss, finite, record) of the one jitted
        apply of ``cache``: what ``_update`` gives."""
        new, optimizer_new, loss, finite, measured = self._apply(trainable, optimizer_values, cache, totals, n)
        return self._folded(held, finite), new, optimizer_new, loss, finite, measured

    def accumulate_from(self, iterator, n: int, pulls: int, size=None, held=False):
        for _ in range(pulls):
            self.accumulate(*next(iterator), n=n)

    def accumulate(self, x, y, n, sample_weight=None):
        """One micro-batch into the cache, nothing applied."""
        trainable, held, optimizer_values = self._state()
        scale, part = self._scale(optimizer_values), (x, y, sample_weight)
        held, self._cache, self._totals = self._micro_step(trainable, held, self._cache, self._totals, part, n, scale)
        self._write(trainable, held, optimizer_values)
        self._pending = held[2]
        self._n = n

    def finish(self, retry=False, stop=0) -> dict:
        """The accumulated update applied once (skipped where not finite), the cache cleared."""
        trainable, held, optimizer_values = self._state()
        n = jnp.float32(self._n)
        held, new, optimizer_new, loss, finite, measured = self._applied(
            trainable, held, optimizer_values, self._cache, self._totals, n
        )
        self._write(new, held, optimizer_new)
        self.reset()
        return {"loss": loss, "applied": finite, "examples": int(n), **measured}
