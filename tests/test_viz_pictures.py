"""Smoke tests for the pictures the labs place: each draws from plain inputs and returns a Figure."""

from types import SimpleNamespace

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from paralab import viz  # noqa: E402
from paralab.ledger import Record  # noqa: E402


def _drawn(fig):
    assert isinstance(fig, Figure)
    fig.canvas.draw()
    plt.close(fig)


def test_plot_collective():
    before = [torch.tensor([10.0 * r]) for r in range(4)]
    _drawn(viz.plot_collective("all_gather", before, [torch.cat(before)] * 4))


def _fsdp_step(units: int, n: int, reshard: bool, replicas: int = 1) -> list[Record]:
    shard, group = 64, tuple(range(n))

    def gather(phase):
        return Record("all_gather_into_tensor", phase, group, (n - 1) * shard, (n - 1) * shard)  # noqa: E731

    records = [gather("forward") for _ in range(units)]
    for _ in range(units):
        records += [gather("backward")] if reshard else []
        records.append(
            Record("reduce_scatter_tensor", "backward", group, (n - 1) * shard, (n - 1) * shard)
        )
        if replicas > 1:
            records.append(Record("all_reduce", "backward", tuple(range(replicas)), shard, shard))
    return records


@pytest.mark.parametrize("reshard, replicas", [(True, 1), (False, 1), (True, 2)])
def test_fsdp_events_hold_nothing_after_the_step(reshard, replicas):
    records = _fsdp_step(3, 4, reshard, replicas)
    events = viz.fsdp_events(records + records)  # two steps: only the first is read
    assert sum(delta for *_, delta in events) == 0
    assert [kind for _, unit, kind, _ in events if unit == 0][:2] == ["gather", "forward"]
    assert sum(kind == "reduce-scatter" for *_, kind, _ in events) == 3
    _drawn(viz.plot_fsdp_timeline(records, resident_bytes=1024))


def test_plot_ulysses_reshape():
    _drawn(viz.plot_ulysses_reshape(4, 8, 16))
    with pytest.raises(ValueError, match="divisible by cp"):
        viz.plot_ulysses_reshape(4, 6, 16)


def test_plot_overlay_vs_consuming():
    overlay = [
        {
            "dp_shard": [r - r % 4 + i for i in range(4)],
            "dp_replicate": [r % 4, r % 4 + 4],
            "cp": [r - r % 2, r - r % 2 + 1],
        }
        for r in range(8)
    ]
    consuming = [
        {
            "dp_shard": [r % 2 + 2 * i for i in range(4)],
            "cp": [r - r % 2, r - r % 2 + 1],
            "dp_shard_cp": list(range(8)),
        }
        for r in range(8)
    ]
    _drawn(viz.plot_overlay_vs_consuming(overlay, consuming))


def test_plot_cfgp_timeline():
    _drawn(viz.plot_cfgp_timeline(2, latent_bytes=6144))


def test_plot_lb_protocol():
    moves = [
        SimpleNamespace(from_rank=0, to_rank=2, local_index=1),
        SimpleNamespace(from_rank=1, to_rank=3, local_index=0),
    ]
    _drawn(viz.plot_lb_protocol(moves, 4))
    _drawn(viz.plot_lb_protocol([], 2))


def test_plot_error_by_token_marks_exact_tokens():
    diff = torch.linspace(3.0, 0.1, 48).expand(2, 5, 48).clone()
    diff[..., 42:] = 0  # the last zigzag chunk of cp = 4 is bitwise right
    _drawn(viz.plot_error_by_token(diff, 4, zigzag=True, title="dK"))


def test_plot_scale_scatter():
    correct = torch.randn(50, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    _drawn(viz.plot_scale_scatter(correct, 4 * correct, 4, "dQ"))
