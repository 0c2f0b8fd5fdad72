"""The Python examples in the README run as written."""

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def test_readme_has_python_examples():
    assert len(BLOCKS) >= 2


@pytest.mark.parametrize("index", range(len(BLOCKS)))
@pytest.mark.slow
def test_readme_example_runs(index, capsys):
    namespace = {}
    exec(compile(BLOCKS[index], f"README.md[python block {index}]", "exec"), namespace)
    if "result" in namespace:
        assert namespace["result"].n_iter == 20


# ------------------------------------------------------------------ the README as a front door (issue 46)
_WORDS = {"four": 4, "five": 5, "six": 6, "seven": 7, "three": 3, "two": 2}


def _manifest() -> dict:
    import yaml

    return yaml.safe_load((README.parent / "plugins" / "ctbench_napari" / "napari.yaml").read_text())


def test_the_counts_the_readme_states_are_the_plugins():
    text = README.read_text()
    doc = _manifest()["contributions"]
    widgets = [_WORDS[w] for w in re.findall(r"(\w+) docked widgets", text) if w in _WORDS]
    samples = [_WORDS[w] for w in re.findall(r"(\w+) samples\b", text) if w in _WORDS]
    assert widgets and set(widgets) == {len(doc["widgets"])}, widgets
    assert samples and set(samples) == {len(doc["sample_data"])}, samples
    for w in doc["widgets"]:    # each named, in the README's words
        assert w["display_name"].lower().split()[0] in text.lower(), w["display_name"]


def test_the_readme_is_a_front_door_and_the_tables_live_in_docs():
    text = README.read_text()
    assert len(text.splitlines()) < 200
    assert "<!-- bench:start -->" not in text and "docs/BENCHMARKS.md" in text
    for section in ("## Install", "## Three examples", "## Benchmarks", "## Documentation"):
        assert section in text
    assert "download.pytorch.org/whl/cpu" in text          # torch's CPU build, before ctbench
    bench = (README.parent / "docs" / "BENCHMARKS.md").read_text()
    assert 0 <= bench.index("<!-- bench:start -->") < bench.index("<!-- bench:end -->")
    for doc in re.findall(r"`(docs/[A-Z_]+\.md)`", text):   # every doc the README names exists
        assert (README.parent / doc).is_file(), doc
