"""The CLI's side of the one loop (loop.Loop): a built run's (run_parts.Run) records, checkpoints and progress in
its run directory (rundir.RunDirectory).

``RunHooks.train(step, stop)`` runs the epochs from ``step`` (updates done) to
the run's end through the Trainer (trainer.py). Records are flushed to metrics.jsonl every
``log_every`` updates and before every checkpoint (a checkpoint never counts an
update that metrics.jsonl lacks); a stop (a signal, max_bad_steps) is
checkpointed at the update it comes after. Where the run is within an epoch is
one object, ``EpochState``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from ..trainer.data.reader import Reader


@dataclass
class EpochState:
    """Where the loop is in an epoch: what its record and the progress bar need between updates."""

    epoch: int  # 0-based
    step: int  # updates done
    end: int  # the update the epoch ends at
    micro_done: int  # micro-batches of the epoch done (the progress bar's count)
    loss_sum: float = 0.0  # of the applied updates' records written so far
    applied_examples: int = 0
    examples: int = 0  # examples this process's loop took in the epoch (for examples per second)
    started: float = field(default_factory=time.time)
    pending: list = field(default_factory=list)  # updates' results not yet in metrics.jsonl


class RunHooks:
    """The CLI's side of the loop (loop.Loop) over ``run`` (run_parts.Run): each update's record and the
    checkpoints in ``directory`` (rundir.RunDirectory), the progress it reports (``progress``), batch_schedule's
    rule at epoch ends, and the errors that end a run. ``step`` is the updates done."""

    stopping = False  # a run ends at its last epoch, or by an error

    def __init__(self, run, directory, progress):
        self.run, self.directory, self.progress = run, directory, progress
        self.trainer = None  # trainer.Trainer (set once built): the loop, the guard, the errors that end a run
        self.state = None
        self.step = 0

    def train(self, step: int, stop) -> int:
        """Every epoch from ``step`` (updates done) on, ``stop`` the run's rundir.StopFlag; the step the run ends
        at. The run's length can change on the way (batch_schedule's rule grows the batch at epoch ends)."""
        run = self.run
        self.step = step
        self.trainer.train(self, run.timeline.epoch_of(step), step, run.cfg.epochs, stop)
        return self.step

    def epoch_begin(self, epoch: int, resumed_at: int | None):
        run, timeline = self.run, self.run.timeline
        first, end = timeline.epoch_range(epoch)
        step = first if resumed_at is None else resumed_at
        whole = timeline.rest_of_epoch(first)
        self.state = EpochState(epoch, step, end, micro_batches(run, whole, until=step))
        self.progress.epoch_start(epoch + 1, run.cfg.epochs, micro_batches(run, whole), self.state.micro_done)
        if step > first:  # a run resumed mid-epoch picks up the losses this epoch already logged
            self.state.loss_sum, self.state.applied_examples = self.directory.log.epoch_losses(epoch + 1)
        return run.reader(), step, end

    def update_begin(self, reader: Reader, step: int) -> None:
        self.planned = reader.at(step)[1]

    def update_end(self, epoch: int, step: int, out: dict, noise) -> None:
        """The update's record, buffered, and written with those before it where due: every ``log_every`` updates,
        at the epoch's end and before a checkpoint (the progress report comes with each write)."""
        run, cfg, state, planned = self.run, self.run.cfg, self.state, self.planned
        state.step = self.step = step
        state.examples += planned.n
        state.micro_done += planned.pulls
        state.pending.append((step, planned.n, {**out, "noise_scale": noise}, planned.batch_size, run.subdivisions))
        # a stop every process agreed on (a signal, max_bad_steps) is checkpointed after this update
        stopping = int(out["stop"]) or int(out["bad_updates_in_a_row"]) >= cfg.max_bad_steps
        if len(state.pending) >= cfg.log_every or step == state.end or self.directory.due(step) or stopping:
            self._flush(state)

    def after_update(self, epoch: int, step: int, out: dict, final: bool) -> None:
        """The checkpoint, where due (``final``: the run stops after this update), after the records it counts."""
        due = self.directory.due(step)
        if final:
            self._flush(self.state)  # a signal to this process alone, heard after the write above
        if final or (due and step != self.state.end):  # the epoch's end checkpoints in epoch_end
            self.directory.save(step)

    def ran_out(self, end) -> None:  # the run's feed lays out every update: only a bug gets here
        raise AssertionError(f"the run's feed ended before update {end}")

    def failed(self, reader: Reader, step: int, err) -> None:
        """Raise the DataError that names the image file of update ``step`` behind ``err``, if it was one (an image
        folder whose file changed after the run's check); nothing otherwise."""
        split, indices = self.run.data.train, reader.indices(step)
        if hasattr(split, "paths") and len(indices):
            from ..datasets.image_folder import raise_first_bad

            raise_first_bad(split.paths[indices], split.input_shape[2], err)

    def _flush(self, state: EpochState) -> None:
        """Write the buffered updates' records; before any checkpoint, which must never count an update that
        metrics.jsonl lacks."""
        if not state.pending:
            return
        loss_sum, examples = self.directory.log.write_updates(state.pending, self.run.timeline)
        state.loss_sum, state.applied_examples = state.loss_sum + loss_sum, state.applied_examples + examples
        state.pending = []
        self.progress.updates(
            state.micro_done,
            loss_sum / examples if examples else float("nan"),
            state.examples / max(time.time() - state.started, 1e-9),
        )

    def epoch_end(self, epoch: int, step: int) -> None:
        """The epoch's record (its scores, its train loss, the noise scale), batch_schedule's rule, the
        checkpoint."""
        run, state = self.run, self.state
        scores = run.scores()
        elapsed = time.time() - state.started
        record = {
            "epoch": state.epoch + 1,
            "step": state.step,
            "train_loss": state.loss_sum / state.applied_examples if state.applied_examples else None,
            **scores,
            "noise_scale": run.noise.value(),  # the gradient noise scale as of the epoch's last update (noise.py)
            "elapsed_s": elapsed,
            "examples_per_s": state.examples / max(elapsed, 1e-9),
        }
        self.directory.log.write([record])
        run.follow_noise(state.epoch + 1, self.progress.message)  # before the checkpoint that keeps its change
        self.directory.save(state.step)
        self.progress.epoch_end(record)


def micro_batches(run, segments, until: int | None = None) -> int:
    """The micro-batches of the updates of ``segments`` (before update ``until``, if given), as the k each
    segment's batch has now (what a progress bar counts)."""
    total = 0
    for segment in segments:
        k = run.k_for(segment.batch_size)
        updates = segment.updates if until is None else max(0, min(segment.updates, until - segment.first_step))
        for i in range(updates):
            total += min(k, segment.batch_size, segment.end - segment.start - i * segment.batch_size)
    return total
