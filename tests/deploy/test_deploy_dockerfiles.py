"""The Dockerfiles build from what the repository holds and start the service's console script.

No Docker engine is needed: each Dockerfile is parsed into instructions (comments dropped,
continuation lines joined) and checked against the repository and pyproject.toml.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Any

import pytest

DOCKERFILES = ["deploy/Dockerfile", "deploy/Dockerfile.cuda"]


def parse(path: Path) -> list[tuple[str, str]]:
    """[(INSTRUCTION, arguments)] of a Dockerfile, with `\\` continuations joined."""
    instructions: list[tuple[str, str]] = []
    pending = ""
    for raw in path.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):  # a comment inside a continued instruction
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        full = pending + line
        pending = ""
        keyword, _, args = full.partition(" ")
        instructions.append((keyword.upper(), args.strip()))
    return instructions


def args_of(instructions: list[tuple[str, str]], keyword: str) -> list[str]:
    return [args for kw, args in instructions if kw == keyword]


def env_of(instructions: list[tuple[str, str]]) -> dict[str, str]:
    """The final ENV of the image (key=value form)."""
    env: dict[str, str] = {}
    for args in args_of(instructions, "ENV"):
        for item in shlex.split(args):
            key, _, value = item.partition("=")
            env[key] = value
    return env


def copy_sources(instructions: list[tuple[str, str]]) -> list[str]:
    """Sources of every COPY from the build context (not `COPY --from=` another stage)."""
    sources = []
    for args in args_of(instructions, "COPY"):
        words = shlex.split(args)
        if any(w.startswith("--from") for w in words):
            continue
        words = [w for w in words if not w.startswith("--")]
        sources.extend(words[:-1])
    return sources


@pytest.fixture(params=DOCKERFILES)
def dockerfile(request: pytest.FixtureRequest, repo: Path) -> tuple[str, list[tuple[str, str]]]:
    return request.param, parse(repo / request.param)


def test_copy_sources_exist_in_the_build_context(dockerfile, repo: Path) -> None:
    name, instructions = dockerfile
    sources = copy_sources(instructions)
    assert sources, name
    for source in sources:
        assert (repo / source).exists(), f"{name}: COPY {source} but the repository has no {source}"


def test_copies_everything_pip_install_needs(dockerfile, pyproject: dict[str, Any]) -> None:
    name, instructions = dockerfile
    sources = {s.rstrip("/") for s in copy_sources(instructions)}
    assert "pyproject.toml" in sources
    readme = pyproject["project"].get("readme")
    if isinstance(readme, str):
        assert readme in sources, f"{name}: pyproject.toml names {readme} as readme; COPY it"
    for pattern in pyproject["tool"]["setuptools"]["packages"]["find"]["include"]:
        top = pattern.rstrip("*").rstrip(".")
        assert top in sources, f"{name}: package {top} is not copied"


def test_dockerignore_keeps_the_copied_files(dockerfile, repo: Path) -> None:
    """BuildKit reads <Dockerfile>.dockerignore; it must not exclude what COPY needs."""
    name, instructions = dockerfile
    ignore = repo / f"{name}.dockerignore"
    if not ignore.exists():
        pytest.skip(f"no {ignore.name}")
    lines = [ln.strip() for ln in ignore.read_text(encoding="utf-8").splitlines()]
    patterns = [ln for ln in lines if ln and not ln.startswith("#")]
    if "*" in patterns:
        for source in copy_sources(instructions):
            stem = source.rstrip("/")
            kept = f"!{stem}" in patterns or f"!{stem}/" in patterns
            assert kept, f"{ignore.name} drops {source}"


def test_starts_the_console_script_on_all_interfaces(dockerfile, pyproject, repo: Path) -> None:
    name, instructions = dockerfile
    (cmd,) = args_of(instructions, "CMD")
    argv = json.loads(cmd)  # exec form, so SIGTERM reaches the service (final snapshot)
    scripts = pyproject["project"]["scripts"]
    assert argv[0] in scripts, f"{name}: CMD {argv[0]} is not a console script"
    module = scripts[argv[0]].split(":")[0]
    assert (repo / (module.replace(".", "/") + ".py")).is_file(), f"{module} is missing"
    env = env_of(instructions)
    assert env["GLN_HOST"] == "0.0.0.0"
    assert env.get("GLN_PORT", "8000") == "8000"
    assert "8000" in args_of(instructions, "EXPOSE")


def test_snapshots_are_on_a_volume(dockerfile) -> None:
    """Without Redis, snapshots and the file log go to GLN_SNAPSHOT_DIR: a volume there keeps
    them when the container is removed (``docker run --rm``)."""
    name, instructions = dockerfile
    volumes = [path for args in args_of(instructions, "VOLUME") for path in json.loads(args)]
    assert env_of(instructions)["GLN_SNAPSHOT_DIR"] in volumes, f"{name}: no snapshot volume"


def test_runs_as_a_non_root_user(dockerfile) -> None:
    name, instructions = dockerfile
    users = args_of(instructions, "USER")
    assert users, f"{name} has no USER"
    assert users[-1].split(":")[0] not in {"root", "0"}


def test_healthcheck_probes_healthz(dockerfile) -> None:
    name, instructions = dockerfile
    (check,) = args_of(instructions, "HEALTHCHECK")
    command = check[check.index("CMD") + len("CMD"):].strip()
    if command.startswith("["):
        command = " ".join(json.loads(command))  # exec form must be valid JSON
    assert "/healthz" in command
    assert "curl" not in command and "wget" not in command, "slim images have neither"


def test_cpu_image(repo: Path) -> None:
    instructions = parse(repo / "deploy" / "Dockerfile")
    (base,) = args_of(instructions, "FROM")
    assert base.split()[0] == "python:3.11-slim"
    assert any(re.search(r"pip install \.(\s|$|&)", run) for run in args_of(instructions, "RUN"))


def test_cuda_image(repo: Path, pyproject: dict[str, Any]) -> None:
    instructions = parse(repo / "deploy" / "Dockerfile.cuda")
    # ARGs before FROM give the defaults used in the base image reference.
    arg_defaults = dict(a.split("=", 1) for a in args_of(instructions, "ARG") if "=" in a)
    (base,) = args_of(instructions, "FROM")
    base = re.sub(r"\$\{(\w+)\}", lambda m: arg_defaults[m.group(1)], base.split()[0])
    assert re.fullmatch(r"nvidia/cuda:12\.[\d.]+-runtime-ubuntu[\d.]+", base), base
    runs = " ".join(args_of(instructions, "RUN"))
    assert "python3.11" in runs
    assert "gpu" in pyproject["project"]["optional-dependencies"]
    assert re.search(r"""pip install ["']?\.\[gpu\]""", runs)
    assert env_of(instructions)["GLN_DEVICE"] == "cuda"
