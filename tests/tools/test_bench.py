"""kleidipy.tools.bench: llama-bench-style pp/tg throughput rows and the markdown table, on SmolLM2 with tiny counts."""

from __future__ import annotations

import pytest
from model_files import SMOLLM2, model_file

from kleidipy.runtime.generate import Engine
from kleidipy.target import parse_target
from kleidipy.tools.bench import BenchError, BenchRow, format_bench_table, parse_threads, run_bench


@pytest.fixture(scope="module")
def engine() -> Engine:
    return Engine(model_file(SMOLLM2), target=parse_target("sme2:svl=512"), progress=False)


def test_bench_rows_and_table(engine: Engine, capsys: pytest.CaptureFixture[str]) -> None:
    """-p 8 -n 4 -t 1,2 -r 1: one row per (threads, test) in llama-bench's order, the model's columns, and the
    engine's thread count restored afterwards."""
    rows = run_bench(engine, n_prompt=8, n_gen=4, threads_list=[1, 2], repetitions=1, progress=True)
    assert [(r.threads, r.test, r.n_tokens) for r in rows] == [
        (1, "pp8", 8),
        (1, "tg4", 4),
        (2, "pp8", 8),
        (2, "tg4", 4),
    ]
    for r in rows:
        assert (r.model, r.backend) == ("llama 135M Q4_1", "kleidipy sme2:svl=512")
        assert r.n_params == 134_515_008 and r.size_bytes == sum(t.data.nbytes for t in engine.gguf.tensors.values())
        assert len(r.samples) == 1 and r.avg_ts > 0 and r.stdev_ts == 0.0
    assert engine.backend.threads == 1
    assert "bench" in capsys.readouterr().err  # the progress bar
    lines = format_bench_table(rows).splitlines()
    assert len(lines) == 2 + len(rows)
    assert [c.strip() for c in lines[0].strip("|").split("|")] == [
        "model", "size", "params", "backend", "threads", "test", "t/s"
    ]  # fmt: skip
    cells = [c.strip() for c in lines[3].strip("|").split("|")]
    assert cells[:6] == ["llama 135M Q4_1", "92.10 MiB", "134.52 M", "kleidipy sme2:svl=512", "1", "tg4"]
    assert cells[6].endswith(" ± 0.00")
    assert len({len(line) for line in lines}) == 1  # columns aligned


def test_format_table_numbers() -> None:
    """Mean ± sample stdev of the per-repetition tokens/s; MiB/GiB and M/B as llama-bench prints them."""
    rows = [
        BenchRow("llama 7B Q4_0", 3_825_065_984, 6_738_415_616, "kleidipy i8mm", 4, "pp512", 512, [2.0, 1.0, 4.0]),
        BenchRow("llama 7B Q4_0", 3_825_065_984, 6_738_415_616, "kleidipy i8mm", 4, "tg128", 128, [16.0]),
    ]
    assert rows[0].rates == [256.0, 512.0, 128.0]
    assert rows[0].avg_ts == pytest.approx(298.6666667) and rows[0].stdev_ts == pytest.approx(195.5232297)
    assert format_bench_table(rows) == (
        "| model         |     size | params | backend       | threads |  test |             t/s |\n"
        "| ------------- | -------: | -----: | ------------- | ------: | ----: | --------------: |\n"
        "| llama 7B Q4_0 | 3.56 GiB | 6.74 B | kleidipy i8mm |       4 | pp512 | 298.67 ± 195.52 |\n"
        "| llama 7B Q4_0 | 3.56 GiB | 6.74 B | kleidipy i8mm |       4 | tg128 |     8.00 ± 0.00 |"
    )


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(n_prompt=0, n_gen=0), "length > 0"),
        (dict(n_prompt=-1), "length > 0"),
        (dict(repetitions=0), "repetitions"),
        (dict(threads_list=[]), "thread counts"),
        (dict(threads_list=[1, 0]), "thread counts"),
        (dict(n_prompt=100_000), "does not fit the context"),
    ],
)
def test_bad_parameters(engine: Engine, kwargs: dict, match: str) -> None:
    with pytest.raises(BenchError, match=match):
        run_bench(engine, **{"n_prompt": 8, "n_gen": 4, "repetitions": 1, "progress": False, **kwargs})


def test_parse_threads() -> None:
    assert parse_threads("1,2") == [1, 2] and parse_threads("4") == [4]
    for bad in ("", "1,,2", "two", "0", "1,-1"):
        with pytest.raises(BenchError, match="thread counts"):
            parse_threads(bad)
