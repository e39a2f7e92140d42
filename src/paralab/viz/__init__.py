"""Pictures for the labs: one module per axis, each function returns a matplotlib Figure.

`common` holds `show`, the colours and the bug-clinic pictures every lab uses; `mesh` the
ParallelDims grids; the others are named after the axis or composition they draw.
"""

from paralab.viz.cfgp import plot_cfg_branches, plot_cfgp_timeline, plot_step_traffic
from paralab.viz.collectives import plot_collective
from paralab.viz.common import PALETTE, plot_diff_heatmap, plot_rank_strip, show
from paralab.viz.compose import plot_group_bytes, plot_rank_places
from paralab.viz.cp import (
    plot_causal_ownership,
    plot_cp_bytes,
    plot_error_by_token,
    plot_ring_timeline,
    plot_scale_scatter,
    plot_ulysses_reshape,
)
from paralab.viz.ep import (
    plot_balance_history,
    plot_drop_rate,
    plot_grouped_batch,
    plot_load_over_steps,
    plot_split_matrix,
    plot_token_journey,
    plot_tokens_per_expert,
)
from paralab.viz.fsdp import (
    fsdp_events,
    plot_fsdp_timeline,
    plot_memory,
    plot_shard_layout,
    plot_traffic,
)
from paralab.viz.mesh import plot_dp_grid, plot_overlay_vs_consuming, plot_rank_groups
from paralab.viz.pipeline import plot_bytes_by_phase, plot_pipeline_memory, plot_pipeline_samples
from paralab.viz.pp import plot_bubble_vs_m, plot_pipeline_timeline
from paralab.viz.scale import (
    plot_alpha_beta,
    plot_axis_seconds,
    plot_cosmos_step_bytes,
    plot_plan,
    plot_prediction_scatter,
    plot_ring_efficiency,
    plot_roofline,
)
from paralab.viz.tp import (
    plot_activation_memory,
    plot_block_regions,
    plot_phase_bytes,
    plot_weight_split,
)
from paralab.viz.train import (
    plot_ac_activation_memory,
    plot_group_phase_bytes,
    plot_token_ownership,
    plot_wrapper_nesting,
)
from paralab.viz.vae_lb import plot_cost_fit, plot_lb_loads, plot_lb_protocol

__all__ = [
    "PALETTE",
    "fsdp_events",
    "plot_ac_activation_memory",
    "plot_activation_memory",
    "plot_balance_history",
    "plot_block_regions",
    "plot_bubble_vs_m",
    "plot_bytes_by_phase",
    "plot_causal_ownership",
    "plot_cfg_branches",
    "plot_cfgp_timeline",
    "plot_collective",
    "plot_cost_fit",
    "plot_cp_bytes",
    "plot_diff_heatmap",
    "plot_dp_grid",
    "plot_drop_rate",
    "plot_error_by_token",
    "plot_fsdp_timeline",
    "plot_group_bytes",
    "plot_group_phase_bytes",
    "plot_lb_loads",
    "plot_lb_protocol",
    "plot_memory",
    "plot_overlay_vs_consuming",
    "plot_phase_bytes",
    "plot_pipeline_memory",
    "plot_pipeline_samples",
    "plot_pipeline_timeline",
    "plot_rank_groups",
    "plot_rank_places",
    "plot_rank_strip",
    "plot_ring_timeline",
    "plot_scale_scatter",
    "plot_shard_layout",
    "plot_split_matrix",
    "plot_grouped_batch",
    "plot_load_over_steps",
    "plot_step_traffic",
    "plot_token_journey",
    "plot_token_ownership",
    "plot_tokens_per_expert",
    "plot_traffic",
    "plot_ulysses_reshape",
    "plot_weight_split",
    "plot_wrapper_nesting",
    "show",
    "plot_alpha_beta",
    "plot_axis_seconds",
    "plot_cosmos_step_bytes",
    "plot_plan",
    "plot_prediction_scatter",
    "plot_ring_efficiency",
    "plot_roofline",
]
