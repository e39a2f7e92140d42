"""Model presets: the shapes the FLOP, byte and memory counts need, each with its config's source.

Two kinds. A language model (`lm`): Llama 3.1's blocks, grouped-query attention and SwiGLU,
causal. A diffusion transformer (`dit`): full (non-causal) self-attention over the video
tokens plus the text tokens, one forward per branch and denoising step. `attention` is an
attention layer alone (the ring-flash-attention benchmark's shape).

`matmul_per_layer` is the weights every token multiplies by in one layer (its GEMM FLOPs are
2 x that per token); `params` is what the GPU stores (for HunyuanVideo's two-stream blocks the
text and video streams have their own weights, so `params` > what one token passes through).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

SOURCES = {
    "llama3": "pytorch/torchtitan@820504e:torchtitan/models/llama3/__init__.py "
    "(dim, n_layers, n_heads, n_kv_heads, ffn_dim_multiplier, multiple_of); vocab 128,256, the "
    "Llama 3 tokenizer's (set from it in model.py)",
    "hunyuanvideo": "Tencent/HunyuanVideo@fa14b00:hyvideo/modules/models.py "
    "(HYVideo-T/2-cfgdistill: 20 double + 40 single blocks, hidden 3072, 24 heads, mlp x4; "
    "text 256 tokens; VAE 4x8x8, patch 1x2x2; cfg-scale 1: one forward a step)",
    "consisid": "THUDM/CogVideo@e519ece:sat/configs/cogvideox_5b_i2v.yaml, the CogVideoX-5B-I2V "
    "transformer ConsisID is trained from (PKU-YuanGroup/ConsisID@60429e4:train_single_rank.sh): "
    "num_layers 42, hidden_size 3072, 48 heads of hidden_size_head 64, patch 2, text_length 226, "
    "time_embed_dim 512 (two 512 -> 6h modulations a layer), mlp x4; VAE 4x8x8; plus "
    "PKU-YuanGroup/ConsisID@60429e4:models/transformer_consisid.py's face cross-attentions, one "
    "every cross_attn_interval 2 layers (PerceiverCrossAttention: q 3072 -> 16 x 128 and out "
    "back on every token, kv from kv_dim 2048; its 32 face tokens' attention is not counted); "
    "guidance 6: two branches",
    "cosmos-transfer2.5-2b": "nvidia-cosmos/cosmos-transfer2.5@ecbc860:cosmos_transfer2/_src/"
    "interactive/configs/registry_defaults/net_transfer.py (28 blocks, 2048, 16 heads, "
    "atten_backend minimal_a2a = Ulysses) + 4 VACE control blocks (control_layer4); 720p = "
    "1280 x 704, Wan VAE 4x8x8, patch 2; guidance 3: two branches; cross-attention over 512 "
    "text tokens, the Reason1 embeddings padded or truncated to NUM_EMBEDDING_PADDING_TOKENS = "
    "512 (nvidia-cosmos/cosmos-transfer2.5@ecbc860:cosmos_transfer2/_src/predict2/"
    "text_encoders/text_encoder.py)",
    "mixtral-8x7b": "Jiang et al., Mixtral of Experts (arxiv.org/abs/2401.04088), Table 1: dim "
    "4096, n_layers 32, head_dim 128, hidden_dim 14336, n_heads 32, n_kv_heads 8, vocab_size "
    "32000, num_experts 8, top_k_experts 2 (46.7B parameters, 12.9B active a token)",
    "flux.1-dev": "black-forest-labs/flux@802fb47:src/flux/util.py flux-dev: 19 double + 38 single "
    "blocks, hidden 3072, 24 heads, mlp x4, 512 text tokens; guidance-distilled (one forward)",
    "cosmos-14b": "nvidia-cosmos/cosmos-transfer2.5@ecbc860:cosmos_transfer2/_src/interactive/"
    "configs/registry_defaults/net_transfer.py (TRANSFER2_CONTROL2WORLD_NET_14B: the 2B net with "
    "model_channels 5120, num_heads 40, num_blocks 36); the matmul and parameter counts a block "
    "are this model's cross-attention DiT estimate (14 h^2 and 15 h^2), not the config's",
}


@dataclass(frozen=True)
class ModelShape:
    name: str
    kind: str  # "lm", "dit" or "attention"
    layers: int
    hidden: int
    heads: int
    head_dim: int
    kv_heads: int = 0
    ffn: int = 0
    vocab: int = 0
    matmul_per_layer: int = 0
    params: int = 0
    text_tokens: int = 0
    cross_tokens: int = 0
    """Tokens a cross-attention attends to (0: none)."""
    latent_channels: int = 16
    patch: tuple[int, int, int] = (1, 2, 2)
    vae: tuple[int, int] = (4, 8)
    """Temporal and spatial compression of the VAE."""
    branches: int = 1
    """Forwards per denoising step without cfgp: 2 with classifier-free guidance."""
    experts: int = 0
    """A mixture of experts: SwiGLU experts of width `ffn` a layer (0: one dense MLP)."""
    top_k: int = 0
    """Experts each token passes through, when `experts` > 0."""
    source: str = ""
    notes: dict = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        if not self.kv_heads:
            object.__setattr__(self, "kv_heads", self.heads)
        if self.kind == "lm" and not self.matmul_per_layer:
            object.__setattr__(self, "matmul_per_layer", lm_layer_matmul(self))
        if self.kind == "lm" and not self.params:
            object.__setattr__(self, "params", lm_params(self))

    @property
    def attention_width(self) -> int:
        return self.heads * self.head_dim

    def video_tokens(self, width: int, height: int, frames: int) -> int:
        """Latent patches of a video: (frames-1)/vae_t + 1 latent frames, each (H/s/p)(W/s/p)."""
        t, s = self.vae
        pt, ph, pw = self.patch
        latent_frames = (frames - 1) // t + 1
        return (latent_frames // pt) * (height // s // ph) * (width // s // pw)

    def root_params(self) -> int:
        """Parameters outside the blocks, the FSDP root: embedding, head and final norm of an
        LM (a DiT's embedders are small and counted in its blocks)."""
        return 2 * self.vocab * self.hidden + self.hidden if self.kind == "lm" else 0

    def block_params(self) -> int:
        """Parameters of one FSDP unit (a block): what one all-gather moves."""
        return (self.params - self.root_params()) // self.layers


def llama_ffn(hidden: int, multiplier: float, multiple_of: int) -> int:
    """Llama's SwiGLU width: 2/3 of 4h, times the multiplier, rounded up to `multiple_of`."""
    width = int(multiplier * int(2 * 4 * hidden / 3))
    return multiple_of * math.ceil(width / multiple_of)


def attention_matmul(m: ModelShape) -> int:
    """q and o (h x heads.d), k and v (h x kv_heads.d)."""
    return 2 * m.hidden * m.attention_width + 2 * m.hidden * m.kv_heads * m.head_dim


def lm_layer_matmul(m: ModelShape) -> int:
    """The weights a token multiplies by in a layer: attention, then the MLP's three h x ffn
    matrices, once, or once per routed expert (top_k) plus the router (h x experts)."""
    mlp = 3 * m.hidden * m.ffn
    if m.experts:
        return attention_matmul(m) + m.top_k * mlp + m.hidden * m.experts
    return attention_matmul(m) + mlp


def lm_params(m: ModelShape) -> int:
    """Blocks (attention, every expert's MLP and the router, 2 norms) + embedding + head +
    final norm."""
    mlp = 3 * m.hidden * m.ffn
    stored = mlp * m.experts + m.hidden * m.experts if m.experts else mlp
    block = attention_matmul(m) + stored + 2 * m.hidden
    return m.layers * block + 2 * m.vocab * m.hidden + m.hidden


def _llama(
    name: str, hidden: int, layers: int, heads: int, mult: float, multiple: int
) -> ModelShape:
    return ModelShape(
        name,
        "lm",
        layers,
        hidden,
        heads,
        hidden // heads,
        kv_heads=8,
        ffn=llama_ffn(hidden, mult, multiple),
        vocab=128256,
        source=SOURCES["llama3"],
    )


def _two_stream(hidden: int, double: int, single: int) -> tuple[int, int]:
    """(matmul per token per layer, params) of MMDiT blocks (HunyuanVideo, Flux).

    A double block has per stream qkv 3h^2, proj h^2, MLP 8h^2 (12h^2) and a 6h^2 modulation;
    a single block linear1 h -> 3h + 4h and linear2 5h -> h (12h^2) and a 3h^2 modulation.
    """
    h2 = hidden * hidden
    return 12 * h2, double * 2 * 18 * h2 + single * 15 * h2


_HY = _two_stream(3072, 20, 40)
_FLUX = _two_stream(3072, 19, 38)
_COSMOS_H = 2048
_CONSISID_H, _FACE_INNER, _FACE_KV = 3072, 16 * 128, 2048
_FACE_TOKEN_MATMUL = 2 * _CONSISID_H * _FACE_INNER // 2
"""q and out of a face cross-attention (3072 x 2048 each), on every other layer: per layer."""
_FACE_PARAMS = 21 * (2 * _CONSISID_H * _FACE_INNER + _FACE_KV * 2 * _FACE_INNER)
"""21 face cross-attentions (42 // 2): q, out and the 2048 -> 2 x 2048 kv projection."""

MODELS: dict[str, ModelShape] = {
    m.name: m
    for m in [
        _llama("llama3.1-8b", 4096, 32, 32, 1.3, 1024),
        _llama("llama3.1-70b", 8192, 80, 64, 1.3, 4096),
        _llama("llama3.1-405b", 16384, 126, 128, 1.2, 4096),
        ModelShape(
            "mixtral-8x7b",
            "lm",
            32,
            4096,
            32,
            128,
            kv_heads=8,
            ffn=14336,
            vocab=32000,
            experts=8,
            top_k=2,
            source=SOURCES["mixtral-8x7b"],
        ),
        ModelShape(
            "llama3-8b-attention",
            "attention",
            1,
            4096,
            32,
            128,
            kv_heads=8,
            source="zhuzilin/ring-flash-attention@8996282:benchmark/benchmark_kvpacked_func.py "
            "(32 q heads, 8 kv heads, head dim 128: Llama-3-8B's attention)",
        ),
        ModelShape(
            "hunyuanvideo",
            "dit",
            60,
            3072,
            24,
            128,
            matmul_per_layer=_HY[0],
            params=_HY[1],
            text_tokens=256,
            source=SOURCES["hunyuanvideo"],
        ),
        ModelShape(
            "consisid",
            "dit",
            42,
            _CONSISID_H,
            48,
            64,
            matmul_per_layer=12 * _CONSISID_H**2 + _FACE_TOKEN_MATMUL,
            params=42 * (12 * _CONSISID_H**2 + 2 * 512 * 6 * _CONSISID_H) + _FACE_PARAMS,
            text_tokens=226,
            patch=(1, 2, 2),
            branches=2,
            source=SOURCES["consisid"],
        ),
        ModelShape(
            "cosmos-transfer2.5-2b",
            "dit",
            32,
            _COSMOS_H,
            16,
            128,
            matmul_per_layer=14 * _COSMOS_H**2,
            params=32 * (14 * _COSMOS_H**2 + 2 * 1024 * _COSMOS_H + 6 * 256 * _COSMOS_H),
            cross_tokens=512,
            branches=2,
            source=SOURCES["cosmos-transfer2.5-2b"],
        ),
        ModelShape(
            "flux.1-dev",
            "dit",
            57,
            3072,
            24,
            128,
            matmul_per_layer=_FLUX[0],
            params=_FLUX[1],
            text_tokens=512,
            source=SOURCES["flux.1-dev"],
        ),
    ]
}
"""Self-attention cost per token per layer is 12h^2 of weights in every DiT here but Cosmos,
whose blocks add a cross-attention (q and out projections, 2h^2, on the video tokens)."""


def model(spec: str | dict) -> ModelShape:
    """A preset by name, or an inline table: `{kind, layers, hidden, heads, ...}`."""
    if isinstance(spec, str):
        if spec not in MODELS:
            raise ValueError(f"unknown model {spec!r}; presets: {sorted(MODELS)}")
        return MODELS[spec]
    fields = dict(spec)
    if "preset" in fields:  # a preset with some fields changed: {preset = "...", branches = 1}
        from dataclasses import replace

        base = model(fields.pop("preset"))
        return replace(base, name=fields.pop("name", base.name), **fields)
    fields.setdefault("name", "inline")
    fields.setdefault("head_dim", fields["hidden"] // fields["heads"])
    if "patch" in fields:
        fields["patch"] = tuple(fields["patch"])
    if "vae" in fields:
        fields["vae"] = tuple(fields["vae"])
    if fields["kind"] == "dit" and not fields.get("matmul_per_layer"):
        fields["matmul_per_layer"] = 12 * fields["hidden"] ** 2
        fields.setdefault("params", fields["layers"] * 18 * fields["hidden"] ** 2)
    return ModelShape(**fields)


_COSMOS_14B_H = 5120
COSMOS_LIKE_14B = {
    "kind": "dit",
    "layers": 36,
    "hidden": _COSMOS_14B_H,
    "heads": 40,
    "branches": 2,
    "matmul_per_layer": 14 * _COSMOS_14B_H**2,
    "params": 36 * 15 * _COSMOS_14B_H**2,
    "name": "cosmos-14b",
    "source": SOURCES["cosmos-14b"],
}
"""A Cosmos-like 14B DiT (36 blocks of 5120 with 40 heads, as in
nvidia-cosmos/cosmos-transfer2.5@ecbc860:cosmos_transfer2/_src/interactive/configs/
registry_defaults/net_transfer.py TRANSFER2_CONTROL2WORLD_NET_14B; cross-attention: 14 h^2 a
token), the size at which lab 11 evaluates lab 06's step bytes; an inline table for `model`, not
a preset."""
LAB06_TOY = {"kind": "dit", "layers": 2, "hidden": 16, "heads": 2, "branches": 2}
"""The toy DiT lab 06 runs on its ranks, as an inline table for `model`."""
