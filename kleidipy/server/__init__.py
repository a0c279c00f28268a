"""The OpenAI-compatible HTTP server (``kleidipy serve``): :func:`serve` loads a model and runs uvicorn on
:func:`create_app`'s Starlette app; :mod:`.scheduler` shares the model between slots, :mod:`.schemas` is the
wire format."""

from kleidipy.server.app import create_app, serve

__all__ = ["create_app", "serve"]
