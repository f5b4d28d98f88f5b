"""The Space's packaging agrees with itself: front matter, pins and the README's commands."""

import re

from tests.conftest import ROOT


def front_matter() -> dict[str, str]:
    text = (ROOT / "README.md").read_text()
    block = text.split("---")[1]
    return dict(re.findall(r"^(\w+): *(.+)$", block, flags=re.M))


def test_sdk_version_is_the_gradio_pin():
    pin = re.search(r"^gradio(?:\[\w+\])?==([\d.]+)$", (ROOT / "requirements.txt").read_text(), flags=re.M).group(1)
    meta = front_matter()
    assert meta["sdk"] == "gradio" and meta["sdk_version"] == pin and meta["app_file"] == "app.py"
    assert meta["suggested_hardware"] not in ("cpu-basic", "cpu-upgrade") and len(meta["short_description"]) <= 60


def test_torch_is_pinned_and_readme_gives_both_commands():
    assert "torch==2.13.0" in (ROOT / "requirements.txt").read_text().splitlines()
    readme = (ROOT / "README.md").read_text()
    assert "pip install -r requirements.txt && python app.py" in readme
    assert "pip install -r requirements-dev.txt && python -m pytest" in readme
    assert "grep -m1 '^pip install -r requirements-dev.txt' README.md" in (ROOT / ".ci" / "run").read_text()


def test_readme_quick_start_has_a_venv_and_cpu_wheels():
    """A fresh clone's user gets a virtual environment and, off a Space, CPU-only torch of the pinned version."""
    readme = (ROOT / "README.md").read_text()
    assert re.search(r"^python3?[\d.]* -m venv \.venv && \. \.venv/bin/activate$", readme, flags=re.M)
    pin = next(line for line in (ROOT / "requirements.txt").read_text().splitlines() if line.startswith("torch=="))
    assert f"pip install {pin} --index-url https://download.pytorch.org/whl/cpu" in readme
