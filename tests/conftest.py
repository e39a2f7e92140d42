"""Shared test helpers: every distributed test goes through paralab.launch.run."""

import pytest


@pytest.fixture(autouse=True, scope="session")
def _one_thread_in_the_test_process():
    import torch

    torch.set_num_threads(1)
