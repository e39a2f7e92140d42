"""From exact bytes to seconds at real scale: an alpha-beta and roofline model on the labs' own
byte formulas, checked against published GPU measurements, and a layout planner.

- `hardware`: one set of constants per GPU preset, each with its source.
- `models`: the shapes of Llama 3.1, HunyuanVideo, ConsisID, Cosmos-Transfer2.5, Flux.
- `predict`: FLOPs / (peak x efficiency) + exposed alpha-beta time of each group's bytes,
  the bytes taken from `paralab.fsdp.costs`, `cp.costs`, `cfgp.costs`, `tp.costs`, `pp.costs`.
- `cases`, `fit`: the TOML case format and the only fitted constants.
- `plan`: every valid layout ranked, with memory per GPU against HBM.
"""

from paralab.scale.cases import Case, load_cases
from paralab.scale.fit import FITTED, fit, predict_case, relative_error
from paralab.scale.hardware import HARDWARE, Hardware, hardware
from paralab.scale.models import MODELS, ModelShape, model
from paralab.scale.predict import Layout, Link, Prediction, Workload, link_for, predict

__all__ = [
    "FITTED",
    "HARDWARE",
    "MODELS",
    "Case",
    "Hardware",
    "Layout",
    "Link",
    "ModelShape",
    "Prediction",
    "Workload",
    "fit",
    "hardware",
    "link_for",
    "load_cases",
    "model",
    "predict",
    "predict_case",
    "relative_error",
]
