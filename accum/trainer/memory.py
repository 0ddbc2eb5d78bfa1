"""Memory: what the process peaked at, and keeping a run within memory.

The allocator's peak and ``peak_during``, the one probe (a piece of work run on the first batch, the allocator
peak read over it), are the backend's (accum/backends/: TensorFlow's allocator); bench reads the same peak over its
timed updates. Automatic micro-batches (the CLI's ``subdivisions: auto``, fit's ``micro_batch_size="auto"``) mean
one thing in both doors: the fewest micro-batches per replica share, 1, 2, 4, ..., that fit. Under a memory limit
one micro-step per candidate is measured before training (``choose_subdivisions``); during training, an update that
runs out of memory, or whose first one peaks over the limit, is retried (``MemoryGuard``). Without a limit only the
device's running out of memory says what does not fit (``UNMEASURED``).
"""

from __future__ import annotations

from collections.abc import Callable

from .. import keras_private
from ..backends import active
from ..defaults import MIN_BATCHNORM_MICRO_BATCH
from ..errors import OutOfMemory
from ..text import counted, first_line, size_text
from .data.batching import largest_micro_batch, largest_share
from .data.order import noisy_batchnorm


def peak_rss_bytes() -> int:
    """VmHWM of this process (ru_maxrss would include a parent's peak across fork+exec)."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


# The last rung of automatic micro-batches, in both doors: one example per micro-batch did not fit.
REMAT = (
    "one example per micro-batch does not fit: retrying with each layer's activation recomputed in the backward "
    'pass (keras.RematScope(mode="activations"))'
)


def rematerialiser(network, engine) -> Callable[[], bool] | None:
    """The last rung's ``remat()`` for ``network`` trained by ``engine``: its layers' activations recomputed in the
    backward pass and the engine's graphs traced anew; True if any layer changed (so once: the layers keep it). None
    for a network that is not a Keras model (the CLI's TensorLayer nets)."""
    import keras

    if not isinstance(network, keras.Model):
        return None

    def remat() -> bool:
        if not keras_private.rematerialise_activations(network):
            return False
        engine.retrace()
        return True

    return remat


# Automatic micro-batches without a memory limit: said at the start, in both doors' words.
UNMEASURED = (
    "{name}: no memory_limit, so nothing is measured before training: the first update runs as {first}, and an "
    "update that runs out of memory is retried at twice the micro-batches (a GPU reports running out; a CPU's memory "
    "is the machine's{advice})"
)


def probe(engine, spec, take: Callable, batch: int, say: Callable[[str], None], remat=None) -> None:
    """Automatic micro-batches' k before the first update of a run that starts afresh (or whose replicas changed):
    measured under ``spec``'s memory limit (trainer.TrainSpec) on ``take(m)``, the first m examples of the first
    batch (``choose_subdivisions``), or said to be unmeasured without one. Nothing for other micro-batches."""
    if not spec.micro.auto or spec.baseline:
        return
    if spec.memory_limit is None:
        # memory_limit where the backend measures a peak (on JAX it does not: XLA keeps none on a CPU)
        advice = ": set memory_limit there" if active().MEASURES_PEAK else ""
        say(UNMEASURED.format(name=spec.words.auto, first="one micro-batch per replica", advice=advice))
        return
    limit_bytes, limit = spec.memory_limit
    choose_subdivisions(engine, take, batch, limit, limit_bytes, say, spec.words.auto, remat)


def choose_subdivisions(
    engine,
    take: Callable,
    batch: int,
    memory_limit: str,
    limit_bytes: int,
    say: Callable[[str], None],
    name: str = "subdivisions=auto",
    remat: Callable[[], bool] | None = None,
) -> int:
    """Automatic micro-batches (``name``: as the door calls them) under a memory limit: the smallest k (1, 2, 4,
    ...) whose micro-step fits it.

    One micro-step (forward, backward, add to the cache) runs at each candidate
    micro-batch size of a replica's share of the batch; the cache and
    statistics are cleared afterwards, so no weight moves. ``take(m)`` gives
    the batch's first m examples: only the micro-batch being probed is made
    (a run holds no more: its update pulls one micro-batch at a time), so the
    batch does not count in the probe's peak. Under several workers each
    probes its own device, and all take the largest k any chose. Where even
    one example per micro-batch is too much, ``remat()`` (``rematerialiser``:
    True the one time it changes the model) turns on rematerialisation and
    the probe runs again."""
    backend = active()
    share, k = largest_share(batch, engine.replicas), 1
    while True:
        micro = largest_micro_batch(batch, engine.replicas, k)
        try:
            x, y = take(micro)
            _, peak = backend.peak_during(lambda x=x, y=y: engine.accumulate(x, y, batch))
            fits = peak is None or peak <= limit_bytes
        except backend.OUT_OF_MEMORY:
            peak, fits = None, False
        x = y = None  # the probe's micro-batch goes before the next is made
        engine.reset()
        say(
            f"{name}: micro-batch of {micro} -> {size_text(peak, 'out of memory')} "
            f"(memory_limit={memory_limit}){'' if fits else ', too much'}"
        )
        if fits:
            break
        if k >= share and remat is not None and remat():  # the probe runs again at one example per micro-batch
            say(f"{name}: {REMAT}")
            continue
        if k >= share:
            raise OutOfMemory(
                f"even one example per micro-batch needs {size_text(peak, 'out of memory')} of TensorFlow memory, "
                f"over memory_limit={memory_limit}: raise memory_limit or use a smaller model"
            )
        k = min(2 * k, share)
    agreed = engine.largest_over_workers(k)
    engine.set_subdivisions(agreed)
    # both counts: under micro_batch_size's name a lone k would read as a size
    largest = largest_micro_batch(batch, engine.replicas, agreed)
    chosen = f"{counted(agreed, 'micro-batch', 'micro-batches')} of up to {counted(largest, 'example')}"
    say(f"{name} chose {chosen}" + ("" if agreed == k else f" (another worker needs it; {k} fits here)"))
    return agreed


class MemoryGuard:
    """What ``memory_limit`` and ``subdivisions: auto`` add to an update; other updates skip it.

    The first update of a process under memory_limit is accumulated, its
    allocator peak read, and only then applied (the baseline, which computes
    and applies in one call, is stopped after it). With subdivisions=auto every
    update goes through ``update``: too much memory (that peak over
    memory_limit, or the backend's OUT_OF_MEMORY) doubles k and retries the same
    batch from a cleared cache; nothing of the batch was applied, so none of it
    is lost or applied twice. With a fixed k, too much memory ends the run
    (OutOfMemory, exit 3; ``out_of_memory`` words it for an update the loop ran
    itself).

    Several workers must agree: with subdivisions=auto each update then
    accumulates in one graph call and finishes in a second, whose one
    all-reduce carries each worker's "retry" flag, so that all workers drop the
    update and double k together when any one of them ran out of memory. With
    a fixed k a worker's out-of-memory ends the run (the launcher stops the
    others), as its peers wait in the update's all-reduce.

    A run's and accum_train.fit's (``micro_batch_size="auto"``)
    updates go through the same guard: ``largest`` is the most micro-batches k
    may grow to, ``more`` what the end of a fixed k's run tells the user to do.
    Automatic micro-batches that do not fit even at one example each try
    ``remat()`` (``rematerialiser``) before the run ends.
    """

    def __init__(
        self, engine, say: Callable[[str], None], *, largest: int, adapts: bool, more: str, limit=None, remat=None
    ):
        self.engine, self.say, self.largest, self.more = engine, say, largest, more
        self.backend = active()  # its peak_during and OUT_OF_MEMORY
        self.remat = remat  # automatic micro-batches' last rung (rematerialiser), as choose_subdivisions'
        self.limit, self.limit_text = (None, None) if limit is None else limit
        self.accumulating = not engine.one_pass  # the baseline has no cache to look into
        self.adapts = adapts and self.accumulating
        self.agree = self.adapts and engine.replicas > len(engine.replica_ids)
        self.check_peak = self.limit is not None  # until the first update of this process is done

    @property
    def needed(self) -> bool:
        """Whether the next update goes through ``update`` rather than straight to the engine."""
        return self.check_peak or self.adapts

    @property
    def subdivisions(self) -> int:
        return self.engine.k if self.accumulating else 1

    def _how(self, k: int) -> str:
        return f"subdivisions={k}" if self.accumulating else "the whole batch in one pass"

    def update(self, reader, step: int, stop: int = 0):
        """Update ``step`` (0-based) from ``reader`` (feed.Reader), within memory; the engine's record.
        ``stop``: the engine's (a signal this process was sent)."""
        while True:
            k = self.subdivisions
            iterator, planned = reader.at(step)  # made again for a retry: its elements are pulled anew
            out, problem, detail = self._attempt(iterator, planned, k, stop)
            if problem is None:
                reader.pulled()
                self.check_peak = False
                return out
            reader.forget()
            self.engine.reset()
            if k >= self.largest and self.adapts and self.remat is not None and self.remat():
                self.say(f"update {step + 1} {problem}: {REMAT}")
                continue
            if k >= self.largest:
                raise OutOfMemory(
                    f"update {step + 1} {problem}{detail}: even one example per micro-batch does not fit: "
                    f"use a smaller model"
                )
            if not self.adapts:
                fix = self.more if detail else "raise memory_limit or use more subdivisions"
                raise OutOfMemory(f"update {step + 1} {problem}{detail}: {fix}")
            self.engine.set_subdivisions(min(2 * k, self.largest))
            retry = f"update {step + 1} {problem}: retrying the same batch with subdivisions={self.subdivisions}"
            self.say(retry + self._batchnorm_note(planned.n))

    def _batchnorm_note(self, n: int) -> str:
        """What a grown k does to BatchNorm, as ``plan`` and fit warn of it at the start (trainer/data/order.py)."""
        micro = noisy_batchnorm(n // self.engine.replicas, self.subdivisions)
        if not self.engine.norm_layers or not micro:
            return ""
        least = MIN_BATCHNORM_MICRO_BATCH
        return f" (BatchNorm now normalises micro-batches of {micro} examples, under {least}: noisy statistics)"

    def _attempt(self, iterator, planned, k: int, stop: int):
        """One try at the update: (the engine's record, None, '') or (None, what was too much, the error's words)."""
        # Accumulate, look at the peak (or hear from the other workers), only then apply or drop.
        separate = self.accumulating and (self.check_peak or self.agree)
        n, pulls, size = planned.n, planned.pulls, planned.size
        problem = detail = ""
        try:
            if separate:
                _, peak = self.backend.peak_during(lambda: self.engine.accumulate_from(iterator, n, pulls, size))
            elif self.check_peak:
                out, peak = self.backend.peak_during(lambda: self.engine.update_from(iterator, n, pulls, stop, size))
            else:  # auto on one process: only an error can say
                return self.engine.update_from(iterator, n, pulls, stop, size), None, ""
            if self.check_peak and peak is not None and peak > self.limit:
                problem = (
                    f"peaked at {size_text(peak)} of TensorFlow memory with {self._how(k)}, "
                    f"over memory_limit={self.limit_text}"
                )
        except self.backend.OUT_OF_MEMORY as err:
            problem, detail = f"ran out of memory with {self._how(k)}", f" ({first_line(err)})"
        if separate:
            out = self.engine.finish(retry=bool(problem), stop=stop)  # under a strategy: the workers agree here
            if bool(out["retry"]) and not problem:
                problem = f"ran out of memory or over memory_limit on another worker with {self._how(k)}"
        return (None, problem, detail) if problem else (out, None, "")

    def out_of_memory(self, step: int, err: Exception) -> OutOfMemory:
        """The end of a run whose update ``step`` (0-based), run by the loop itself, ran out of memory."""
        return OutOfMemory(
            f"update {step + 1} ran out of memory with {self._how(self.subdivisions)} ({first_line(err)}): {self.more}"
        )
