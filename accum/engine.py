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
all-reduce. The gradient cache is gradient_cache.py's, the built-in loss
losses.py's.

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
import signal
from collections.abc import Callable, Sequence

import tensorflow as tf

from .batching import micro_bounds
from .gradient_cache import GradientCache, all_finite

NAN = float("nan")
SIGINT, SIGTERM = int(signal.SIGINT), int(signal.SIGTERM)


def local_replica_ids(strategy: tf.distribute.Strategy) -> list:
    """The global ids of this process's replicas (all of them, except under multi-worker)."""
    ids = strategy.experimental_distribute_values_from_function(lambda ctx: tf.constant(ctx.replica_id_in_sync_group))
    return [int(i) for i in strategy.experimental_local_results(ids)]


def _first(strategy, structure):
    """The value of replica 0 of this process (every replica computes the same one)."""
    return tf.nest.map_structure(lambda t: strategy.experimental_local_results(t)[0], structure)


def _size(y, n=None):
    """The global batch size as the graphs take it (a tensor: a Python int would retrace per value)."""
    return tf.constant(len(tf.nest.flatten(y)[0]) if n is None else int(n), tf.int32)


def _rows(structure, start, end):
    """Examples [start, end) of a batch: a tensor, or a structure of them (targets with sample weights)."""
    return tf.nest.map_structure(lambda tensor: tensor[start:end], structure)


def _examples(structure):
    """How many examples a batch (or a structure of tensors of one batch) holds."""
    return tf.shape(tf.nest.flatten(structure)[0])[0]


def _signal(stop) -> tf.Tensor:
    """A stop request as the graphs take it (a tensor: a Python int would retrace per value)."""
    return tf.constant(int(stop), tf.int32)


def _as_given(element, n):
    """An element that is already (x, y)."""
    return element


def _function(fn, input_signature):
    kwargs = {"input_signature": input_signature} if input_signature else {"reduce_retracing": True}
    return tf.function(fn, **kwargs)


class Update:
    """What every engine shares: the one all-reduce, then one clipped apply per update, or a skip.

    ``norm_layers`` are objects with ``deferred``, ``pending.values()``,
    ``fold(values)`` and ``discard()`` (AccumBatchNorm): the engine defers their
    moving statistics and folds them in once per applied update, from the sums
    of every micro-batch on every replica. ``strategy`` None is one device.
    """

    def __init__(
        self,
        variables: Sequence[tf.Variable],
        optimizer,
        *,
        clip_norm: float | None = None,
        norm_layers=(),
        strategy: tf.distribute.Strategy | None = None,
        loss_scale: float | None = None,
        growth_updates: int = 2000,
        prepare: Callable | None = None,
    ):
        self.strategy = strategy or tf.distribute.get_strategy()
        # What a micro-step makes of an element pulled from a feed (accum/feed.py): (x, y) as the loss takes
        # them; inside the micro-step, so that the pipeline holds stored values (uint8), never float inputs.
        self.prepare = prepare or _as_given
        self.variables = list(variables)
        self.optimizer = optimizer
        self.clip_norm = clip_norm
        self.norm_layers = list(norm_layers)
        for layer in self.norm_layers:
            layer.deferred = True  # moving statistics move once per update, not per micro-batch
        self.replica_ids = local_replica_ids(self.strategy)
        with self.strategy.scope():
            self.bad_updates_in_a_row = tf.Variable(0, dtype=tf.int64, trainable=False, name="bad_updates_in_a_row")
            self.skipped_updates = tf.Variable(0, dtype=tf.int64, trainable=False, name="skipped_updates")
            # Dynamic loss scaling (mixed_float16): ONE scale per update. Every micro-batch is scaled by
            # it, the accumulated gradient is unscaled once, and it changes only between updates.
            self.dynamic = loss_scale is not None
            self.growth_updates = int(growth_updates)
            self.loss_scale = tf.Variable(float(loss_scale or 1.0), trainable=False, name="loss_scale")
            self.good_updates = tf.Variable(0, dtype=tf.int64, trainable=False, name="good_updates")
        self.hold()

    def hold(self) -> None:
        """Keep the optimizer from all-reducing what apply_gradients gets: the gradients reaching it are already
        the global sum (the one all-reduce). ``release`` gives it back its own."""
        if self.optimizer is not None:
            if not hasattr(self.optimizer, "_all_reduce_sum_gradients"):
                raise RuntimeError(
                    "this Keras optimizer has no _all_reduce_sum_gradients: the engine cannot stop "
                    "it from reducing the gradients a second time; use Keras 3.x with TensorFlow"
                )
            self.optimizer._all_reduce_sum_gradients = list

    @property
    def replicas(self) -> int:
        return self.strategy.num_replicas_in_sync

    def release(self) -> None:
        """Give the optimizer back its own all-reduce (a caller's optimizer may train elsewhere after this)."""
        if self.optimizer is not None and "_all_reduce_sum_gradients" in vars(self.optimizer):
            del self.optimizer._all_reduce_sum_gradients

    @property
    def one_process(self) -> bool:
        """Every replica is in this process (one device, or mirrored): nothing to agree on with others."""
        return self.replicas == len(self.replica_ids)

    def largest_over_workers(self, value: int) -> int:
        """The largest ``value`` any worker holds (every worker must call this at the same point)."""
        if self.one_process:
            return int(value)

        def every():  # each replica puts its value at its own place: the SUM holds every replica's
            ctx = tf.distribute.get_replica_context()
            mine = tf.one_hot(ctx.replica_id_in_sync_group, self.replicas) * float(value)
            return ctx.all_reduce(tf.distribute.ReduceOp.SUM, mine)

        return int(tf.reduce_max(_first(self.strategy, tf.function(lambda: self.strategy.run(every))())))

    def learning_rate(self):
        """The rate the next apply_gradients uses (the schedule at optimizer.iterations)."""
        return tf.cast(self.optimizer.learning_rate, tf.float32)

    def _shares(self, x, y, n):
        """Each local replica's contiguous share of the global batch, from this process's examples."""
        if len(self.replica_ids) == 1 and self.replicas == 1:
            return x, y  # one device: the batch itself
        offset = micro_bounds(self.replica_ids[0], n, self.replicas)[0]

        def share(ctx, tensor):
            start, end = micro_bounds(ctx.replica_id_in_sync_group, n, self.replicas)
            return _rows(tensor, start - offset, end - offset)

        return (
            self.strategy.experimental_distribute_values_from_function(lambda ctx: share(ctx, x)),
            self.strategy.experimental_distribute_values_from_function(lambda ctx: share(ctx, y)),
        )

    def _scaled(self, loss):
        """What a micro-batch differentiates: its loss share times the update's loss scale."""
        return loss * self.loss_scale if self.dynamic else loss

    def _conclude(self, loss, gradients, retry, stop=0):
        """Replica context: reduce, then apply once, skip (not finite) or drop (retry) in cross-replica context.

        ``stop``: the signal (SIGINT 2, SIGTERM 15; 0: none) this process received. It rides in the same
        all-reduce, so every process learns after this same update that one of them was asked to stop."""
        used = [g is not None for g in gradients]
        reduced = self._all_reduce(self._payload(loss, gradients, retry, stop))
        return self._settle(reduced["loss"], self._unscaled(reduced["grads"]), reduced, used)

    def _payload(self, loss, gradients, retry, stop=0, extra=None) -> dict:
        """What the update's one all-reduce carries: gradients (None as zeros), the loss, the BatchNorm sums,
        the retry flag, the stop request and ``extra`` (any structure of float tensors the caller sums too)."""
        grads = [
            tf.zeros(v.shape, tf.float32) if g is None else tf.cast(g, tf.float32)
            for g, v in zip(gradients, self.variables * (len(gradients) // max(len(self.variables), 1)))
        ]
        stop = tf.convert_to_tensor(stop, tf.int32)
        return {
            "grads": grads,
            "stats": [layer.pending.values() for layer in self.norm_layers],  # [count, sum, sum of squares] each
            "loss": loss,
            "retry": tf.cast(retry, tf.float32),
            "stop": tf.cast(tf.stack([tf.equal(stop, SIGINT), tf.equal(stop, SIGTERM)]), tf.float32),
            "extra": extra if extra is not None else {},
        }

    @staticmethod
    def _all_reduce(payload: dict) -> dict:
        """One collective: all_reduce batches the whole structure."""
        return tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, payload)

    def _unscaled(self, grads):
        """The reduced gradients without the update's loss scale (unscaled once, for the whole update)."""
        if not self.dynamic:
            return grads
        scale = self.loss_scale.read_value()
        return [g * (1.0 / scale) for g in grads]

    def _settle(self, loss, grads, reduced: dict, used):
        """Replica context, after the all-reduce: the finite check, clipping, then apply once, skip (not
        finite) or drop (retry) in cross-replica context; the update's record. ``grads``: the global,
        unscaled gradients; ``reduced``: the payload as reduced (stats, retry, stop)."""
        ctx = tf.distribute.get_replica_context()
        stats, retried = reduced["stats"], reduced["retry"]
        # SIGTERM (a platform preempting the machine) wins over SIGINT
        stop = tf.where(reduced["stop"][1] > 0, SIGTERM, tf.where(reduced["stop"][0] > 0, SIGINT, 0))
        scale = self.loss_scale.read_value()
        retry = retried > 0  # any replica of any worker asked for it: all drop the update together
        finite = all_finite(loss, grads)
        # An overflow of the scaled gradient (the loss itself finite): a smaller scale will fix it.
        overflow = (
            tf.logical_and(tf.logical_not(finite), tf.logical_and(tf.math.is_finite(loss), scale > 1.0))
            if self.dynamic
            else tf.constant(False)
        )
        applied = tf.logical_and(finite, tf.logical_not(retry))
        norm = tf.linalg.global_norm(grads)
        if self.clip_norm is not None:
            grads, _ = tf.clip_by_global_norm(grads, self.clip_norm, use_norm=norm)
        rate = self.learning_rate()  # read before the apply advances optimizer.iterations
        ctx.merge_call(self._decide, args=(applied, retry, overflow, tuple(grads), tuple(stats), tuple(used)))
        for layer in self.norm_layers:
            layer.discard()
        nan = tf.constant(NAN)
        out = {
            "loss": loss,
            "grad_norm": tf.where(applied, norm, nan),
            "applied": applied,
            "learning_rate": tf.where(applied, rate, nan),
            "retry": retry,
            "stop": stop,
        }
        if self.dynamic:
            out.update(loss_scale=scale, overflow=overflow)
        return out

    def _decide(self, strategy, applied, retry, overflow, grads, stats, used):
        """Cross-replica context: every replica holds the same decision; the branches hold no collective."""

        def apply():
            def apply_local(*local):
                self.optimizer.apply_gradients(
                    [(tf.cast(g, v.dtype), v) for g, v, u in zip(local, self.variables, used) if u]
                )

            strategy.extended.call_for_each_replica(apply_local, args=grads)
            for layer, sums in zip(self.norm_layers, stats):
                layer.fold(_first(strategy, sums))
            self.bad_updates_in_a_row.assign(0)
            if self.dynamic:  # grow after growth_updates applied updates in a row: counted in updates
                grow = self.good_updates + 1 >= self.growth_updates
                self.loss_scale.assign(tf.where(grow, self.loss_scale * 2.0, self.loss_scale))
                self.good_updates.assign(tf.where(grow, tf.constant(0, tf.int64), self.good_updates + 1))
            return tf.constant(True)

        def skip():  # weights, optimizer state and statistics stay as they were
            self.skipped_updates.assign_add(1)
            if not self.dynamic:
                self.bad_updates_in_a_row.assign_add(1)
                return tf.constant(False)
            # An overflow while the scale searches halves it, once for the whole update, and is not a
            # bad update; anything else (a non-finite loss, or still non-finite at scale 1) is.
            over = _first(strategy, overflow)
            self.bad_updates_in_a_row.assign_add(tf.where(over, tf.constant(0, tf.int64), tf.constant(1, tf.int64)))
            self.loss_scale.assign(tf.where(over, tf.maximum(self.loss_scale / 2.0, 1.0), self.loss_scale))
            self.good_updates.assign(0)
            return tf.constant(False)

        return tf.cond(
            _first(strategy, applied), apply, lambda: tf.cond(_first(strategy, retry), lambda: tf.constant(False), skip)
        )

    def reset(self):
        """Forget a half-done update (pooled BatchNorm statistics)."""
        for layer in self.norm_layers:
            layer.discard()


class AccumulatingUpdate(Update):
    """The subdivided update: accumulate k micro-batches per replica, reduce and apply once.

    ``loss_fn(x, y)`` returns the per-example loss (a vector) of a micro-batch
    in training mode. ``input_signature`` is (x, y) of a batch; ``update``,
    ``accumulate_batch`` and ``finish`` take this process's examples of the
    global batch (all of them, except under multi-worker: the shares of its
    replicas, in replica order, see ``data.worker_part``) and ``n``, the
    global batch size. ``shared`` are Update's keyword arguments (clip_norm,
    norm_layers, strategy, loss_scale, growth_updates).
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

    def _accumulate_micro(self, x, y, batch_examples):
        """Add the gradient of this micro-batch's share of the batch's mean loss."""
        share, gradients = self._micro_gradients(x, y, batch_examples)
        self.cache.add(gradients, share)
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

        def body(i, element, loss, grads, stats):
            following = tf.cond(i + 1 < k, lambda: fetch(i + 1), lambda: element)
            with contextlib.ExitStack() as stack:
                collected = [stack.enter_context(p.collect()) for p in pending]
                share, micro_grads = self._micro_gradients(*prepare(element, n), n)
            grads = [total if g is None else total + tf.cast(g, tf.float32) for total, g in zip(grads, micro_grads)]
            stats = list(stats)  # one [count, sum, sum of squares] per layer
            for j, calls in enumerate(collected):
                for sums in calls:  # one per call of the layer in this micro-batch
                    stats[j] = [total + s for total, s in zip(stats[j], sums)]
            return i + 1, following, loss + share, grads, stats

        start = (
            tf.constant(0),
            fetch(0),
            tf.constant(0.0),
            [tf.zeros(v.shape, tf.float32) for v in self.variables],
            [[tf.zeros(v.shape, v.dtype) for v in p.variables()] for p in pending],
        )
        _, _, loss, grads, stats = tf.while_loop(lambda i, *_: i < k, body, start, parallel_iterations=self.parallel)
        self.cache.add(grads, loss)
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
        out = self._conclude(self.cache.loss.read_value(), self.cache.gradients(), retry, stop)
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
