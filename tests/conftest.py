import pytest
import torch

from flashcute.kernels import registry


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(params=registry.FAMILIES)
def kernel(request) -> str:
    """Each kernel family by name, on the GPUs that run it: a test taking it runs once per family."""
    if request.param not in registry.available():
        pytest.skip(f"kernel {request.param} does not run on this GPU")
    return request.param
