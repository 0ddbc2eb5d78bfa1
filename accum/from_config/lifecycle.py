"""The CLI's run of a config, from its start to its summary: ``train(cfg, run_dir)`` resolves the config into what
the trainer takes and hands it over.

Before anything is written, it sets up the runtime (thread pools, the backend's strategy), loads and checks the
data for the model the run builds (a resume's, and a worker's, from the run directory's copy), checks the output
directory and builds the run (build.build_run: the model and its objective, the optimizer and the accumulator):
bad input leaves nothing behind. The Trainer (trainer/trainer.py) then runs its course, as it runs fit's: the run
directory locked, the newest intact checkpoint restored or the automatic micro-batches probed, the loop,
summary.json. What is the CLI's is here, in ``ConfigRunDir``: ``--resume`` (k adapted to other replicas),
config.yaml and run.json's fields, the lines a run starts with, weights.npz; run_hooks.RunHooks is its side of the
loop. A resume continues from the latest checkpoint with the same data order, reaching the weights an
uninterrupted run would.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

from ..backends import active
from ..config import Config, load_run_config
from ..errors import RunDirError
from ..files import atomic_write
from ..processes import announce_started, restarts
from ..progress import Progress
from ..trainer.data.batching import k_for_micro_batch
from ..trainer.data.order import describe_split, largest_micro_batch
from ..trainer.memory import probe
from ..trainer.store.checkpoints import newest_intact_checkpoint
from ..trainer.store.rundir import MODEL_COPY, RunDirectory, check_output_dir, save_weights, write_record
from ..trainer.trainer import Trainer
from .advice import split_warnings
from .build import build_run, configure, load_data
from .run_hooks import RunHooks
from .run_parts import Run
from .source import model_source


def train(
    cfg: Config,
    run_dir: Path | None,
    progress: Progress | None = None,
    resume: bool = False,
    data=None,
) -> dict:
    """Train as configured, leaving a complete run directory; returns summary.json's content.

    Under a multi-worker strategy every worker calls this; only the chief writes
    ``run_dir``, the others write their (required) checkpoints to a scratch folder
    (rundir.RunDirectory)."""
    threads = configure(cfg)  # before any op: thread pools are fixed when the runtime starts
    strategy = None
    if cfg.strategy.name != "default":
        strategy = active().make_strategy(cfg.strategy.name, cfg.strategy.cpu_devices)  # before any other op
    chief = active().is_chief(strategy)  # the process that writes the run directory (any process outside a cluster)
    progress = progress or Progress()
    if data is None or data.for_model is None:
        # the model file: a resume's copy of it, and a worker's beside the chief (the same bytes as the chief's)
        source = model_source(cfg, run_dir if resume or not chief else None)
        if data is None:
            # before anything is written: bad data leaves no trace
            data = load_data(cfg, run_dir if resume else None, source)
        else:
            data = dataclasses.replace(data, for_model=source)
    run_dir = Path(run_dir)
    if not chief:
        progress = Progress()  # the chief reports
    elif not resume:
        check_output_dir(run_dir)
    # (wall, CPU) time from here: the summary's times include building the model
    started = time.time(), time.process_time()
    run = build_run(cfg, data, strategy)  # before any write: a model that does not fit leaves no trace
    directory = ConfigRunDir(run, run_dir, chief, progress, resume, threads, started)
    directory.hooks = hooks = RunHooks(run, directory, progress)
    network = getattr(run.model, "network", None)  # a keras_file's Keras model (rematerialised); None: TensorLayer
    trainer = hooks.trainer = Trainer(run.spec, run.engine, network, run.noise, run.cfg.batch_size, progress.message)
    return trainer.run(directory, lambda stop: hooks.train(directory.first_step, stop), run.first_examples)


class ConfigRunDir(RunDirectory):
    """The run directory of a config's run, with what is the CLI's: ``--resume`` (which must find an intact
    checkpoint), config.yaml, run.json's data and the model file's copy, the lines a run starts with, weights.npz
    and summary.json's fields of a config. ``writer``: this process writes it (the chief, holding its writer lock
    from before its first write to its return), another worker a scratch folder; ``threads``: what build.configure
    set up, for the summary; ``started``: (wall, CPU) time the run began at; ``first_step``: the update the loop
    starts from; ``hooks``: the CLI's side of the loop (run_hooks.RunHooks)."""

    def __init__(self, run, run_dir, writer, progress, resume, threads, started):
        flag = "--resume " if resume else "--output-dir "
        super().__init__(run_dir, writer, flag, f"resume with --resume {run_dir}")
        self.run, self.progress, self.resume, self.threads = run, progress, resume, threads
        self.tracked, self.optional, self.began = run.tracked, run.optional, started
        self.first_step, self.hooks = 0, None
        # how the run's config.yaml cut the batch, read before this call rewrites it: a resume's other cut wins over
        # the checkpoint's k (a worker that starts after the chief rewrote it reads the new one)
        self.cut_before = None
        if resume and (Path(run_dir) / "config.yaml").is_file():
            before = load_run_config(run_dir)
            self.cut_before = before.subdivisions, before.micro_batch_size

    def check(self) -> None:
        # with no intact checkpoint the run directory stays as it was
        if self.resume and self.writer:
            self.found = newest_intact_checkpoint(self.path / "checkpoints", self.flag)

    def resumes(self) -> bool:
        return self.resume

    def restored(self, step: int, trainer) -> None:
        """The rule's batches and the learning rate as of ``step``; a run past its end refused before config.yaml
        records the smaller epochs; metrics.jsonl cut back to the checkpoint; k adapted to other replicas."""
        run, cfg = self.run, self.run.cfg
        run.regrow(step)
        if step > run.total_steps:
            raise RunDirError(
                f"--resume {self.path}: the run is at update {step}, past the end of epochs={cfg.epochs} "
                f"(update {run.total_steps}): resume with a larger epochs"
            )
        self.first_step = step
        self.log.truncate_after(step, run.timeline.epoch_of(step))
        self.progress.message(f"resuming {self.path} at update {step} of {run.total_steps}")
        schedule = cfg.optimizer.schedule
        end = schedule.warmup_steps + (schedule.decay_steps or 0)
        if schedule.name == "cosine" and end < run.total_steps:
            self.progress.message(
                f"note: the cosine schedule ends at update {end} (decay_steps={schedule.decay_steps}, "
                f"fixed when the run started); later updates use its final learning rate"
            )
        if cfg.baseline:
            return
        anew = self.cut_before is not None and self.cut_before != (cfg.subdivisions, cfg.micro_batch_size)
        _recut(run, trainer, self.progress, run.timeline.batch_size(step), anew)

    def write_records(self, spec) -> None:
        run, data, local = self.run, self.run.data, self.local
        local.mkdir(parents=True, exist_ok=True)
        # a keras_file run's copy of its model file, which resume, export, evaluate and predict rebuild the model
        # from (a worker copies the run directory's copy)
        model = data.for_model.config
        if model.name == "keras_file" and not (local / MODEL_COPY).is_file():
            atomic_write(local / MODEL_COPY, Path(model.path).read_bytes())
        # not in run.json: the user's file of the config as resolved (docs/configuration.md), which --resume reads
        text = run.cfg.to_yaml() + scaled_rate_note(run)
        if not (local / "config.yaml").is_file() or (local / "config.yaml").read_text() != text:
            atomic_write(local / "config.yaml", text.encode())
        write_record(local, "config", spec, data.describe())
        if self.writer and data.file_checks is not None:  # an image folder: what its check found, for a resume
            data.file_checks.save(local)
            self.progress.message(data.file_checks.line())

    def started(self, trainer, resumed: bool) -> None:
        _say_split(self.run, trainer, resumed, self.progress)
        run = self.run
        self.log_start(self.first_step, resumed, run.cfg.strategy.name, run.replicas, run.subdivisions)
        announce_started()  # to a --workers supervisor: every worker has joined

    def finish(self) -> tuple:
        run, cfg, step = self.run, self.run.cfg, self.hooks.step
        save_weights(run.model.named_weights(), self.local / "weights.npz")
        return step, {
            **run.scores(),
            "examples_seen": run.timeline.examples_seen(step),
            # how many times a --workers supervisor started this run's workers again after a failure
            "restarts": restarts(),
            "batch_size": cfg.batch_size,
            "batch_schedule": [
                {"update": p.step + 1, "epoch": p.epoch + 1, "batch_size": p.batch_size} for p in run.timeline.phases
            ]
            if len(run.timeline.phases) > 1
            else None,
            "baseline": cfg.baseline,
            "precision": cfg.precision,
            **self.threads,
        }


def adapt_subdivisions(batch_size: int, replicas_before: int, k_before: int, replicas: int) -> int:
    """The fewest micro-batches per replica share that keep every micro-batch within the largest one
    ``k_before`` cut on ``replicas_before`` replicas: what a resume on other replicas runs."""
    return k_for_micro_batch(batch_size, largest_micro_batch(batch_size, replicas_before, k_before), replicas)


def _say_split(run: Run, trainer: Trainer, resumed: bool, progress: Progress) -> None:
    """How the batch in force is split (k set for it), the batch schedule, plan's warnings (a start only), what
    the noise scale and the precision will do."""
    cfg = run.cfg
    step = min(trainer.directory.first_step, run.total_steps - 1)
    batch = run.timeline.batch_size(step)
    k = run.follow_batch(batch)
    trainer.follow_batch(batch)
    if cfg.strategy.name != "default":
        progress.message(describe_split(batch, None if cfg.baseline else k, run.replicas))
    elif not cfg.baseline:
        progress.message(describe_split(batch, k))
    if len(run.timeline.phases) > 1 and cfg.batch_rule is None:
        progress.message("batch_schedule: " + describe_phases(run))
    if not resumed:  # what plan warns of, with subdivisions=auto's k chosen
        fixed = None if cfg.baseline else k
        for warning in split_warnings(cfg, fixed, run.n_train, len(run.model.norm_layers), run.total_steps):
            progress.message("warning: " + warning)
    if cfg.baseline or k * run.replicas < 2:
        progress.message(NO_NOISE_SCALE)
    elif cfg.data.trim_padding is not None:
        progress.message(TRIMMED_NOISE_SCALE)
    if cfg.precision == "mixed_float16" and not active().has_gpu():
        progress.message(
            "note: mixed_float16 is slow on a CPU (no float16 kernels: 7-10x the time of float32, "
            "measured); mixed_bfloat16 is a CPU's 16-bit precision"
        )


# Said once when no update can measure the gradient noise scale (noise.py); metrics.jsonl then holds null.
NO_NOISE_SCALE = "noise_scale: none (each update is one micro-batch; the estimate needs two or more: subdivisions >= 2)"
TRIMMED_NOISE_SCALE = (
    "noise_scale: none (data.trim_padding orders each batch by length; the estimate needs micro-batches drawn at "
    "random)"
)


def scaled_rate_note(run: Run) -> str:
    """config.yaml's closing comment under scale_learning_rate: the peak rate each batch size runs at (YAML
    readers skip it; the run recomputes it from the keys above)."""
    scale, rate = run.cfg.optimizer.scale_learning_rate, run.cfg.optimizer.learning_rate
    if scale.rule == "none":
        return ""
    lines = [f"# learning rate in force ({scale.rule} rule from {rate:g} at base_batch_size {scale.base_batch_size}):"]
    for phase in run.timeline.phases:
        lines.append(
            f"#   {rate * scale.factor(phase.batch_size):.6g} at batch_size {phase.batch_size} "
            f"from update {phase.step + 1}"
        )
    return "\n".join(lines) + "\n"


def describe_phases(run: Run) -> str:
    """The batch schedule as run: each batch size, its k and learning rate, and the update it starts at."""
    from ..trainer.optim import learning_rate_at

    return "; ".join(
        f"batch_size={phase.batch_size} (k={run.k_for(phase.batch_size)}, learning rate "
        f"{learning_rate_at(run.schedule, phase.step):.4g}) from update {phase.step + 1} (epoch {phase.epoch + 1})"
        for phase in run.timeline.phases
    )


def _recut(run: Run, trainer: Trainer, progress: Progress, batch: int, anew: bool) -> None:
    """After a restore, k for ``batch``, the batch size in force. ``anew``: the resume's config cuts the batch
    otherwise than the checkpoint's, and its k wins over the checkpoint's (auto: measured again, as a start does).
    Else a resume on another number of replicas keeps the global batch, the data order and the schedule (all
    counted in updates) and changes only how a replica cuts its share: k is adapted so that no micro-batch is larger
    than before (re-probed with subdivisions=auto under a memory_limit). Said in one line."""
    cfg, k_before, before = run.cfg, run.subdivisions, int(run.saved_replicas.numpy())
    if not anew and before == run.replicas:
        return
    if cfg.auto_subdivisions and (anew or cfg.memory_limit is not None):
        run.engine.set_subdivisions(1)
        probe(run.engine, trainer.spec, run.first_examples, batch, trainer.say, trainer.remat)
    elif anew or cfg.micro_batch_size is not None:  # (a baseline, one pass, never comes here: ``restored``)
        run.engine.set_subdivisions(cfg.subdivisions_for(batch, run.replicas))
    else:
        run.engine.set_subdivisions(adapt_subdivisions(batch, before, k_before, run.replicas))
    run.saved_replicas.assign(run.replicas)
    micro = largest_micro_batch(batch, run.replicas, run.subdivisions)
    said = (
        f"subdivisions {k_before} -> {run.subdivisions} since the checkpoint (micro-batches of up to {micro} examples"
        if anew
        else f"replicas changed since the checkpoint: {before} -> {run.replicas}; subdivisions {k_before} -> "
        f"{run.subdivisions} (micro-batches of up to {micro} examples, at most as before"
    )
    progress.message(f"{said}); batch_size, data order, learning-rate schedule and update count unchanged")
