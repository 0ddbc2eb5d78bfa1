"""The training loop and the run directory it leaves.

``train(cfg, run_dir)`` does all setup first (data, model, optimizer, engine,
checkpoint, first trace), then runs one plain loop: one graph call per update,
a step count, and host syncs only every ``log_every`` updates, when the
buffered losses are written to metrics.jsonl and TensorBoard. A run directory
holds config.yaml, metrics.jsonl, tensorboard/, checkpoints/, weights.npz and
summary.json; ``resume=True`` continues one from its latest checkpoint with
the same data order, so it reaches the same weights as an uninterrupted run.

Progress goes to a ``Progress`` object; the CLI draws bars with it, tests
pass nothing.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np
import tensorflow as tf

from .config import Config
from .engine import AccumulatingUpdate, PlainUpdate, sparse_softmax_loss
from .errors import OutOfMemory, RunDirError, TrainingStopped
from .models import build_model
from .optim import learning_rate_at, make_optimizer, make_schedule
from .rundir import _UMASK, atomic_write, check_output_dir, is_run_dir, write_json  # noqa: F401  (re-exported)


class Progress:
    """Callbacks from the loop. The default does nothing."""

    def epoch_start(self, epoch: int, epochs: int, micro_batches: int, done: int) -> None: ...

    def updates(self, micro_done: int, loss: float, examples_per_s: float) -> None: ...

    def epoch_end(self, record: dict) -> None: ...

    def message(self, text: str) -> None: ...


@dataclass
class Interrupted(Exception):
    """A signal stopped the run after a clean checkpoint."""
    signum: int
    run_dir: Path
    step: int


# ----------------------------------------------------------------------------
# Files


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


def _reset_allocator_peak() -> None:
    try:
        tf.config.experimental.reset_memory_stats(memory_device())
    except (ValueError, RuntimeError):
        pass


def allocator_peak_bytes() -> Optional[int]:
    """TensorFlow's allocator peak since start (or the last reset); None if not kept."""
    try:
        return int(tf.config.experimental.get_memory_info(memory_device())["peak"])
    except (ValueError, RuntimeError):
        return None


# ----------------------------------------------------------------------------
# Data


def epoch_order(seed: int, epoch: int, n: int) -> np.ndarray:
    """The permutation of epoch ``epoch`` (0-based): a pure function of (seed, epoch),
    so a resumed run sees exactly the batches an uninterrupted one would."""
    return np.random.default_rng([seed, epoch]).permutation(n)


def to_inputs(images, labels):
    x = tf.cast(images, tf.float32)[..., tf.newaxis] / 255.0
    return x, tf.cast(labels, tf.int32)


def batches(images: tf.Tensor, labels: tf.Tensor, order: np.ndarray, batch_size: int):
    """Batches of a given order of indices, gathered and converted on the tf.data side."""
    indices = tf.data.Dataset.from_tensor_slices(order.astype(np.int64)).batch(batch_size)
    return indices.map(lambda idx: to_inputs(tf.gather(images, idx), tf.gather(labels, idx)),
                       num_parallel_calls=tf.data.AUTOTUNE).prefetch(2)


# ----------------------------------------------------------------------------
# The run


class Run:
    """Everything set up for training: built once, then driven by ``train``."""

    def __init__(self, cfg: Config, data, run_dir: Path, strategy=None):
        self.cfg, self.run_dir = cfg, Path(run_dir)
        self.train_images = tf.constant(data.train.images)
        self.train_labels = tf.constant(data.train.labels)
        self.test_images, self.test_labels = data.test.images, data.test.labels
        self.n_train = len(data.train.labels)
        self.steps_per_epoch = math.ceil(self.n_train / cfg.batch_size)
        self.total_steps = self.steps_per_epoch * cfg.epochs

        self.schedule = make_schedule(cfg.optimizer.learning_rate, cfg.optimizer.schedule, self.total_steps)
        with strategy.scope() if strategy is not None else contextlib.nullcontext():
            self.model = build_model(cfg.model, cfg.seed)
            self.optimizer = make_optimizer(cfg.optimizer, self.schedule, self.model.trainable_variables)
        for layer in self.model.norm_layers:
            layer.deferred = True  # moving statistics move once per update
        signature = (tf.TensorSpec([None, 28, 28, 1], tf.float32), tf.TensorSpec([None], tf.int32))
        loss_fn = sparse_softmax_loss(self.model.forward)
        if strategy is not None:
            from .distribute import DistributedUpdate
            self.engine = DistributedUpdate(strategy, loss_fn, self.model.trainable_variables, self.optimizer,
                                            cfg.subdivisions)
        elif cfg.baseline:
            self.engine = PlainUpdate(loss_fn, self.model.trainable_variables, self.optimizer,
                                      cfg.optimizer.clip_norm, self.model.norm_layers, signature)
        else:
            # subdivisions=auto starts at 1; choose_subdivisions measures before training.
            self.engine = AccumulatingUpdate(loss_fn, self.model.trainable_variables, self.optimizer,
                                             1 if cfg.auto_subdivisions else cfg.subdivisions,
                                             cfg.optimizer.clip_norm, self.model.norm_layers, signature)
        self.evaluate_batch = tf.function(self._evaluate_batch, input_signature=signature)

        self.memory_checked = False
        self.step = tf.Variable(0, dtype=tf.int64, trainable=False, name="step")
        # Updates skipped for a non-finite loss or gradient: in a row, and in all.
        self.bad_updates = tf.Variable(0, dtype=tf.int64, trainable=False, name="bad_updates")
        self.skipped_updates = tf.Variable(0, dtype=tf.int64, trainable=False, name="skipped_updates")
        tracked = {"weights": self.model.variables, "optimizer": self.optimizer,
                   "step": self.step, "bad_updates": self.bad_updates,
                   "skipped_updates": self.skipped_updates}
        if not cfg.baseline:
            tracked["subdivisions"] = self.engine.subdivisions
        self.checkpoint = tf.train.Checkpoint(**tracked)
        self.manager = tf.train.CheckpointManager(self.checkpoint, str(self.run_dir / "checkpoints"),
                                                  max_to_keep=cfg.checkpoint.keep)

    @property
    def subdivisions(self) -> int:
        return 1 if self.cfg.baseline else int(self.engine.subdivisions.numpy())

    @property
    def eval_batch_size(self) -> int:
        # Evaluation holds no gradients: twice a training micro-batch fits where one did.
        return max(2 * math.ceil(self.cfg.batch_size / self.subdivisions), 100)

    def reset_update(self) -> None:
        """Forget a half-done update: cache and pooled BatchNorm statistics."""
        if isinstance(self.engine, AccumulatingUpdate):
            self.engine.cache.clear()
        for layer in self.model.norm_layers:
            layer.discard()

    def choose_subdivisions(self, progress: "Progress") -> int:
        """subdivisions=auto: the smallest k (1, 2, 4, ...) whose micro-step fits memory_limit.

        One micro-step (forward, backward, add to the cache) is run at each
        candidate micro-batch size and TensorFlow's allocator peak is read; the
        cache and statistics are cleared afterwards, so no weight moves.
        """
        limit = self.cfg.memory_limit_bytes
        batch = self.cfg.batch_size
        order = epoch_order(self.cfg.seed, 0, self.n_train)[:batch]
        x, y = to_inputs(tf.gather(self.train_images, order), tf.gather(self.train_labels, order))
        k = 1
        while True:
            micro = math.ceil(batch / k)
            try:
                _reset_allocator_peak()
                float(self.engine.accumulate(x[:micro], y[:micro], batch))
                peak = allocator_peak_bytes()
                fits = peak is None or peak <= limit
            except tf.errors.ResourceExhaustedError:
                peak, fits = None, False
            self.reset_update()
            shown = f"{peak / 2**20:.0f} MiB" if peak is not None else "out of memory"
            progress.message(f"subdivisions=auto: micro-batch of {micro} -> {shown} "
                             f"(memory_limit={self.cfg.memory_limit}){'' if fits else ', too much'}")
            if fits:
                break
            if k >= batch:
                raise OutOfMemory(f"even one example per micro-batch needs {shown} of TensorFlow memory, "
                                  f"over memory_limit={self.cfg.memory_limit}: raise memory_limit or use a "
                                  f"smaller model")
            k = min(2 * k, batch)
        self.engine.set_subdivisions(k)
        progress.message(f"subdivisions=auto chose {k}")
        return k

    def _evaluate_batch(self, x, y):
        logits = self.model.forward(x, False)
        losses = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits)
        correct = tf.reduce_sum(tf.cast(tf.equal(tf.argmax(logits, 1, output_type=tf.int32), y), tf.float32))
        return tf.reduce_sum(losses), correct

    def evaluate(self):
        """(mean loss, accuracy) on the test split."""
        loss_sum = correct = 0.0
        n = len(self.test_labels)
        for start in range(0, n, self.eval_batch_size):
            x, y = to_inputs(self.test_images[start:start + self.eval_batch_size],
                             self.test_labels[start:start + self.eval_batch_size])
            batch_loss, batch_correct = self.evaluate_batch(x, y)
            loss_sum += float(batch_loss)
            correct += float(batch_correct)
        return loss_sum / n, correct / n

    def restore_latest(self, run_dir: Path) -> int:
        """Restore the latest checkpoint of run_dir (the chief's, for every worker)."""
        latest = tf.train.latest_checkpoint(str(Path(run_dir) / "checkpoints"))
        if latest is None:
            raise RunDirError(f"--resume {run_dir}: no checkpoint in {Path(run_dir) / 'checkpoints'}; "
                              f"start a new run instead")
        self.checkpoint.restore(latest).assert_existing_objects_matched()
        return int(self.step.numpy())

    def save_checkpoint(self, step: int) -> None:
        """Save the state as of ``step`` updates; TensorFlow writes the files first and the 'checkpoint' pointer last,
        so a failed or killed save leaves the previous checkpoint as the latest."""
        self.step.assign(step)
        try:
            self.manager.save(checkpoint_number=step)
        except (tf.errors.OpError, OSError) as err:
            message = getattr(err, "message", None) or getattr(err, "strerror", None) or str(err)
            raise RunDirError(f"cannot write checkpoint {int(self.step.numpy())} in {self.manager.directory} "
                              f"({message.splitlines()[0]}): free space or fix permissions, then resume with "
                              f"--resume {self.run_dir} (the last complete checkpoint, "
                              f"{Path(self.manager.latest_checkpoint or 'none').name}, is intact)") from None

    def save_weights(self) -> None:
        arrays = {name: v.numpy() for name, v in self.model.named_weights().items()}
        fd, tmp = tempfile.mkstemp(dir=self.run_dir, prefix=".weights.", suffix=".npz")
        os.close(fd)
        try:
            np.savez(tmp, **arrays)
            os.chmod(tmp, 0o666 & ~_UMASK)
            os.replace(tmp, self.run_dir / "weights.npz")
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)


class MetricsLog:
    """metrics.jsonl (one JSON object per line) plus the same scalars for TensorBoard."""

    def __init__(self, run_dir: Path):
        self.path = Path(run_dir) / "metrics.jsonl"
        self.writer = tf.summary.create_file_writer(str(Path(run_dir) / "tensorboard"))

    def truncate_after(self, step: int, epochs_done: int) -> None:
        """Drop records a resumed run will write again (those after its checkpoint)."""
        if not self.path.exists():
            return
        keep = []
        for line in self.path.read_text().splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line cut by a kill
            if "test_accuracy" in record:
                if record["epoch"] <= epochs_done:
                    keep.append(line)
            elif record.get("step", 0) <= step:
                keep.append(line)
        atomic_write(self.path, "".join(line + "\n" for line in keep).encode())

    def write(self, records) -> None:
        with open(self.path, "a") as handle:
            for record in records:
                handle.write(json.dumps(record) + "\n")
            handle.flush()
        with self.writer.as_default():
            for record in records:
                if "test_accuracy" in record:
                    step = record["step"]
                    for key in ("test_loss", "test_accuracy", "train_loss", "examples_per_s"):
                        if record[key] is not None:
                            tf.summary.scalar(f"epoch/{key}", record[key], step=step)
                else:
                    if record["loss"] is not None:  # a skipped update has no loss worth plotting
                        tf.summary.scalar("train/loss", record["loss"], step=record["step"])
                    tf.summary.scalar("train/learning_rate", record["learning_rate"], step=record["step"])
        self.writer.flush()

    def read(self):
        return [json.loads(line) for line in self.path.read_text().splitlines() if line.strip()]

    def epoch_losses(self, epoch: int) -> tuple:
        """(loss sum, examples) of the applied updates logged so far in ``epoch``."""
        loss_sum, examples, seen = 0.0, 0, 0
        for record in self.read() if self.path.exists() else []:
            if "loss" not in record:
                continue
            n, seen = record["examples_seen"] - seen, record["examples_seen"]  # records start at step 1
            if record["epoch"] == epoch and not record["skipped"]:
                loss_sum += record["loss"] * n
                examples += n
        return loss_sum, examples


class _StopFlag:
    """SIGINT/SIGTERM set a flag; the loop finishes the update in hand, checkpoints, stops."""

    def __init__(self):
        self.signum = 0
        self._previous = {}

    def __enter__(self):
        import threading
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, frame):
        if self.signum:  # a second signal: the user means it
            signal.signal(signum, self._previous.get(signum, signal.SIG_DFL))
            raise KeyboardInterrupt
        self.signum = signum

    def __exit__(self, *exc):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


def load_data(cfg: Config):
    from . import datasets
    return datasets.load(cfg.data)


def train(cfg: Config, run_dir: Path, progress: Optional[Progress] = None, resume: bool = False,
          data=None, strategy=None) -> dict:
    """Train as configured, leaving a complete run directory; returns summary.json's content.

    Under a multi-worker strategy every worker calls this; only the chief writes
    ``run_dir``, the others write their (required) checkpoints to a scratch folder."""
    from .distribute import is_chief
    progress = progress or Progress()
    shared_dir = Path(run_dir)
    if not is_chief(strategy):
        scratch = tempfile.TemporaryDirectory(prefix="accum-train-worker-")
        run_dir, progress = Path(scratch.name) / "run", Progress()
        if resume:  # the scratch folder needs the shape of a run to continue in
            run_dir.mkdir()
            atomic_write(run_dir / "config.yaml", cfg.to_yaml().encode())
    run_dir = Path(run_dir)
    if data is None:
        data = load_data(cfg)  # before anything is written: bad data leaves no trace
    if not resume:
        check_output_dir(run_dir)
    started = time.time()
    cpu_started = time.process_time()
    if not resume:
        run_dir.mkdir(parents=True, exist_ok=True)
        atomic_write(run_dir / "config.yaml", cfg.to_yaml().encode())
    run = Run(cfg, data, run_dir, strategy)
    log = MetricsLog(run_dir)
    step = 0
    if resume:
        step = run.restore_latest(shared_dir)
        log.truncate_after(step, step // run.steps_per_epoch)
        progress.message(f"resuming {run_dir} at update {step} of {run.total_steps}")
    else:
        if cfg.auto_subdivisions and not cfg.baseline:
            run.choose_subdivisions(progress)
        run.save_checkpoint(0)  # a run is resumable from its first moment
    if strategy is not None:
        replicas, k = strategy.num_replicas_in_sync, run.subdivisions
        share = math.ceil(cfg.batch_size / replicas)
        progress.message(f"batch_size={cfg.batch_size} over {replicas} replicas ({cfg.batch_size // replicas}-"
                         f"{share} examples each), each as {k} micro-batches of up to {math.ceil(share / k)} "
                         f"examples; one gradient all-reduce per update")
    elif not cfg.baseline:
        k = run.subdivisions
        progress.message(f"batch_size={cfg.batch_size} as {k} micro-batches of "
                         f"{cfg.batch_size // k}-{math.ceil(cfg.batch_size / k)} examples")

    with _StopFlag() as stop:
        while step < run.total_steps:
            epoch = step // run.steps_per_epoch
            first = step % run.steps_per_epoch
            order = epoch_order(cfg.seed, epoch, run.n_train)[first * cfg.batch_size:]
            k = run.subdivisions
            full, rest = divmod(run.n_train, cfg.batch_size)
            progress.epoch_start(epoch + 1, cfg.epochs, full * k + min(k, rest), first * k)
            epoch_started = time.time()
            epoch_examples = 0
            # A run resumed mid-epoch picks up the losses this epoch already logged.
            epoch_loss_sum, epoch_applied_examples = log.epoch_losses(epoch + 1) if first else (0.0, 0)
            micro_done = first * k
            pending = []
            for x, y in batches(run.train_images, run.train_labels, order, cfg.batch_size):
                out = _update_within_memory(run, x, y, step, progress)
                step += 1
                n = int(y.shape[0])
                epoch_examples += n
                micro_done += min(k, n)
                pending.append((step, n, out))
                end_of_epoch = step % run.steps_per_epoch == 0
                if len(pending) >= cfg.log_every or end_of_epoch or stop.signum:
                    loss_sum, examples = _flush(run, log, pending, progress, micro_done,
                                                epoch_examples / max(time.time() - epoch_started, 1e-9))
                    epoch_loss_sum += loss_sum
                    epoch_applied_examples += examples
                    pending = []
                    if int(run.bad_updates.numpy()) >= cfg.max_bad_updates:
                        run.save_checkpoint(step)  # skipped updates changed nothing: this is the last good state
                        raise TrainingStopped(
                            f"{int(run.bad_updates.numpy())} updates in a row had a non-finite loss or gradient "
                            f"(max_bad_updates={cfg.max_bad_updates}), the last at update {step}; weights are "
                            f"checkpointed as of the last good update: lower optimizer.learning_rate or set "
                            f"optimizer.clip_norm, then resume with --resume {run_dir}")
                if stop.signum:
                    run.save_checkpoint(step)
                    raise Interrupted(stop.signum, run_dir, step)
                if cfg.checkpoint.every_steps and step % cfg.checkpoint.every_steps == 0 \
                        and not end_of_epoch:
                    run.save_checkpoint(step)
            test_loss, test_accuracy = run.evaluate()
            elapsed = time.time() - epoch_started
            train_loss = epoch_loss_sum / epoch_applied_examples if epoch_applied_examples else None
            record = {"epoch": epoch + 1, "step": step, "train_loss": train_loss,
                      "test_loss": test_loss, "test_accuracy": test_accuracy,
                      "elapsed_s": elapsed, "examples_per_s": epoch_examples / max(elapsed, 1e-9)}
            log.write([record])
            run.save_checkpoint(step)
            progress.epoch_end(record)

    test_loss, test_accuracy = run.evaluate()
    run.save_weights()
    summary = {
        "test_accuracy": test_accuracy,
        "test_loss": test_loss,
        "steps": step,
        "examples_seen": _examples_seen(step, run.steps_per_epoch, run.n_train, cfg.batch_size),
        "wall_time_s": time.time() - started,
        "cpu_time_s": time.process_time() - cpu_started,
        "peak_memory_bytes": allocator_peak_bytes(),
        "peak_rss_bytes": peak_rss_bytes(),
        "skipped_updates": int(run.skipped_updates.numpy()),
        "subdivisions": run.subdivisions,
        "batch_size": cfg.batch_size,
        "baseline": cfg.baseline,
    }
    write_json(run_dir / "summary.json", summary)
    return summary


def _update_within_memory(run: Run, x, y, step: int, progress: Progress):
    """One update, within memory.

    Out of memory (TensorFlow's ResourceExhaustedError, or a first update whose
    allocator peak exceeds memory_limit) is fatal (OutOfMemory) with a fixed k.
    With subdivisions=auto, a ResourceExhaustedError instead doubles k and
    retries the same batch from a cleared cache: the error comes before the
    apply, so nothing of the batch was applied and none of it is lost.
    """
    while True:
        try:
            out = run.engine.update(x, y)
            if run.cfg.memory_limit is not None and not run.memory_checked:
                run.memory_checked = True
                float(out["loss"])  # wait for the update, then read its peak
                peak = allocator_peak_bytes()
                if peak is not None and peak > run.cfg.memory_limit_bytes:
                    raise OutOfMemory(f"the first update of this process peaked at {peak / 2**20:.0f} MiB of "
                                      f"TensorFlow memory, over memory_limit={run.cfg.memory_limit}: raise "
                                      f"memory_limit or use more subdivisions")
            return out
        except tf.errors.ResourceExhaustedError as err:
            k = run.subdivisions
            first_line = (err.message or "ResourceExhaustedError").splitlines()[0]
            if not run.cfg.auto_subdivisions or k >= run.cfg.batch_size:
                hint = "use more subdivisions or subdivisions: auto" if k < run.cfg.batch_size else \
                    "even one example per micro-batch does not fit: use a smaller model"
                raise OutOfMemory(f"update {step + 1} ran out of memory with subdivisions={k} "
                                  f"({first_line}): {hint}") from None
            run.reset_update()
            new_k = min(2 * k, run.cfg.batch_size)
            run.engine.set_subdivisions(new_k)
            progress.message(f"update {step + 1} ran out of memory with subdivisions={k}: "
                             f"retrying the same batch with subdivisions={new_k}")


def _examples_seen(step: int, steps_per_epoch: int, n_train: int, batch_size: int) -> int:
    epochs, rest = divmod(step, steps_per_epoch)
    return epochs * n_train + min(rest * batch_size, n_train)


def _flush(run: Run, log: MetricsLog, pending, progress: Progress, micro_done: int,
           examples_per_s: float) -> tuple:
    """Bring buffered update results to the host: the only sync in the loop.

    Returns the loss sum and example count of the applied updates."""
    records = []
    loss_sum, examples = 0.0, 0
    for step, n, out in pending:
        loss = float(out["loss"])
        applied = bool(out["applied"])
        if applied:
            run.bad_updates.assign(0)
            loss_sum += loss * n
            examples += n
        else:
            run.bad_updates.assign_add(1)
            run.skipped_updates.assign_add(1)
        epoch = (step - 1) // run.steps_per_epoch
        records.append({"epoch": epoch + 1, "step": step,
                        "examples_seen": _examples_seen(step, run.steps_per_epoch, run.n_train,
                                                        run.cfg.batch_size),
                        "loss": loss if math.isfinite(loss) else None,
                        "learning_rate": learning_rate_at(run.schedule, step - 1),
                        "skipped": not applied})
    log.write(records)
    progress.updates(micro_done, loss_sum / examples if examples else float("nan"), examples_per_s)
    return loss_sum, examples
