"""pyproject.toml's dependencies against constraints/worker.txt and the code: every base, worker and plots
requirement is pinned in the constraints file, and the pin satisfies the requirement (so a fleet installed
with ``-c constraints/worker.txt`` gets the versions the suite passed with)."""

from __future__ import annotations

import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]


def _pins() -> dict[str, Version]:
    pins = {}
    for line in (ROOT / "constraints" / "worker.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            assert version, f"constraints/worker.txt: {line!r} is not NAME==VERSION"
            pins[canonicalize_name(name)] = Version(version)
    return pins


def test_every_base_worker_and_plots_requirement_is_pinned_by_a_version_it_accepts() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    reqs = [Requirement(r) for r in project["dependencies"] + extras["worker"] + extras["plots"]]
    pins = _pins()
    for req in reqs:
        name = canonicalize_name(req.name)
        assert name in pins, f"{req.name} is a dependency but constraints/worker.txt does not pin it"
        assert req.specifier.contains(pins[name], prereleases=True), (
            f"{req.name}=={pins[name]} violates {req}"
        )


def test_the_base_package_holds_no_model_runtime() -> None:
    base = {
        canonicalize_name(Requirement(r).name)
        for r in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    }
    assert not base & {"torch", "transformers", "matplotlib", "gguf", "vllm", "accelerate"}
