"""Model presets: the shapes the FLOP, byte and memory counts need, each with its config's source.

Two kinds. A language model (`lm`), causal: Llama 3.1's blocks (grouped-query attention and
SwiGLU), Megatron-LM's GPT (multi-head attention and a GELU MLP), Mixtral and DeepSeek-V3 (a
mixture of experts; DeepSeek-V3's first layers dense and its attention latent). A diffusion
transformer (`dit`): full (non-causal) self-attention over the video
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
    "cosmos-transfer2.5-2b-weights": "nvidia-cosmos/cosmos-transfer2.5@c9ad44b:cosmos_transfer2/"
    "_src/transfer2/configs/vid2vid_transfer/defaults/net.py (TRANSFER2_CONTROL2WORLD_NET_2B: "
    "model_channels 2048, num_blocks 28, num_heads 16, adaln_lora_dim 256, patch 2 x 2 x 1, 16 "
    "channels and the padding mask), its experiment in cosmos_transfer2/_src/transfer2/configs/"
    "vid2vid_transfer/experiment/exp_large_scale.py (crossattn_proj_in_channels 100352, "
    "crossattn_emb_channels 1024, vace_block_every_n 7: 4 control blocks; "
    "extra_image_context_dim 1152, share_q_in_i2v_cross_attn False), the blocks of "
    "cosmos_transfer2/_src/transfer2/networks/minimal_v4_lvg_dit_control_vace.py "
    "(I2VCrossAttentionFull, ControlEncoderDiTBlock's before_proj and after_proj); the text "
    "encoder of cosmos_transfer2/_src/predict2/text_encoders/text_encoder.py, built whole "
    "(cosmos_transfer2/_src/reason1/models/vlm_qwen.py: the vision tower, the language model "
    "and lm_head; under torch.distributed sharded by FSDP2 over every rank, "
    "cosmos_transfer2/_src/reason1/parallelisms/parallelize_qwen.py's apply_fsdp on a "
    "data_parallel_shard_degree of -1, the world, in cosmos_transfer2/_src/reason1/configs/"
    "default/model_config.py) in bf16 (cosmos_transfer2/_src/reason1/models/vlm_base.py sets the default "
    "dtype to the config's precision, bfloat16 in cosmos_transfer2/_src/reason1/configs/default/"
    "model_config.py; the vision tower's sizes in cosmos_transfer2/_src/reason1/configs/default/"
    "model_config_qwen.py)",
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
    "gpt-megatron": "NVIDIA/Megatron-LM@d98e8a6:images/model_table.png, the table of README.md's "
    "Performance Benchmarking (attention heads, hidden size, number of layers of each model "
    "size; vocabulary 131,072, sequence 4,096, as the README states under it). Megatron's GPT: "
    "multi-head attention, a 4 h GELU MLP (fc1, fc2), untied embedding and output layer; its "
    "biases (qkv 3 h, proj h, fc1 4 h, fc2 h) and LayerNorm shifts (2 h), 11 h a layer, under "
    "0.05 % of any preset, are not counted",
    "deepseek-v3": "deepseek-ai/DeepSeek-V3@9b4e978:inference/configs/config_671B.json (dim 7168, "
    "n_layers 61, n_dense_layers 3, inter_dim 18432, moe_inter_dim 2048, n_heads 128, "
    "n_routed_experts 256, n_shared_experts 1, n_activated_experts 8, q_lora_rank 1536, "
    "kv_lora_rank 512, qk_nope_head_dim 128, qk_rope_head_dim 64, v_head_dim 128, vocab_size "
    "129280), the layers of deepseek-ai/DeepSeek-V3@9b4e978:inference/model.py (MLA's wq_a, "
    "wq_b, wkv_a, wkv_b, wo and its two latent norms; the gate, no bias counted); 671B total, "
    "37B activated (deepseek-ai/DeepSeek-V3@9b4e978:README.md). The multi-token prediction "
    "module (one more MoE layer, 11.5B, deepseek-ai/DeepSeek-V3@9b4e978:README_WEIGHTS.md) is "
    "not modelled",
    "flux.1-dev": "black-forest-labs/flux@802fb47:src/flux/util.py flux-dev: 19 double + 38 single "
    "blocks, hidden 3072, 24 heads, mlp x4, 512 text tokens; guidance-distilled (one forward)",
    "cosmos-14b": "nvidia-cosmos/cosmos-transfer2.5@ecbc860:cosmos_transfer2/_src/interactive/"
    "configs/registry_defaults/net_transfer.py (TRANSFER2_CONTROL2WORLD_NET_14B: the 2B net with "
    "model_channels 5120, num_heads 40, num_blocks 36); the matmul and parameter counts a block "
    "are this model's cross-attention DiT estimate (14 h^2 and 15 h^2), not the config's",
    "wan2.1-vae": "nvidia-cosmos/cosmos-transfer2.5@c9ad44b:cosmos_transfer2/_src/predict2/"
    "tokenizers/wan2pt1.py (_video_vae: dim 96, dim_mult [1, 2, 4, 4], num_res_blocks 2, "
    "temperal_downsample [False, True, True], z_dim 16; Encoder3d, Decoder3d, Resample, "
    "AttentionBlock), the Wan2.1 VAE Cosmos-Transfer2.5 encodes and decodes with",
}


@dataclass(frozen=True)
class LatentAttention:
    """DeepSeek's multi-head latent attention (MLA): q from a `q_rank` latent, k and v from one
    `kv_rank` latent shared by every head, plus one `rope_dim` rotary key shared by the heads.
    A head's q and k are `nope_dim + rope_dim` wide, its v `v_dim`."""

    q_rank: int
    kv_rank: int
    nope_dim: int
    rope_dim: int
    v_dim: int

    def weights(self, hidden: int, heads: int) -> int:
        """wq_a (h -> q latent), wq_b (latent -> heads x qk), wkv_a (h -> kv latent + rotary
        key), wkv_b (latent -> heads x (nope k + v)) and wo (heads x v -> h)."""
        qk = self.nope_dim + self.rope_dim
        return (
            hidden * self.q_rank
            + self.q_rank * heads * qk
            + hidden * (self.kv_rank + self.rope_dim)
            + self.kv_rank * heads * (self.nope_dim + self.v_dim)
            + heads * self.v_dim * hidden
        )

    @property
    def head_dim(self) -> int:
        """The mean of a head's q.k width and its v width: attention's FLOPs (q k^T, then p v),
        the q, k, v and output tensors and the K/V bytes are all linear in their sum."""
        return (self.nope_dim + self.rope_dim + self.v_dim) // 2


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
    makes: str = "video"
    """What one sample of a DiT is: "video" or "image" (its tokens, `video_tokens` of one frame)."""
    autoencoder: str = ""
    """The video VAE whose FLOPs the time model counts (`AUTOENCODERS`); "": not priced."""
    vae_passes: tuple[int, int] = (0, 0)
    """(encodes, decodes) of the whole video inside the seconds a source times, run by every
    rank of the video's group (the tokenizer's context-parallel path off, its default)."""
    branches: int = 1
    """Forwards per denoising step without cfgp: 2 with classifier-free guidance."""
    text_encoder: int = 0
    """Parameters of a text encoder the pipeline keeps in bf16 on its GPUs beside the denoiser,
    sharded by FSDP over all of them (0: none counted)."""
    text_encoder_root: int = 0
    """Of them, those outside its FSDP units, in the root, which FSDP2 keeps gathered after a
    forward (`tests/test_fsdp_engine_facts.py`): whole on every GPU."""
    experts: int = 0
    """A mixture of experts: SwiGLU experts of width `ffn` a layer (0: one dense MLP)."""
    top_k: int = 0
    """Experts each token passes through, when `experts` > 0."""
    shared_experts: int = 0
    """Experts of width `ffn` every token passes through besides its top_k (DeepSeek's)."""
    dense_layers: int = 0
    """A mixture of experts' first layers whose MLP is one dense SwiGLU of width `dense_ffn`."""
    dense_ffn: int = 0
    mlp_matrices: int = 3
    """Weight matrices of an MLP: 3 for SwiGLU (w1, w3, w2), 2 for GPT's GELU MLP (fc1, fc2)."""
    latent: LatentAttention | None = None
    """Multi-head latent attention (DeepSeek); None: q, k, v and o projections."""
    source: str = ""
    notes: dict = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        if not self.kv_heads:
            object.__setattr__(self, "kv_heads", self.heads)
        if self.kind == "lm" and not self.matmul_per_layer:
            object.__setattr__(self, "matmul_per_layer", lm_layer_matmul(self))
        if self.kind == "lm" and not self.params:
            object.__setattr__(self, "params", lm_params(self))
        sizes = (self.layers, self.hidden, self.heads, self.head_dim, self.ffn, self.params)
        object.__setattr__(self, "_hash", hash(sizes))

    def __hash__(self) -> int:
        """The hash of its sizes, computed once: every cache of the time and memory models is
        keyed by the model, and a planner search asks them millions of times. Integers hash
        alike in every process, so a pickled copy's stays valid."""
        return self._hash

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
        """Parameters of one FSDP unit (a block): what one all-gather moves (the mean block of
        a model whose first layers are dense)."""
        return (self.params - self.root_params()) // self.layers

    def layer_params(self, dense: bool = False) -> int:
        """One block's parameters: attention and its norms, then the MLP, which in a mixture
        of experts is every routed and shared expert and the router, or, in one of its first
        `dense_layers` (`dense`), one SwiGLU of width `dense_ffn`. A DiT's blocks are alike:
        its `block_params`."""
        if self.kind != "lm":
            return self.block_params()
        norms = 2 * self.hidden + (self.latent.q_rank + self.latent.kv_rank if self.latent else 0)
        if not self.experts:
            mlp = self.mlp_weights(self.ffn)
        elif dense:
            mlp = self.mlp_weights(self.dense_ffn)
        else:
            experts = self.experts + self.shared_experts
            mlp = experts * self.mlp_weights(self.ffn) + self.hidden * self.experts
        return attention_matmul(self) + norms + mlp

    def mlp_weights(self, width: int) -> int:
        return self.mlp_matrices * self.hidden * width

    @property
    def moe_layers(self) -> int:
        return self.layers - self.dense_layers if self.experts else 0

    def routed_expert_params(self) -> int:
        """Every routed expert's weights, all layers: what ep splits (0 for a dense model)."""
        return self.moe_layers * self.layer_routed_params()

    def layer_routed_params(self) -> int:
        """One mixture-of-experts layer's routed experts (0 for a dense model)."""
        return self.experts * self.mlp_weights(self.ffn)

    def idle_expert_params(self) -> int:
        """Weights a token does not pass through: the routed experts it is not sent to."""
        return self.moe_layers * (self.experts - self.top_k) * self.mlp_weights(self.ffn)

    def mlp_width(self) -> float:
        """The MLP width a token passes through, averaged over the layers: `ffn` for a dense
        model; top_k + shared experts' in a MoE layer, `dense_ffn` in a dense one."""
        if not self.experts:
            return self.ffn
        moe = (self.top_k + self.shared_experts) * self.ffn
        return (self.dense_layers * self.dense_ffn + self.moe_layers * moe) / self.layers


def llama_ffn(hidden: int, multiplier: float, multiple_of: int) -> int:
    """Llama's SwiGLU width: 2/3 of 4h, times the multiplier, rounded up to `multiple_of`."""
    width = int(multiplier * int(2 * 4 * hidden / 3))
    return multiple_of * math.ceil(width / multiple_of)


def attention_matmul(m: ModelShape) -> int:
    """q and o (h x heads.d), k and v (h x kv_heads.d); or a latent attention's projections."""
    if m.latent:
        return m.latent.weights(m.hidden, m.heads)
    return 2 * m.hidden * m.attention_width + 2 * m.hidden * m.kv_heads * m.head_dim


def lm_layer_matmul(m: ModelShape) -> int:
    """The weights a token multiplies by in a layer: attention, then the MLP's matrices, once,
    or in a MoE layer once per routed expert (top_k) and shared expert, plus the router
    (h x experts); averaged over the layers when the first ones are dense."""
    if not m.experts:
        return attention_matmul(m) + m.mlp_weights(m.ffn)
    moe = (m.top_k + m.shared_experts) * m.mlp_weights(m.ffn) + m.hidden * m.experts
    dense = m.dense_layers * m.mlp_weights(m.dense_ffn)
    return attention_matmul(m) + (dense + m.moe_layers * moe) // m.layers


def lm_params(m: ModelShape) -> int:
    """Blocks (`ModelShape.layer_params`: attention, 2 norms and a latent attention's 2, the
    MLP) + embedding + head + final norm."""
    dense = m.dense_layers if m.experts else 0
    blocks = dense * m.layer_params(dense=True) + (m.layers - dense) * m.layer_params()
    return blocks + 2 * m.vocab * m.hidden + m.hidden


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


MEGATRON_GPT = {
    "1.7b": (24, 2048, 16),
    "7.1b": (30, 4096, 32),
    "16b": (32, 6144, 48),
    "32b": (48, 7168, 56),
    "70b": (84, 8192, 64),
    "119b": (92, 10240, 80),
    "177b": (96, 12288, 96),
    "314b": (96, 16384, 128),
    "462b": (112, 18432, 144),
}
"""Megatron-LM's benchmark GPTs by model size: (layers, hidden, heads), its table's columns."""


def _gpt(size: str) -> ModelShape:
    layers, hidden, heads = MEGATRON_GPT[size]
    return ModelShape(
        f"gpt-{size}",
        "lm",
        layers,
        hidden,
        heads,
        hidden // heads,
        ffn=4 * hidden,
        vocab=131072,
        mlp_matrices=2,
        source=SOURCES["gpt-megatron"],
    )


DEEPSEEK_V3_MLA = LatentAttention(q_rank=1536, kv_rank=512, nope_dim=128, rope_dim=64, v_dim=128)
DEEPSEEK_V3 = ModelShape(
    "deepseek-v3",
    "lm",
    61,
    7168,
    128,
    DEEPSEEK_V3_MLA.head_dim,
    ffn=2048,
    vocab=129280,
    experts=256,
    top_k=8,
    shared_experts=1,
    dense_layers=3,
    dense_ffn=18432,
    latent=DEEPSEEK_V3_MLA,
    source=SOURCES["deepseek-v3"],
)
"""Every head attends with its own k and v once the latent is expanded (kv_heads = heads), so
tp and cp cut it as multi-head attention."""

_HY = _two_stream(3072, 20, 40)
_FLUX = _two_stream(3072, 19, 38)
_COSMOS_H = 2048
_COSMOS_BLOCK = 4 * _COSMOS_H**2 + 256 + 2 * (_COSMOS_H**2 + 1024 * _COSMOS_H) + 256
_COSMOS_BLOCK += (
    3 * _COSMOS_H**2 + 256 + 8 * _COSMOS_H**2 + 3 * (_COSMOS_H * 256 + 256 * 3 * _COSMOS_H)
)
"""A Cosmos block's weights (SOURCES["cosmos-transfer2.5-2b-weights"]): self-attention (4 h^2 and
q, k norms), text cross-attention (q and out h^2, k and v from the 1,024-wide context), the
image-context cross-attention (3 h^2), the 4x MLP and the adaLN-LoRA of rank 256: 81,789,696."""
_COSMOS_OUTSIDE = 18 * 4 * _COSMOS_H + 4 * _COSMOS_H**2 + _COSMOS_H + 1152 * _COSMOS_H + _COSMOS_H
_COSMOS_OUTSIDE += _COSMOS_H * 64 + _COSMOS_H * 256 + 256 * 2 * _COSMOS_H  # the final layer
_COSMOS_OUTSIDE += 100_352 * 1024 + 1024
"""Outside the blocks: patch and time embedders, final layer, image-context and text-context
projections (the 28 Reason1 layers' 3,584-wide states, 100,352, onto the 1,024-wide context)."""
_COSMOS_CONTROL = 4 * (_COSMOS_H**2 + _COSMOS_H) + (_COSMOS_H**2 + _COSMOS_H) + 130 * 4 * _COSMOS_H
"""The control branch beside its 4 blocks: each block's output projection, the first block's
input projection and the control embedder (8 modalities of 16 channels, 2 more, patch 2 x 2)."""
COSMOS_SINGLE_GPU_VRAM_GB = 65.4
"""What Cosmos-Transfer2.5-2B asks of one GPU for inference, "Required GPU VRAM"
(nvidia-cosmos/cosmos-transfer2.5@c9ad44b:docs/inference.md); it says neither GB or GiB nor
allocated or reserved."""
COSMOS_TEXT_ENCODER_ROOT = 2 * 152_064 * 3584 + 3584 + 1_505_280 + 44_574_464
"""Reason1's parameters outside the units parallelize_qwen.py shards (each vision block, each
language-model layer): the embedding and output head, the final norm, the vision tower's patch
embedding (3 x 2 x 14 x 14 x 1,280) and its merger (1,280 + 5,120^2 + 5,120 + 5,120 x 3,584 +
3,584)."""
COSMOS_TEXT_ENCODER = 7_615_616_512 + 676_550_144
"""Cosmos-Reason1.1-7B: Qwen2.5-VL-7B's language model (28 layers of 3,584, MLP 18,944, 4 kv
heads, untied 152,064-entry embedding and head) and its vision tower (32 layers of 1,280 and
the merger), which the text encoder builds too; a distributed run shards it over every GPU
but for its root, `COSMOS_TEXT_ENCODER_ROOT` (SOURCES["cosmos-transfer2.5-2b-weights"])."""
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
        DEEPSEEK_V3,
        *(_gpt(size) for size in MEGATRON_GPT),
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
            params=32 * _COSMOS_BLOCK + _COSMOS_OUTSIDE + _COSMOS_CONTROL,
            text_encoder=COSMOS_TEXT_ENCODER,
            text_encoder_root=COSMOS_TEXT_ENCODER_ROOT,
            cross_tokens=512,
            branches=2,
            autoencoder="wan2.1",
            vae_passes=(2, 1),
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
            makes="image",
            source=SOURCES["flux.1-dev"],
        ),
    ]
}
"""Self-attention cost per token per layer is 12h^2 of weights in every DiT here but Cosmos,
whose blocks add a cross-attention (q and out projections, 2h^2, on the video tokens)."""


# ------------------------------------------------------------------ video autoencoders
def _conv(outputs: int, c_in: int, c_out: int, kernel: int) -> int:
    """FLOPs of a convolution: 2 x kernel x c_in multiply-adds for each of `outputs` x c_out."""
    return 2 * outputs * c_in * c_out * kernel


def _residual(outputs: int, c_in: int, c_out: int) -> int:
    """Two 3x3x3 convolutions, plus a 1x1x1 shortcut when the width changes."""
    shortcut = _conv(outputs, c_in, c_out, 1) if c_in != c_out else 0
    return _conv(outputs, c_in, c_out, 27) + _conv(outputs, c_out, c_out, 27) + shortcut


def _frame_attention(frames: int, pixels: int, width: int) -> int:
    """One head over each frame's pixels: 1x1 qkv and out projections, then QK^T and AV."""
    return frames * (_conv(pixels, width, 4 * width, 1) + 4 * pixels * pixels * width)


def wan21_vae_flops(frames: int, pixels: int) -> tuple[int, int]:
    """(encode, decode) FLOPs of the Wan2.1 VAE over `frames` frames of `pixels` pixels each.

    Causal convolutions with a cache give each output frame one kernel's work, so each level
    costs its frames x pixels. Widths 96, 192, 384, 384; space halves after each of the first
    three levels, time after the second and third (temperal_downsample [False, True, True]:
    frames 1 + (f-1)/2, then 1 + (f-1)/4), by a stride-2 time convolution on every frame but
    the first, which the encoder takes alone before chunks of four. The decoder mirrors it with
    one more residual block a level, doubling frames by a time convolution to twice the
    channels (every latent frame but the first). Norms, SiLUs and the nearest-neighbour
    upsampling are left out (no FLOPs counted). Exact for 4k + 1 frames, height and width
    multiples of 8: the shapes the upstream chunks run whole."""
    if frames % 4 != 1:
        raise ValueError(f"wan21_vae_flops: frames must be 4k + 1 (the VAE's chunks), got {frames}")
    f1, f2, f3 = frames, 1 + (frames - 1) // 2, 1 + (frames - 1) // 4
    p1, p2, p3, p4 = pixels, pixels // 4, pixels // 16, pixels // 64
    encode = (
        _conv(f1 * p1, 3, 96, 27)
        + 2 * _residual(f1 * p1, 96, 96)
        + _conv(f1 * p2, 96, 96, 9)  # 3x3 stride 2, each frame
        + _residual(f1 * p2, 96, 192)
        + _residual(f1 * p2, 192, 192)
        + _conv(f1 * p3, 192, 192, 9)
        + _conv((f2 - 1) * p3, 192, 192, 3)  # time stride 2
        + _residual(f2 * p3, 192, 384)
        + _residual(f2 * p3, 384, 384)
        + _conv(f2 * p4, 384, 384, 9)
        + _conv((f3 - 1) * p4, 384, 384, 3)
        + 4 * _residual(f3 * p4, 384, 384)  # two blocks, then the middle's two
        + _frame_attention(f3, p4, 384)
        + _conv(f3 * p4, 384, 32, 27)  # mean and log-variance
        + _conv(f3 * p4, 32, 32, 1)
    )
    decode = (
        _conv(f3 * p4, 16, 16, 1)
        + _conv(f3 * p4, 16, 384, 27)
        + 5 * _residual(f3 * p4, 384, 384)  # the middle's two, then three
        + _frame_attention(f3, p4, 384)
        + _conv((f3 - 1) * p4, 384, 768, 3)  # each latent frame but the first into two
        + _conv(f2 * p3, 384, 192, 9)  # upsample 2x, 3x3
        + _residual(f2 * p3, 192, 384)
        + 2 * _residual(f2 * p3, 384, 384)
        + _conv((f2 - 1) * p3, 384, 768, 3)
        + _conv(f1 * p2, 384, 192, 9)
        + 3 * _residual(f1 * p2, 192, 192)
        + _conv(f1 * p1, 192, 96, 9)
        + 3 * _residual(f1 * p1, 96, 96)
        + _conv(f1 * p1, 96, 3, 27)
    )
    return encode, decode


AUTOENCODERS = {"wan2.1": wan21_vae_flops}
"""Video VAEs the time model prices, by `ModelShape.autoencoder`: (frames, pixels) -> (encode,
decode) FLOPs. The other DiTs' VAEs (HunyuanVideo's, CogVideoX's for ConsisID) are not counted."""
AUTOENCODER_PEAK_GIB = {"wan2.1": 11.762}
"""The most a video VAE has been measured to allocate encoding and decoding 720p, its weights and
the video included: FastVAE's Wan2.1 row, one process (nono-Sang/FastVAE@cd72332:README.md,
`torch.cuda.max_memory_allocated()` over 1024**3 in test/wan/test_vae_video_e2e.py). Cosmos runs
the same VAE through its own code, in 16-frame windows; no figure measures that."""

AUTOENCODER_MODELS = {
    "wan2.1-vae": ModelShape(
        "wan2.1-vae",
        "vae",
        0,
        0,
        0,
        0,
        autoencoder="wan2.1",
        vae_passes=(1, 1),
        source=SOURCES["wan2.1-vae"],
    )
}
"""The VAE alone, for cases that time its encode or decode (`vae_passes` (1, 0) or (0, 1));
`model` finds it, the planner does not offer it."""


def model(spec: str | dict) -> ModelShape:
    """A preset by name, or an inline table: `{kind, layers, hidden, heads, ...}`."""
    if isinstance(spec, str):
        if spec in AUTOENCODER_MODELS:
            return AUTOENCODER_MODELS[spec]
        if spec not in MODELS:
            raise ValueError(f"unknown model {spec!r}; presets: {sorted(MODELS)}")
        return MODELS[spec]
    fields = dict(spec)
    for key in ("patch", "vae", "vae_passes"):  # TOML arrays; the shape is hashed
        if key in fields:
            fields[key] = tuple(fields[key])
    if "preset" in fields:  # a preset with some fields changed: {preset = "...", branches = 1}
        from dataclasses import replace

        base = model(fields.pop("preset"))
        return replace(base, name=fields.pop("name", base.name), **fields)
    fields.setdefault("name", "inline")
    fields.setdefault("head_dim", fields["hidden"] // fields["heads"])
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
