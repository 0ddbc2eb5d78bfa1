"""The accumulator: one gradient cache per normaliser of the loss, and an update that is one graph call, on one
device or on any tf.distribute strategy. ``accum-train run``/``compare``/``bench``, ``accum_train.run`` and
``accum_train.fit`` all train with it; what differs between them is passed in.

- The objective (objective.py): what a micro-batch adds up, per normaliser of the loss a sum and a count.
  The built-in cross-entropy is the one-normaliser, per-example case; a compiled Keras loss has one normaliser
  per kind of division it makes (keras_objective.py).
- ``prepare(element, n)``: how an element pulled from the input pipeline becomes ``(x, y, sample_weight)``,
  inside the micro-step (the CLI's feed converts and augments its stored values there; fit unpacks its data).
- ``metrics``: what else a micro-step keeps, read once per update (fit's compiled metrics; none for the CLI).

A batch of ``n`` examples is cut into contiguous micro-batches whose sizes differ by at most one (batching.py); under a
strategy each replica takes its contiguous share and cuts that. Each micro-step differentiates its part of each
normaliser's sum, divided by ``n`` (the magnitude of a batch mean, what a 16-bit loss scale expects), into that
normaliser's cache and adds its part of the normaliser to the totals. The update then makes ONE collective (update.py's
``Finish``), an all-reduce of the caches, the totals, the BatchNorm sums, the noise terms, the metrics, a retry flag and
the stop request; each cache is multiplied by ``n / D`` once (exactly 1 for a per-example loss of a whole batch: the
bits of dividing by ``n`` in the micro-step), the weight regularizers' gradient is added once, and update.py's
``Update`` applies the result once or skips it. Averaging micro-batch means, or dividing by ``subdivisions``, is biased
as soon as micro-batches differ in size or in valid tokens.

The micro-batches come from an input pipeline (``update_from``: ``pulls`` elements per local replica, pulled inside
the graph, so only one micro-batch is ever an input). A batch held in memory (``update``: the tests, the gradient
check) becomes such a pipeline first (feed.held), cut as every feed cuts. Two loops run the micro-steps. One at a
time (``parallel`` 1) adds each to the cache variables as it is done: the least memory. ``parallel`` > 1 carries
the sums as tensors through a ``tf.while_loop`` with ``parallel_iterations`` and writes them once, so that
micro-steps overlap: on a few CPU cores small micro-batches keep the cores busier that way than with threads inside
each op (trainer/runtime.py). Both add in micro-batch order: they give the same bits. A replica cannot pull from a
distributed iterator, so pulled micro-steps overlap only on one device. ``one_pass`` is the baseline: each
replica's share in one micro-step, its gradients straight to the all-reduce, no cache. A pulled update of one
micro-batch in all (k=1 on one replica) takes the baseline's route too: a round trip through the caches would add
its gradient to zeros, the same bits, and its noise terms would estimate nothing (noise.py needs two
micro-batches).

``accumulator_for`` is the one place an Accumulator is set up, for both doors and for compare's gradient check.
What the model decides is read from it there: the variables the engine writes (Keras' own storage, as the optimizer
and checkpoints see it), and whether micro-steps are traced for their size (a model that loops over time runs
leaner so). What a door decides is passed in: k, the micro-steps in flight (trainer/runtime.py's policy), the loss
scale, the optimizer, and how a pulled element becomes a batch (``prepare``).

The pieces are separately usable: ``accumulate_from``/``accumulate_batch``/``accumulate`` (into the caches,
nothing applied), ``finish`` (reduce, apply or skip, clear) and ``reset``; the memory guard uses them to look
at an update's peak, or to let every worker agree on a retry, before anything is applied.
"""

from __future__ import annotations

import contextlib

import keras
import tensorflow as tf

from ... import keras_private
from ...trainer.data.batching import as_data
from ...trainer.data.feed import held, sized
from ...trainer.noise import terms_size
from . import noise
from .gradient_cache import REPLICA_LOCAL, GradientCache, dense
from .graphs import graph, in_turn
from .objective import Parts, Totals, as_objective, combine, scale_of, units
from .update import Finish, _first, _size


class Accumulator(Finish):
    """The update of ``objective`` over k micro-batches per replica: accumulate, reduce once, apply once.

    ``objective``: an objective (objective.py), or a per-example ``loss_fn(x, y)``. ``subdivisions``: k for
    a held batch (``update``; a variable: a new k retraces only for a new micro-batch size). ``groups``: the
    normalisers the data gives (the objective's own by default). ``sized``: trace an update for its micro-batch
    size where every micro-batch holds the same number of examples (feed.sized): a model that loops over
    time (a recurrent layer) runs about a fifth faster on a CPU so, while convolutions ran 5 to 17% slower
    (docs/performance.md). ``shared`` are Update's keyword arguments (clip_norm, norm_layers, strategy,
    loss_scale, growth_steps)."""

    def __init__(
        self,
        objective,
        variables,
        optimizer,
        *,
        subdivisions: int = 1,
        one_pass: bool = False,
        parallel: int = 1,
        groups=None,
        metrics=None,
        prepare=None,
        sized: bool = False,
        jit: bool = False,
        **shared,
    ):
        super().__init__(variables, optimizer, jit=jit, **shared)
        self.objective = as_objective(objective)
        self.groups = tuple(groups if groups is not None else self.objective.groups)
        self.metrics, self.one_pass = metrics, bool(one_pass)
        self.prepare = prepare or as_data
        self.sized = bool(sized)
        # Micro-steps in flight at once: 1 adds each micro-batch to the caches as it is done (the least memory);
        # more carries the sums as tensors (one more gradient-sized buffer per normaliser, and up to
        # ``parallel`` micro-batches of activations alive) so that micro-steps can overlap.
        self.parallel = 1 if self.one_pass else max(1, int(parallel))
        self.used = [False] * len(self.variables)  # which variables the loss reaches (found while tracing)
        self._n = None  # the batch of the micro-batches accumulated so far (``finish`` divides by it)
        self._k = None  # ``subdivisions`` as read last (``k``)
        with self.strategy.scope():
            # A variable, not a Python int: a new k (subdivisions: auto, a retry after running out of memory)
            # retraces the update only where it makes a new micro-batch size (one graph per size, and one for
            # micro-batches of unknown or unequal sizes).
            self.subdivisions = tf.Variable(int(subdivisions), trainable=False, dtype=tf.int32, name="subdivisions")
            self.totals = Totals(self.groups, len(self.objective.kinds))
            if not self.one_pass:
                self.caches = [GradientCache(self.variables) for _ in self.groups]
                size = terms_size(len(self.groups))
                self.noise = tf.Variable(tf.zeros([size]), trainable=False, name="noise_cache", **REPLICA_LOCAL)
        self._compile_jit = jit
        self.retrace()

    def retrace(self) -> None:
        """The update's graphs made anew: each is traced again at its next call (after the model's layers changed
        how they compute: rematerialisation)."""
        run = self.strategy.run
        # XLA (compile's jit_compile): each micro-step's forward and backward pass is one compiled cluster, and so
        # is the optimizer's apply on one replica (update.py). The pulls, the loop and the all-reduce stay outside:
        # XLA compiles no iterator and no collective.
        self._compiled = tf.function(self._collecting, jit_compile=True, autograph=False) if self._compile_jit else None
        self._update_pulled = graph(self._update_from)
        self._accumulate_pulled = graph(self._accumulate_from)
        self._accumulate_one = graph(self._accumulate_micro, reduce_retracing=True)
        self._finish = graph(lambda n, retry, stop: run(self._finish_replica, args=(n, retry, stop)))
        self._reset = graph(lambda: run(self._reset_replica))

    @property
    def k(self) -> int:
        """``subdivisions`` as a Python int, read from the variable once after each change: a read is an eager op,
        which the loop would otherwise pay several times an update (about 0.1 ms each on a 2-core CPU)."""
        if self._k is None:
            self._k = int(self.subdivisions.numpy())
        return self._k

    def set_subdivisions(self, k: int) -> None:
        self.subdivisions.assign(int(k))
        self._k = int(k)

    def restored(self) -> None:
        """The variables were restored from a checkpoint: ``k`` reads ``subdivisions`` again."""
        self._k = None

    # -- host side

    def update_from(self, iterator, n: int, pulls: int, stop=0, size=None, held=False):
        """One update whose micro-batches the graph pulls from ``iterator`` (``pulls`` elements per local replica,
        each ``prepare``d inside its micro-step), ``n`` the global batch (or the nominal one of a stream): one
        graph call; the record {loss, grad_norm, applied, learning_rate, retry, stop, examples, noise, ...},
        with ``logs`` when there are metrics. ``stop``: the signal this process was sent (0: none); ``stop``
        out: the largest any process was sent. ``size``: the examples of every element of every replica, when
        all hold the same number, else None (used where ``sized``: one graph per size, traced once). ``held``: the
        elements are a held batch's (feed.held), taken as they are rather than ``prepare``d."""
        self._n = None
        size = size if self.sized else None
        single = self.replicas == 1 and int(pulls) == 1  # a Python bool: one graph for it, one for the rest
        pulled = self._update_pulled(iterator, _size(n), _size(pulls), _size(stop), size, single, held)
        return _first(self.strategy, pulled)

    def accumulate_from(self, iterator, n: int, pulls: int, size=None, held=False):
        """``update_from``'s micro-batches into the caches, nothing applied (``finish`` concludes); the examples
        this process's first replica holds so far."""
        self._n = n
        size = size if self.sized else None
        return _first(self.strategy, self._accumulate_pulled(iterator, _size(n), _size(pulls), size, held))

    def update(self, x, y, n=None, stop=0):
        """One update from a batch held in memory (this process's examples of the global batch of ``n``: all of
        them, except under multi-worker, where a process holds its replicas' contiguous shares), through the
        feed's cut (feed.held): as ``update_from``."""
        iterator, n, pulls, size = held(self, (x, y), n)
        return self.update_from(iterator, n, pulls, stop, size, held=True)

    def accumulate_batch(self, x, y, n=None, sample_weight=None):
        """All micro-batches of a held batch into the caches, nothing applied; as ``accumulate_from``."""
        data = (x, y) if sample_weight is None else (x, y, sample_weight)
        return self.accumulate_from(*held(self, data, n), held=True)

    def accumulate(self, x, y, n):
        """One micro-batch (the same on every replica) into the caches, ``n`` the batch it is part of; as
        ``accumulate_from``."""
        self._n = n
        return _first(self.strategy, self._accumulate_one((x, y), _size(n)))

    def accumulated(self) -> list:
        """What was accumulated so far as the batch's gradient, one tensor per variable (the sum over this
        process's replicas; nothing is applied or cleared)."""
        totals = self.totals.values()  # read across replicas: their sum
        factors, _ = combine(totals, self.groups, _size(self._n))
        scale = self.loss_scale if self.dynamic else 1.0
        return [
            tf.add_n([f * cache.slots[i].read_value() for f, cache in zip(factors, self.caches)]) / scale
            for i in range(len(self.variables))
        ]

    def finish(self, retry=False, stop=0):
        """Reduce what was accumulated, then apply it once (or skip it if anything is not finite, or drop it if
        any worker asks to ``retry``), then clear it; the update's record."""
        n, self._n = self._n, None
        return _first(self.strategy, self._finish(_size(n), tf.constant(bool(retry)), _size(stop)))

    def reset(self) -> None:
        """Forget a half-done update: the caches, totals, noise terms and pooled BatchNorm statistics (on every
        replica, in replica context: no collective, so workers may reset different numbers of times). The
        metrics' state is the caller's to restore."""
        self._n = None
        self._reset()

    # -- inside the graph: the micro-step

    def _gradients(self, x, y, sample_weight, n):
        """One micro-batch: its parts, its sums as divided (``shares``) and per normaliser the gradients of its
        (loss-scaled) share."""
        if self._compiled is None:
            parts, shares, gradients, predictions = self._compute(x, y, sample_weight, n)
        else:
            # BatchNorm layers collecting their sums (the carried loop) get them as the compiled call's outputs:
            # a tensor made inside it cannot leave it any other way
            lists = [p._collected for p in self._pending() if p._collected is not None]
            flat, shares, gradients, (predictions, masks), collected = self._compiled(
                x, y, sample_weight, n, bool(lists)
            )
            parts, predictions = Parts(*flat), keras_private.masked(predictions, masks)
            for into, sums_of_calls in zip(lists, collected):
                into.extend(sums_of_calls)
        if self.metrics is not None:
            self.metrics.update(x, y, predictions, sample_weight, self.objective.steps)
        return parts, shares, gradients

    def _compute(self, x, y, sample_weight, n):
        with tf.GradientTape(persistent=len(self.groups) > 1) as tape:
            parts, predictions = self.objective.evaluate(x, y, sample_weight, True, self.groups)
            shares = {g: parts.sums[g] / scale_of(g, n) for g in self.groups}
            targets = [self._scaled(shares[g]) for g in self.groups]
        gradients = [tape.gradient(target, self.variables) for target in targets]
        del tape
        for grads in gradients:
            self.used = [u or g is not None for u, g in zip(self.used, grads)]
        return parts, shares, gradients, predictions

    def _pending(self) -> list:
        return [layer.pending for layer in self.norm_layers]

    def _collecting(self, x, y, sample_weight, n, collecting: bool):
        """``_compute`` as the XLA function runs it: plain structures out, and with ``collecting`` the BatchNorm
        sums of this micro-batch (a list per collecting layer) instead of into the variables."""
        lists = [[] for _ in self._pending()] if collecting else []
        outer = [p._collected for p in self._pending()]
        try:
            for p, into in zip(self._pending(), lists):
                p._collected = into
            parts, shares, gradients, predictions = self._compute(x, y, sample_weight, n)
        finally:
            for p, was in zip(self._pending(), outer):
                p._collected = was
        return parts.flat(), shares, gradients, (predictions, keras_private.masks_of(predictions)), lists

    def _micro(self, data, n, prepare):
        """Replica context: one micro-batch into the caches and totals."""
        parts, shares, gradients = self._gradients(*prepare(data, n), n)
        for cache, grads in zip(self.caches, gradients):
            cache.add(grads)
        self.totals.add(self.totals.plus(self.totals.zeros(), parts, shares))
        self.noise.assign_add(noise.micro_terms(gradients, units(parts, self.groups)))

    # -- the two loops

    def _carried(self, fetch, prepare, k, n):
        """The k micro-batches (``fetch(i)``, then ``prepare``d) with their sums carried through the loop as
        tensors and written to the caches once. No variable is written inside the loop (but the metrics'), so
        up to ``parallel`` micro-steps can run at once; the next micro-batch is fetched by the micro-step before
        it, and each sum still adds in micro-batch order, the order the caches add in."""
        pending = self._pending()

        def body(i, element, grads, totals, stats, terms):
            # first: the next micro-step can start once its micro-batch is here, while this one still runs
            following = tf.cond(i + 1 < k, lambda: fetch(i + 1), lambda: element)
            with contextlib.ExitStack() as stack:
                collected = [stack.enter_context(p.collect()) for p in pending]
                parts, shares, gradients = self._gradients(*prepare(element, n), n)
            grads = [
                [total if g is None else total + dense(g) for total, g in zip(sums, micro)]
                for sums, micro in zip(grads, gradients)
            ]
            stats = list(stats)  # one [count, sum, sum of squares] per layer
            for j, calls in enumerate(collected):
                for sums in calls:  # one per call of the layer in this micro-batch
                    stats[j] = [total + s for total, s in zip(stats[j], sums)]
            terms = terms + noise.micro_terms(gradients, units(parts, self.groups))
            return i + 1, following, grads, self.totals.plus(totals, parts, shares), stats, terms

        start = (
            tf.constant(0),
            fetch(0),
            [[tf.zeros(v.shape, tf.float32) for v in self.variables] for _ in self.groups],
            self.totals.zeros(),
            [[tf.zeros(v.shape, v.dtype) for v in p.variables()] for p in pending],
            tf.zeros(self.noise.shape),
        )
        _, _, grads, totals, stats, terms = tf.while_loop(
            lambda i, *_: i < k, body, start, parallel_iterations=self.parallel
        )
        for cache, sums in zip(self.caches, grads):
            cache.add(sums)
        self.totals.add(totals)
        for p, sums in zip(pending, stats):
            p.add_sums(sums)
        self.noise.assign_add(terms)

    def _steps(self, fetch, prepare, k, n):
        if self.parallel > 1:
            self._carried(fetch, prepare, k, n)
        else:  # one at a time
            in_turn(k, lambda i: self._micro(fetch(i), n, prepare))

    # -- pulled from a pipeline

    def _prepare_for(self, size, held=False):
        """``prepare`` (a held batch's elements, (data, where): their data as they are), each element's examples
        fixed at ``size`` first when that is known (feed.sized)."""
        prepare = (lambda element, n: as_data(element[0])) if held else self.prepare
        return prepare if size is None else lambda element, n: prepare(sized(element, size), n)

    def _pull(self, iterator, n, pulls, size, held=False):
        """``pulls`` micro-steps per local replica from ``iterator``: one element per replica and pull."""
        prepare = self._prepare_for(size, held)
        if self.replicas == 1:  # in replica context (a strategy's variables are written there), pulled from it
            self.strategy.run(lambda: self._steps(lambda i: next(iterator), prepare, pulls, n))
            return
        # a replica cannot pull from a distributed iterator: one pull per step, each replica's element in turn
        in_turn(pulls, lambda i: self.strategy.run(lambda e: self._micro(e, n, prepare), args=(next(iterator),)))

    def _accumulate_from(self, iterator, n, pulls, size, held=False):
        self._pull(iterator, n, pulls, size, held)
        return self._held()

    def _update_from(self, iterator, n, pulls, stop, size, single=False, held=False):
        if self.one_pass or single:  # the one element of each replica's share, straight to the all-reduce
            prepare = self._prepare_for(size, held)
            return self.strategy.run(lambda e: self._one_pass(prepare(e, n), n, stop), args=(next(iterator),))
        self._pull(iterator, n, pulls, size, held)
        return self.strategy.run(self._finish_replica, args=(n, False, stop))

    def _accumulate_micro(self, data, n):
        self.strategy.run(self._micro, args=(data, n, as_data))
        return self._held()

    def _held(self):
        """Each replica's examples in the caches so far (in replica context: no collective)."""
        return self.strategy.run(self.totals.examples.read_value)


def accumulator_for(model, objective, optimizer, *, subdivisions: int, **options) -> Accumulator:
    """The Accumulator training ``model`` (a Keras model, or the CLI's models/containers.py wrapper of one or of a
    TensorLayer net) on ``objective``; ``options`` are the Accumulator's other keyword arguments."""
    network = model if isinstance(model, keras.Model) else getattr(model, "network", None)
    variables = model.trainable_variables
    if isinstance(model, keras.Model):
        variables = [keras_private.storage(v) for v in variables]
    sized = isinstance(network, keras.Model) and keras_private.loops_over_time(network)
    if isinstance(network, keras.Model):  # a weight's constraint, which Keras' optimizer reads off its own variable
        options["constraints"] = [v.constraint for v in network.trainable_variables]
    return Accumulator(objective, variables, optimizer, subdivisions=subdivisions, sized=sized, **options)
