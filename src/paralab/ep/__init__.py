"""Expert parallelism by hand: the experts of one MoE layer split over the ranks of an ep group.

A router picks each token's top-k experts (`router`), a capacity limit drops what does not
fit, dispatch sends each kept assignment to its expert's rank with one all-to-all whose
splits come from an exchange of counts, the local experts run, and combine brings the rows
back with the reverse all-to-all and sums them per token, gate-weighted (`dispatch`). The
backward of dispatch is combine's all-to-all and the reverse. The ep groups are carved
from the data-parallel ranks (`runs`); `costs` gives the bytes from the routed counts.

What production changes, each an option of `MoEConfig`: the local experts as one grouped
matmul with alignment padding (`grouped`), a per-expert bias that balances the load without
an auxiliary loss (`balance`); and `layout` counts what DeepEP's dispatch sends to each node.
"""

from paralab.ep.costs import layer_bytes, split_matrix
from paralab.ep.dispatch import (
    AllToAll,
    combine,
    dispatch,
    exchange_counts,
    expert_permutation,
    run_local_experts,
)
from paralab.ep.model import MoEConfig, MoETransformer, make_model, sample
from paralab.ep.router import capacity, capacity_keep, switch_aux_loss, top_k_route
from paralab.ep.runs import reference, train

__all__ = [
    "AllToAll",
    "MoEConfig",
    "MoETransformer",
    "capacity",
    "capacity_keep",
    "combine",
    "dispatch",
    "exchange_counts",
    "expert_permutation",
    "layer_bytes",
    "make_model",
    "reference",
    "run_local_experts",
    "sample",
    "split_matrix",
    "switch_aux_loss",
    "top_k_route",
    "train",
]
