import pytest
import torch

from specterbench.plugins import get_host, reset_host

PROMPTS = [
    ("p0", "Shall I compare thee to a summer's day? Thou art more lovely and more temperate."),
    ("p1", "To be, or not to be, that is the question: whether 'tis nobler in the mind"),
    ("p2", "Now is the winter of our discontent made glorious summer by this sun of York"),
]


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)


@pytest.fixture
def host():
    reset_host()
    yield get_host()
    reset_host()


@pytest.fixture
def small_prompts(monkeypatch):
    """Three short fixed prompts in place of the shipped workloads, to keep engine tests fast."""
    import specterbench.runner as runner

    monkeypatch.setattr(runner, "load_prompts", lambda name, n: PROMPTS[:n])
    return PROMPTS
