"""Shared test helpers: every distributed test goes through paralab.launch.run."""

import pytest


@pytest.fixture(autouse=True, scope="session")
def _one_thread_in_the_test_process():
    import torch

    torch.set_num_threads(1)


@pytest.fixture(autouse=True, scope="session")
def _one_pristine_package_per_worker(tmp_path_factory):
    """The grader builds its stubbed, compiled package copy once per batch (1.5 CPU-s); the suite
    grades ~25 batches from the same sources, so each worker builds it once and every later batch
    gets a copy of it (`copy_package`: hard links under bubblewrap; mtimes kept, so its bytecode
    stays valid)."""
    from paralab.grade import __main__ as cli
    from paralab.grade.submission import copy_package

    build, built = cli.pristine_package, []

    def copy_of_the_first(root):
        if not built:
            built.append(build(tmp_path_factory.mktemp("pristine") / "src"))
        return copy_package(built[0], root)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(cli, "pristine_package", copy_of_the_first)
        yield
