"""A run set up for training: its model (built-in, a keras_file on class labels, or a keras_file with a Keras
loss) and objective, optimizer, accumulator, evaluation and what its checkpoints hold, built once before the
first update and then driven by the loop (loop.py, run_hooks.py); lifecycle.py keeps it in a run directory.
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np

from ..backends import active
from ..config import BatchChange, Config
from ..errors import ConfigError
from ..trainer.data.batching import Cut, as_data, eval_batch_size
from ..trainer.data.feed import Feed, TrimmedSplit
from ..trainer.data.lengths import check_trimmable
from ..trainer.data.order import epoch_order, first_batch
from ..trainer.data.reader import Reader
from ..trainer.data.sources import feed_for
from ..trainer.data.timeline import Timeline
from ..trainer.noise import rule_change
from ..trainer.trainer import build_engine
from .optim import make_optimizer, run_schedule


class Run:
    """Everything set up for training: built once, then driven by ``train``."""

    def __init__(self, cfg: Config, data, model, objective, strategy=None, parallel: int = 1, *, spec):
        """``cfg`` checked against ``data`` (``Config.for_data``), whose training split it cuts by data.trim_padding;
        ``model`` and its ``objective`` built under ``strategy`` for that data, as the front end builds them
        (from_config.build_run); ``parallel`` micro-steps in flight; ``spec``: what the trainer takes of the config
        (trainer.TrainSpec)."""
        self.spec = spec
        self.n_train = len(data.train)
        self.cfg = cfg
        self.model, self.objective = model, objective
        self._lay_out(())
        in_scope = active().strategy_in_scope(strategy)
        multiple = cfg.data.trim_padding
        if multiple is not None and self.n_train:  # none to cut in a run rebuilt without them
            # the training split read in like lengths (trim.TrimmedSplit), the loss probed again for sequences of
            # any length; refused in one line for a model it cannot cut
            where = f"data.trim_padding={multiple}"
            if data.classification:
                raise ConfigError(
                    f"{where}: it cuts the sequences a Keras loss trains on, and model.path={cfg.model.path} trains "
                    f"with the built-in cross-entropy on class labels: give loss: in the YAML, or remove "
                    f"data.trim_padding"
                )
            with in_scope.scope():
                check_trimmable(model.network, in_scope.num_replicas_in_sync, where)
                split = TrimmedSplit(data.train, multiple, where)
                objective.steps = split.trim.steps  # a mean over every position still counts them uncut
                objective.probe(as_data(split.signature()), in_scope)
            # refused in one line where the cut would change the update: the first batch's shortest micro-batch,
            # cut into the k it starts with, measured whole and cut (the backend's check_trim)
            first = split.split.gather(np.arange(min(cfg.batch_size, len(split)), dtype=np.int64))
            k = 1 if cfg.baseline else spec.micro.k_for(cfg.batch_size, in_scope.num_replicas_in_sync) or 1
            unpack = lambda stored: as_data(split.convert(stored))  # noqa: E731
            cut, groups = Cut(k, 1, (0,)), objective.groups
            active().check_trim(objective, groups, first, split.timed, split.spec, cut, in_scope, where, unpack)
            data = dataclasses.replace(data, train=split)
        self.data = data
        self.cfg = cfg = cfg.resolved(self.total_steps)  # what config.yaml records

        # batch_schedule's rule: the changes it made ([[1-based epoch, batch size], ...] as JSON, checkpointed:
        # a resume lays out the epochs before it as they ran) and the learning-rate factor of the batch in force
        self.rule_changes = self.rate_factor = None
        if cfg.batch_rule is not None:
            self.rule_changes = active().state_variable("[]", "string", "rule_changes")
            factor = cfg.optimizer.scale_learning_rate.factor(cfg.batch_size)
            self.rate_factor = active().state_variable(factor, "float32", "rate_factor")
        # trim_padding's micro-batches are sequences of like length, not the random draws the noise scale assumes
        self.noise = active().NoiseScale(measured=cfg.data.trim_padding is None)
        self.schedule = schedule = run_schedule(
            cfg.optimizer, cfg.batch_size, bool(cfg.batch_changes), self.timeline, self.rate_factor
        )
        self.replicas = active().replicas(in_scope)
        with in_scope.scope():
            self.optimizer = make_optimizer(cfg.optimizer, schedule, self.model.trainable_variables)
        self.engine = build_engine(
            spec,
            self.model,
            self.objective,
            self.optimizer,
            cfg.batch_size,
            strategy,
            parallel,
            prepare=self.prepare,
            clip_norm=cfg.optimizer.clip_norm,
            norm_layers=self.model.norm_layers,
            loss_scale=cfg.loss_scale.initial if cfg.precision == "mixed_float16" else None,
            growth_steps=cfg.loss_scale.growth_steps,
        )
        self.scorer = active().Scorer(self.model, self.objective, data, lambda: self.eval_batch_size)
        self.augment = active().Augment(cfg.data.augment.flip, cfg.data.augment.crop, cfg.seed)

        # What a checkpoint holds (with what every run keeps: rundir.RunDirectory.keep). ``optional``: what 0.1.0's
        # checkpoints lack, saved always and restored where a checkpoint holds it: such a run resumes with the
        # replica count it has now (0.1.0 resumed on the same replicas) and the noise scale afresh.
        self.tracked = {"weights": self.model.variables, "optimizer": self.optimizer}
        self.optional = {}
        if not cfg.baseline:
            self.tracked["subdivisions"] = self.engine.subdivisions
            # The replicas the checkpointed k was chosen for: a resume on other replicas adapts k to it
            # (``adapt_subdivisions``).
            with in_scope.scope():
                self.saved_replicas = active().state_variable(self.replicas, "int64", "replicas")
            self.optional = {"replicas": self.saved_replicas}
        if self.rule_changes is not None:
            self.tracked["rule_changes"] = self.rule_changes

    def _lay_out(self, grown: tuple) -> None:
        """The timeline of the run's updates, with batch_schedule rule's changes ``grown`` so far."""
        cfg = self.cfg
        changes = cfg.batch_changes or tuple(BatchChange(epoch=e, batch_size=b) for e, b in grown)
        self.timeline = Timeline(self.n_train, cfg.epochs, cfg.batch_size, changes)
        self.total_steps = self.timeline.total_steps

    @property
    def grown(self) -> tuple:
        """batch_schedule rule's changes so far: ((1-based epoch, batch size), ...)."""
        if self.rule_changes is None:
            return ()
        return tuple((int(e), int(b)) for e, b in json.loads(self.rule_changes.numpy().decode()))

    def follow_noise(self, epochs_done: int, say) -> None:
        """batch_schedule's rule at the end of epoch ``epochs_done`` (1-based): the batch of the epochs from the
        next on, from the noise scale measured so far (accum/trainer/noise.py ``rule_change``), and its learning
        rate. Before the epoch's checkpoint, which keeps the change; the same estimate gives the same change on a
        resume that makes it again."""
        cfg, before = self.cfg, self.timeline.phases[-1].batch_size
        change = rule_change(cfg.batch_rule, self.noise.value(), epochs_done, cfg.epochs, before, cfg.micro_batch_size)
        if change is None:
            return
        after, said = change
        if after == before:
            say(said)
            return
        self.rule_changes.assign(json.dumps([*map(list, self.grown), [epochs_done + 1, after]]))
        self._lay_out(self.grown)
        self._rate_for(after)
        say(f"{said} (k={self.k_for(after)}, learning rate x{self.rate_factor.numpy():.4g} of the configured one)")

    def regrow(self, step: int) -> None:
        """After a restore: the config's constant learning rate, the timeline with the rule's restored changes,
        and the rate of the batch at ``step``."""
        if self.optimizer is not None and not callable(self.schedule):
            # a constant rate is an optimizer variable, which the checkpoint restored: the config's replaces it (a
            # resume may lower it); a schedule is built from the config, not restored
            self.optimizer.learning_rate = self.schedule
        if self.rule_changes is None:
            return
        self._lay_out(self.grown)
        if self.total_steps:  # a run rebuilt without its training set (evaluate, export) lays out nothing
            self._rate_for(self.timeline.batch_size(min(step, self.total_steps - 1)))

    def _rate_for(self, batch_size: int) -> None:
        """The rule's learning-rate factor: scale_learning_rate's for the batch in force."""
        self.rate_factor.assign(self.cfg.optimizer.scale_learning_rate.factor(batch_size))

    def reader(self) -> Reader:
        """The updates as the loop and the guard read them (feed.Reader): the feed of the rest of an epoch, k set
        for each batch size."""

        def open(step: int, k: int) -> Feed:
            epoch = self.timeline.epoch_of(step)
            order = epoch_order(self.cfg.seed, epoch, self.n_train, self.cfg.data.shuffle)
            segments = self.timeline.rest_of_epoch(step)
            engine = self.engine
            return feed_for(self.data.train, order, epoch, segments, self.k_for, engine.strategy, engine.replica_ids)

        return Reader(self.engine, open, follow=self.follow_batch, k=lambda: self.subdivisions)

    def first_examples(self, m: int):
        """``take(m)`` for the auto probe (trainer.Trainer.probe): the first m examples of the first update's batch."""
        return first_batch(self.data, self.cfg.seed, m, self.cfg.data.shuffle)

    def prepare(self, element, n):
        """Inside a micro-step: a feed's element (accum/trainer/data/feed.py: stored values and where they sit) as the
        loss takes it, (x, y, sample weights or None), converted (uint8 to float) and augmented there, so the
        pipeline holds no float batch."""
        stored, where = element
        x, y, weights = as_data(self.data.train.convert(stored))
        if self.augment.active:  # the draws of these rows of update where[0]'s global batch of n
            x = self.augment.rows(x, where[0], n, where[1])
        return x, y, weights

    @property
    def subdivisions(self) -> int:
        return 1 if self.cfg.baseline else self.engine.k

    def k_for(self, batch_size: int) -> int:
        """The k a batch of ``batch_size`` runs with: micro_batch_size's for it (a batch_schedule's batch grows,
        the micro-batch stays); a fixed or probed k stays; 1 for the baseline."""
        if self.cfg.micro_batch_size is None or self.cfg.baseline:
            return self.subdivisions
        return self.cfg.subdivisions_for(batch_size, self.replicas)

    def follow_batch(self, batch_size: int) -> int:
        """Set k for a batch of ``batch_size`` (``k_for``); the k in force."""
        k = self.k_for(batch_size)
        if k != self.subdivisions:
            self.engine.set_subdivisions(k)
        return self.subdivisions

    @property
    def eval_batch_size(self) -> int:
        return eval_batch_size(self.cfg.batch_size, self.subdivisions, self.cfg.micro_batch_size)

    def scores(self) -> dict:
        """The model's test (and validation) scores now (scoring.Scorer)."""
        return self.scorer.scores()
