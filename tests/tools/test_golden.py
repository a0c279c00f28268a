"""Every run of ../shared/golden through the verifier, in every execution, must be bit-exact."""

import json
import shutil

import pytest

from kleidipy.cli import main


@pytest.mark.parametrize("execution", ["reference", "jit"])  # isa: tests/test_emulator.py
def test_golden_set_passes(golden_dir, execution, capsys):
    """`kleidipy golden DIR --execution E`: a PASS line per runnable run, then "N passed, 0 failed, S skipped"."""
    code = main(["golden", str(golden_dir), "--execution", execution])
    lines = capsys.readouterr().out.strip().splitlines()
    failures = [line for line in lines if line.startswith("FAIL")]
    assert not failures, "\n".join(failures[:20])
    manifest = json.loads((golden_dir / "manifest.json").read_text())
    statuses = [r.get("status") for c in manifest["cases"] for r in c["runs"]]
    ok = statuses.count("ok")
    assert lines[-1] == f"{ok} passed, 0 failed, {len(statuses) - ok} skipped"
    assert len(lines) == ok + 1 and all(line.startswith(f"PASS [{execution}") for line in lines[:-1])
    assert code == 0


def test_cli_reports_unrunnable_entry(golden_dir, tmp_path, capsys):
    manifest = json.loads((golden_dir / "manifest.json").read_text())
    case = manifest["cases"][0]
    run = dict(next(r for r in case["runs"] if r.get("status") == "ok"))
    run["kernels"] = dict(run["kernels"], matmul="kai_run_matmul_clamp_f32_no_such_kernel")
    case = dict(case, runs=[run])
    (tmp_path / "manifest.json").write_text(json.dumps({"meta": {}, "cases": [case]}))
    for entry in case["inputs"].values():
        dest = tmp_path / entry["file"]
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(golden_dir / entry["file"], dest)
    assert main(["golden", str(tmp_path), "--execution", "reference"]) == 1
    out = capsys.readouterr().out
    assert "cannot run: unknown kernel" in out
    assert out.strip().splitlines()[-1].startswith("0 passed, 1 failed")


def test_cli_missing_manifest_is_one_line_error(tmp_path, capsys):
    assert main(["golden", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("kleidipy: error: no manifest.json") and "\n" not in err
