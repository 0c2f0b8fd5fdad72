"""A fresh virtual environment holding a built ctbench wheel, outside the checkout (tests/test_wheel.py,
tests/test_first_hour_wheel.py).

The wheel is unpacked into the venv's site-packages as pip would; its dependencies (torch, numpy, ...) come
from the environment that runs the tests through a .pth file, not from the network.  ``ctbench`` (the
console script) is written as pip would from the wheel's entry points.
"""

from __future__ import annotations

import configparser
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path


def install_wheel(wheel: Path, venv: Path) -> tuple[Path, Path]:
    """``(python, site-packages)`` of a new venv at ``venv`` with ``wheel`` installed."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    vpy = venv / "bin" / "python"
    site = subprocess.run([str(vpy), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(site)
        entry = next((n for n in zf.namelist() if n.endswith(".dist-info/entry_points.txt")), None)
        points = zf.read(entry).decode() if entry else ""
    # every site-packages folder this interpreter reads (a venv may itself see another's through a .pth), as
    # plain folders: no .pth inside them runs, so no editable ctbench of a checkout comes along
    deps = [sysconfig.get_paths()["purelib"]] + [p for p in sys.path if p.rstrip("/").endswith("site-packages")]
    Path(site, "ctbench_deps.pth").write_text("".join(f"{p}\n" for p in dict.fromkeys(deps)))
    cfg = configparser.ConfigParser()
    cfg.read_string(points)
    for name, target in (cfg["console_scripts"].items() if cfg.has_section("console_scripts") else []):
        module, func = target.split(":")
        script = venv / "bin" / name
        script.write_text(f"#!{vpy}\nimport sys\nfrom {module} import {func}\nsys.exit({func}())\n")
        script.chmod(0o755)
    return vpy, Path(site)
