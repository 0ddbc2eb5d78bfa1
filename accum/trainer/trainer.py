"""The Trainer: what a run of either door does around its updates, given door-neutral values.

A front door (the CLI's from_config/, accum_train.fit's keras_fit/) turns what its user gives into an engine
(engine.Accumulator, built by ``build_engine``), the noise scale it follows and a ``TrainSpec``: how a batch is
cut into micro-batches, the memory limit, the stop after non-finite updates, the checkpoint policy and the door's
names for its own settings, which the lines the Trainer prints use. The Trainer owns what every run does with
them: the engine's options, the automatic micro-batches' probe before training, the memory guard every update
goes through, the one loop (loop.Loop) that drives the door's hooks, and the errors that end a run (a signal,
max_bad_steps) at the run directory's checkpoint. The run directory (rundir.RunDirectory) keeps the checkpoint
policy and writes the one summary.json. What stays the door's is what its user sees of an update: the CLI's
records and progress lines, fit's callbacks and History.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass

from ..backends import active
from ..errors import too_many_bad_updates
from .data.batching import k_for_micro_batch, largest_share
from .loop import Loop
from .memory import MemoryGuard, probe, rematerialiser
from .runtime import auto_parallel
from .store.rundir import CheckpointPolicy


@dataclass(frozen=True)
class MicroBatches:
    """How each replica's share of a batch is cut: ``count`` micro-batches, the fewest that keep each within
    ``size`` examples, or (``auto``) the fewest that fit in memory, measured before training under a memory limit
    and doubled when an update runs out. None of them: one micro-batch, the whole share."""

    count: int | None = None
    size: int | None = None
    auto: bool = False

    def k_for(self, batch_size: int, replicas: int = 1) -> int | None:
        """k for a batch of ``batch_size`` over ``replicas``; None under ``auto``, whose k the run measures."""
        if self.auto:
            return None
        if self.size is not None:
            return k_for_micro_batch(batch_size, self.size, replicas)
        return self.count or 1


@dataclass(frozen=True)
class Wording:
    """How a door names its settings in the lines the Trainer prints: ``auto`` its automatic micro-batches,
    ``more`` what a run whose fixed micro-batches ran out of memory should change, ``bad_fix`` what a run stopped
    by non-finite updates should change."""

    auto: str
    more: str
    bad_fix: str


@dataclass(frozen=True)
class TrainSpec:
    """What a door decides about a run, in no door's terms: its micro-batches, ``memory_limit`` as (bytes, as
    given) or None, ``max_bad_steps`` (None: never stop), whether it is the one-pass baseline, its run directory's
    ``checkpoints`` (rundir.CheckpointPolicy), and the door's ``words``."""

    micro: MicroBatches
    words: Wording
    memory_limit: tuple | None = None
    max_bad_steps: int | None = None
    baseline: bool = False
    checkpoints: CheckpointPolicy | None = None


def build_engine(spec: TrainSpec, model, objective, optimizer, batch_size: int, strategy, parallel=None, **options):
    """The Accumulator (the active backend's ``accumulator_for``: accum/backends/) of a run as ``spec`` says, for a
    first batch of ``batch_size`` under ``strategy`` (None: the one in scope): its micro-batches (automatic ones
    start at one, which the probe or the guard raise), the baseline's one pass, and the micro-steps in flight:
    ``parallel`` where the door fixed its thread pools for a number, else runtime.auto_parallel's rule (one under
    XLA, whose compiled micro-step spreads over the cores on its own: two in flight cost about 4% more CPU and
    wall time on a 2-core CPU, the masked tagger of peers_masked.py). ``options``: the Accumulator's others."""
    backend = active()
    replicas = backend.replicas(strategy)
    k = spec.micro.k_for(batch_size, replicas) or 1
    if parallel is None:
        in_flight = 2 if spec.micro.auto else k  # auto may come to two or more
        parallel = 1 if options.get("jit") else auto_parallel(in_flight, spec.memory_limit is not None, replicas)
    return backend.accumulator_for(
        model,
        objective,
        optimizer,
        subdivisions=k,
        one_pass=spec.baseline,
        parallel=parallel,
        strategy=strategy,
        **options,
    )


class Trainer:
    """A run's updates around ``engine`` (engine.Accumulator) on ``network`` (a Keras model, or None for the CLI's
    TensorLayer nets, which cannot rematerialise), with ``noise`` (noise.NoiseScale) following them, as ``spec``
    (``TrainSpec``) says; ``say`` prints a line. ``batch_size``: the batch in force at the start; ``directory``:
    ``run`` keeps the run directory."""

    def __init__(self, spec: TrainSpec, engine, network, noise, batch_size: int, say: Callable[[str], None]):
        self.spec, self.engine, self.noise = spec, engine, noise
        self.say, self.batch_size, self.directory = say, batch_size, None
        self.remat = rematerialiser(network, engine)  # automatic micro-batches' last rung
        self.guard = MemoryGuard(
            engine,
            say,
            largest=largest_share(batch_size, engine.replicas),
            adapts=spec.micro.auto and not spec.baseline,
            more=spec.words.more,
            limit=spec.memory_limit,
            remat=self.remat,
        )

    def run(self, directory, drive: Callable, take: Callable) -> dict | None:
        """A run from its start or resume to its summary, kept in ``directory`` (a door's rundir.RunDirectory, or
        None: nothing kept); summary.json's content, or None where none was written.

        Under the writer lock: the newest intact checkpoint restored where the door resumes, the door's records
        written; on a start, the automatic micro-batches probed on ``take(m)`` (memory.probe) and, where the policy
        says, a first checkpoint saved, so that a run is resumable from its first moment. ``drive(stop)`` runs the
        door's loop (``train``), ``stop`` the signal flag (rundir.StopFlag; None without a directory); then the
        door's last files and summary.json, with the figures of every run (RunDirectory.write_summary)."""
        self.directory = directory
        with contextlib.ExitStack() as held:
            resumed = directory is not None and self._open(directory, held)
            if not resumed:
                probe(self.engine, self.spec, take, self.batch_size, self.say, self.remat)
            if directory is None:
                drive(None)
                return None
            if not resumed and self.spec.checkpoints.at_start:
                directory.save(0)
            directory.started(self, resumed)
            held.callback(directory.flush)  # what the run logged, also when it ends in an exception
            drive(held.enter_context(directory.stop_flag()))
            directory.flush()
            finished = directory.finish()
            return None if finished is None else directory.write_summary(finished[0], directory.began, finished[1])

    def _open(self, directory, held: contextlib.ExitStack) -> bool:
        """``directory`` checked, locked (until ``held`` closes), its checkpoint manager kept, the newest intact
        checkpoint restored where the door resumes, and the door's records written; whether it resumed."""
        directory.check()  # before the lock: a refused start leaves the directory as it was
        directory.enter(held)
        directory.keep(directory.tracked, self.spec.checkpoints, self.engine, self.noise, directory.optional)
        resumed = directory.resumes()
        if resumed:  # a resume goes on at the k it had come to
            directory.restored(directory.restore(self.say, directory.found), self)
        else:
            directory.begun()
        directory.write_records(self.spec)
        return resumed

    def follow_batch(self, batch_size: int) -> None:
        """A batch of ``batch_size`` from here on (a batch schedule's): the most micro-batches the guard may reach."""
        self.guard.largest = largest_share(batch_size, self.engine.replicas)

    def train(self, hooks, first_epoch: int, resumed_at: int, epochs: int, stop=None) -> Loop:
        """Epochs ``first_epoch`` to ``epochs`` (0-based, end excluded) through the door's ``hooks`` (loop.py), the
        first from update ``resumed_at`` of the run; ``stop``: the signal flag (rundir.StopFlag) or None."""
        loop = Loop(self.engine, self.guard, self.noise, stop, self.spec.max_bad_steps, ends=self)
        loop.run(hooks, first_epoch, resumed_at, epochs)
        return loop

    def too_many_bad(self, bad: int, updates_done: int):
        """max_bad_steps reached: with a run directory, its checkpoint (just saved) is the last good state."""
        done, resume = updates_done, ""
        if self.directory is not None:
            done, resume = self.directory.step, self.directory.resume_hint
        return too_many_bad_updates(bad, self.spec.max_bad_steps, done, self.spec.words.bad_fix, resume)

    def interrupted(self, signum: int):
        """A signal's end, at the checkpoint just saved (a stop flag is set only with a run directory)."""
        return self.directory.interrupted(signum)
