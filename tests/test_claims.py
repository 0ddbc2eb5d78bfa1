"""Issue 77 point 9: claims no wider than the tests. Each case reads a page (or setup.cfg, or a config) and checks
what it says against what is tested or measured: no "any model" or "every data source" without the conditions, no
CI workflow that the repository does not have, no GPU figure that nothing measured, the conformance patterns' k as
the tests run them, and a config's stated time range holding its own measured time."""

import configparser
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "CHANGELOG.md"]


@pytest.mark.parametrize(
    "claim",
    [
        "any compiled Keras 3 model",  # exact under limitations.md's conditions, not for any model
        "for any Keras 3 model",
        "every data source model.fit takes",  # a generator as validation_data is refused
        "CI runs it on every change",  # the repository has .ci/run, no workflow that runs on changes
    ],
)
def test_no_page_makes_a_claim_wider_than_its_tests(claim):
    said = [page.name for page in PAGES if claim in " ".join(page.read_text().split())]
    assert said == []


def test_the_package_description_states_its_condition():
    setup = configparser.ConfigParser()
    setup.read(ROOT / "setup.cfg")
    description = setup["metadata"]["description"]
    assert "limitations.md" in description and "1e-5" in description, description


@pytest.mark.parametrize("page", ["docs/mixed-precision.md", "docs/memory.md"])
def test_a_gpu_behaviour_nothing_measured_is_said_untested_with_no_expected_figure(page):
    text = " ".join((ROOT / page).read_text().split())
    assert re.search(r"GPU\W{0,6}\s?untested|untested on a GPU", text, re.I), page
    assert [s for s in re.split(r"(?<=\.)\s", text) if "GPU" in s and "expect" in s] == []


def test_fit_md_names_the_k_the_conformance_patterns_run_at():
    conformance = (ROOT / "tests" / "test_conformance.py").read_text()
    ks = re.search(r"k: tuple = \((\d+), (\d+)\)", conformance).groups()
    assert f"at k={ks[0]} and k={ks[1]}:" in " ".join((ROOT / "docs" / "fit.md").read_text().split())


def test_the_main_job_s_stated_time_range_holds_its_measured_time():
    text = (ROOT / "configs" / "fmnist.yaml").read_text()
    low, high = map(int, re.search(r"\((\d+) to (\d+)\s*#?\s*minutes", text, re.S).groups())
    measured = [int(m) + int(s) / 60 for m, s in re.findall(r"(\d+) min (\d+) s", text.split("AVX2 CPU")[0])]
    assert measured and all(low <= minutes <= high for minutes in measured), (low, high, measured)
