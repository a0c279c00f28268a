"""The OpenAI-compatible HTTP server: a Starlette ASGI app over one loaded :class:`~kleidipy.runtime.generate.Engine`
(:func:`create_app`).

Routes, limits and context: docs/server.md."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import hmac
import importlib.resources
import json
import os
import re
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from kleidipy.errors import KleidipyError
from kleidipy.runtime.chat_template import ChatTemplateError
from kleidipy.runtime.generate import Engine, Generation, PromptError
from kleidipy.runtime.pull import CATALOGUE
from kleidipy.server.inside import InsideRecorder, LoadRecord, inside_routes
from kleidipy.server.metrics import CONTENT_TYPE as METRICS_TYPE
from kleidipy.server.metrics import metrics_text
from kleidipy.server.scheduler import Job, Scheduler
from kleidipy.server.schemas import (
    APIError,
    GenerationRequest,
    check_token_ids,
    chunk_object,
    completion_object,
    invalid,
    logprobs_object,
    parse_chat,
    parse_completion,
    parse_detokenize,
    parse_embeddings,
    parse_tokenize,
    usage,
)

MAX_BODY = 1 << 20  # bytes
MIN_SLOT_CTX = 16  # tokens
#: the chat page served at ``GET /`` (package data: one HTML file, its own script and style inline)
CHAT_PAGE = importlib.resources.files("kleidipy.server") / "static" / "chat.html"
#: the browser scripts the page loads from this server (package data: marked and DOMPurify, vendor/README.md)
VENDOR = importlib.resources.files("kleidipy.server") / "static" / "vendor"


def chat_page_csp(page: bytes) -> str:
    """The chat page's Content-Security-Policy: scripts from this server and the page's own inline ``<script>`` and
    ``<style>``, allowed by their SHA-256 (so no other inline script, handler or style attribute runs, whatever
    the rendered Markdown holds); calls to this server; nothing else (no other site, no frames)."""

    def hashes(tag: bytes) -> str:
        bodies = re.findall(rb"<%s>(.*?)</%s>" % (tag, tag), page, re.DOTALL)
        # the browser hashes the element's text, whose line ends the HTML parser made \n
        digests = (hashlib.sha256(b.replace(b"\r\n", b"\n").replace(b"\r", b"\n")).digest() for b in bodies)
        return "".join(f" 'sha256-{base64.b64encode(d).decode()}'" for d in digests)

    styles = hashes(b"style") or " 'none'"
    return (
        f"default-src 'none'; script-src 'self'{hashes(b'script')}; style-src{styles}; connect-src 'self'; "
        "img-src data: blob:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    )


class ServerConfigError(KleidipyError, ValueError):
    """Server options that cannot work together (no slots, too little context per slot)."""


def error_response(exc: APIError) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status)


class APIKeyMiddleware:
    """Answers 401 unless the request carries ``Authorization: Bearer <key>`` (the scheme in any case, RFC 7235);
    the chat page itself (``GET /`` and its ``/static/`` scripts) holds no secret and is served to anyone, its API
    calls send the key."""

    def __init__(self, app: ASGIApp, api_key: str) -> None:
        self.app = app
        self.key = api_key.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and not (_page_path(scope["path"]) and scope["method"] in ("GET", "HEAD")):
            given = next((v for k, v in scope["headers"] if k == b"authorization"), b"")
            scheme, _, token = given.strip(b" ").partition(b" ")
            if not (scheme.lower() == b"bearer" and hmac.compare_digest(token.lstrip(b" "), self.key)):
                message = "invalid API key: send it as 'Authorization: Bearer <key>'"
                await error_response(APIError(401, message, code="invalid_api_key"))(scope, receive, send)
                return
        await self.app(scope, receive, send)


def _page_path(path: str) -> bool:
    """Whether ``path`` is the chat page's (the page or one of its scripts): served without the API key."""
    return path == "/" or path.startswith("/static/")


#: origins a browser page may call the API from without --cors: pages served from this machine
_LOOPBACK = re.compile(r"^https?://(localhost|127\.0\.0\.1|\[::1\])(:\d+)?$")


class OriginMiddleware:
    """Answers 403 to a request whose ``Origin`` header names a web page on another site than this machine,
    unless ``--cors`` allows that origin ("*": every origin): a page a user happens to open cannot drive the local
    API (ollama's OLLAMA_ORIGINS idea). Requests without an Origin (curl, SDKs) are not concerned."""

    def __init__(self, app: ASGIApp, allowed: frozenset[str]) -> None:
        self.app, self.allowed = app, allowed

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            origin = next((v for k, v in scope["headers"] if k == b"origin"), None)
            if origin is not None and not self.allows(origin.decode("latin-1")):
                message = (
                    f"cross-origin request from {origin.decode('latin-1')!r} refused (allow it with --cors ORIGIN)"
                )
                await error_response(APIError(403, message, "permission_error", code="origin_not_allowed"))(
                    scope, receive, send
                )
                return
        await self.app(scope, receive, send)

    def allows(self, origin: str) -> bool:
        return "*" in self.allowed or origin in self.allowed or bool(_LOOPBACK.match(origin))


def slot_context(n_ctx: int, parallel: int) -> int:
    """Tokens of context per slot when ``n_ctx`` is split between ``parallel`` slots (ServerConfigError if the
    options cannot work)."""
    if parallel < 1:
        raise ServerConfigError(f"--parallel must be >= 1, got {parallel}")
    if n_ctx // parallel < MIN_SLOT_CTX:
        raise ServerConfigError(
            f"a context of {n_ctx} tokens split between {parallel} slots leaves {n_ctx // parallel} per slot "
            f"(at least {MIN_SLOT_CTX} needed): raise --ctx or lower --parallel"
        )
    return n_ctx // parallel


def model_id(engine: Engine) -> str:
    """The name the server answers to: the catalogue name, or the GGUF file name."""
    name = os.fspath(engine.model)
    return name if name in CATALOGUE else engine.path.name


def create_app(
    engine: Engine,
    parallel: int = 4,
    api_key: str | None = None,
    max_body: int = MAX_BODY,
    max_queue: int = 1024,
    cors: tuple[str, ...] = (),
    deterministic: bool = False,
    load: LoadRecord | None = None,
    lookup: int = 0,
) -> Starlette:
    """The ASGI app serving ``engine`` with ``parallel`` slots (the scheduler thread runs during the app's
    lifespan; ``app.state.scheduler`` is the :class:`Scheduler`, which batches the slots' steps unless
    ``deterministic``); browser pages from the ``cors`` origins (and from this machine) may call it. ``load``: the
    engine's load as recorded (the Inside view's load stage; None: not recorded); ``lookup``: the prompt-lookup
    drafts of a request that does not say (its ``lookup`` field)."""
    slot_ctx = slot_context(engine.context_length, parallel)
    scheduler = Scheduler(
        engine.lm,
        parallel,
        slot_ctx,
        max_queue,
        deterministic=deterministic,
        poll=engine.poll_compiled,
        exact_rows=engine.backend.exact_rows,
    )
    name = model_id(engine)
    inside = scheduler.inside = InsideRecorder(engine.lm, name, engine.target.describe(), engine.threads, load)
    aliases = {name, os.fspath(engine.model), engine.path.name}
    created = int(engine.path.stat().st_mtime)
    tokenizer = engine.tokenizer

    def piece(token: int) -> bytes:
        return tokenizer.decode_bytes([token])

    def model_card() -> dict[str, Any]:
        meta = {"n_ctx": engine.context_length, "n_ctx_slot": slot_ctx, "parallel": parallel}
        return {"id": name, "object": "model", "created": created, "owned_by": "kleidipy", "meta": meta}

    async def read_json(request: Request) -> Any:
        ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if ctype != "application/json":
            raise APIError(415, f"Content-Type must be application/json, got {ctype or 'none'!r}")
        too_large = APIError(413, f"the request body is larger than {max_body} bytes", code="request_too_large")
        length = request.headers.get("content-length", "")
        if length.isdigit() and int(length) > max_body:
            raise too_large
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > max_body:
                raise too_large
        try:
            return json.loads(body)
        except (ValueError, RecursionError) as exc:
            raise invalid(None, f"the request body is not valid JSON: {exc}", "invalid_json") from None

    def prompt_ids(req: GenerationRequest) -> list[int]:
        """Token ids of the request (runs in a worker thread: tokenizing a large prompt takes a while)."""
        param = "messages" if req.kind == "chat" else "prompt"
        if isinstance(req.prompt, tuple):
            check_token_ids(req.prompt, tokenizer.n_vocab, param)
            ids = list(req.prompt)
        else:
            try:
                ids = engine.chat_prompt(req.messages) if req.kind == "chat" else engine.prompt(req.prompt)
            except (ChatTemplateError, PromptError) as exc:
                raise invalid(param, str(exc)) from None
        if not ids:
            raise invalid(param, "the prompt is empty")
        if len(ids) > slot_ctx:
            message = f"the prompt is {len(ids)} tokens, more than the context of {slot_ctx} tokens per slot"
            raise invalid(param, message, "context_length_exceeded")
        return ids

    def generations(req: GenerationRequest) -> list[Generation]:
        """One sequence per choice, seed + i, so a seeded request repeats every choice (runs in a worker thread:
        tokenizing a large prompt, or the grammar's first view of the vocabulary, takes a while)."""
        ids = prompt_ids(req)
        return [
            Generation(
                tokenizer,
                ids,
                slot_ctx,
                req.max_tokens,
                req.params,
                None if req.seed is None else req.seed + i,
                req.stop,
                chunk=engine.lm.n_ubatch,
                logprobs=req.logprobs,
                grammar=req.grammar,
                lookup=lookup if req.lookup is None else req.lookup,
            )
            for i in range(req.n)
        ]

    async def generate(request: Request, req: GenerationRequest) -> Response:
        if req.max_tokens is not None and req.max_tokens > slot_ctx:
            message = f"max_tokens={req.max_tokens} is more than the context ({slot_ctx} tokens)"
            raise invalid("max_tokens", message, "invalid_value")
        loop = asyncio.get_running_loop()
        ident = f"{'chatcmpl' if req.kind == 'chat' else 'cmpl'}-{uuid.uuid4().hex}"
        gens = await run_in_threadpool(generations, req)
        jobs = [Job(gen, loop, cache_prompt=req.cache_prompt, request=ident) for gen in gens]
        try:
            for job in jobs:
                scheduler.submit(job)
        except APIError:
            for job in jobs:
                scheduler.withdraw(job)
            raise
        watcher = asyncio.create_task(watch_disconnect(request, jobs))
        stamp = int(time.time())
        if req.stream:
            return StreamingResponse(
                stream(req, jobs, watcher, ident, stamp),
                media_type="text/event-stream",
                headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
            )

        async def answer(job: Job) -> tuple[str, Any, dict | None]:
            pieces = []
            async for kind, payload in events(job):
                if kind == "error":
                    raise payload
                pieces.append(payload)
            gen = job.generation
            lps = None if req.logprobs is None else logprobs_object(req.kind, gen.token_logprobs, piece)
            return "".join(pieces), gen.finish_reason, lps

        try:
            answers = await asyncio.gather(*(answer(job) for job in jobs))
        finally:
            for job in jobs:
                scheduler.withdraw(job)
            watcher.cancel()
        return JSONResponse(completion_object(req.kind, ident, stamp, name, answers, jobs_usage(jobs)))

    async def stream(
        req: GenerationRequest, jobs: list[Job], watcher: asyncio.Task, ident: str, stamp: int
    ) -> AsyncIterator[str]:
        def sse(obj: dict[str, Any]) -> str:
            return f"data: {json.dumps(obj, ensure_ascii=False, separators=(',', ':'))}\n\n"

        def chunk(text: str = "", **kw: Any) -> str:
            return sse(chunk_object(req.kind, ident, stamp, name, text, include_usage=req.include_usage, **kw))

        sent = [0] * len(jobs)

        def new_logprobs(i: int) -> dict | None:
            """The log-probabilities of choice i's tokens generated since its last chunk (those of text still held
            back for a stop string come with the chunk that sends it or with the last one)."""
            if req.logprobs is None:
                return None
            entries = jobs[i].generation.token_logprobs[sent[i] :]
            sent[i] += len(entries)
            return logprobs_object(req.kind, entries, piece)

        merged: asyncio.Queue[tuple[int, str, Any]] = asyncio.Queue()

        async def pump(i: int, job: Job) -> None:
            async for kind, payload in events(job):
                await merged.put((i, kind, payload))
            await merged.put((i, "end", None))

        pumps = [asyncio.create_task(pump(i, job)) for i, job in enumerate(jobs)]
        try:
            if req.kind == "chat":
                for i in range(len(jobs)):
                    yield chunk(first=True, index=i)
            open_jobs = len(jobs)
            while open_jobs:
                i, kind, payload = await merged.get()
                if kind == "error":
                    yield sse(payload.body())
                    return
                if kind == "text":
                    yield chunk(payload, logprobs=new_logprobs(i), index=i)
                    continue
                open_jobs -= 1  # "end": the choice is finished, or the client is gone
                if not jobs[i].cancelled:
                    yield chunk(finish=jobs[i].generation.finish_reason, logprobs=new_logprobs(i), index=i)
            if any(job.cancelled for job in jobs):  # the client is gone
                return
            if req.include_usage:
                yield chunk(use=jobs_usage(jobs))
            yield "data: [DONE]\n\n"
        finally:
            for task in pumps:
                task.cancel()
            for job in jobs:
                scheduler.withdraw(job)
            watcher.cancel()

    async def chat_completions(request: Request) -> Response:
        return await generate(request, parse_chat(await read_json(request)))

    async def completions(request: Request) -> Response:
        return await generate(request, parse_completion(await read_json(request)))

    async def tokenize(request: Request) -> Response:
        req = parse_tokenize(await read_json(request))
        ids = await run_in_threadpool(tokenizer.encode, req.content, req.add_special, req.parse_special)
        if req.with_pieces:
            pieces = [{"id": t, "piece": tokenizer.decode([t])} for t in ids]
            return JSONResponse({"tokens": pieces})
        return JSONResponse({"tokens": ids})

    async def detokenize(request: Request) -> Response:
        ids = parse_detokenize(await read_json(request), tokenizer.n_vocab)
        return JSONResponse({"content": await run_in_threadpool(tokenizer.decode, ids)})

    async def embeddings(request: Request) -> Response:
        items, encoding = parse_embeddings(await read_json(request))

        def token_ids(item: str | list[int]) -> list[int]:
            ids = tokenizer.encode(item, add_special=True) if isinstance(item, str) else item
            check_token_ids(ids, tokenizer.n_vocab, "input")
            if not ids or len(ids) > slot_ctx:
                raise invalid("input", f"an input must be 1..{slot_ctx} tokens, got {len(ids)}", "invalid_value")
            return ids

        batches = [await run_in_threadpool(token_ids, item) for item in items]
        loop = asyncio.get_running_loop()
        vectors = [await scheduler.embed(ids, loop) for ids in batches]
        n = sum(len(ids) for ids in batches)
        data = [
            {"object": "embedding", "index": i, "embedding": v.tolist() if encoding == "float" else _base64(v)}
            for i, v in enumerate(vectors)
        ]
        return JSONResponse(
            {"object": "list", "data": data, "model": name, "usage": {"prompt_tokens": n, "total_tokens": n}}
        )

    async def metrics(request: Request) -> Response:
        return Response(metrics_text(scheduler), media_type=METRICS_TYPE)

    page = CHAT_PAGE.read_bytes()
    page_csp = chat_page_csp(page)
    scripts = {f.name: f.read_bytes() for f in VENDOR.iterdir() if f.name.endswith(".js")}
    etags = {name: f'"{hashlib.sha256(data).hexdigest()[:32]}"' for name, data in scripts.items()}

    async def chat_page(request: Request) -> Response:
        """``GET /``: the chat page, a static HTML file whose script streams replies from ``/v1/chat/completions``
        (same origin, so the Origin rules let it in; an API key is typed into the page)."""
        return HTMLResponse(page, headers={"Content-Security-Policy": page_csp, "Cache-Control": "no-cache"})

    async def vendor_script(request: Request) -> Response:
        """``GET /static/vendor/NAME``: a script of the chat page (revalidated by its ETag: 304 when unchanged)."""
        name = request.path_params["name"]
        if name not in scripts:
            raise HTTPException(404)
        headers = {"ETag": etags[name], "Cache-Control": "no-cache", "X-Content-Type-Options": "nosniff"}
        if etags[name] in request.headers.get("if-none-match", ""):
            return Response(status_code=304, headers=headers)
        return Response(scripts[name], media_type="text/javascript; charset=utf-8", headers=headers)

    async def health(request: Request) -> Response:
        busy = scheduler.busy
        body = {"status": "ok", "slots_idle": parallel - busy, "slots_processing": busy, "queued": scheduler.queued}
        return JSONResponse(body)

    async def models(request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [model_card()]})

    async def model(request: Request) -> Response:
        if request.path_params["model"] not in aliases:
            raise APIError(404, f"the model {request.path_params['model']!r} does not exist", code="model_not_found")
        return JSONResponse(model_card())

    async def on_api_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, APIError)
        return error_response(exc)

    async def on_http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        return error_response(APIError(exc.status_code, f"{exc.detail}: {request.method} {request.url.path}", kind))

    async def on_crash(request: Request, exc: Exception) -> Response:
        return error_response(APIError(500, f"internal error: {exc}", "server_error"))

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        scheduler.start()
        try:
            yield
        finally:
            await run_in_threadpool(scheduler.stop)

    app = Starlette(
        routes=[
            Route("/", chat_page, methods=["GET"]),
            Route("/static/vendor/{name}", vendor_script, methods=["GET"]),
            Route("/health", health, methods=["GET"]),
            Route("/v1/models", models, methods=["GET"]),
            Route("/v1/models/{model:path}", model, methods=["GET"]),
            Route("/v1/chat/completions", chat_completions, methods=["POST"]),
            Route("/v1/completions", completions, methods=["POST"]),
            Route("/v1/embeddings", embeddings, methods=["POST"]),
            Route("/tokenize", tokenize, methods=["POST"]),
            Route("/metrics", metrics, methods=["GET"]),
            *inside_routes(inside),
            Route("/detokenize", detokenize, methods=["POST"]),
        ],
        middleware=[
            Middleware(OriginMiddleware, allowed=frozenset(cors)),
            Middleware(
                CORSMiddleware,
                allow_origins=list(cors),
                allow_origin_regex=_LOOPBACK.pattern,
                allow_methods=["*"],
                allow_headers=["*"],
            ),
            *([Middleware(APIKeyMiddleware, api_key=api_key)] if api_key else []),
        ],
        exception_handlers={APIError: on_api_error, HTTPException: on_http_error, Exception: on_crash},
        lifespan=lifespan,
    )
    app.state.scheduler = scheduler
    app.state.model_id = name
    app.state.slot_ctx = slot_ctx
    return app


async def events(job: Job) -> AsyncIterator[tuple[str, Any]]:
    """The job's ("text", piece) and ("error", APIError) events until it is done (or the client is gone)."""
    while True:
        kind, payload = await job.events.get()
        if kind in ("done", "disconnect"):
            return
        yield kind, payload
        if kind == "error":
            return


def jobs_usage(jobs: list[Job]) -> dict[str, Any]:
    """The usage of a request answered by ``jobs`` (one per choice, same prompt): every choice's tokens."""
    first = jobs[0].generation
    return usage(len(first.prompt), sum(job.generation.n_generated for job in jobs), first.n_cached)


async def watch_disconnect(request: Request, jobs: list[Job]) -> None:
    """Cancel the request's ``jobs`` (and wake whoever waits on their events) when the client goes away."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
    for job in jobs:
        job.cancel()
        job.events.put_nowait(("disconnect", None))


def _base64(vector: np.ndarray) -> str:
    """An embedding as OpenAI's base64 encoding: the little-endian float32 bytes."""
    return base64.b64encode(np.asarray(vector, "<f4").tobytes()).decode("ascii")
