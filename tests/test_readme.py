"""The README and docs/ say what the tool does: their blocks of command output are what the commands print
(scripts/readme_outputs.py writes them), every command of their sh blocks parses (and, in the slow suite, runs at
smoke size), their Python examples run as written, their tables say what their JSON says, their links resolve.

The slow suite runs the own-data example exactly as its page gives it (with the page's other commands), and
compares predict's output with the page's block.
"""

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest
from accum_train.cli.main import main
from click.testing import CliRunner
from helpers import load_file

DEBIAN = "/usr/share/datasets/fashion-mnist"


@pytest.fixture(scope="module")
def readme(repo_root):
    module = load_file(repo_root / "scripts" / "readme_outputs.py", "readme_outputs")
    return module, module.all_text()


def test_every_output_block_names_a_command_of_the_tool(readme):
    module, text = readme
    found = module.blocks(text)
    assert [(b.command.split()[:2], b.after_example) for b in found] == [
        (["accum-train", "predict"], True),
        (["accum-train", "plan"], False),
    ]
    assert text.count("<!-- output ") == len(found)  # no marker the pattern misses


def test_the_plan_block_is_what_plan_prints(readme, data_dir, monkeypatch):
    module, text = readme
    (block,) = [b for b in module.blocks(text) if not b.after_example]
    monkeypatch.setenv("ACCUM_TRAIN_DATA", str(data_dir))
    printed = module.run(block.command, module.ROOT).replace(str(data_dir), DEBIAN)
    assert printed == block.body, "README is stale: python scripts/readme_outputs.py rewrites it"


TABLE = """\
input  prediction  probability  top 3
a.png  Bag              0.9968  Bag 0.9968, Shirt 0.0032, Sandal 0.0000
"""


@pytest.mark.parametrize(
    "printed, same",
    [
        (TABLE, True),
        (TABLE.replace("0.9968", "0.9880").replace("Shirt 0.0032, Sandal", "Shirt 0.0118, Coat"), True),  # rounding
        (TABLE.replace("0.9968", "0.9700"), False),
        (TABLE.replace("Shirt 0.0032", "Shirt 0.0300"), False),
        (TABLE.replace("Sandal 0.0000", "Coat 0.0250"), False),  # a class with 0.025 that the README lacks
        (TABLE.replace("Bag ", "Coat "), False),
        (TABLE + "b.png  Bag  1.0000  Bag 1.0000\n", False),
    ],
)
def test_a_block_that_differs_is_caught(readme, printed, same):
    module, _ = readme
    assert module.same(TABLE, printed, after_example=True) is same
    assert module.same("updates 120\n", "updates 121\n", after_example=False) is False


def python_block(repo_root, name: str) -> str:
    text = "\n".join(page.read_text() for page in [repo_root / "README.md", *sorted((repo_root / "docs").glob("*.md"))])
    return text.split(f"<!-- python example: {name} -->\n```python\n", 1)[1].split("```", 1)[0]


def run_python(script, cwd, data_dir=None):
    env = {**os.environ, **({"ACCUM_TRAIN_DATA": str(data_dir)} if data_dir else {})}
    done = subprocess.run([sys.executable, "-c", script], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def one_line_example(repo_root):
    """The "From Python" block, its accum_train.fit line, and that line's model.fit twin right above it."""
    lines = python_block(repo_root, "one line").splitlines()
    (ours,) = [i for i, line in enumerate(lines) if "accum_train.fit(" in line]
    return lines, ours


def test_the_one_line_to_change_is_model_fit_with_the_same_arguments(repo_root):
    lines, ours = one_line_example(repo_root)
    keras_line = lines[ours - 1]
    assert keras_line == "# history = model.fit(x, y, batch_size=1000, epochs=3, validation_split=0.2)"
    ours_line = lines[ours].replace("accum_train.fit(model, ", "model.fit(").replace(" micro_batch_size=100,", "")
    assert ours_line == keras_line.removeprefix("# ")


@pytest.mark.slow  # four fresh processes, each starting TensorFlow
def test_a_keras_script_moves_over_by_changing_one_line(repo_root, tmp_path):
    """The "From Python" block runs as written, and so does its model.fit twin; in one data order (no
    shuffling) from one initialisation, the two print the same validation figures."""
    lines, ours = one_line_example(repo_root)

    def val_mae(script_lines):
        (printed,) = [line for line in run_python("\n".join(script_lines), tmp_path) if line.startswith("val_mae:")]
        return json.loads(printed.removeprefix("val_mae: "))

    keras_version = [*lines[: ours - 1], lines[ours - 1].removeprefix("# "), *lines[ours + 1 :]]
    assert len(val_mae(lines)) == 3
    assert len(val_mae(keras_version)) == 3

    def one_order(script_lines, fit_line):  # the weights drawn from one seed, the batches read in order
        head = ["import keras", "keras.utils.set_random_seed(0)"]
        return head + [line[:-1] + ", shuffle=False)" if i == fit_line else line for i, line in enumerate(script_lines)]

    ours_figures, keras_figures = val_mae(one_order(lines, ours)), val_mae(one_order(keras_version, ours - 1))
    np.testing.assert_allclose(ours_figures, keras_figures, atol=2e-4)  # printed to 4 decimals


@pytest.mark.slow  # an LSTM over 512 sequences, twice
def test_the_token_example_runs_as_written_and_a_second_run_resumes(repo_root, tmp_path):
    block = python_block(repo_root, "tokens")
    (printed,) = [line for line in run_python(block, tmp_path) if line.startswith("loss:")]
    first = json.loads(printed.removeprefix("loss: "))
    assert len(first) == 2
    run_dir = tmp_path / "runs" / "tagger"
    assert json.loads((run_dir / "summary.json").read_text())["steps"] == 8  # 512 sequences, 128 per update
    # again: the run directory is continued (it has both epochs: nothing to train) and its history returned
    (printed,) = [line for line in run_python(block, tmp_path) if line.startswith("loss:")]
    assert json.loads(printed.removeprefix("loss: ")) == first
    assert json.loads((run_dir / "summary.json").read_text())["steps"] == 8


@pytest.mark.slow  # an LSTM over 512 sequences, twice
def test_the_trim_padding_example_runs_as_written_to_the_losses_of_the_same_call_without_it(repo_root, tmp_path):
    block = python_block(repo_root, "trim")
    uncut = block.replace(", trim_padding=True", "")
    assert uncut != block

    def losses(script):
        (printed,) = [line for line in run_python(script, tmp_path) if line.startswith("loss: ")]
        return json.loads(printed.removeprefix("loss: "))

    trimmed = losses(block)
    assert len(trimmed) == 2 and trimmed[1] < trimmed[0]
    np.testing.assert_allclose(trimmed, losses(uncut), rtol=1e-5)  # the same updates, without most padding


@pytest.mark.slow
def test_the_run_example_runs_as_written(repo_root, data_dir, tmp_path):
    """accum_train.run from an empty folder (its config path made absolute): run's directory is where the
    example says."""
    block = python_block(repo_root, "run")
    script = block.replace('"configs/smoke.yaml"', repr(str(repo_root / "configs" / "smoke.yaml")))
    assert script != block
    (run_line,) = [line for line in run_python(script, tmp_path, data_dir) if line.startswith("run: ")]
    accuracy, steps = run_line.removeprefix("run: ").split()
    assert float(accuracy) > 0.5 and int(steps) == 94
    assert json.loads((tmp_path / "runs" / "from-python" / "summary.json").read_text())["steps"] == 94


def pages(repo_root):
    return [repo_root / "README.md", *sorted((repo_root / "docs").rglob("*.md")), repo_root / "CHANGELOG.md"]


def install_section(repo_root):
    """(the pip lines of the README's install block, the text under its heading)."""
    import re

    section = repo_root.joinpath("README.md").read_text().split("## Install\n", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```sh\n(.*?)```", section, re.S).group(1)
    return [line.split(" #", 1)[0].strip() for line in block.splitlines() if line.strip()], section


def test_the_install_section_names_the_extras_and_versions_setup_cfg_declares(repo_root):
    import configparser
    import re

    setup = configparser.ConfigParser()
    setup.read(repo_root / "setup.cfg")
    extras = dict(setup["options.extras_require"].items())
    lines, section = install_section(repo_root)
    # the develop line is followed by KerasHub's own (its wheels ask for the full TensorFlow: installed without deps)
    *extras_lines, kerashub = lines
    extras_given = [re.fullmatch(r'pip install (?:-e )?"\.(?:\[([a-z,]+)\])?"', line) for line in extras_lines]
    assert [match and match.group(1) for match in extras_given] == [None, "cpu", "gpu", "cpu,hub,test"]
    assert {"cpu", "gpu", "hub", "test"} <= set(extras)
    # the develop line is the one make's set-up (and so CI) installs with, and KerasHub's the versions it adds
    makefile = repo_root.joinpath("Makefile").read_text()
    assert '$(UV) -e ".[cpu,hub,test]"' in makefile
    hub = re.search(r"^HUB +:= (.*)$", makefile, re.M).group(1)
    assert f'pip install ".[cpu,hub]" && pip install --no-deps {hub}`' in " ".join(section.split())
    assert kerashub == f"pip install --no-deps {hub}"
    low, high = re.search(r"TensorFlow (\d+\.\d+) to (\d+\.\d+)", section).groups()
    major, last = high.split(".")
    for extra in ("cpu", "gpu"):
        assert f">={low},<{major}.{int(last) + 1}" in extras[extra]
    keras = re.search(r"Keras (\d+\.\d+)", section).group(1)
    assert f"keras>={keras},<3.{int(keras.split('.')[1]) + 1}" in setup["options"]["install_requires"]
    python = re.search(r"Python (\d+\.\d+) or later", section).group(1)
    assert setup["options"]["python_requires"] == f">={python}"
    tensorlayer = re.search(r"TensorLayer (\d+\.\d+\.\d+)", section).group(1)
    assert f"tensorlayer=={tensorlayer}" in setup["options"]["install_requires"]
    # "Tested:" names what this suite runs under (CI runs it in a fresh venv)
    import keras
    import tensorflow as tf

    tested = re.search(r"Tested: Python (\S+), TensorFlow (\S+) \(`tensorflow-cpu` (\S+)\), Keras ([\d.]+)", section)
    assert tested.groups() == (
        "{}.{}".format(*sys.version_info[:2]),
        ".".join(tf.__version__.split(".")[:2]),
        tf.__version__,
        keras.__version__,
    )


def test_the_package_s_version_is_the_newest_release_in_the_changelog(repo_root):
    import configparser
    import datetime
    import re

    import accum_train

    setup = configparser.ConfigParser()
    setup.read(repo_root / "setup.cfg")
    releases = re.findall(
        r"^## \[(\d+)\.(\d+)\.(\d+)\] - (\d{4}-\d{2}-\d{2})$", (repo_root / "CHANGELOG.md").read_text(), re.M
    )
    versions = [tuple(int(part) for part in release[:3]) for release in releases]
    assert len(versions) >= 2 and versions == sorted(versions, reverse=True)  # newest first, each once
    dates = [datetime.date.fromisoformat(release[3]) for release in releases]
    assert dates == sorted(dates, reverse=True)
    newest = ".".join(releases[0][:3])
    assert accum_train.__version__ == setup["metadata"]["version"] == newest
    assert (
        CliRunner().invoke(main, ["--version"], prog_name="accum-train").output == f"accum-train, version {newest}\n"
    )  # as installed


CHANGELOG_SECTIONS = ("Added", "Changed", "Fixed", "Removed")


def changelog_faults(text: str) -> list:
    """What keeps CHANGELOG.md from being a list of changes a user can act on: over 2,500 words, a commit hash (7
    to 40 hex digits with a letter and a digit), an issue reference, or a release with a section other than
    Added, Changed, Fixed and Removed (each at most once)."""
    import re

    faults = [f"{len(text.split())} words (at most 2500)"] if len(text.split()) > 2500 else []
    for number, line in enumerate(text.splitlines(), 1):
        hashes = [w for w in re.findall(r"\b[0-9a-f]{7,40}\b", line) if re.search("[a-f]", w) and re.search("[0-9]", w)]
        faults += [f"line {number}: commit {w}" for w in hashes]
        faults += [f"line {number}: {m}" for m in re.findall(r"\b[Ii]ssues?\s*#?\d+|#\d+", line)]
    releases = re.split(r"^## ", text, flags=re.M)[1:]
    for release in releases:
        heading, _, body = release.partition("\n")
        sections = re.findall(r"^### (.*)$", body, re.M)
        if any(s not in CHANGELOG_SECTIONS for s in sections) or len(set(sections)) != len(sections):
            faults.append(f"{heading}: sections {sections}")
        if not sections or re.search(r"^#### ", body, re.M):
            faults.append(f"{heading}: no Added/Changed/Fixed/Removed section, or a deeper heading")
    return faults


def test_the_changelog_is_short_and_names_changes_not_commits_or_issues(repo_root):
    text = (repo_root / "CHANGELOG.md").read_text()
    assert len(re.findall(r"^## \[", text, re.M)) >= 3  # the premise: the releases were found
    assert changelog_faults(text) == []


@pytest.mark.parametrize(
    "change",
    [
        lambda t: t.replace("### Fixed\n", "### Fixed\n\n- Fixed at commit 3fa9c2e.\n", 1),
        lambda t: t.replace("### Fixed\n", "### Fixed\n\n- The crash of issue 56.\n", 1),
        lambda t: t.replace("### Fixed\n", "### Fixed\n\n- The crash of Issue #57.\n", 1),
        lambda t: t.replace("### Fixed\n", "### Fixed\n\n- The crash (#57).\n", 1),
        lambda t: t.replace("### Fixed\n", "### Measured\n", 1),
        lambda t: t.replace("### Fixed\n", "### Known issues\n\n- Slow.\n\n### Fixed\n", 1),
        lambda t: t + " word" * 2500,
    ],
    ids=["a commit", "an issue", "an Issue #", "a #number", "a Measured section", "Known issues", "too long"],
)
def test_a_changelog_that_breaks_a_rule_is_caught(repo_root, change):
    text = (repo_root / "CHANGELOG.md").read_text()
    changed = change(text)
    assert changed != text and changelog_faults(changed) != []


def documented_signature(page: str, name: str) -> str:
    """The `name(...)` a bullet of the page gives, whitespace collapsed."""
    found = re.search(rf"^- `{name}\((.*?)\)`", page, re.S | re.M)
    assert found, f"no signature of {name} on the page"
    return " ".join(found.group(1).split())


def signature_as_written(function) -> str:
    """A function's parameters as docs/python.md writes them: no annotations, string defaults in double quotes."""
    import inspect

    parts, starred = [], False
    for parameter in inspect.signature(function).parameters.values():
        if parameter.kind is parameter.KEYWORD_ONLY and not starred:
            parts.append("*")
            starred = True
        default = parameter.default
        shown = (
            "" if default is parameter.empty else "=" + (f'"{default}"' if isinstance(default, str) else repr(default))
        )
        parts.append(parameter.name + shown)
    return ", ".join(parts)


def test_the_python_page_gives_fit_s_and_run_s_signatures_as_they_are(repo_root):
    import accum_train

    page = (repo_root / "docs" / "python.md").read_text()
    for function in (accum_train.fit, accum_train.run):
        assert documented_signature(page, function.__name__) == signature_as_written(function)


def test_a_signature_that_lacks_a_parameter_is_caught(repo_root):
    import accum_train

    page = (repo_root / "docs" / "python.md").read_text()
    stale = page.replace("max_restarts=None)", ")", 1)  # the parameter gone, its comma left
    assert stale != page and documented_signature(stale, "run") != signature_as_written(accum_train.run)


def test_the_readme_is_short(repo_root):
    assert len((repo_root / "README.md").read_text().splitlines()) <= 200


def test_the_guide_pages_name_no_commit(repo_root):
    """The README and docs/*.md say what holds now: a commit goes with its measured table under docs/results/ (and
    what changed when, in CHANGELOG.md). A commit is a word of 7 to 40 hex digits with a letter and a digit."""
    import re

    named = []
    for page in [repo_root / "README.md", *sorted((repo_root / "docs").glob("*.md"))]:
        for number, line in enumerate(page.read_text().splitlines(), 1):
            words = re.findall(r"\b[0-9a-f]{7,40}\b", line)
            named += [f"{page.name}:{number}: {w}" for w in words if re.search("[a-f]", w) and re.search("[0-9]", w)]
    assert named == []


def test_every_relative_link_resolves(repo_root):
    """Markdown links to files of the repository (not URLs, not anchors) name files that exist."""
    import re

    broken = []
    for page in pages(repo_root):
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
            if target.startswith(("http://", "https://", "#", "mailto:")):
                continue
            path = (page.parent / target.split("#", 1)[0]).resolve()
            if not path.exists():
                broken.append(f"{page.relative_to(repo_root)}: {target}")
    assert broken == []


def test_the_configuration_page_is_the_schema_s(repo_root):
    """docs/configuration.md is what scripts/config_reference.py makes of the schema now."""
    done = subprocess.run(
        [sys.executable, str(repo_root / "scripts" / "config_reference.py"), "--check"], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_readme_s_config_is_a_valid_config(repo_root):
    import yaml
    from accum_train.config import as_config

    text = (repo_root / "README.md").read_text()
    block = text.split("```yaml\n", 1)[1].split("```", 1)[0]
    cfg = as_config(yaml.safe_load(block))
    assert (cfg.batch_size, cfg.micro_batch_size, cfg.subdivisions_for(cfg.batch_size)) == (4000, 500, 8)


def test_the_results_tables_are_their_json_s(repo_root):
    """Every table of the README and docs/ generated from a benchmark's JSON (scripts/results_tables.py) says what
    the JSON says."""
    done = subprocess.run(
        [sys.executable, str(repo_root / "scripts" / "results_tables.py"), "--check"], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr
    # every benchmark JSON of docs/ is the source of a generated table: none can go back to being typed by hand
    import re

    text = "\n".join(page.read_text() for page in (repo_root / "docs").rglob("*.md"))
    sources = set(re.findall(r"<!-- table from docs/(\S+\.json): [\w-]+ -->", text))
    expected = {
        "large-batch.json",
        "peers.json",
        "peers-keras-file.json",
        "peers-masked.json",
        "memory-batch.json",
        "image-folder.json",
        "compare-fmnist.json",
    }
    assert expected <= {path.name for path in (repo_root / "docs").glob("*.json")}  # the premise: they exist
    missing = (expected | {path.name for path in (repo_root / "docs").glob("*.json")}) - sources
    assert not missing, f"no generated table (<!-- table from docs/X.json: KIND -->) in docs/ for {sorted(missing)}"
    assert text.count("<!-- table from ") == text.count("<!-- end of table -->")  # no block left unclosed
    # the README's headline table, made from four of them
    readme = (repo_root / "README.md").read_text()
    sources = "docs/peers-masked.json,docs/peers.json,docs/memory-batch.json,docs/main-job.json"
    assert f"<!-- table from {sources}: headline -->" in readme


def test_every_documented_command_names_real_commands_and_options(repo_root):
    """Each `accum-train ...` line of a sh block in the README or docs/ parses: its command and options exist
    (click parses the whole line before --help answers; an unknown command or option is exit 2)."""
    import shlex

    found = [(name, command) for name, command in documented_commands(repo_root) if command.startswith("accum-train ")]
    assert len(found) >= 20  # the premise: the pages' commands were found
    wrong = []
    for name, command in found:
        words = [w for w in shlex.split(command)[1:] if w not in ("|", "&&")]
        result = CliRunner().invoke(main, [*words, "--help"])
        if result.exit_code != 0:
            wrong.append(f"{name}: {command}: {result.output.strip().splitlines()[-1:]}")
    assert wrong == []


# Every command of a sh block in the README and docs/, run in order per page in an empty folder, at smoke size:
# the data, the width, the epochs, the timed rounds cut down; every other word as the page gives it.
NOT_RUN = {
    "make main": "the main job itself (CI runs it)",
    "make test": "the suite this test is part of",
    ". .venv/bin/activate": "the environment this test runs in",
    # installing needs the package index; make's set-up runs the develop line, and the test of the install
    # section below checks that each line names extras setup.cfg has
    'pip install "."': "an install into the environment the suite runs in",
    'pip install ".[cpu]"': "an install from the package index",
    'pip install ".[gpu]"': "an install from the package index",
    'pip install -e ".[cpu,hub,test]"': "make's set-up, which the suite runs in",
}
FASHION_CONFIGS = ("configs/fmnist.yaml", "configs/smoke.yaml")
SMOKE_SETS = ["epochs=1"]
SMOKE_FASHION = ["data.train_limit=1000", "data.test_limit=200", "model.width=0.0625", "data.validation=0"]
SMOKE_WORDS = {  # option: the value it is run with
    "--rounds": "1",
    "--steps": "2",
    "--train": "640",
    "--test": "200",
    "--mem-batch": "256",
    "--mem-k": "2",
    "--updates": "2",
}
# option: how many of its comma-separated values are run. bench runs one fresh process per value: its first k
# here, so that the pages' three bench commands over k (1,8; 1,2,4,8,16; 1,8 --rounds 5) cut down to one run (see
# measured) of one process; test_bench.py runs bench over two k (1,4) and reads back every row. --micro-batch-size
# keeps both of its values: this is the only run of bench over a list of micro-batch sizes.
SMOKE_LISTS = {"--subdivisions": 1, "--micro-batch-size": 2}
SMOKE_ADDED = {  # a script's smoke options that the page leaves at their defaults
    "scripts/make_own_data.py": ["--train", "640", "--test", "200"],
    "benchmarks/peers.py": [
        "--rounds",
        "1",
        "--mem-batch",
        "256",
        "--mem-k",
        "2",
        "--k",
        "2",
        "--updates",
        "2",
        "--width",
        "0.0625",
    ],
    "benchmarks/profile.py": ["--updates", "2"],
    "benchmarks/subdivided.py": ["--rounds", "1", "--steps", "2"],
}


def documented_commands(repo_root):
    """(page, command) for each line of each ```sh block, in page order."""
    import re

    found = []
    for page in pages(repo_root):
        for block in re.findall(r"```sh\n(.*?)```", page.read_text(), re.S):
            for line in block.splitlines():
                command = line.split(" #", 1)[0].strip()
                if command:
                    found.append((page.name, command))
    return found


def smoke_size(words: list) -> list:
    """The command's words with its size cut down (SMOKE_*), nothing else changed."""
    out = [SMOKE_WORDS.get(before, word) if i else word for i, (before, word) in enumerate(zip(["", *words], words))]
    out = [",".join(w.split(",")[: SMOKE_LISTS[b]]) if b in SMOKE_LISTS else w for b, w in zip(["", *out], out)]
    if words[0] == "accum-train" and words[1] in ("run", "compare", "plan", "bench") and "--resume" not in words:
        sets = SMOKE_SETS + (SMOKE_FASHION if words[2] in FASHION_CONFIGS else [])
        out += [part for value in sets for part in ("--set", value)]
        if words[1] == "bench":
            out += [
                part
                for option in ("--steps", "--rounds")
                if option not in words
                for part in (option, SMOKE_WORDS[option])
            ]
    for script, added in SMOKE_ADDED.items():
        if script in words and not any(option in words for option in added[::2]):
            out += added
    return out


def measured(words: list):
    """A bench or compare command at smoke size as what it runs: its (option, value) pairs as a set, its output
    directory left out (they only write there); None for any other command. Two pages' commands that differ only
    in the order of their options, or in their --rounds once cut to one, run the same."""
    if words[0] != "accum-train" or words[1] not in ("bench", "compare"):
        return None
    pairs = {(option, value) for option, value in zip(words[3::2], words[4::2]) if option != "--output-dir"}
    return (*words[:3], frozenset(pairs))


@pytest.mark.parametrize(
    "a, b, same",
    [
        ("bench C --subdivisions 1,8 --rounds 1 --steps 2", "bench C --steps 2 --rounds 1 --subdivisions 1,8", True),
        ("compare C --set epochs=1", "compare C --output-dir runs/cmp --set epochs=1", True),
        ("bench C --subdivisions 1,8 --steps 2", "bench C --subdivisions 1,2 --steps 2", False),
        ("bench C --set a=1 --set b=2", "bench C --set a=1", False),
        ("compare C", "compare D", False),
        ("run C --output-dir a", "run C --output-dir b", False),  # only bench and compare are matched
    ],
)
def test_a_measuring_command_runs_once_whatever_its_options_order(a, b, same):
    key_a, key_b = (measured(["accum-train", *command.split()]) for command in (a, b))
    assert (key_a is not None and key_a == key_b) is same


@pytest.mark.slow  # every documented command, each a run of seconds to a minute
def test_every_documented_command_runs_at_smoke_size(readme, repo_root, data_dir, tmp_path, monkeypatch):
    """Every command at smoke size, but the own-data example's (the first sh block of docs/data-and-models.md):
    those run exactly as the page gives them (6000 + 1000 images, 10 epochs), and what they wrote and printed is
    checked, predict's table against the page's block (to 0.02)."""
    import shlex
    import shutil

    module, text = readme
    example = module.example_commands(text)
    monkeypatch.setenv("ACCUM_TRAIN_DATA", str(data_dir))
    commands = documented_commands(repo_root)
    assert len(commands) >= 30  # the premise: the pages' commands were found
    assert {("data-and-models.md", command) for command in example} <= set(commands)
    failed, ran, seen, printed = [], 0, set(), {}
    for page in dict.fromkeys(name for name, _ in commands):
        folder = tmp_path / page.removesuffix(".md")
        (folder / "docs").mkdir(parents=True)  # a benchmark's --output docs/X.json lands here, not in the repo
        for name in ("configs", "scripts", "benchmarks"):
            (folder / name).symlink_to(repo_root / name)
        monkeypatch.chdir(folder)
        for _, command in [c for c in commands if c[0] == page]:
            if command in NOT_RUN:
                continue
            as_written = page == "data-and-models.md" and command in example
            words = shlex.split(command) if as_written else smoke_size(shlex.split(command))
            key = measured(words)
            if key is not None and key in seen:  # a bench or compare another page runs already, as it is cut down
                continue
            seen.add(key)
            if words[0] == "accum-train" and "--workers" not in words:
                # in this process: no second TensorFlow start (compare and bench start their own children)
                result = CliRunner().invoke(main, words[1:])
                code, said = result.exit_code, result.output[-1500:]
                if as_written:
                    printed[command] = result.stdout
            else:
                argv = (
                    [sys.executable, "-m", "accum_train.cli.main", *words[1:]] if words[0] == "accum-train" else words
                )
                argv = [sys.executable, *argv[1:]] if argv[0] == "python" else argv
                if "--workers" in words:  # TF's gRPC server listens on every interface: a private network
                    if shutil.which("unshare") is None or shutil.which("ip") is None:
                        pytest.fail("unshare and ip (util-linux, iproute2) run --workers on a private network")
                    quoted = " ".join(shlex.quote(part) for part in argv)
                    argv = ["unshare", "-rn", "sh", "-c", f"ip link set lo up && exec {quoted}"]
                done = subprocess.run(argv, capture_output=True, text=True, timeout=900)
                code, said = done.returncode, (done.stdout + done.stderr)[-1500:]
            ran += 1
            if code != 0:
                failed.append(f"{page}: {command} (as {' '.join(words)}): exit {code}: {said}")
    assert failed == []
    assert ran >= 27  # the pages' bench commands over k run once (SMOKE_LISTS)
    own_data_example_wrote_and_printed(module, text, tmp_path / "data-and-models", example, printed)


def own_data_example_wrote_and_printed(module, text, folder, example, printed):
    """The own-data example, as written: 10 epochs of 6000 examples in batches of 256 (23 full and a short one of
    112 each), the run's files, evaluate's figures, and predict's table, which is the page's block."""
    summary = json.loads((folder / "runs" / "mine" / "summary.json").read_text())
    assert summary["steps"] == 240 and summary["subdivisions"] == 4
    assert summary["test_accuracy"] > 0.3  # chance is 0.1
    evaluated = json.loads((folder / "runs" / "mine" / "evaluate" / "evaluate.json").read_text())
    assert evaluated["test_accuracy"] == summary["test_accuracy"] and evaluated["test_examples"] == 1000
    assert (folder / "runs" / "mine" / "model.keras").is_file()
    weights = np.load(folder / "runs" / "mine" / "weights.npz")
    assert any("batch_normalization" in name and "moving_variance" in name for name in weights.files)
    (block,) = [b for b in module.blocks(text) if b.after_example]
    assert block.command in example  # the block is the output of the example's own predict command
    rows = [line.split() for line in printed[block.command].splitlines()[1:]]
    assert [row[0] for row in rows] == block.command.split()[3:]
    assert all(0.0 < float(row[2]) <= 1.0 for row in rows)  # the predicted class's probability
    assert module.same(block.body, printed[block.command], after_example=True), printed[block.command]


@pytest.mark.parametrize(
    "command, run_as",
    [
        (
            "accum-train bench configs/fmnist.yaml --subdivisions 1,8 --rounds 5",
            "accum-train bench configs/fmnist.yaml --subdivisions 1 --rounds 1 --set epochs=1 --set "
            "data.train_limit=1000 --set data.test_limit=200 --set model.width=0.0625 --set data.validation=0 "
            "--steps 2",
        ),
        (
            "accum-train bench configs/fmnist.yaml --subdivisions 1,2,4,8,16 --steps 10",
            "accum-train bench configs/fmnist.yaml --subdivisions 1 --steps 2 --set epochs=1 --set "
            "data.train_limit=1000 --set data.test_limit=200 --set model.width=0.0625 --set data.validation=0 "
            "--rounds 1",
        ),
        (
            "accum-train bench configs/fmnist.yaml --micro-batch-size 500,100 --rounds 5",
            "accum-train bench configs/fmnist.yaml --micro-batch-size 500,100 --rounds 1 --set epochs=1 --set "
            "data.train_limit=1000 --set data.test_limit=200 --set model.width=0.0625 --set data.validation=0 "
            "--steps 2",
        ),
        ("accum-train run --resume runs/x", "accum-train run --resume runs/x"),
        (
            "accum-train run configs/own-data.yaml --output-dir runs/mine",
            "accum-train run configs/own-data.yaml --output-dir runs/mine --set epochs=1",
        ),
        ("accum-train evaluate runs/x", "accum-train evaluate runs/x"),
        (
            "python scripts/make_own_data.py --out mydata",
            "python scripts/make_own_data.py --out mydata --train 640 --test 200",
        ),
        ("python benchmarks/profile.py", "python benchmarks/profile.py --updates 2"),
    ],
)
def test_a_documented_command_runs_with_only_its_size_cut_down(command, run_as):
    assert " ".join(smoke_size(command.split())) == run_as


def test_a_json_that_records_its_commit_and_cpu_names_them_in_its_caption(repo_root, monkeypatch):
    """benchmarks/provenance.py records where a benchmark ran; the caption of the table made from it says so
    (older JSONs, without them, say "commit not recorded")."""
    monkeypatch.syspath_prepend(str(repo_root / "benchmarks"))
    import provenance
    import tables

    where = provenance.machine()
    assert set(where) == {"commit", "cpu", "cpus"} and where["commit"] != "unknown"
    report = json.loads((repo_root / "docs" / "peers.json").read_text())
    for key in ("commit", "cpu"):  # as a JSON written before provenance.py
        report["environment"].pop(key, None)
    assert "commit not recorded" in tables.peers(report).splitlines()[0]
    report["environment"].update(commit="abc1234", cpu="Some CPU")
    first = tables.peers(report).splitlines()[0]
    assert first.startswith("Measured on 2 CPUs (Some CPU), TensorFlow ") and ", commit abc1234: `python " in first


@pytest.mark.parametrize(
    "label, cpu, wall, shown",
    [
        # (a), (e) and the fastest Keras by each measure, in ms per example; the value shown, rounded up
        ("(a)/(e) CPU time per example", {"a": 0.3301, "e": 0.3300, "b": 0.5}, None, "1.001"),
        ("(e)/{cpu} examples per CPU-second", {"a": 0.33, "e": 0.3, "b": 0.4499}, None, "1.500"),
        ("(e)/{cpu} examples per CPU-second", {"a": 0.33, "e": 0.3, "b": 0.4501}, None, "1.501"),
        ("(e)/{wall} examples per wall-second", None, {"a": 0.2, "e": 0.1, "b": 0.20001}, "2.001"),
    ],
)
def test_the_one_pass_rows_are_the_medians_rounded_up(repo_root, monkeypatch, label, cpu, wall, shown):
    """One plain pass over the whole batch, (e), is shown against (a) and against the fastest Keras variants,
    rounded up: (a)/(e) against accum-train, (e)/Keras never understating how far a plain pass gets."""
    monkeypatch.syspath_prepend(str(repo_root / "benchmarks"))
    import tables

    report = json.loads((repo_root / "docs" / "peers.json").read_text())
    best = report["a_b_against"]
    for measure, ms in (("cpu", cpu), ("wall", wall)):
        for key, name in (("a", tables.A), ("e", tables.E), ("b", best[measure])):
            if ms is not None:
                report["time"][name][f"{measure}_s_per_example"] = ms[key] / 1000
    label = label.format(**{measure: tables._short(name) for measure, name in best.items()})  # "(b'')"
    rows = [line for line in tables.peers(report).splitlines() if line.startswith(f"| {label}")]
    assert len(rows) == 1
    assert rows[0].endswith(f"| - | {shown} |")


@pytest.mark.parametrize(
    "threads, command_ends, pools",
    [
        (None, "--output docs/peers-masked.json`", "TensorFlow's default thread pools"),
        ([1, 2], "--output docs/peers-masked.json --threads 1,2`", "1 intra-op and 2 inter-op threads per process"),
    ],
)
def test_the_tagger_s_caption_names_the_thread_pools_its_run_set(repo_root, monkeypatch, threads, command_ends, pools):
    """A run of benchmarks/peers_masked.py under --threads is captioned with the option and the pools, so that its
    table cannot pass for one under TensorFlow's defaults."""
    monkeypatch.syspath_prepend(str(repo_root / "benchmarks"))
    import peers_masked

    report = json.loads((repo_root / "docs" / "peers-masked.json").read_text())
    report["args"]["threads"] = threads
    first = peers_masked.markdown_table(report).splitlines()[0]
    assert first.endswith(command_ends)
    assert f", {pools}, " in first
