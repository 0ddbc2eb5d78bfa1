"""The training loop: one plain loop over a built run (run_parts.Run), one graph call per update.

``Trainer.train(step)`` runs the epochs from ``step`` (updates done) to the run's
end. Each update's result is read back at once, so a stop for non-finite
updates comes at the update that reaches max_bad_steps; records are flushed
to metrics.jsonl every ``log_every`` updates and before every checkpoint (a
checkpoint never counts an update that metrics.jsonl lacks); a signal to any
process stops every process after the same update, checkpointed. Where the
loop is within an epoch is one object, ``EpochState``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import tensorflow as tf

from .errors import Interrupted, too_many_bad_updates
from .feed import Reader


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


class Trainer:
    """The loop over ``run``: updates, their records (``log``, a metrics_log.MetricsLog), checkpoints and stops.
    ``stop`` is the run's stopping.StopFlag, ``guard`` its memory.MemoryGuard, ``progress`` what it reports to."""

    def __init__(self, run, log, progress, guard, stop):
        self.run, self.log, self.progress, self.guard, self.stop = run, log, progress, guard, stop

    def train(self, step: int) -> int:
        """Every epoch from ``step`` (updates done) on; the step the run ends at. The run's length can change on
        the way (batch_schedule's rule grows the batch at epoch ends)."""
        while step < self.run.total_steps:
            step = self.epoch(step)
        return step

    def epoch(self, step: int) -> int:
        """The rest of the epoch that ``step`` (updates done) falls in; the step it ends at."""
        run, timeline = self.run, self.run.timeline
        epoch = timeline.epoch_of(step)
        first, end = timeline.epoch_range(epoch)
        whole = timeline.rest_of_epoch(first)
        state = EpochState(epoch, step, end, micro_batches(run, whole, until=step))
        self.progress.epoch_start(epoch + 1, run.cfg.epochs, micro_batches(run, whole), state.micro_done)
        if step > first:  # a run resumed mid-epoch picks up the losses this epoch already logged
            state.loss_sum, state.applied_examples = self.log.epoch_losses(epoch + 1)
        reader = Reader(run)
        while state.step < state.end:
            self._update(state, reader)
        self._end_epoch(state)
        return state.step

    def _update(self, state: EpochState, reader: Reader) -> None:
        """One update, its record buffered (or flushed), then the checkpoint or stop it calls for."""
        run, cfg, step = self.run, self.run.cfg, state.step
        planned = reader.at(step)[1]
        try:
            # A signal to this process goes into the update's all-reduce: every process stops after it.
            signum = self.stop.signum
            out = self.guard.update(reader, step, signum) if self.guard.needed else reader.update(step, signum)
        except tf.errors.ResourceExhaustedError as err:  # a fixed k that does not fit (auto adapts in the guard)
            raise self.guard.out_of_memory(step, err) from None
        except tf.errors.OpError as err:  # an image that no longer decodes: named, as the data check would
            broken_file(run.data.train, reader.indices(step), err)
            raise
        state.step = step = step + 1
        state.examples += planned.n
        state.micro_done += planned.pulls
        out = {**out, "noise_scale": run.noise.add(out)}
        state.pending.append((step, planned.n, out, planned.batch_size, run.subdivisions))
        bad = int(out["bad_updates_in_a_row"])  # the stop comes at the update that reaches max_bad_steps
        # Any process's stop request, as of this update (every process learns it in the same all-reduce)
        signalled = int(out["stop"])
        end_of_epoch = step == state.end
        checkpoint_due = cfg.checkpoint.every_steps and step % cfg.checkpoint.every_steps == 0
        if (
            len(state.pending) >= cfg.log_every
            or end_of_epoch
            or checkpoint_due
            or signalled
            or bad >= cfg.max_bad_steps
        ):
            self._flush(state)
        if run.engine.one_process and self.stop.signum and not signalled:  # no one to agree with: stop now
            signalled = self.stop.signum
            self._flush(state)
        if bad >= cfg.max_bad_steps:
            run.save_checkpoint(step)  # skipped updates changed nothing: this is the last good state
            raise too_many_bad_updates(
                bad,
                cfg.max_bad_steps,
                step,
                "lower optimizer.learning_rate or set optimizer.clip_norm",
                f"resume with --resume {run.run_dir}",
            )
        if signalled:
            run.save_checkpoint(step)
            raise Interrupted(signalled, run.run_dir, step)
        if checkpoint_due and not end_of_epoch:
            run.save_checkpoint(step)

    def _flush(self, state: EpochState) -> None:
        """Write the buffered updates' records; before any checkpoint, which must never count an update that
        metrics.jsonl lacks."""
        if not state.pending:
            return
        loss_sum, examples = self.log.write_updates(state.pending, self.run.timeline)
        state.loss_sum, state.applied_examples = state.loss_sum + loss_sum, state.applied_examples + examples
        state.pending = []
        self.progress.updates(
            state.micro_done,
            loss_sum / examples if examples else float("nan"),
            state.examples / max(time.time() - state.started, 1e-9),
        )

    def _end_epoch(self, state: EpochState) -> None:
        """The epoch's record (its scores, its train loss, the noise scale), batch_schedule's rule, the
        checkpoint."""
        run = self.run
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
        self.log.write([record])
        run.follow_noise(state.epoch + 1, self.progress.message)  # before the checkpoint that keeps its change
        run.save_checkpoint(state.step)
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


def broken_file(split, indices, err) -> None:
    """Raise the DataError that names the image file of ``indices`` behind ``err``, if it was one (an image folder
    whose file changed after the run's check); nothing otherwise."""
    if hasattr(split, "paths") and len(indices):
        from .datasets.image_folder import _raise_first_bad

        _raise_first_bad(split.paths[indices], split.input_shape[2], err)
