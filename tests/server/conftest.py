"""The server tests' shared engine: SmolLM2 as shipped, one per test module."""

import pytest
from model_files import SMOLLM2, model_file

from kleidipy.runtime.generate import Engine


@pytest.fixture(scope="module")
def smollm2() -> Engine:
    model_file(SMOLLM2)
    return Engine(SMOLLM2, n_ctx=1024, progress=False)
