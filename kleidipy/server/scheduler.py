"""Slots and the compute thread: P sequences share one loaded model, each with its own KV cache. The
:class:`Scheduler` owns P :class:`Slot` s and the one worker thread that touches the model, and gives every busy slot
one step in one forward pass (continuous batching, as llama-server does).

Details (rounds, determinism, cancellation): docs/server.md."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from kleidipy.errors import KleidipyError
from kleidipy.runtime.generate import Generation
from kleidipy.runtime.kv_cache import KVCache
from kleidipy.runtime.layers import CausalLM
from kleidipy.server.inside import InsideRecorder
from kleidipy.server.schemas import APIError

log = logging.getLogger("kleidipy.server")

Event = tuple[Literal["text", "done", "error", "disconnect"], Any]


@dataclass(eq=False)
class Job:
    """A generation submitted by a request handler; its events (``("text", piece)``, ``("done", None)``,
    ``("error", APIError)``) arrive on ``events`` in the handler's event loop."""

    generation: Generation
    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue[Event] = field(default_factory=asyncio.Queue)
    cancelled: bool = False
    #: reuse the longest prefix of the prompt a slot's KV cache holds (llama-server's ``cache_prompt``)
    cache_prompt: bool = True
    #: the id of the request it answers (a choice of it): the Inside view records its passes under it
    request: str = ""

    def cancel(self) -> None:
        """Stop generating (checked by the worker before each step); the slot is freed."""
        self.cancelled = True

    def post(self, kind: str, payload: Any = None) -> None:
        """Deliver an event from the worker thread (dropped if the event loop is already closed)."""
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, (kind, payload))
        except RuntimeError:
            self.cancelled = True


@dataclass
class Stats:
    """What the scheduler has done since it started (read by ``/metrics``)."""

    prompt_tokens: int = 0
    predicted_tokens: int = 0
    requests: int = 0
    forward_seconds: float = 0.0
    #: forward passes run, and the sequences they ran (summed over the passes: their ratio is the mean batch)
    forward_passes: int = 0
    forward_sequences: int = 0


@dataclass(eq=False)
class Slot:
    """One sequence's KV cache and the job using it (None: idle)."""

    index: int
    cache: KVCache
    job: Job | None = None


class Scheduler:
    """P slots over one model, a FIFO queue and the compute thread (see docs/server.md)."""

    def __init__(
        self,
        lm: CausalLM,
        parallel: int,
        n_ctx: int,
        max_queue: int = 1024,
        deterministic: bool = False,
        n_batch: int | None = None,
        poll: Callable[[], object] = lambda: None,
        exact_rows: bool = False,
    ) -> None:
        self.lm = lm
        #: whether a batch's rows are each a decoded token's (the model's weights' kernels say: the backend's
        #: ``exact_rows``); else a pass that verifies a draft runs every matmul's GEMV
        self.exact_rows = exact_rows
        #: called before each round: the engine takes its compiled plan there once a background build is over
        self._poll = poll
        self.n_ctx = n_ctx
        self.max_queue = max_queue
        #: one forward pass per slot and step (reproducible replies) instead of one per round for all slots
        self.deterministic = deterministic
        #: rows of a batched forward pass (decode tokens first, then prompt chunks); default the model's n_ubatch
        self.n_batch = lm.n_ubatch if n_batch is None else n_batch
        self.slots = [Slot(i, lm.new_cache(n_ctx)) for i in range(parallel)]
        self._queue: deque[Job] = deque()
        self._embeds: deque[tuple[list[int], asyncio.Future, asyncio.AbstractEventLoop]] = deque()
        self.stats = Stats()
        self._cond = threading.Condition()
        self._stopping = False
        self._thread: threading.Thread | None = None
        #: told of every forward pass (:class:`~kleidipy.server.inside.InsideRecorder`), or None
        self.inside: InsideRecorder | None = None

    @property
    def busy(self) -> int:
        return sum(slot.job is not None for slot in self.slots)

    @property
    def queued(self) -> int:
        return len(self._queue)

    def start(self) -> None:
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="kleidipy-compute", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Finish the current step, fail every unfinished job, and end the thread."""
        with self._cond:
            self._stopping = True
            self._cond.notify()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def submit(self, job: Job) -> None:
        """Queue a job (503 when the queue is full or the server is stopping)."""
        with self._cond:
            if self._stopping or self._thread is None:
                raise _shutting_down()
            if len(self._queue) >= self.max_queue:
                raise APIError(503, f"the server is busy ({len(self._queue)} requests queued)", "server_error")
            self._queue.append(job)
            self._cond.notify()

    def embed(self, ids: Sequence[int], loop: asyncio.AbstractEventLoop) -> asyncio.Future:
        """Queue an embedding of ``ids`` (computed by the compute thread between generation steps); the future
        resolves to the float32 vector or to the error."""
        future = loop.create_future()
        with self._cond:
            if self._stopping or self._thread is None:
                raise _shutting_down()
            self._embeds.append((list(ids), future, loop))
            self._cond.notify()
        return future

    def _run_embeds(self) -> None:
        while True:
            with self._cond:
                if not self._embeds:
                    return
                ids, future, loop = self._embeds.popleft()
            try:
                result: Any = self.lm.embed(ids)
            except Exception as exc:  # a failing embedding must not take the server down
                result = exc if isinstance(exc, APIError) else APIError(500, f"embedding failed: {exc}", "server_error")
            with contextlib.suppress(RuntimeError):  # the event loop is gone: nobody waits any more
                loop.call_soon_threadsafe(_resolve, future, result)

    def withdraw(self, job: Job) -> None:
        """Cancel ``job``: it leaves the queue now, or its slot before the next step."""
        job.cancel()
        with self._cond:
            if job in self._queue:
                self._queue.remove(job)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._stopping and not self._queue and not self.busy and not self._embeds:
                    self._cond.wait()
                if self._stopping:
                    break
                self._admit()
            self._poll()
            self._run_embeds()
            if self.deterministic:
                for slot in self.slots:
                    if slot.job is not None:
                        self._step(slot)
            else:
                self._step_all()
        with self._cond:
            pending = [s.job for s in self.slots if s.job is not None] + list(self._queue)
            self._queue.clear()
            embeds, self._embeds = list(self._embeds), deque()
        for _, future, loop in embeds:
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(_resolve, future, _shutting_down())
        for slot in self.slots:
            slot.job = None
        for job in pending:
            job.post("error", _shutting_down())

    def _admit(self) -> None:
        """Queued jobs into free slots, in order; each takes the free slot whose cache holds the longest prefix of
        its prompt and prefills only the rest (llama-server's prompt cache; a job with ``cache_prompt`` off
        starts from an empty cache)."""
        free = [slot for slot in self.slots if slot.job is None]
        while free and self._queue:
            job = self._queue.popleft()
            if job.cancelled:
                continue
            gen = job.generation
            slot = max(free, key=lambda s: s.cache.shared_prefix(gen.prompt) if job.cache_prompt else 0)
            free.remove(slot)
            if not job.cache_prompt:
                slot.cache.clear()
            gen.n_past = gen.n_cached = slot.cache.reuse(gen.prompt)
            slot.job = job

    def _step(self, slot: Slot) -> None:
        """One step of the slot's job in a forward pass of its own."""

        def forward(ids: Sequence[int]) -> np.ndarray:
            return self._forward([(slot.cache, ids, slot.job.generation.n_past)])[0]

        def forward_rows(ids: Sequence[int]) -> np.ndarray:
            return self._forward([(slot.cache, ids, slot.job.generation.n_past)], [True])[0]

        self._advance(slot, lambda gen: gen.step(forward, forward_rows))

    def _step_all(self) -> None:
        """One step of every busy slot in one forward pass: decoding slots first, then prompt chunks up to
        ``n_batch`` rows in all (a prompt that does not fit waits for a later round)."""
        for slot in self.slots:
            if slot.job is not None and slot.job.cancelled:
                slot.job = None
        busy = [slot for slot in self.slots if slot.job is not None]
        busy.sort(key=lambda slot: slot.job.generation.prefilling)
        budget, batch = self.n_batch, []
        for slot in busy:
            gen = slot.job.generation
            ids = gen.next_ids()[: max(budget, 0)] if gen.prefilling else gen.next_ids()
            if ids:
                batch.append((slot, ids))
                budget -= len(ids)
        if not batch:
            return
        try:
            parts = [(slot.cache, ids, slot.job.generation.n_past) for slot, ids in batch]
            rows = [bool(slot.job.generation.draft) for slot, _ in batch]
            logits = self._forward(parts, rows) if any(rows) else self._forward(parts)
        except Exception:  # run again slot by slot, so that only a job whose own pass fails ends
            for slot, _ in batch:
                slot.cache.n_past = slot.job.generation.n_past
                self._step(slot)
            return
        for (slot, ids), row in zip(batch, logits, strict=True):
            n = len(ids)
            self._advance(slot, lambda gen, n=n, row=row: gen.advance(n, row))

    def _advance(self, slot: Slot, step: Callable[[Generation], str]) -> None:
        """Run ``step`` on the slot's job and deliver its text; a job that fails or finishes frees the slot."""
        job = slot.job
        assert job is not None
        if job.cancelled:
            slot.job = None
            return
        try:
            piece = step(job.generation)
            slot.cache.n_past = job.generation.n_past  # (past a draft's rejected rows)
        except Exception as exc:  # one failing job must not take the others down
            if not isinstance(exc, KleidipyError):
                log.exception("generation failed in slot %d", slot.index)
            slot.job = None
            job.post("error", APIError(500, f"generation failed: {exc}", "server_error"))
            return
        done = job.generation.done
        if done:  # the slot is free before the handler hears of it, so /health agrees with what clients saw
            slot.job = None
            self.stats.prompt_tokens += len(job.generation.prompt)
            self.stats.predicted_tokens += job.generation.n_generated
            self.stats.requests += 1
        if piece:
            job.post("text", piece)
        if done:
            job.post("done")

    def _forward(
        self, parts: list[tuple[KVCache, Sequence[int], int]], rows: list[bool] | None = None
    ) -> list[np.ndarray]:
        """The logits of each part (cache, ids, first position) in one forward pass: its last token's, or every
        row's for a part that drafted (``rows``), each then as a decode step computes it (told to :attr:`inside`
        when it succeeds)."""
        inside = self.inside
        if inside is not None:
            inside.before_pass()
        t0 = time.perf_counter()
        logits = None
        try:
            if rows is None:
                logits = self.lm.forward_batch(parts)
            else:
                logits = self.lm.forward_batch(parts, all_logits=rows, as_decoded=not self.exact_rows)
            return logits
        finally:
            seconds = time.perf_counter() - t0
            self.stats.forward_seconds += seconds
            self.stats.forward_passes += 1
            self.stats.forward_sequences += len(parts)
            if inside is not None and logits is not None:
                jobs = {id(slot.cache): slot.job for slot in self.slots}
                seqs = [(jobs[id(kv)], len(ids)) for kv, ids, _ in parts]
                record = [(job.request, job.generation.prefilling, n) for job, n in seqs if job is not None]
                inside.after_pass(record, sum(n for _, n in seqs), seconds)


def _shutting_down() -> APIError:
    return APIError(503, "the server is shutting down", "server_error", code="unavailable")


def _resolve(future: asyncio.Future, result: Any) -> None:
    if not future.done():
        if isinstance(result, BaseException):
            future.set_exception(result)
        else:
            future.set_result(result)
