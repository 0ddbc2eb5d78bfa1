"""The one training loop, behind both doors: epochs of updates, one graph call per update.

The CLI (run_hooks.RunHooks) and accum_train.fit (keras_fit/fit_hooks.FitHooks)
plug into it as ``hooks``; what they share is here, so that it is written and
tested once:

- every update goes through the memory guard (accum/trainer/memory.py) when the run
  needs it (``memory_limit``, automatic micro-batches), straight to the engine
  otherwise; a fixed number of micro-batches that runs out of memory ends the
  call in one line;
- its result is read back at once, so the stop for non-finite updates comes at
  the update that reaches ``max_bad_steps``, and a signal (rundir.StopFlag)
  stops after the update in hand, every process after the same one;
- the gradient noise scale's running estimate (accum/trainer/noise.py) takes in each
  update.

What an update, an epoch and a stop mean to a door is the door's: its records,
checkpoints, progress and callbacks. The hooks:

``epoch_begin(epoch, resumed_at)``
    (source, first step, end) of ``epoch``, or None to end the training. The
    source gives updates as the memory guard reads them (``at``, ``pulled``,
    ``forget``, ``update``); ``end`` is None where only the data's end ends the
    epoch. ``resumed_at`` is the step a resumed run goes on from, for its
    first epoch only (None otherwise).
``update_begin(source, step)``, ``update_end(epoch, step, out, noise)``
    around each update (a signal sent from ``update_end`` stops after it);
``after_update(epoch, step, out, final)``
    its checkpoint, if due; ``final`` when the loop stops after it.
``ran_out(end)``
    the data ended before ``end``.
``epoch_end(epoch, step)``, ``stopping``
    after each epoch; whether the door asked to stop (model.stop_training).
``failed(source, step, err)``
    an update failed with the backend's ``OP_ERROR`` (a broken file is named there).

The errors that end the call, ``too_many_bad(bad, updates_done)`` and
``interrupted(signum)``, come from ``ends`` (the Trainer, trainer.py): they
read the run directory, not the door.
"""

from __future__ import annotations

from ..backends import active


class Loop:
    """The epochs of one call: ``engine`` (engine.Accumulator) updates through ``guard`` (memory.MemoryGuard);
    ``noise`` (noise.NoiseScale) follows the updates; ``stop`` (rundir.StopFlag, or None) is the signal flag;
    ``max_bad_steps`` (or None) ends the call after that many non-finite updates in a row, with the error ``ends``
    gives (trainer.Trainer)."""

    def __init__(self, engine, guard, noise, stop, max_bad_steps, ends):
        self.engine, self.guard, self.noise, self.stop, self.ends = engine, guard, noise, stop, ends
        self.max_bad_steps = max_bad_steps
        self.updates_done = 0  # by this call
        self.backend = active()  # the errors an update raises: OUT_OF_MEMORY, then any other OP_ERROR

    def run(self, hooks, first_epoch: int, resumed_at: int, epochs: int) -> None:
        """Epochs ``first_epoch`` to ``epochs`` (0-based, end excluded), the first from step ``resumed_at``."""
        for epoch in range(first_epoch, epochs):
            begun = hooks.epoch_begin(epoch, resumed_at if epoch == first_epoch else None)
            if begun is None:
                break
            source, step, end = begun
            while end is None or step < end:
                hooks.update_begin(source, step)
                out = self.update(hooks, source, step)
                if float(out["examples"]) == 0:  # the data ended (a generator, a dataset without a count)
                    hooks.ran_out(end)
                    break
                step += 1
                self.updates_done += 1
                hooks.update_end(epoch, step, out, self.noise.add(out))
                signalled = int(out["stop"])  # any process's request, as of this update (its all-reduce)
                if not signalled and self.stop is not None and self.engine.one_process:
                    signalled = self.stop.signum  # no one to agree with: stop after the update in hand
                # read only when asked for: one more value fetched from the device per update otherwise
                bad = int(out["bad_updates_in_a_row"]) if self.max_bad_steps is not None else 0
                too_many = self.max_bad_steps is not None and bad >= self.max_bad_steps
                # skipped updates changed nothing: a checkpoint here is the last good state
                hooks.after_update(epoch, step, out, final=bool(signalled or too_many))
                if too_many:
                    raise self.ends.too_many_bad(bad, self.updates_done)
                if signalled:
                    raise self.ends.interrupted(signalled)
                if hooks.stopping:
                    break
            hooks.epoch_end(epoch, step)
            if hooks.stopping:
                break

    def update(self, hooks, source, step: int) -> dict:
        """Update ``step`` from ``source``, through the memory guard when needed: the engine's record."""
        signum = self.stop.signum if self.stop is not None else 0  # goes into the update's all-reduce
        try:
            if self.guard.needed:
                return self.guard.update(source, step, signum)
            return source.update(step, signum)
        except self.backend.OUT_OF_MEMORY as err:  # a fixed k that does not fit (auto adapts in the guard)
            raise self.guard.out_of_memory(step, err) from None
        except self.backend.OP_ERROR as err:
            hooks.failed(source, step, err)
            raise
