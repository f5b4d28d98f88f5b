"""Imports go one way: attention <- profiling <- app; plotly only in charts; no gradio below app."""

import ast
import sys
from pathlib import Path

from tests.conftest import ROOT


def imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def package_imports(package: str) -> dict[str, set[str]]:
    return {p.name: imports(p) for p in (ROOT / package).glob("*.py")}


def test_attention_imports_torch_only():
    for name, found in package_imports("attention").items():
        # `kernels` is hub_flash's optional loader, imported lazily inside it.
        assert found - set(sys.stdlib_module_names) <= {"torch", "attention", "kernels"}, name


def test_profiling_never_imports_gradio_or_app():
    for name, found in package_imports("profiling").items():
        assert not found & {"gradio", "app", "spaces"}, name


def test_plotly_only_in_charts():
    """The chart package draws; no other module of profiling/ imports plotly."""
    users = {name for name, found in package_imports("profiling").items() if "plotly" in found}
    drawers = {name for name, found in package_imports("profiling/charts").items() if "plotly" in found}
    assert users == set()
    assert drawers == {"timeline.py", "runs.py", "steps.py", "memory.py", "job.py"}


def test_cli_runs_without_gradio_or_plotly():
    import subprocess
    import sys

    blocker = "import sys; sys.modules['gradio'] = None; sys.modules['plotly'] = None; "
    code = (
        blocker
        + "from profiling.__main__ import main; sys.exit(main(['run', '--device', 'cpu', '--seq-len', '16', '--json']))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert '"kernels_per_forward": 6.0' in out.stdout


def test_app_import_is_light():
    import subprocess
    import sys

    code = "import sys, app; print('torch' in sys.modules, 'profiling' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["False", "False"], out.stderr


def test_trace_reader_works_without_orjson_or_isal():
    import subprocess
    import sys

    code = (
        "import sys; sys.modules['orjson'] = sys.modules['isal'] = None; from profiling.trace import load_trace; "
        "print(len(load_trace('tests/data/a100_simple_add.json.gz').kernels))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "79", out.stderr
