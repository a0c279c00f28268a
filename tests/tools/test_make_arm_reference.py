"""tests/data/llama_cpp_arm/make_arm_reference.py: the script that cross-builds llama.cpp + KleidiAI and records the
Arm reference under QEMU. Without building (minutes) or emulating (hours): its arguments, its one-line errors on
source trees that are not llama.cpp's or KleidiAI's, and that its models and output folders are the ones the data's
README and ``benchmarks/reference_gap.py`` name."""

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import paths

SCRIPT = paths.DATA / "llama_cpp_arm" / "make_arm_reference.py"


def load_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("make_arm_reference", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_help_names_both_cpus_and_models():
    proc = subprocess.run([sys.executable, str(SCRIPT), "--help"], capture_output=True, text=True, check=True)
    for word in ("i8mm", "sme2", "smollm2-q4_0", "smollm2-q8_0", "gemma3-q4_0", "--threads"):
        assert word in proc.stdout


def test_not_source_trees_one_line_error(tmp_path: Path, capsys):
    script = load_script()
    rc = script.main([str(tmp_path), str(tmp_path), "smollm2-q4_0", "--cpu", "i8mm", "--work", str(tmp_path / "w")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 1
    assert len(err) == 1 and err[0].startswith("make_arm_reference: error:")
    assert not (tmp_path / "w" / "build").exists()


def test_outputs_and_models_match_the_data():
    script = load_script()
    assert script.OUT["i8mm"] == paths.DATA / "llama_cpp_arm" / "logits"
    assert script.OUT["sme2"] == paths.DATA / "llama_cpp_arm" / "sme2_svl512" / "logits"
    assert script.CPUS == {"i8mm": "max,sme=off", "sme2": "max,sme-default-vector-length=64"}
    for key in script.MODELS:
        assert any(script.OUT["sme2"].glob(f"{key}__*__default.json")), key
