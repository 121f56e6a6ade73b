"""The Dockerfiles build from what the repository holds and start the service's console script.

No Docker engine is needed: each Dockerfile is parsed into instructions (comments dropped,
continuation lines joined) and checked against the repository and pyproject.toml.
"""

from __future__ import annotations

import json
import os
import posixpath
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


def read_dockerignore(path: Path) -> list[str]:
    """The patterns of a .dockerignore file, comments and blank lines dropped."""
    lines = [ln.strip() for ln in path.read_text(encoding="utf-8").splitlines()]
    return [ln for ln in lines if ln and not ln.startswith("#")]


def _pattern(pattern: str) -> re.Pattern[str]:
    """A .dockerignore pattern as a regex over slash-separated paths relative to the context.

    As Docker's matcher: the pattern is cleaned (a trailing or leading `/` dropped), `*` and `?`
    stay within one path element, `**` spans any number of them (none included).
    """
    pattern = posixpath.normpath(pattern.lstrip("/"))
    assert "[" not in pattern and "\\" not in pattern, f"unsupported pattern {pattern}"
    regex, i = "", 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            regex, i = regex + "(?:.*/)?", i + 3
        elif pattern.startswith("**", i):
            regex, i = regex + ".*", i + 2
        elif pattern[i] == "*":
            regex, i = regex + "[^/]*", i + 1
        elif pattern[i] == "?":
            regex, i = regex + "[^/]", i + 1
        else:
            regex, i = regex + re.escape(pattern[i]), i + 1
    return re.compile(regex + r"\Z")


def is_ignored(path: str, patterns: list[str]) -> bool:
    """Whether Docker leaves `path` out of the build context: the last pattern that matches the
    path or one of its parent folders decides, and a `!` pattern takes the path back in."""
    parts = path.split("/")
    prefixes = ["/".join(parts[:n]) for n in range(1, len(parts) + 1)]
    ignored = False
    for pattern in patterns:
        negated = pattern.startswith("!")
        regex = _pattern(pattern[1:] if negated else pattern)
        if any(regex.match(prefix) for prefix in prefixes):
            ignored = not negated
    return ignored


def context_files(repo: Path) -> list[str]:
    """Every file of the checkout, relative to it, with .git and the venvs not descended into."""
    found = []
    for folder, dirs, files in os.walk(repo):
        dirs[:] = [d for d in dirs if d not in {".git", ".venv", ".venv-test"}]
        rel = Path(folder).relative_to(repo).as_posix()
        found.extend(f if rel == "." else f"{rel}/{f}" for f in files)
    return found


def copied_files(instructions: list[tuple[str, str]], repo: Path) -> list[str]:
    """The files of the context that the Dockerfile's COPY sources name (bytecode left out)."""
    files = []
    for source in copy_sources(instructions):
        stem = source.rstrip("/")
        if (repo / stem).is_dir():
            files.extend(
                p.relative_to(repo).as_posix() for p in (repo / stem).rglob("*")
                if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"
            )
        else:
            files.append(stem)
    return files


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
    """BuildKit reads <Dockerfile>.dockerignore, the classic builder only the root .dockerignore;
    neither may exclude what COPY needs."""
    name, instructions = dockerfile
    ignores = [repo / f"{name}.dockerignore", repo / ".dockerignore"]
    assert any(ignore.exists() for ignore in ignores), f"{name}: no .dockerignore"
    files = copied_files(instructions, repo)
    assert "pyproject.toml" in files and any(f.startswith("service/") for f in files)
    for ignore in (i for i in ignores if i.exists()):
        patterns = read_dockerignore(ignore)
        dropped = [f for f in files if is_ignored(f, patterns)]
        assert not dropped, f"{ignore.relative_to(repo)} drops {dropped[:5]}"


def test_root_dockerignore_keeps_the_venv_and_the_rest_out(repo: Path) -> None:
    """Without BuildKit only the root .dockerignore applies: without one, the whole checkout
    (.venv and .git included) is sent as the build context."""
    assert (repo / ".dockerignore").is_file(), "no .dockerignore at the build context's root"
    patterns = read_dockerignore(repo / ".dockerignore")
    for path in (".venv/bin/python", ".venv", ".venv-test/bin/python", ".git/HEAD",
                 "tests/deploy/conftest.py", "docs/deploy.md", "snapshots/m.snap",
                 "gln/__pycache__/x.cpython-311.pyc", "service/sub/__pycache__/y.pyc",
                 "deploy/Dockerfile.cuda"):
        assert is_ignored(path, patterns), f".dockerignore sends {path}"
    for path in ("pyproject.toml", "README.md", "gln/__init__.py", "service/api/app.py"):
        assert not is_ignored(path, patterns), f".dockerignore drops {path}"


@pytest.mark.parametrize("name", DOCKERFILES)
def test_root_dockerignore_agrees_with_the_per_dockerfile_one(name: str, repo: Path) -> None:
    """BuildKit and the classic builder must send the same context for each image."""
    own = repo / f"{name}.dockerignore"
    if not own.exists():
        pytest.skip(f"no {own.name}: BuildKit reads the root .dockerignore too")
    root, specific = read_dockerignore(repo / ".dockerignore"), read_dockerignore(own)
    files = context_files(repo) + [".venv/pyvenv.cfg", ".git/config"]
    differ = [f for f in files if is_ignored(f, root) != is_ignored(f, specific)]
    assert not differ, f".dockerignore and {own.name} disagree on {differ[:5]}"


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


def test_cpu_image_holds_its_compiled_kernels(repo: Path) -> None:
    """The CPU kernels are compiled while the image is built, into the Numba cache the
    container uses, by the user it runs as (so that Numba may add to the cache on another
    CPU): a new container's first model does not compile them."""
    instructions = parse(repo / "deploy" / "Dockerfile")
    keywords = [keyword for keyword, _ in instructions]
    runs = [(i, args) for i, (keyword, args) in enumerate(instructions) if keyword == "RUN"]
    at = [i for i, args in runs if "python -m gln.precompile" in args]
    assert at, "the CPU image does not precompile the kernels"
    last_user = max(i for i, keyword in enumerate(keywords) if keyword == "USER")
    assert at[0] > last_user, "precompiled as root: the runtime user could not add to it"
    cache = env_of(instructions)["NUMBA_CACHE_DIR"]
    env_before = env_of(instructions[:at[0]])
    assert env_before.get("NUMBA_CACHE_DIR") == cache, "compiled into another cache"
    assert not cache.startswith("/tmp"), "a cache in /tmp is not part of the image"
    owned = " ".join(args for i, args in runs if i < last_user)
    assert re.search(rf"chown -R gln:gln [^&]*{re.escape(str(Path(cache).parent))}", owned)


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
