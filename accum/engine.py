"""The accumulation engine: a gradient cache and a one-graph-call update, on
one device or on any tf.distribute strategy.

A batch of ``n`` examples is cut into ``k = min(subdivisions, n)`` contiguous
micro-batches whose sizes differ by at most one. Each micro-batch adds the
gradient of ``sum(per-example loss) / n`` to the cache, so the cache ends up
holding the gradient of the *mean loss over the whole batch*, whatever the
split: ragged micro-batches and a short last batch are weighted by their
example counts. (Dividing by ``subdivisions``, or averaging micro-batch means
as equals, is biased as soon as the sizes differ.)

One device is tf.distribute's default strategy: the same code runs there and
on MirroredStrategy or MultiWorkerMirroredStrategy. Under a strategy each
replica takes its contiguous share of the global batch and cuts that into k
micro-batches; the cache (and the BatchNorm layers' pending statistics) are
replica-local ``ON_READ``/``SUM`` variables, so no collective runs inside the
micro-batch loop. An update then makes ONE collective: a single all-reduce of
the accumulated gradients, the loss, a retry flag and the BatchNorm sums.
Norm, clipping and the finite check act on the reduced (global) values, the
same on every replica; the apply-or-skip decision is a ``tf.cond`` in
cross-replica context (``merge_call``), whose apply branch goes back to the
replicas for ``apply_gradients`` (``call_for_each_replica``). Neither branch
holds a collective, so the replicas cannot disagree inside one. Keras'
optimizer would all-reduce the gradients a second time inside
``apply_gradients``; the engine turns that off (``_all_reduce_sum_gradients``,
its one private Keras hook, guarded by a test that a double reduction fails).
The baseline, ``PlainUpdate`` (baseline.py), is the same update without the
micro-batches: each replica's share of the batch in one pass, then the same
all-reduce. What every update shares (the all-reduce, apply or skip, the loss
scale, the counters) is update.py's, the gradient cache gradient_cache.py's,
the built-in loss losses.py's, the micro-batches a run pulls feed.py's.

The pieces are separately usable: ``reset``, ``accumulate`` (one
micro-batch), ``accumulate_batch`` (all k micro-batches of a batch) and
``finish`` (reduce, then apply once or skip, then clear). ``update`` composes
them into ONE tf.function call per batch: the micro-batch loop is a
``tf.range`` loop inside the graph, so only one micro-batch of activations is
alive at a time and Python is entered once per update. With ``parallel`` > 1
the loop carries the sums as tensors instead (a ``tf.while_loop`` with
``parallel_iterations``) and writes them to the cache once, so that up to that
many micro-steps run at once: on a few CPU cores, small micro-batches keep the
cores busier that way than with threads inside each op (threads.py). The sums
add in micro-batch order either way: the two paths give the same bits.
Nothing here knows TensorLayer: any list of variables and per-example loss
function will do.

Every engine counts, inside its graph, the updates it skipped in all and in a
row; the training loop reads the counters after each update and checkpoints
them, so they are never stale.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence

import tensorflow as tf

from .batching import micro_bounds
from .gradient_cache import GradientCache
from .update import Update, _as_given, _examples, _first, _function, _rows, _signal, _size


class AccumulatingUpdate(Update):
    """The subdivided update: accumulate k micro-batches per replica, reduce and apply once.

    ``loss_fn(x, y)`` returns the per-example loss (a vector) of a micro-batch
    in training mode. ``input_signature`` is (x, y) of a batch; ``update``,
    ``accumulate_batch`` and ``finish`` take this process's examples of the
    global batch (all of them, except under multi-worker: the shares of its
    replicas, in replica order, see ``data.worker_part``) and ``n``, the
    global batch size. ``shared`` are Update's keyword arguments (clip_norm,
    norm_layers, strategy, loss_scale, growth_steps).
    """

    def __init__(
        self,
        loss_fn: Callable,
        variables: Sequence[tf.Variable],
        optimizer,
        *,
        subdivisions: int,
        input_signature=None,
        parallel: int = 1,
        **shared,
    ):
        super().__init__(variables, optimizer, **shared)
        self.loss_fn = loss_fn
        # Micro-steps in flight at once: 1 adds each micro-batch to the cache variables as it is done
        # (the least memory); more carries the sums as tensors (one more gradient-sized buffer, and up
        # to ``parallel`` micro-batches of activations alive) so that micro-steps can overlap.
        self.parallel = int(parallel)
        with self.strategy.scope():
            self.cache = GradientCache(self.variables)
            # A variable, not a Python int, so that changing k (subdivisions: auto,
            # retry after out-of-memory) never retraces the graph.
            self.subdivisions = tf.Variable(int(subdivisions), trainable=False, dtype=tf.int32, name="subdivisions")
        signature = (*input_signature, tf.TensorSpec([], tf.int32)) if input_signature else None
        self._update = _function(self._update_all, signature and (*signature, tf.TensorSpec([], tf.int32)))
        self._accumulate_batch = _function(self._accumulate_all, signature)
        self._finish = tf.function(lambda retry, stop: self.strategy.run(self._finish_replica, args=(retry, stop)))
        self._accumulate = tf.function(
            lambda x, y, n: self.strategy.run(self._accumulate_micro, args=(x, y, n)), reduce_retracing=True
        )
        self._reset = tf.function(lambda: self.strategy.run(self._reset_replica))
        self._update_pulled = tf.function(self._update_from)
        self._accumulate_pulled = tf.function(self._accumulate_from)

    def set_subdivisions(self, k: int) -> None:
        self.subdivisions.assign(int(k))

    # -- the separately usable pieces (host side)

    def update(self, x, y, n=None, stop=0):
        """One update from a batch: one graph call; {loss, grad_norm, applied, learning_rate, retry, stop}.
        ``stop``: the signal this process was sent (0: none); ``stop`` out: any process's (``_conclude``)."""
        return _first(self.strategy, self._update(x, y, _size(y, n), _signal(stop)))

    def update_from(self, iterator, n: int, pulls: int, stop=0):
        """One update whose micro-batches the graph pulls from ``iterator`` (a feed's: ``pulls`` elements per
        local replica, each ``prepare``d inside its micro-step), ``n`` the global batch: one graph call, the
        record ``update`` gives. Only one micro-batch is ever an input: the batch is never held whole."""
        return _first(self.strategy, self._update_pulled(iterator, _size(None, n), _size(None, pulls), _signal(stop)))

    def accumulate_from(self, iterator, n: int, pulls: int):
        """``update_from``'s micro-batches into the cache, nothing applied (``finish`` concludes)."""
        return _first(self.strategy, self._accumulate_pulled(iterator, _size(None, n), _size(None, pulls)))

    def accumulate_batch(self, x, y, n=None):
        """All k micro-batches of a batch into the cache, nothing applied; this replica's loss share."""
        return _first(self.strategy, self._accumulate_batch(x, y, _size(y, n)))

    def finish(self, retry=False, stop=0):
        """Reduce the cache, then apply it once (or skip it if anything is not finite, or drop it if any
        worker asks to ``retry``), then clear it; the update's record, as ``update`` gives it."""
        return _first(self.strategy, self._finish(tf.constant(bool(retry)), _signal(stop)))

    def accumulate(self, x, y, batch_examples):
        """One micro-batch (the same on every replica) into the cache; its share of the batch's mean loss."""
        return _first(self.strategy, self._accumulate(x, y, _size(y, batch_examples)))

    def reset(self):
        """Forget a half-done update: the cache and the pooled BatchNorm statistics (on every replica,
        in replica context: no collective, so workers may reset different numbers of times)."""
        self._reset()

    def _reset_replica(self):
        self.cache.clear()
        super().reset()

    # -- inside the graph

    def _micro_gradients(self, x, y, batch_examples):
        """This micro-batch's share of the batch's mean loss, and its (scaled) gradients."""
        with tf.GradientTape() as tape:
            losses = self.loss_fn(x, y)
            share = tf.reduce_sum(losses) / tf.cast(batch_examples, losses.dtype)
            scaled = self._scaled(share)
        return share, tape.gradient(scaled, self.variables)

    def _noise_terms(self, gradients, examples, batch_examples):
        """[|g_i|^2, 1/b_i, 1] of a micro-batch of b_i = ``examples``, g_i its mean gradient over its own examples
        (accum/noise.py); zeros for an empty one. Its gradients are of (its loss sum) / n, times the loss scale:
        g_i is them times n / (b_i x scale). One reduction over gradients already computed, no collective."""
        squared = tf.add_n([tf.reduce_sum(tf.square(tf.cast(g, tf.float32))) for g in gradients if g is not None])
        b = tf.cast(examples, tf.float32)
        ratio = tf.cast(batch_examples, tf.float32) / tf.maximum(b, 1.0)
        if self.dynamic:
            ratio = ratio / self.loss_scale
        there = tf.cast(examples > 0, tf.float32)
        return tf.stack([squared * ratio * ratio, 1.0 / tf.maximum(b, 1.0), 1.0]) * there

    def _accumulate_micro(self, x, y, batch_examples):
        """Add the gradient of this micro-batch's share of the batch's mean loss."""
        share, gradients = self._micro_gradients(x, y, batch_examples)
        self.cache.add(gradients, share, self._noise_terms(gradients, _examples(y), batch_examples))
        return share

    def _accumulate_replica(self, x, y, n):
        """This replica's share (x, y) of a batch of n, as k micro-batches, into its cache."""
        local_n = _examples(y)
        k = tf.minimum(self.subdivisions, local_n)  # a short share may have fewer examples than k, even none

        def micro_batch(i):
            start, end = micro_bounds(i, local_n, k)
            return _rows(x, start, end), _rows(y, start, end)

        if self.parallel > 1:
            return self._carried(micro_batch, _as_given, k, n)
        loss = tf.constant(0.0)
        for i in tf.range(k):
            loss += self._accumulate_micro(*micro_batch(i), n)
        return loss

    def _carried(self, fetch, prepare, k, n):
        """The k micro-batches (``fetch(i)``, then ``prepare``d) with their sums carried through the loop as
        tensors and written to the cache once. No variable is written inside the loop, so up to ``parallel``
        micro-steps can run at once (``parallel_iterations``); the next micro-batch is fetched by the
        micro-step before it, and each sum still adds in micro-batch order, the order the cache adds in."""
        pending = [layer.pending for layer in self.norm_layers]

        def body(i, element, loss, grads, stats, noise):
            following = tf.cond(i + 1 < k, lambda: fetch(i + 1), lambda: element)
            with contextlib.ExitStack() as stack:
                collected = [stack.enter_context(p.collect()) for p in pending]
                x, y = prepare(element, n)
                share, micro_grads = self._micro_gradients(x, y, n)
            grads = [total if g is None else total + tf.cast(g, tf.float32) for total, g in zip(grads, micro_grads)]
            stats = list(stats)  # one [count, sum, sum of squares] per layer
            for j, calls in enumerate(collected):
                for sums in calls:  # one per call of the layer in this micro-batch
                    stats[j] = [total + s for total, s in zip(stats[j], sums)]
            noise = noise + self._noise_terms(micro_grads, _examples(y), n)
            return i + 1, following, loss + share, grads, stats, noise

        start = (
            tf.constant(0),
            fetch(0),
            tf.constant(0.0),
            [tf.zeros(v.shape, tf.float32) for v in self.variables],
            [[tf.zeros(v.shape, v.dtype) for v in p.variables()] for p in pending],
            tf.zeros([3]),
        )
        _, _, loss, grads, stats, noise = tf.while_loop(
            lambda i, *_: i < k, body, start, parallel_iterations=self.parallel
        )
        self.cache.add(grads, loss, noise)
        for p, sums in zip(pending, stats):
            p.add_sums(sums)
        return loss

    def _pull(self, iterator, n, pulls):
        """A feed's ``pulls`` micro-steps per replica into the caches: one element per replica and pull (a replica
        cannot pull from a distributed iterator, so micro-steps overlap only on one device)."""
        if self.parallel > 1 and self.replicas == 1 and self.one_process:
            self._carried(lambda i: next(iterator), self.prepare, pulls, n)
            return
        for _ in tf.range(pulls):
            # one micro-step at a time: the next element is pulled (and converted) when this one is done
            tf.autograph.experimental.set_loop_options(parallel_iterations=1)
            self.strategy.run(self._accumulate_element, args=(next(iterator), n))

    def _accumulate_element(self, element, n):
        return self._accumulate_micro(*self.prepare(element, n), n)

    def _update_from(self, iterator, n, pulls, stop):
        self._pull(iterator, n, pulls)
        return self.strategy.run(self._finish_replica, args=(False, stop))

    def _accumulate_from(self, iterator, n, pulls):
        self._pull(iterator, n, pulls)
        return self.strategy.run(self.cache.loss.read_value)

    def _finish_replica(self, retry, stop=0):
        noise = {"noise": self.cache.noise.read_value()}
        out = self._conclude(self.cache.loss.read_value(), self.cache.gradients(), retry, stop, noise)
        self.cache.clear()
        return out

    def _accumulate_all(self, x, y, n):
        xs, ys = self._shares(x, y, n)
        return self.strategy.run(self._accumulate_replica, args=(xs, ys, n))

    def _update_all(self, x, y, n, stop):
        xs, ys = self._shares(x, y, n)

        def replica_update(x, y):
            self._accumulate_replica(x, y, n)
            return self._finish_replica(False, stop)

        return self.strategy.run(replica_update, args=(xs, ys))
