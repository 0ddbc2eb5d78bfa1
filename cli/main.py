"""``accum-train``: the command line over the core (accum_train).

Subcommands: ``run`` trains one config, ``compare`` trains the baseline and the
subdivided run side by side, ``bench`` measures time and memory against k;
``plan``, ``evaluate``, ``predict``, ``export`` and ``describe`` (use.py) work
before and after training; the last three also read a run directory of
accum_train.fit(output_dir=...), which ``run --resume`` refuses (only that
call has the model's code and the data to go on with). The commands parse
flags and print; the core does the work, and ``outcome.ending`` turns how it
ended into an exit code.
Bad input of any kind (config, data, paths) ends as one line on stderr,
``error: ...``, with exit code 2 and nothing written; TensorFlow is imported
only after the config has been checked, so those errors come back at once.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from ..config import load_config
from ..defaults import PRECISIONS
from ..errors import UserError
from ..from_config.api import resumed
from ..from_config.api import run as run_api
from ..from_config.source import default_output_dir
from ..outcome import EpochLines, ending, last_line, quiet_tensorflow
from ..trainer.data.batching import k_for_micro_batch
from .use import describe, evaluate, export, output_dir_option, plan, predict, set_option, verbose_option


def count_option(name: str, default: int, help_text: str):
    """A whole number >= 1 with its default shown, e.g. --steps."""
    return click.option(name, default=default, show_default=True, type=click.IntRange(min=1), help=help_text)


class BarProgress(EpochLines):
    """Progress bars (progressbar2) on a terminal; one line per epoch and every message always (EpochLines')."""

    def __init__(self, show_bar: bool, stream=None):
        self.show_bar = show_bar
        self.stream = stream or sys.stderr
        self.bar = None

    def epoch_start(self, epoch, epochs, micro_batches, done):
        super().epoch_start(epoch, epochs, micro_batches, done)
        if not self.show_bar:
            return
        import progressbar

        widgets = [
            f"epoch {epoch}/{epochs} ",
            progressbar.Counter(),
            f"/{micro_batches} micro-batches ",
            progressbar.Bar(),
            " ",
            progressbar.Variable("loss", precision=4),
            " ",
            progressbar.Variable("examples_per_s", format="{formatted_value} examples/s", precision=6),
            " ",
            progressbar.ETA(),
        ]
        self.bar = progressbar.ProgressBar(
            max_value=micro_batches,
            widgets=widgets,
            initial_value=done,
            fd=self.stream,
            line_breaks=False,
            is_terminal=True,
        )
        self.bar.start()

    def updates(self, micro_done, loss, examples_per_s):
        if self.bar is not None:
            self.bar.update(min(micro_done, self.bar.max_value), loss=loss, examples_per_s=examples_per_s)

    def epoch_end(self, record):
        if self.bar is not None:
            self.bar.finish()
            self.bar = None
        super().epoch_end(record)


class OneLineErrors(click.Group):
    """Click's usage errors (an unknown option, a missing value) as every other bad input of the tool: one line,
    ``error: ...``, exit 2, where Click prints the usage and a hint first."""

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode, **extra)
        try:
            code = super().main(args, prog_name, complete_var, False, **extra)
        except click.UsageError as err:
            see = f" (see {err.ctx.command_path} --help)" if err.ctx is not None else ""
            click.echo(f"error: {err.format_message()}{see}", err=True)
            sys.exit(err.exit_code)
        except click.ClickException as err:
            err.show()
            sys.exit(err.exit_code)
        except click.Abort as err:
            if isinstance(err.__context__, KeyboardInterrupt):  # Ctrl-C before a run's own stop (start-up, loading)
                click.echo("stopped by SIGINT", err=True)
                sys.exit(130)  # 128 + SIGINT, as a run that a signal stops
            click.echo("Aborted!", err=True)
            sys.exit(1)
        sys.exit(code if isinstance(code, int) else 0)


@click.group(cls=OneLineErrors, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="accum-train")
def main():
    """Train TensorFlow models with exact gradient accumulation.

    \b
    accum-train run configs/fmnist.yaml
    accum-train run configs/fmnist.yaml --set subdivisions=10 --output-dir runs/x
    accum-train compare configs/fmnist.yaml
    """


@main.command()
@click.argument("config", required=False, type=click.Path(dir_okay=True, path_type=Path))
@set_option("Override a config value, e.g. --set subdivisions=10 --set optimizer.learning_rate=0.002")
@output_dir_option("Run directory to create (default: runs/CONFIG-DATE-TIME).")
@click.option(
    "--resume",
    "resume_dir",
    type=click.Path(path_type=Path),
    default=None,
    help="Continue the run in this directory from its latest checkpoint.",
)
@click.option("--quiet", is_flag=True, help="No progress bar (also off when stdout is not a terminal).")
@click.option(
    "--workers",
    type=click.IntRange(min=2),
    default=None,
    help="Train on this many local worker processes (MultiWorkerMirroredStrategy on 127.0.0.1).",
)
@click.option(
    "--max-restarts",
    type=int,
    default=None,
    help="With --workers: when a worker fails, start all of them again from the last checkpoint, "
    "up to this many times.",
)
@verbose_option
def run(config, overrides, output_dir, resume_dir, quiet, workers, max_restarts, verbose):
    """Train the model a CONFIG describes and print its test accuracy.

    \b
    accum-train run configs/fmnist.yaml
    accum-train run configs/smoke.yaml --set subdivisions=4 --output-dir runs/smoke
    accum-train run --resume runs/smoke
    accum-train run configs/smoke.yaml --workers 2 --max-restarts 3
    """
    with ending():  # a config's or a run directory's error in under a second: before TensorFlow loads
        if resume_dir is not None:
            resumed(resume_dir, config, overrides)
        elif config is not None:
            load_config(config, overrides)
    quiet_tensorflow(verbose, load=not workers)  # the --workers supervisor never loads TensorFlow
    if output_dir is None and resume_dir is None and config is not None:
        output_dir = default_output_dir(config)
    run_dir = resume_dir or output_dir
    with ending():
        summary = run_api(
            config,
            output_dir=output_dir,
            overrides=overrides,
            progress=BarProgress(not quiet and sys.stdout.isatty()),
            resume=resume_dir,
            workers=workers,
            max_restarts=max_restarts,
        )
    if workers:
        return  # the chief's own output, echoed by the launcher, ended with the same line
    click.echo(last_line(summary, run_dir))


@main.command()
@click.argument("config", type=click.Path(dir_okay=True, path_type=Path))
@set_option("Override a config value for both runs, e.g. --set epochs=3")
@output_dir_option("Directory for compare.json, compare.png and both runs (default: runs/compare-CONFIG-DATE-TIME).")
@verbose_option
def compare(config, overrides, output_dir, verbose):
    """Train the baseline (whole batch) and the subdivided run side by side.

    \b
    accum-train compare configs/fmnist.yaml
    accum-train compare configs/smoke.yaml --set model.norm=none --output-dir runs/cmp
    """
    quiet_tensorflow(verbose)
    with ending():
        cfg = load_config(config, overrides)
        out_dir = Path(output_dir) if output_dir else default_output_dir(config, "compare-")
        from ..compare import compare as run_compare

        result = run_compare(cfg, out_dir, BarProgress(False))
    click.echo(format_compare(result, out_dir))


def _parse_ks(text: str, option: str = "--subdivisions", example: str = "1,2,4,8,16") -> list:
    try:
        ks = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        ks = []
    if not ks or any(k < 1 for k in ks):
        raise UserError(f"{option} {text!r} must be a comma-separated list of integers >= 1, e.g. {example}")
    return list(dict.fromkeys(ks))  # each measured once, in the order first given


@main.command()
@click.argument("config", type=click.Path(dir_okay=True, path_type=Path))
@click.option(
    "--subdivisions", "ks", default=None, help="Values of k to measure, comma-separated.  [default: 1,2,4,8,16]"
)
@click.option(
    "--micro-batch-size",
    "micro_sizes",
    default=None,
    help="Instead of --subdivisions: micro-batch sizes to measure, comma-separated (k = ceil(batch_size / size)).",
)
@count_option("--steps", 10, "Timed updates per k (after 2 warm-up updates).")
@click.option(
    "--precision",
    "precisions",
    default=None,
    help="Precisions to measure, comma-separated (float32, mixed_bfloat16, mixed_float16); default: the config's.",
)
@count_option("--rounds", 1, "Measure every variant this many times, alternating; ratios are medians over the rounds.")
@set_option("Override a config value.")
@output_dir_option("Directory for bench.json and bench.png (default: runs/bench-CONFIG-DATE-TIME).")
@verbose_option
def bench(config, ks, micro_sizes, steps, precisions, rounds, overrides, output_dir, verbose):
    """Time and memory of one update for each number of subdivisions (and precision).

    \b
    accum-train bench configs/fmnist.yaml --subdivisions 1,8 --rounds 5
    accum-train bench configs/fmnist.yaml --subdivisions 8 --precision float32,mixed_bfloat16 --rounds 5
    accum-train bench configs/fmnist.yaml --micro-batch-size 500,250 --rounds 5
    """
    quiet_tensorflow(verbose)
    with ending():
        cfg = load_config(config, overrides)
        if cfg.whole_set:  # batch_size: all is the training set's size
            from ..from_config.build import load_data

            cfg = cfg.for_data(len(load_data(cfg).train))
        if ks is not None and micro_sizes is not None:
            raise UserError("give --subdivisions or --micro-batch-size, not both")
        if micro_sizes is not None:
            sizes = _parse_ks(micro_sizes, "--micro-batch-size", "500,250")
            values = list(dict.fromkeys(k_for_micro_batch(cfg.batch_size, size) for size in sizes))
        else:
            values = _parse_ks(ks or "1,2,4,8,16")
        too_many = [k for k in values if k > cfg.batch_size]
        if too_many:
            raise UserError(
                f"--subdivisions {too_many[0]} is more than batch_size={cfg.batch_size}: "
                f"a micro-batch holds at least one example"
            )
        chosen = _parse_precisions(precisions) if precisions is not None else [cfg.precision]
        out_dir = Path(output_dir) if output_dir else default_output_dir(config, "bench-")
        from ..bench import bench as run_bench

        result = run_bench(cfg, values, steps, out_dir, BarProgress(False), chosen, rounds)
    click.echo(format_bench(result, out_dir))


def _parse_precisions(text: str) -> list:
    chosen = list(dict.fromkeys(part.strip() for part in text.split(",") if part.strip()))
    bad = [p for p in chosen if p not in PRECISIONS]
    if not chosen or bad:
        raise UserError(f"--precision {text!r} must be a comma-separated list of {', '.join(PRECISIONS)}")
    return chosen


def mib_text(n_bytes: int | None) -> str:
    """Bytes as whole MiB, e.g. '48 MiB'; n/a where nothing was measured."""
    return f"{n_bytes / 2**20:.0f} MiB" if n_bytes is not None else "n/a"


def format_bench(result: dict, out_dir: Path) -> str:
    rows = result["rows"]
    first = rows[0]
    several = result["rounds"] > 1

    def ratio(spread):
        return f"{spread['median']:.2f}x" + (f" [{spread['min']:.2f}-{spread['max']:.2f}]" if several else "")

    lines = [
        f"{'precision':<15} {'k':>4} {'micro':>6} {'s/update':>9} {'examples/s':>11} {'CPU ms/example':>15} "
        f"{'TF peak':>9} {'peak RSS':>9} {'time x':>7} {'CPU x':>7} {'memory x':>9}  threads"
    ]
    for r in rows:
        mem_ratio, intra, inter = r["memory_ratio"], r["intra_op_threads"], r["inter_op_threads"]
        pools = f"intra {intra}, inter {inter}" if intra or inter else "defaults"  # the pools a worker ran under
        lines.append(
            f"{r['precision']:<15} {r['subdivisions']:>4} {r['micro_batch_size']:>6} "
            f"{r['median_s_per_update']:>9.3f} {r['examples_per_s']:>11.0f} "
            f"{1000 * r['cpu_s_per_example']:>15.3f} {mib_text(r['peak_memory_bytes']):>9} "
            f"{mib_text(r['peak_rss_bytes']):>9} {ratio(r['time_ratio']):>7} {ratio(r['cpu_ratio']):>7} "
            f"{(f'{mem_ratio:.2f}x' if mem_ratio else 'n/a'):>9}  {r['parallel_micro_steps']} in flight, {pools}"
        )
    how = (
        f"medians over {result['rounds']} alternating rounds, [min-max] of the per-round ratios"
        if several
        else "one round"
    )
    lines.append(
        f"(ratios against {first['precision']} k={first['subdivisions']}; {result['steps']} updates per "
        f"measurement, one fresh process each; {how})"
    )
    lines.append(f"written: {out_dir / 'bench.json'}, {out_dir / 'bench.png'}")
    return "\n".join(lines)


def format_compare(result: dict, out_dir: Path) -> str:
    """The side-by-side table: one row per epoch, then cost rows and the gradient check."""
    from ..compare import check_lines, score_key

    base, sub = result["baseline"], result["subdivided"]
    ok = base["status"] == "ok"
    curves = sub["curves"]
    score = score_key(curves)  # accuracy, or a Keras loss's run's first metric
    short = "acc" if score == "test_accuracy" else (score or "test_")[len("test_") :][:7]
    lines = [
        f"{'epoch':>5} | {'baseline':^29} | {'subdivided':^29}",
        f"{'':>5} | {'train loss':>10} {'test loss':>9} {short:>7} | {'train loss':>10} {'test loss':>9} {short:>7}",
    ]

    def cells(side_curves, i):
        value = side_curves[score][i] if score in side_curves else float("nan")
        return f"{side_curves['train_loss'][i]:>10.4f} {side_curves['test_loss'][i]:>9.4f} {value:>7.4f}"

    for i, epoch in enumerate(curves["epoch"]):
        left = cells(base["curves"], i) if ok else f"{'out of memory':^29}"
        lines.append(f"{epoch:>5} | {left} | {cells(curves, i)}")
    lines.append("")
    lines.append(f"{'cost':<22} {'baseline':>12} {'subdivided':>12} {'ratio':>8}")
    units = {
        "wall_time_s": ("wall time", lambda v: f"{v:.1f} s"),
        "cpu_time_s": ("CPU time", lambda v: f"{v:.1f} s"),
        "examples_per_s": ("examples/s", lambda v: f"{v:.0f}"),
        "peak_memory_bytes": ("TF allocator peak", mib_text),
        "peak_rss_bytes": ("peak RSS", mib_text),
    }
    for key, (label, fmt) in units.items():
        b = fmt(base["summary"][key]) if ok and base["summary"].get(key) is not None else "n/a"
        s = fmt(sub["summary"][key]) if sub["summary"].get(key) is not None else "n/a"
        r = result["ratios"][key] if result["ratios"] and result["ratios"].get(key) is not None else None
        lines.append(f"{label:<22} {b:>12} {s:>12} {(f'{r:.2f}x' if r is not None else 'n/a'):>8}")
    if not ok:
        lines.append(f"baseline: {base['message']}")
    lines += ["", *check_lines(result["gradient_check"])]
    lines.append(f"written: {out_dir / 'compare.json'}, {out_dir / 'compare.png'}")
    return "\n".join(lines)


for command in (plan, evaluate, predict, export, describe):
    main.add_command(command)


if __name__ == "__main__":  # pragma: no cover
    main()
