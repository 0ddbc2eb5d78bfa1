"""A figure the guide (README.md, docs/*.md) quotes in its prose is its benchmark JSON's.

Each row of FIGURES is a sentence of a page with its measured figures as `{}`, the JSON under docs/ they come
from, how each figure is read or derived from it, and how it is written. The test writes the sentence from the
JSON and asserts that the page says exactly that (whitespace aside, in prose: not in a generated table or a
code block). Rounding is the generated tables' (benchmarks/tables.py): absolute figures to the nearest, ratios of
accum-train to another method rounded against accum-train, costs rounded up, so that the page never reads
better than its JSON. A figure no JSON holds does not belong in the guide's prose: the page links to the
docs/results/ page that records it instead. A row may name a docs/results/ page too, for a figure its prose
repeats from its JSON.

DIRECTIONS does the same for words that say which way a comparison goes (A "spends more CPU time than" B, "less
than 2x" a target): the page must still say them, and the JSON must put A on that side of B.
"""

from __future__ import annotations

import copy
import json
import math
import re
from collections.abc import Callable
from decimal import ROUND_CEILING, Decimal
from pathlib import Path
from typing import Any, NamedTuple

import pytest
from helpers import load_file

ROOT = Path(__file__).resolve().parent.parent
MIB = 2**20

tables = load_file(ROOT / "benchmarks" / "tables.py", "quoted_tables")  # the generated tables' rounding


class Figure(NamedTuple):
    page: str  # relative to the repository
    text: str  # the page's sentence, each figure a {}
    source: str  # the JSON under docs/
    values: Callable[[dict], Any]  # the figure(s) from the JSON: one value or a tuple, one per {}
    formats: Any  # a format spec or a function of the value, or a tuple of them, one per {}


def for_accum(value: float) -> str:
    """A ratio where higher is better for accum-train, to 3 decimals, rounded down (benchmarks/tables.py)."""
    return tables.against(value, True)


def cost(value: float) -> str:
    """A ratio where lower is better, to 2 decimals, rounded up (benchmarks/subdivided.py's `_up`)."""
    return tables.against(value, False, "0.01")


def percent_up(part: int, whole: int) -> str:
    return f"{(Decimal(part) * 100 / Decimal(whole)).quantize(Decimal('1'), ROUND_CEILING)}%"


# --- docs/main-job.json: the main job's noise scale at each epoch's end
def noise(report: dict) -> list:
    return [epoch["noise_scale"] for epoch in report["epochs"]]


def under_the_batch(report: dict) -> tuple[float, float, int]:
    """The range of the noise scale over the leading epochs where it is under the batch, and their count."""
    batch, values = report["summary"]["batch_size"], noise(report)
    count = next((i for i, value in enumerate(values) if value is None or value >= batch), len(values))
    return min(values[:count]), max(values[:count]), count


def the_next_six(report: dict) -> tuple[float, float]:
    *_, count = under_the_batch(report)
    part = noise(report)[count : count + 6]
    return min(part), max(part)  # a null among them raises: the page's range would not hold


# --- docs/large-batch.json
def row(report: dict, name: str) -> dict:
    return next(r for r in report["rows"] if r["row"] == name)


def accuracy(name: str) -> Callable[[dict], float]:
    return lambda report: row(report, name)["test_accuracy"]


def grown_for_the_last_epoch(report: dict) -> int | None:
    """The batch the noise-scale rule (with the reference's cosine) grew to, if that was for the last epoch only."""
    schedule = row(report, "noise-scale-cosine")["batch_schedule"]
    return schedule[-1]["batch_size"] if len(schedule) == 2 and schedule[-1]["epoch"] == report["epochs"] else None


def never_grew(report: dict) -> float:
    """The noise-scale rule's test accuracy at a constant rate, with or without the sqrt rule: the same, neither
    batch grown (NaN otherwise, which no page says)."""
    plain, sqrt = row(report, "noise-scale"), row(report, "noise-scale-sqrt")
    same = plain["test_accuracy"] == sqrt["test_accuracy"] and plain["batch_schedule"] is sqrt["batch_schedule"] is None
    return plain["test_accuracy"] if same else math.nan


# --- docs/memory-batch.json
def peaks(report: dict) -> list[int]:
    return [r["peak_memory_bytes"] for r in report["rows"]]


def flat_ends(report: dict) -> str:
    """The allocator peak at the smallest and at the largest batch, in MiB, where both read the same."""
    first, last = (f"{p / MIB:.0f}" for p in (peaks(report)[0], peaks(report)[-1]))
    return first if first == last else f"{first} and {last}"


# --- docs/subdivided-precision.json
def bench_row(report: dict, precision: str, k: int) -> dict:
    rows = report["variants"]["precision"]["rows"]
    return next(r for r in rows if r["precision"] == precision and r["subdivisions"] == k)


def bfloat16_over_float32(key: Callable[[dict], float], k: int) -> Callable[[dict], float]:
    return lambda report: key(bench_row(report, "mixed_bfloat16", k)) / key(bench_row(report, "float32", k))


def median_time(r: dict) -> float:
    return r["time_ratio"]["median"]


def peak(r: dict) -> int:
    return r["peak_memory_bytes"]


# --- docs/profile.json
def profiled(report: dict, variant: str) -> dict:
    return report["variants"][variant]


def kernel_increase(kind: str) -> Callable[[dict], float]:
    """What k=8 one micro-step at a time adds to k=1's kernel time of a kind, ms per update."""
    return lambda r: profiled(r, "k=8, 1 at once")["op_ms"][kind] - profiled(r, "k=1")["op_ms"][kind]


def outside_kernels(variant: dict) -> float:
    return variant["cpu_ms"] - sum(variant["op_ms"].values())  # as benchmarks/tables.py's profile table


def one_at_a_time_bookkeeping(report: dict) -> int:
    """The least whole ms over the loop, the cache adds and BatchNorm pooling, one micro-step at a time."""
    ops = profiled(report, "k=8, 1 at once")["op_ms"]
    return math.floor(ops["accumulation"] + ops["loop, slicing"]) + 1


# --- docs/distributed.json
def carried(report: dict) -> int:
    """What (a)'s one gradient all-reduce carries besides the gradients, in floats."""
    sizes = [size for kind, _, size in report["methods"]["(a) accumulate-then-reduce"]["collectives"]]
    return max(sizes) - report["gradient_elements"]


def saved_all_reduces(report: dict) -> int:
    methods = report["methods"]
    return (
        methods["(n) reduce per micro-batch"]["gradient_all_reduces"]
        - methods["(a) accumulate-then-reduce"]["gradient_all_reduces"]
    )


A1_KERAS = "a1/b examples per {} (one micro-step at a time)"


def side(value: float, than: float) -> str:
    """ "more" when ``value`` is above ``than``, else "less": a page's word for which way a comparison went is
    checked as its figures are."""
    return "more" if value > than else "less"


def near(value: float, than: float) -> str:
    """ "about" within 5% of ``than``, else "more than" or "less than": the page's word for a ratio near 1."""
    if abs(value / than - 1) <= 0.05:
        return "about"
    return "more than" if value > than else "less than"


def quote(name: str, page: str, text: str, source: str, values, formats):
    """A row of FIGURES, named for the test's id."""
    return pytest.param(Figure(page, text, source, values, formats), id=name)


FIGURES = [
    quote(
        "README: the main job's noise scale",
        "README.md",
        "On the main job (`make main`, batch {}) it stays between {} and {} examples for the first {} of 30 "
        "epochs, then rises to {}-{} over the next six as the cosine lowers the rate",
        "main-job.json",
        lambda r: (r["summary"]["batch_size"], *under_the_batch(r), *the_next_six(r)),
        ("d", ".0f", ".0f", "d", ".0f", ".0f"),
    ),
    quote(
        "noise-scale: the main job's noise scale under the batch",
        "docs/noise-scale.md",
        "It stays between {} and {}, under the batch of {}, for the first {} epochs",
        "main-job.json",
        lambda r: (*under_the_batch(r)[:2], r["summary"]["batch_size"], under_the_batch(r)[2]),
        (".0f", ".0f", "d", "d"),
    ),
    quote(
        "noise-scale: the main job's null estimates",
        "docs/noise-scale.md",
        "the ratio grows without bound and {} reads null",
        "main-job.json",
        lambda r: noise(r).count(None),
        {1: "once", 2: "twice"}.get,
    ),
    quote(
        "large-batch: batch 16000 against 500",
        "docs/large-batch.md",
        "batch 16000 at Adam's 3e-3 reaches {} test accuracy where the reference, batch 500, reaches {}",
        "large-batch.json",
        lambda r: (accuracy("16000-a")(r), accuracy("reference")(r)),
        ".4f",
    ),
    quote(
        "large-batch: LAMB and LARS at batch 4000",
        "docs/large-batch.md",
        "the best recipe at batch 4000 ({}, against {} for Adam with the linear rule and a 3-epoch warm-up), and "
        "still {} short; LARS peaks at 8-16 ({}). Both have {} updates where the reference has {}.",
        "large-batch.json",
        lambda r: (
            r["best"]["4000"]["test_accuracy"],
            accuracy("4000-linear-3")(r),
            r["best"]["4000"]["gap_to_reference"],
            max(x["test_accuracy"] for x in r["rows"] if x["row"].startswith("4000-lars-")),
            row(r, r["best"]["4000"]["row"])["updates"],
            row(r, "reference")["updates"],
        ),
        (".4f", ".4f", ".4f", ".4f", "d", "d"),
    ),
    quote(
        "large-batch: batch 4000 for the reference's updates",
        "docs/large-batch.md",
        "batch 4000 comes within {} ({}) with the linear rule",
        "large-batch.json",
        lambda r: (accuracy("reference")(r) - accuracy("4000-long")(r), accuracy("4000-long")(r)),
        ".4f",
    ),
    quote(
        "large-batch: the noise-scale rule",
        "docs/large-batch.md",
        "grew it to {} for the last epoch with the reference's cosine: within {} of the reference's test "
        "accuracy with {} of its updates. With a constant rate (as the growing rows of (e)) it never grew at "
        "all ({}, identical with and without the sqrt rule",
        "large-batch.json",
        lambda r: (
            grown_for_the_last_epoch(r),
            r["best"]["noise-scale"]["gap_to_reference"],
            percent_up(r["best"]["noise-scale"]["updates"], r["best"]["noise-scale"]["reference_updates"]),
            never_grew(r),
        ),
        ("d", ".4f", "s", ".4f"),
    ),
    quote(
        "memory: the peak against the batch",
        "docs/memory.md",
        "At micro-batches of 500, the main net's allocator peak does not grow with the batch: {} MiB at batch {} "
        "and at batch {}, the whole training set, and at most {}x that in between",
        "memory-batch.json",
        lambda r: (
            flat_ends(r),
            r["rows"][0]["batch_size"],
            r["rows"][-1]["batch_size"],
            max(peaks(r)[1:-1]) / peaks(r)[0],
        ),
        ("s", "d", "d", cost),
    ),
    quote(
        "memory: the four peaks",
        "docs/memory.md",
        "The four peaks lie within {}x of each other ({} to {} bytes in docs/memory-batch.json)",
        "memory-batch.json",
        lambda r: (max(peaks(r)) / min(peaks(r)), min(peaks(r)), max(peaks(r))),
        (cost, "d", "d"),
    ),
    quote(
        "results/fit: the tagger's valid tokens per micro-batch",
        "docs/results/fit.md",
        "SGD 0.5 on batches whose micro-batches hold {} down to {} valid tokens",
        "peers-masked.json",
        lambda r: (max(r["distance"]["tokens_per_micro_batch"]), min(r["distance"]["tokens_per_micro_batch"])),
        "d",
    ),
    quote(
        "fit: the tagger against Keras",
        "docs/fit.md",
        "with `trim_padding=True` trains {}x the examples per CPU-second of Keras' own accumulation at its best and "
        "{}x per wall-second",
        "peers-masked.json",
        lambda r: (r["ratios"]["cpu"], r["ratios"]["wall"]),
        for_accum,
    ),
    quote(
        "README: fit on JAX against Keras' accumulation on JAX",
        "README.md",
        "trains a GPT-2 causal LM at {}x the examples per CPU-second ({}x with `trim_padding`), and the seed net's "
        "Keras twin at {}x per CPU-second and {}x per wall-second",
        "peers-jax.json",
        lambda r: tuple(
            next(
                x["ratio"]["median"]
                for x in r["results"]
                if (x["part"], x["ours"][:3], x["theirs"][:3], x["measure"]) == key
            )
            for key in (
                ("lm", "(a)", "(b)", "cpu"),
                ("lm", "(c)", "(b)", "cpu"),
                ("seed", "(a)", "(b)", "cpu"),
                ("seed", "(a)", "(b)", "wall"),
            )
        ),
        for_accum,
    ),
    quote(
        "fit: the tagger against Keras, without trim_padding",
        "docs/fit.md",
        "Without `trim_padding`: {}x per CPU-second and {}x per wall-second.",
        "peers-masked.json",
        lambda r: (r["untrimmed"]["ratios"]["cpu"], r["untrimmed"]["ratios"]["wall"]),
        for_accum,
    ),
    quote(
        "performance: subdivided against one pass",
        "docs/performance.md",
        "There k=8 with two micro-steps in flight costs {} what one pass costs: {}x its wall time and {}x its CPU "
        "time per example (medians over the rounds, each round's ratio from {}x to {}x), for {}x of the allocator "
        "peak. One micro-step at a time costs {}x the wall time, for {}x of the peak.",
        "subdivided.json",
        lambda r: (
            near(r["variants"]["auto"]["rows"][1]["time_ratio"]["median"], 1.0),
            r["variants"]["auto"]["rows"][1]["time_ratio"]["median"],
            r["variants"]["auto"]["rows"][1]["cpu_ratio"]["median"],
            r["variants"]["auto"]["rows"][1]["time_ratio"]["min"],
            r["variants"]["auto"]["rows"][1]["time_ratio"]["max"],
            r["variants"]["auto"]["rows"][1]["memory_ratio"],
            r["variants"]["one at a time"]["rows"][1]["time_ratio"]["median"],
            r["variants"]["one at a time"]["rows"][1]["memory_ratio"],
        ),
        ("s", cost, cost, cost, cost, cost, cost, cost),
    ),
    quote(
        "performance: one at a time against Keras, seed convnet",
        "docs/performance.md",
        "One at a time, accum-train runs at {}x Keras' best examples per wall-second and {}x its best per CPU-second",
        "peers.json",
        lambda r: tuple(
            r["ratios_a_b_per_keras_variant"][A1_KERAS.format(unit)] for unit in ("wall-second", "CPU-second")
        ),
        for_accum,
    ),
    quote(
        "performance: one at a time against Keras, keras_file",
        "docs/performance.md",
        "one micro-step at a time it runs at {}x Keras' best examples per CPU-second and {}x per wall-second",
        "peers-keras-file.json",
        lambda r: tuple(
            r["ratios_a_b_per_keras_variant"][A1_KERAS.format(unit)] for unit in ("CPU-second", "wall-second")
        ),
        for_accum,
    ),
    quote(
        "performance: the loop's own cost",
        "docs/performance.md",
        "cost almost nothing** (under {} ms of {} one at a time)",
        "profile.json",
        lambda r: (one_at_a_time_bookkeeping(r), profiled(r, "k=8, 1 at once")["wall_ms"]),
        ("d", ".0f"),
    ),
    quote(
        "performance: what k=8 adds, by kernel",
        "docs/performance.md",
        "micro-step's own ops run at 32 examples: convolutions +{} ms, batch norm +{}, small ops +{},",
        "profile.json",
        lambda r: tuple(kernel_increase(kind)(r) for kind in ("convolutions", "batch norm", "other in loop")),
        ".1f",
    ),
    quote(
        "performance: what k=8 adds outside kernels",
        "docs/performance.md",
        "(CPU not in a kernel +{})",
        "profile.json",
        lambda r: outside_kernels(profiled(r, "k=8, 1 at once")) - outside_kernels(profiled(r, "k=1")),
        ".1f",
    ),
    quote(
        "performance: two micro-steps in flight",
        "docs/performance.md",
        "bring k=8 {} here ({} against {} ms), and its CPU {} ({} against {} ms)",
        "profile.json",
        lambda r: (
            {"less": "to k=1's wall time or below", "more": "above k=1's wall time"}[
                side(profiled(r, "k=8, 2 at once")["wall_ms"], profiled(r, "k=1")["wall_ms"])
            ],
            *(profiled(r, v)["wall_ms"] for v in ("k=8, 2 at once", "k=1")),
            {"less": "to k=1's or below", "more": "above k=1's"}[
                side(profiled(r, "k=8, 2 at once")["cpu_ms"], profiled(r, "k=1")["cpu_ms"])
            ],
            *(profiled(r, v)["cpu_ms"] for v in ("k=8, 2 at once", "k=1")),
        ),
        ("s", ".1f", ".1f", "s", ".1f", ".1f"),
    ),
    quote(
        "mixed-precision: bfloat16 against float32",
        "docs/mixed-precision.md",
        "At the same k, bfloat16 takes about {}x (k=1) and {}x (k=8) of float32's time (the ratios of the "
        "medians above), and {}x and {}x of its allocator peak",
        "subdivided-precision.json",
        lambda r: tuple(bfloat16_over_float32(key, k)(r) for key in (median_time, peak) for k in (1, 8)),
        cost,
    ),
    quote(
        "distributed: the all-reduces saved",
        "docs/distributed.md",
        "what it saves is k-1 = {} gradient all-reduces per update ({} floats each here), which is what costs "
        "across machines. (a)'s one all-reduce carries {} floats besides the gradients",
        "distributed.json",
        lambda r: (saved_all_reduces(r), r["gradient_elements"], carried(r)),
        ("d", ",", "d"),
    ),
]


# --- which way a comparison goes: where docs/performance.md or its results page says in words that A is faster,
# slower, more or less than B, the JSON the figures come from must put A on that side of B
class Direction(NamedTuple):
    page: str  # relative to the repository
    words: str  # the page's words that say which way the comparison goes
    source: str  # the JSON under docs/
    value: Callable[[dict], float]  # A's figure over B's, or A's figure
    claim: str  # "more" or "less": the side of ``than`` the words put it on
    than: float  # what the words compare it with: 1 for A against B, or a target such as 1.5


A_DEFAULT = "(a) accum-train"


def per_example(report: dict, method: str, unit: str) -> float:
    """A peer benchmark's median seconds per example for a method (``unit``: "cpu" or "wall")."""
    return report["time"][method][f"{unit}_s_per_example"]


def in_flight_over_one_at_a_time(unit: str) -> Callable[[dict], float]:
    """(a)'s time per example over that of one micro-step at a time at its best, (a1) or (a1')."""
    return lambda r: per_example(r, A_DEFAULT, unit) / per_example(r, r["a1_best"][unit], unit)


def one_at_a_time(report: dict) -> dict:
    """benchmarks/subdivided.py's k=8 row with one micro-step at a time."""
    return report["variants"]["one at a time"]["rows"][1]


def direction(name: str, page: str, words: str, source: str, value, claim: str, than: float):
    """A row of DIRECTIONS, named for the test's id."""
    return pytest.param(Direction(page, words, source, value, claim, than), id=name)


LEAD = "Part of the lead over Keras is the two micro-steps in flight."
DIRECTIONS = [
    direction(
        "performance: ahead of Keras by CPU",
        "docs/performance.md",
        LEAD,
        "peers.json",
        lambda r: r["ratios"]["a/b examples per CPU-second"],
        "more",
        1.0,
    ),
    direction(
        "performance: ahead of Keras by wall time",
        "docs/performance.md",
        LEAD,
        "peers.json",
        lambda r: r["ratios"]["a/b examples per wall-second"],
        "more",
        1.0,
    ),
    direction(
        "performance: two in flight take less CPU than one at a time",
        "docs/performance.md",
        LEAD,
        "peers.json",
        in_flight_over_one_at_a_time("cpu"),
        "less",
        1.0,
    ),
    direction(
        "performance: two in flight take less wall time than one at a time",
        "docs/performance.md",
        LEAD,
        "peers.json",
        in_flight_over_one_at_a_time("wall"),
        "less",
        1.0,
    ),
    direction(
        "performance: one at a time costs more wall time than one pass",
        "docs/performance.md",
        "One micro-step at a time costs",
        "subdivided.json",
        lambda r: one_at_a_time(r)["time_ratio"]["median"],
        "more",
        1.0,
    ),
    direction(
        "performance: one at a time for a smaller peak than one pass",
        "docs/performance.md",
        "One micro-step at a time costs",
        "subdivided.json",
        lambda r: one_at_a_time(r)["memory_ratio"],
        "less",
        1.0,
    ),
]

GENERATED = re.compile(r"<!-- table from .*?<!-- end of table -->", re.S)
CODE = re.compile(r"^```.*?^```", re.S | re.M)


def prose(text: str) -> str:
    """A page's text without its generated tables and code blocks, every run of whitespace one space."""
    return " ".join(CODE.sub(" ", GENERATED.sub(" ", text)).split())


def load(source: str) -> dict:
    return json.loads((ROOT / "docs" / source).read_text())


def quoted(figure: Figure, report: dict) -> str:
    """The figure's sentence as its JSON says it, whitespace collapsed."""
    values = figure.values(report)
    values = values if isinstance(values, tuple) else (values,)
    formats = figure.formats if isinstance(figure.formats, tuple) else (figure.formats,) * len(values)
    assert len(formats) == len(values) == figure.text.count("{}"), "one value and one format per {}"
    shown = [fmt(value) if callable(fmt) else format(value, fmt) for value, fmt in zip(values, formats, strict=True)]
    return " ".join(figure.text.format(*shown).split())


def says(figure: Figure, page_text: str, report: dict) -> bool:
    return quoted(figure, report) in prose(page_text)


@pytest.mark.parametrize("figure", FIGURES)
def test_a_figure_the_guide_quotes_is_its_json_s(figure):
    expected = quoted(figure, load(figure.source))
    page = prose((ROOT / figure.page).read_text())
    if expected not in page:  # say what the page has where the sentence starts, to find the figure that differs
        where = page.find(" ".join(figure.text.split("{}", 1)[0].split())[:40])
        found = page[where : where + len(expected) + 20] if where >= 0 else "(the sentence's start is not there)"
        pytest.fail(f"{figure.page} should say, from docs/{figure.source}:\n  {expected}\nit says:\n  {found}")


def test_a_page_or_a_json_that_differs_is_caught():
    """The check fails when the page's figure is not the JSON's (the README's stale 120-480 of an earlier
    wording), and when the JSON changes under the page."""
    (figure,) = [p.values[0] for p in FIGURES if p.id == "README: the main job's noise scale"]
    page, report = (ROOT / figure.page).read_text(), load(figure.source)
    assert says(figure, page, report)  # the premise: the row holds as the repository stands
    stale = page.replace("between 125 and 448 examples", "between 120 and 480 examples")
    assert stale != page and not says(figure, stale, report)
    changed = copy.deepcopy(report)
    changed["epochs"][0]["noise_scale"] = 99.6  # an epoch below the quoted range: the range reads 100-448
    assert not says(figure, page, changed)
    assert "between 100 and 448 examples" in quoted(figure, changed)
    changed = copy.deepcopy(report)
    changed["epochs"][17]["noise_scale"] = 600.0  # epoch 18 over the batch: the first 17, not 18
    assert not says(figure, page, changed)


def test_rounding_is_never_in_accum_train_s_favour():
    """A ratio of accum-train to a peer rounds down, a cost rounds up, and a percentage of updates rounds up."""
    assert for_accum(1.2192032208050767) == "1.219" and for_accum(0.9896927517147245) == "0.989"
    assert cost(0.7706116460420679) == "0.78" and cost(0.8342535339381799) == "0.84"
    assert percent_up(1034, 1100) == "94%" and percent_up(1035, 1100) == "95%"


RATIO = re.compile(r"\b\d+\.\d+x\b")
# ratios a page states as a bound a test asserts: a guarantee, not a measured figure
BOUNDS = {"docs/memory.md": ["peak within 1.15x of each other (slow suite)"]}  # tests/test_feed.py


def test_every_ratio_in_the_guide_s_prose_is_checked():
    """A ratio (1.175x) in the prose of README.md or docs/*.md lies inside a sentence of FIGURES: a new one must
    be registered above or go (the generated tables under docs/results/ hold the rest)."""
    rows = [p.values[0] for p in FIGURES]
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    unchecked = []
    for path in pages:
        text = prose(path.read_text())
        name = str(path.relative_to(ROOT))
        covered = []
        for figure in (f for f in rows if f.page == name):
            expected = quoted(figure, load(figure.source))
            start = text.find(expected)
            covered += [(start, start + len(expected))] if start >= 0 else []
        for bound in BOUNDS.get(name, []):
            covered += [(m.start(), m.end()) for m in re.finditer(re.escape(bound), text)]
        for match in RATIO.finditer(text):
            if not any(a <= match.start() and match.end() <= b for a, b in covered):
                unchecked.append(f"{name}: ...{text[max(0, match.start() - 60) : match.end() + 10]}...")
    assert unchecked == []


def test_every_row_names_a_guide_page_and_a_json_of_docs():
    pages = {"README.md", *(str(p.relative_to(ROOT)) for p in (ROOT / "docs").rglob("*.md"))}
    for param in FIGURES:
        figure = param.values[0]
        assert figure.page in pages - {"docs/configuration.md", "docs/api.md"}, figure.page
        assert (ROOT / "docs" / figure.source).is_file(), figure.source


def goes_the_way_it_says(row: Direction, page_text: str, report: dict) -> bool:
    return " ".join(row.words.split()) in prose(page_text) and side(row.value(report), row.than) == row.claim


@pytest.mark.parametrize("row", DIRECTIONS)
def test_a_comparison_goes_the_way_its_json_says(row):
    """The page still says it (in prose), and the JSON puts A on the side of B that the words say."""
    report = load(row.source)
    assert " ".join(row.words.split()) in prose((ROOT / row.page).read_text()), f"{row.page} no longer says it"
    value = row.value(report)
    assert side(value, row.than) == row.claim, (
        f"{row.page}: '{row.words}' says {row.claim} than {row.than}; docs/{row.source} gives {value:.4f}"
    )


def test_a_comparison_whose_json_turned_is_caught():
    """The check fails when the JSON puts A on the other side (accum-train behind Keras' fastest by CPU, where the
    page calls it a lead), and when the words change."""
    wanted = "performance: ahead of Keras by CPU"
    (row,) = [p.values[0] for p in DIRECTIONS if p.id == wanted]
    page, report = (ROOT / row.page).read_text(), load(row.source)
    assert goes_the_way_it_says(row, page, report)  # the premise: it holds as the repository stands
    turned = copy.deepcopy(report)
    turned["ratios"]["a/b examples per CPU-second"] = 0.97  # behind Keras' fastest by CPU: no lead
    assert not goes_the_way_it_says(row, page, turned)
    assert not goes_the_way_it_says(row, page.replace("the lead over Keras", "the gap to Keras"), report)


def test_every_direction_row_names_a_page_and_a_json_of_docs():
    for param in DIRECTIONS:
        row = param.values[0]
        assert (ROOT / row.page).is_file(), row.page
        assert (ROOT / "docs" / row.source).is_file(), row.source
        assert row.claim in ("more", "less")
