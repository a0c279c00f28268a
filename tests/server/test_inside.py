"""``GET /api/inside`` and its pictures over loopback: after a chat request the load, prefill and decode stages name
the RHS packer, the LHS packer, the GEMM and the GEMV that ran, with calls and seconds; ``?id=`` answers an earlier
request; an unknown id is a 404 and an empty one a 400, as is a layout or an emulation of a kernel or shape that
cannot be drawn (OpenAI-style error bodies, as the rest of the server). And kleidipy's call stacks the view shows
name functions that exist, each called by the frame above it (so that they cannot go stale)."""

from __future__ import annotations

import http.client
import importlib
import inspect
import json
from collections.abc import Iterator

import pytest
from model_files import SMOLLM2
from test_server import Server, is_openai_error, serving

from kleidipy.runtime.generate import Engine
from kleidipy.server.inside import GGML_STACKS, KLEIDIPY_STACKS, LoadRecord


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    """SmolLM2 served as ``kleidipy serve`` serves it: its load recorded."""
    load = LoadRecord()
    engine = Engine(SMOLLM2, n_ctx=1024, progress=False, observers=[load])
    engine.observers.remove(load)
    with serving(engine, parallel=1, load=load) as server:
        yield server


def get(server: Server, path: str) -> tuple[int, str, bytes]:
    """(status, content type, body) of ``GET path``."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=300)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, resp.getheader("Content-Type", ""), resp.read()
    finally:
        conn.close()


def inside(server: Server, query: str = "") -> dict:
    status, kind, body = get(server, "/api/inside" + query)
    assert status == 200 and kind == "application/json", body
    return json.loads(body)


def kernels(stage: dict) -> dict[str, list[dict]]:
    """The stage's kernel rows by role (SmolLM2: the Q4_1 weights' KleidiAI functions and the Q8_0 output's)."""
    rows: dict[str, list[dict]] = {}
    for row in stage["kernels"]:
        rows.setdefault(row["role"], []).append(row)
    return rows


def test_the_stages_of_a_request_name_the_kernels_that_ran(server: Server) -> None:
    before = inside(server)
    assert before["id"] is None and before["ids"] == [] and [s["name"] for s in before["stages"]] == ["load"]
    load = before["stages"][0]
    assert load["recorded"] and load["stack"]["ggml"] == GGML_STACKS["load"] and load["stack"]["kleidipy"]
    assert set(kernels(load)) == {"rhs_pack"}
    for repack in load["kernels"]:
        assert repack["kernel"].startswith("kai_run_rhs_pack_") and repack["calls"] > 0 and repack["seconds"] > 0
    weights = sum(r["calls"] for r in load["kernels"])  # one repack per matmul weight

    client = server.client()
    messages = [{"role": "user", "content": "Name a colour."}]
    reply = client.chat.completions.create(model=SMOLLM2, messages=messages, max_tokens=5, temperature=0)
    body = inside(server)
    assert body["id"] == reply.id and body["ids"] == [reply.id] and body["execution"] == "compiled plan"
    load, prefill, decode = body["stages"]
    assert [s["name"] for s in body["stages"]] == ["load", "prefill", "decode"]
    assert load == {**before["stages"][0], "kernels": load["kernels"]}

    assert prefill["passes"] == 1 and prefill["tokens"] == reply.usage.prompt_tokens and prefill["untimed_passes"] == 0
    rows = kernels(prefill)
    assert set(rows) == {"lhs_pack", "gemm", "gemv"}  # (the LM head of the one row kept: a GEMV)
    assert all(r["kernel"].startswith("kai_run_lhs_quant_pack_") for r in rows["lhs_pack"])
    assert all(r["kernel"].startswith("kai_run_matmul_") and r["gops"] > 0 for r in rows["gemm"])
    assert sum(r["calls"] for r in rows["gemm"] + rows["gemv"]) == weights  # every matmul of the plan, once

    # the prefill's logits give the first token: a pass per token after it
    assert decode["passes"] == decode["tokens"] == reply.usage.completion_tokens - 1 > 0
    rows = kernels(decode)
    assert set(rows) == {"lhs_pack", "gemv"} and all(r["kernel"].startswith("kai_run_matmul_") for r in rows["gemv"])
    assert sum(r["calls"] for r in rows["gemv"]) == decode["passes"] * weights  # every matmul, once a pass
    for stage in (prefill, decode):
        assert stage["stack"]["ggml"] == GGML_STACKS["run"]
        assert stage["stack"]["kleidipy"][-1] == "mul_mat" and stage["seconds"] > 0
        assert len(stage["steps"]) == stage["passes"]
        for row in stage["kernels"]:
            assert row["calls"] > 0 and 0 < row["seconds"] <= stage["seconds"] and 0 < row["share"] <= 1, row
            assert row["bytes_read"] > 0 and row["bytes_written"] > 0 and row["gbps"] > 0, row
        # (a batch's ATTENTION whose KQV a KV-cache GEMM takes names it: "ATTENTION (KQV: kai_run_…)")
        assert {op["op"].partition(" (KQV: ")[0] for op in stage["ops"]} >= {"ATTENTION", "RMS_NORM"}
        assert sum(r["seconds"] for r in stage["kernels"] + stage["ops"]) <= stage["seconds"]

    # an earlier request by its id; the last one without
    second = client.completions.create(model=SMOLLM2, prompt="One, two,", max_tokens=2, temperature=0)
    assert inside(server)["id"] == second.id and inside(server)["ids"] == [reply.id, second.id]
    again = inside(server, f"?id={reply.id}")
    assert again["id"] == reply.id and again["stages"][1:] == body["stages"][1:]


def test_unknown_and_bad_ids_are_openai_errors(server: Server) -> None:
    status, _, body = get(server, "/api/inside?id=chatcmpl-nosuchrequest")
    assert status == 404 and is_openai_error(json.loads(body), "id")
    assert json.loads(body)["error"]["code"] == "request_not_found"
    status, _, body = get(server, "/api/inside?id=")
    assert status == 400 and is_openai_error(json.loads(body), "id")


def test_layout_and_emulate_answer_the_picture_and_the_steps(server: Server) -> None:
    status, kind, body = get(server, "/api/inside/layout")
    assert status == 200 and kind == "image/svg+xml" and body.startswith(b"<") and b"<svg" in body
    status, kind, body = get(server, "/api/inside/emulate")
    assert status == 200 and kind == "application/json"
    assert json.loads(body)["steps"]


@pytest.mark.parametrize("route", ["layout", "emulate"])
@pytest.mark.parametrize(
    "query", ["?m=two", "?k=1.5", "?svl=", "?kernel=kai_run_no_such_kernel", "?kernel=%00", "?m=-3", "?k=-64", "?n=-1"]
)
def test_layout_and_emulate_of_bad_input_are_400(server: Server, route: str, query: str) -> None:
    status, _, body = get(server, f"/api/inside/{route}{query}")
    assert status == 400, body
    assert is_openai_error(json.loads(body))


@pytest.mark.parametrize("stage", sorted(KLEIDIPY_STACKS))
def test_kleidipy_stacks_name_functions_that_exist(stage: str) -> None:
    """Every frame of a kleidipy stack is a function of that module (numba's compiled ones by their Python code),
    and every frame's code names the next one (``__call__``: called as the object)."""
    caller = None
    for frame in KLEIDIPY_STACKS[stage]:
        module, _, qualname = frame.partition(":")
        obj = importlib.import_module(module)
        for part in qualname.split("."):
            obj = getattr(obj, part)
        func = getattr(obj, "py_func", obj)
        assert inspect.isfunction(func), frame
        name = qualname.rpartition(".")[2]
        if caller is not None and name != "__call__":
            assert name in inspect.getsource(caller), f"{frame} is not called from {caller.__qualname__}"
        caller = func
