"""The OpenAI-compatible HTTP server (``kleidipy serve``): :func:`serve` (:mod:`.serve`) loads a model and runs
uvicorn on :func:`create_app`'s Starlette app (:mod:`.app`); :mod:`.scheduler` shares the model between slots,
:mod:`.schemas` is the wire format."""

from kleidipy.server.app import create_app
from kleidipy.server.serve import serve

__all__ = ["create_app", "serve"]
