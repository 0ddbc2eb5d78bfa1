"""Memory: what TensorFlow's allocator and the process peaked at, and keeping
a run within memory.

``peak_during`` is the one probe: it runs a piece of work on the first batch
(``data.first_batch``) and reads the allocator peak over it. ``subdivisions:
auto`` probes one micro-step per candidate k before training
(``choose_subdivisions``), and ``update_within_memory`` probes the first
update of a process before applying it; bench reads the same peak over its
timed updates.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable

import tensorflow as tf

from .errors import OutOfMemory


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


def memory_device() -> str:
    return "GPU:0" if tf.config.list_physical_devices("GPU") else "CPU:0"


def reset_allocator_peak() -> None:
    with contextlib.suppress(ValueError, RuntimeError):  # an allocator that keeps no statistics
        tf.config.experimental.reset_memory_stats(memory_device())


def allocator_peak_bytes() -> int | None:
    """TensorFlow's allocator peak since start (or the last reset); None if not kept."""
    try:
        return int(tf.config.experimental.get_memory_info(memory_device())["peak"])
    except (ValueError, RuntimeError):
        return None


def peak_during(work: Callable[[], tf.Tensor]):
    """(result, allocator peak while ``work`` ran, None if not kept)."""
    reset_allocator_peak()
    result = work()
    for tensor in tf.nest.flatten(result):
        tensor.numpy()  # wait for the work, then read its peak
    return result, allocator_peak_bytes()


def _mib(peak: int | None) -> str:
    return f"{peak / 2**20:.0f} MiB" if peak is not None else "out of memory"


def choose_subdivisions(engine, x, y, memory_limit: str, limit_bytes: int, say: Callable[[str], None]) -> int:
    """subdivisions=auto: the smallest k (1, 2, 4, ...) whose micro-step fits the limit.

    One micro-step (forward, backward, add to the cache) runs at each candidate
    micro-batch size of a replica's share of the batch; the cache and
    statistics are cleared afterwards, so no weight moves. Under several
    workers each probes its own device, and all take the largest k any chose."""
    batch = int(y.shape[0])
    share = math.ceil(batch / engine.replicas)
    k = 1
    while True:
        micro = math.ceil(share / k)
        try:
            _, peak = peak_during(lambda micro=micro: engine.accumulate(x[:micro], y[:micro], batch))
            fits = peak is None or peak <= limit_bytes
        except tf.errors.ResourceExhaustedError:
            peak, fits = None, False
        engine.reset()
        say(
            f"subdivisions=auto: micro-batch of {micro} -> {_mib(peak)} "
            f"(memory_limit={memory_limit}){'' if fits else ', too much'}"
        )
        if fits:
            break
        if k >= share:
            raise OutOfMemory(
                f"even one example per micro-batch needs {_mib(peak)} of TensorFlow memory, "
                f"over memory_limit={memory_limit}: raise memory_limit or use a smaller model"
            )
        k = min(2 * k, share)
    agreed = engine.largest_over_workers(k)
    engine.set_subdivisions(agreed)
    say(f"subdivisions=auto chose {agreed}" + ("" if agreed == k else f" (another worker needs it; {k} fits here)"))
    return agreed


def update_within_memory(engine, x, y, n: int, step: int, cfg, check_peak: bool, say: Callable[[str], None]):
    """One update (``step`` is its 0-based index) of a global batch of ``n``, within memory.

    With ``check_peak`` (the first update of a process under memory_limit)
    the batch is accumulated, its allocator peak read, and only then applied.
    Too much memory (that peak over memory_limit, or a ResourceExhaustedError)
    with a fixed k is fatal (OutOfMemory). With subdivisions=auto it doubles k
    and retries the same batch from a cleared cache: nothing of the batch was
    applied, so none of it is lost or applied twice.

    Several workers must agree: with subdivisions=auto every update then
    accumulates in one graph call and finishes in a second, whose one
    all-reduce carries each worker's "retry" flag, so that all workers drop the
    update and double k together when any one of them ran out of memory. With
    a fixed k a worker's out-of-memory ends the run (the launcher stops the
    others), as its peers wait in the update's all-reduce.
    """
    # The baseline applies in the same call as it computes: over the limit it
    # stops (a fixed k), so applying before the check loses nothing.
    separable = hasattr(engine, "accumulate_batch")
    several_workers = engine.replicas > len(engine.replica_ids)
    agree = separable and several_workers and cfg.auto_subdivisions
    while True:
        k = int(engine.subdivisions.numpy()) if separable else 1
        how = f"subdivisions={k}" if separable else "the whole batch in one pass"
        problem = detail = ""
        fix = "raise memory_limit or use more subdivisions"
        try:
            if not (check_peak or agree):
                return engine.update(x, y, n)
            if not separable:
                out, peak = peak_during(lambda: engine.update(x, y, n))
            else:
                _, peak = peak_during(lambda: engine.accumulate_batch(x, y, n))
            if check_peak and peak is not None and peak > cfg.memory_limit_bytes:
                problem = (
                    f"peaked at {peak / 2**20:.0f} MiB of TensorFlow memory with {how}, "
                    f"over memory_limit={cfg.memory_limit}"
                )
        except tf.errors.ResourceExhaustedError as err:
            problem = f"ran out of memory with {how}"
            detail = f" ({(err.message or 'ResourceExhaustedError').splitlines()[0]})"
            fix = "use more subdivisions or subdivisions: auto"
            if several_workers and not (check_peak or agree):
                raise OutOfMemory(f"update {step + 1} {problem}{detail}: {fix}") from None
        if separable:
            out = engine.finish(retry=bool(problem))  # under a strategy: the workers agree here
            if not bool(out["retry"]):
                return out
            problem = problem or f"ran out of memory or over memory_limit on another worker with {how}"
        elif not problem:
            return out
        engine.reset()
        if k >= cfg.batch_size:
            fix = "even one example per micro-batch does not fit: use a smaller model"
        if not (cfg.auto_subdivisions and separable) or k >= cfg.batch_size:
            raise OutOfMemory(f"update {step + 1} {problem}{detail}: {fix}")
        new_k = min(2 * k, cfg.batch_size)
        engine.set_subdivisions(new_k)
        say(f"update {step + 1} {problem}: retrying the same batch with subdivisions={new_k}")
