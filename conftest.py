import pytest
import torch


@pytest.fixture(scope="session", autouse=True)
def _one_thread():
    """One intra-op thread for the whole session (tiny models: more threads only add contention on a 2-core box).
    Session-scoped, so module-scoped fixtures that build models run under it too; the count is restored after."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
