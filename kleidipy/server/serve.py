"""``kleidipy serve``: the port taken before the model loads (a busy one is one line), the model loaded, uvicorn on
:func:`~kleidipy.server.app.create_app`'s app on that socket, and a line with the chat page's URL once it serves."""

from __future__ import annotations

import contextlib
import errno
import socket
import sys

from kleidipy.runtime.generate import Engine
from kleidipy.runtime.pull import default_model
from kleidipy.server.app import MIN_SLOT_CTX, ServerConfigError, create_app, slot_context
from kleidipy.server.inside import LoadRecord
from kleidipy.target import Target


def serve(
    model: str | None = None,
    host: str = "127.0.0.1",
    port: int = 8080,
    threads: int = 1,
    ctx: int | None = None,
    parallel: int = 4,
    api_key: str | None = None,
    cors: tuple[str, ...] = (),
    target: Target | None = None,
    execution: str = "jit",
    progress: bool = True,
    log_level: str = "info",
    check_tensors: bool = True,
    repack_cache: bool = True,
    graph: bool = True,
    deterministic: bool = False,
    lookup: int = 0,
    exact_weights: bool | None = None,
) -> None:
    """Load ``model`` (None: :func:`~kleidipy.runtime.pull.default_model`) and serve it until interrupted
    (``kleidipy serve``). ``ctx`` is the total context, split
    between the ``parallel`` slots; ``target`` is a :class:`~kleidipy.target.Target` (None: resolved);
    ``deterministic``: each slot steps in a forward pass of its own (:class:`Scheduler`); ``lookup``: prompt-lookup
    drafts of up to that many tokens a step for requests that do not say. The port is taken before
    the model is loaded (a busy one is a ServerConfigError), and a line gives the page's URL once it is served."""
    import uvicorn

    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise ServerConfigError(f"--port must be in 0..65535, got {port!r}")
    slot_context(ctx or parallel * MIN_SLOT_CTX, parallel)  # fail before loading the model
    sock = listen_socket(host, port)  # likewise, and no other process can take the port while the model loads
    port = sock.getsockname()[1]  # --port 0: the one the system chose
    url = f"http://{_url_host(host)}:{port}"

    class ReadyServer(uvicorn.Server):
        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            await super().startup(sockets)
            if self.started:  # llama-server's "server is listening on" line
                print(f"kleidipy: chat page at {url}/ - OpenAI API at {url}/v1", file=sys.stderr, flush=True)

    with sock:
        load = LoadRecord()  # (the load stage of the Inside view: every repack, timed as kleidipy trace times it)
        engine = Engine(
            model or default_model(),
            target=target,
            threads=threads,
            execution=execution,
            n_ctx=ctx,
            progress=progress,
            check_tensors=check_tensors,
            repack_cache=repack_cache,
            graph=graph,
            background_compile=True,
            observers=[load],
            exact_weights=exact_weights,
        )
        engine.observers.remove(load)  # (an engine without observers runs its fast path)
        app = create_app(
            engine,
            parallel=parallel,
            api_key=api_key,
            cors=tuple(cors),
            deterministic=deterministic,
            load=load,
            lookup=lookup,
        )
        print(
            f"kleidipy: serving {app.state.model_id} on http://{host}:{port}/v1 "
            f"({parallel} slot(s) x {app.state.slot_ctx} tokens of context)",
            file=sys.stderr,
        )
        if api_key is None and host not in ("127.0.0.1", "localhost", "::1"):
            print(f"kleidipy: warning: listening on {host} without --api-key", file=sys.stderr)
        config = uvicorn.Config(app, host=host, port=port, log_level=log_level, timeout_graceful_shutdown=5)
        server = ReadyServer(config)
        with contextlib.suppress(KeyboardInterrupt):  # as uvicorn.run: Ctrl+C is the way to stop
            server.run(sockets=[sock])
    if not server.started:  # uvicorn said why (as uvicorn.run exits)
        sys.exit(3)


def listen_socket(host: str, port: int) -> socket.socket:
    """A socket bound to ``host``:``port`` as uvicorn binds one (IPv6 if the host has a colon, SO_REUSEADDR), not yet
    listening; a busy port, or a host that is not this machine's, is a ServerConfigError of one line."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    try:
        if sys.platform != "win32":  # there, SO_REUSEADDR would let it share a port that another server listens on
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise ServerConfigError(f"port {port} on {host} is in use (choose another with --port)") from None
        if exc.errno == errno.EACCES:
            message = f"no permission to listen on port {port} on {host} (choose another with --port)"
            raise ServerConfigError(message) from None
        raise ServerConfigError(f"cannot listen on {host} port {port}: {exc.strerror or exc} (check --host)") from None
    return sock


def _url_host(host: str) -> str:
    """The host of a URL to this server: a wildcard address shows as this machine's loopback, IPv6 in brackets."""
    host = {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)
    return f"[{host}]" if ":" in host else host
