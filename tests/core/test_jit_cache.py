"""kleidipy.core.jit_cache: numba's cache of kleidipy functions is keyed by every kleidipy source file, so that a
compiled caller (the plan's run_plan) never runs a callee older than its source; other functions keep numba's
own key; ``import kleidipy`` does not import numba."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numba
import numba.core.caching as caching

from kleidipy.core import jit_cache
from kleidipy.formats import rows


def test_kleidipy_functions_carry_the_package_stamp() -> None:
    assert all(c.__name__.startswith("Kleidipy") for c in caching.CacheImpl._locator_classes)
    own, stamp = rows.get_rows._cache._impl.locator.get_source_stamp()
    assert stamp == jit_cache.package_stamp() and own  # the file's own stamp is kept too


def test_other_functions_keep_numbas_key(tmp_path: Path) -> None:
    source = tmp_path / "elsewhere.py"
    source.write_text("def f(x):\n    return x + 1\n")
    namespace: dict = {}
    exec(compile(source.read_text(), str(source), "exec"), namespace)  # noqa: S102 - a function defined in that file
    locator = numba.njit(cache=True)(namespace["f"])._cache._impl.locator
    assert type(locator).__name__.startswith("Kleidipy")  # the keyed locator, which leaves this file's stamp alone
    stamp = locator.get_source_stamp()
    assert not (isinstance(stamp, tuple) and jit_cache.package_stamp() in stamp)


def test_the_stamp_follows_any_source_change(tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    (tmp_path / "a.py").write_text("x = 1\n")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.py").write_text("y = 2\n")
    monkeypatch.setattr(jit_cache, "PACKAGE", tmp_path)
    first = jit_cache.package_stamp()
    assert jit_cache.package_stamp() == first
    (tmp_path / "sub" / "b.py").write_text("y = 22\n")  # another size (and time)
    assert jit_cache.package_stamp() != first


def test_installed_whichever_is_imported_first() -> None:
    check = (
        "import sys\n{first}\n{second}\nimport numba.core.caching as c\n"
        "assert all(k.__name__.startswith('Kleidipy') for k in c.CacheImpl._locator_classes)\n"
        "print('numba' in sys.modules)"
    )
    for first, second in (("import kleidipy", "pass"), ("import numba", "import kleidipy")):
        out = subprocess.run(
            [sys.executable, "-c", check.format(first=first, second=second)], capture_output=True, text=True
        )
        assert out.returncode == 0, out.stderr
    light = subprocess.run(
        [sys.executable, "-c", "import sys, kleidipy; print('numba' in sys.modules)"], capture_output=True, text=True
    )
    assert light.stdout.strip() == "False"
