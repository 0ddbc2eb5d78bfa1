"""docs/api.md is what scripts/api_reference.py makes of the public API's signatures and docstrings now: it names
every public object, and a changed docstring, default, callback or error leaves it stale."""

import re

import accum_train
import pytest
from accum_train import errors
from helpers import load_file


@pytest.fixture(scope="module")
def api(repo_root):
    return load_file(repo_root / "scripts" / "api_reference.py", "api_reference")


def _user_errors(cls=errors.UserError):
    """UserError and its subclasses defined in accum/errors.py, found by walking __subclasses__ (not as the script
    finds them)."""
    found = [cls] if cls.__module__ == errors.__name__ else []
    for sub in cls.__subclasses__():
        found += _user_errors(sub)
    return found


PUBLIC = sorted({name for name in accum_train.__all__ if name != "__version__"} | {c.__name__ for c in _user_errors()})


def test_the_api_page_is_current(api, capsys):
    assert api.main(["--check"]) == 0, capsys.readouterr().out


@pytest.mark.parametrize("name", PUBLIC)
def test_the_page_has_a_section_for_every_public_name(repo_root, name):
    page = (repo_root / "docs" / "api.md").read_text()
    assert re.search(rf"^#+ accum_train\.(errors\.)?{name}$", page, re.MULTILINE), f"docs/api.md has no {name}"


def test_every_section_has_a_docstring(repo_root):
    assert "(no docstring)" not in (repo_root / "docs" / "api.md").read_text()


def _fit_docstring(monkeypatch, api, tmp_path):
    fit = accum_train.fit
    monkeypatch.setattr(fit, "__doc__", fit.__doc__.replace("a micro-batch at a time", "a mini-batch at a time"))


def _run_default(monkeypatch, api, tmp_path):
    monkeypatch.setattr(accum_train.run, "__kwdefaults__", {**accum_train.run.__kwdefaults__, "workers": 2})


def _error_docstring(monkeypatch, api, tmp_path):
    monkeypatch.setattr(errors.DataError, "__doc__", "A data file is missing.")


def _new_error(monkeypatch, api, tmp_path):
    new = type("QuotaError", (errors.UserError,), {"__doc__": "Over quota.", "__module__": errors.__name__})
    monkeypatch.setattr(errors, "QuotaError", new, raising=False)


def _new_callback(monkeypatch, api, tmp_path):
    def step_end(self, step: int) -> None: ...

    monkeypatch.setattr(accum_train.Progress, "step_end", step_end, raising=False)


def _page_edited(monkeypatch, api, tmp_path):
    copy, page = tmp_path / "api.md", api.PAGE.read_text()
    copy.write_text(page.replace("## accum_train.run\n", "## accum_train.runs\n"))
    assert copy.read_text() != page  # the premise: the page was edited
    monkeypatch.setattr(api, "PAGE", copy)


@pytest.mark.parametrize(
    "change", [_fit_docstring, _run_default, _error_docstring, _new_error, _new_callback, _page_edited]
)
def test_a_change_leaves_the_page_stale(api, monkeypatch, tmp_path, capsys, change):
    change(monkeypatch, api, tmp_path)
    assert api.main(["--check"]) == 1
    (line,) = capsys.readouterr().out.splitlines()
    assert line.endswith("is stale: python scripts/api_reference.py rewrites it")


def _example(a, /, b=1, *args, c: "int | None" = None, d="auto", e=print, **kw) -> "dict": ...


class _Marker: ...


MARKER = _Marker()  # its repr has an address


def _keyword_only(a, *, b=(1, 2), f=_example, g=MARKER): ...


@pytest.mark.parametrize(
    "function, shown",
    [
        (_example, '_example(a, /, b=1, *args, c: int | None = None, d="auto", e=print, **kw) -> dict'),
        (_keyword_only, "_keyword_only(a, *, b=(1, 2), f=_example, g=_Marker())"),  # no address
    ],
)
def test_a_signature_is_shown_as_the_source_writes_it(api, function, shown):
    assert api.signature(function) == shown
