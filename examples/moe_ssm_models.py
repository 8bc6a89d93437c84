"""Mixture-of-experts and state-space models for the zoo, built as users build them: each from
its ``transformers`` config with the library's defaults (attention implementation, experts
implementation, Mamba's associative scan), 2 layers, hidden size 64, seeded weights, no
download. ``builders()`` has the same form as ``export_models.builders``: name -> (build the
model, example inputs); ``FAMILY`` says which family each belongs to. ``held_out_builders()``
has further architectures built the same way, kept out of the zoo (``HELD_OUT_FAMILY``: MoE
decoders, state-space models of other sizes and hybrids, decoders, an encoder, vision and
speech models): the mechanisms are tuned on the zoo, these check that they carry over.

    python benchmarks/moe_ssm.py [model ...]     # launches, accuracy, gradients vs Inductor
    python benchmarks/vs_inductor.py --held-out  # the held-out decoders vs Inductor
"""

from __future__ import annotations

SEED = 0
H, HEADS, FF, VOCAB, LAYERS, EXPERTS = 64, 4, 128, 256, 2, 4

FAMILY = {
    "mamba": "state-space", "mamba2": "state-space", "falcon_mamba": "state-space",
    "mixtral": "mixture-of-experts", "qwen2_moe": "mixture-of-experts",
    "olmoe": "mixture-of-experts", "qwen3_moe": "mixture-of-experts",
    "deepseek_v3": "mixture-of-experts", "gpt_oss": "mixture-of-experts",
    "phimoe": "mixture-of-experts",
}
HELD_OUT_FAMILY = {
    **dict.fromkeys(("glm4_moe", "dots1", "granitemoe", "ernie4_5_moe", "jetmoe", "deepseek_v2",
                     "llama4", "dbrx"), "mixture-of-experts"),
    **dict.fromkeys(("mamba_wide", "falcon_mamba_narrow", "mamba2_groups", "jamba", "bamba"),
                    "state-space"),
    **dict.fromkeys(("cohere", "phi3", "gemma2", "olmo2"), "decoder"),
    "modernbert": "encoder", "dinov2": "vision", "convnextv2": "vision", "wavlm": "audio",
}


def _inputs(torch):
    g = torch.Generator().manual_seed(SEED)
    return (torch.randint(0, VOCAB, (2, 16), generator=g),)


def _builder(attn: str):
    """``build(config class, model class, attention=True, **config)`` -> (build model,
    example inputs), the model returning its last hidden state; ``attn`` the attention
    implementation (the library default ``sdpa``, or ``eager``) of models with attention."""
    import torch

    if attn not in ("sdpa", "eager"):
        raise ValueError(f"attention implementation {attn!r} (accepted: sdpa, eager)")
    common = dict(attn_implementation="eager") if attn == "eager" else {}

    class Hidden(torch.nn.Module):
        """Returns the model's last hidden state only."""

        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, x):
            return self.model(input_ids=x).last_hidden_state

    class Named(Hidden):
        """Returns the last hidden state of the model fed ``key`` (pixels, a waveform)."""

        def __init__(self, model, key):
            super().__init__(model)
            self.key = key

        def forward(self, x):
            return self.model(**{self.key: x}).last_hidden_state

    def build(cfg_cls, model_cls, attention=True, key=None, shape=None, **kw):
        """``key``/``shape``: a model fed a float tensor of ``shape`` (uniform in [0, 1))
        under that keyword instead of token ids."""
        def make():
            torch.manual_seed(SEED)
            cfg = cfg_cls(**kw, **(common if attention else {}))
            model = model_cls(cfg).eval()
            return Named(model, key) if key else Hidden(model)

        def inputs():
            if not key:
                return _inputs(torch)
            return (torch.rand(*shape, generator=torch.Generator().manual_seed(SEED)),)
        return make, inputs

    return build


def builders(attn: str = "sdpa"):
    """name -> (build model, example inputs); each model returns its last hidden state.
    ``attn``: the attention implementation of the MoE decoders, the library default
    (``sdpa``) or ``eager``; the state-space models have no attention."""
    import transformers as T

    build = _builder(attn)
    ssm = dict(hidden_size=H, num_hidden_layers=LAYERS, vocab_size=VOCAB, state_size=16)
    moe = dict(num_hidden_layers=LAYERS, hidden_size=H, num_attention_heads=HEADS,
               num_key_value_heads=2, intermediate_size=FF, vocab_size=VOCAB,
               max_position_embeddings=64, num_experts_per_tok=2)
    return {
        "mamba": build(T.MambaConfig, T.MambaModel, attention=False, **ssm),
        "mamba2": build(T.Mamba2Config, T.Mamba2Model, attention=False, num_heads=8,
                        head_dim=16, n_groups=1, chunk_size=8, **ssm),
        "falcon_mamba": build(T.FalconMambaConfig, T.FalconMambaModel, attention=False, **ssm),
        "mixtral": build(T.MixtralConfig, T.MixtralModel, num_local_experts=EXPERTS, **moe),
        "qwen2_moe": build(T.Qwen2MoeConfig, T.Qwen2MoeModel, num_experts=EXPERTS,
                           moe_intermediate_size=FF, shared_expert_intermediate_size=FF, **moe),
        "olmoe": build(T.OlmoeConfig, T.OlmoeModel, num_experts=EXPERTS, pad_token_id=0,
                       eos_token_id=0, **moe),
        "qwen3_moe": build(T.Qwen3MoeConfig, T.Qwen3MoeModel, num_experts=EXPERTS,
                           moe_intermediate_size=FF, **moe),
        # multi-head latent attention; a sigmoid router with a bias, grouped top-k; the
        # first layer dense, the second a MoE layer with a shared expert
        "deepseek_v3": build(T.DeepseekV3Config, T.DeepseekV3Model, n_routed_experts=EXPERTS,
                             n_group=2, topk_group=1, first_k_dense_replace=1,
                             moe_intermediate_size=FF, q_lora_rank=32, kv_lora_rank=32,
                             qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16, **moe),
        # attention sinks, sliding and full attention layers, a clamped gated activation
        "gpt_oss": build(T.GptOssConfig, T.GptOssModel, num_local_experts=EXPERTS,
                         head_dim=16, sliding_window=8, **moe),
        # the sparsemixer router (experts picked by max and masks, no TopK)
        "phimoe": build(T.PhimoeConfig, T.PhimoeModel, num_local_experts=EXPERTS, **moe),
    }


def held_out_builders(attn: str = "sdpa"):
    """name -> (build model, example inputs) of the held-out architectures
    (``HELD_OUT_FAMILY``), built as ``builders`` builds the zoo's. MoE decoders: GLM-4-MoE
    and dots.llm1 (group-limited routers), GraniteMoE, ERNIE-4.5-MoE, JetMoE (mixtures of
    attention heads and of MLPs, experts split by their token counts), DeepSeek-V2 and
    Llama 4's text model (rotary as complex products: ``torch.polar``, ``view_as_complex``;
    Llama 4 also with layers without rotary, chunked attention and a shared expert beside a
    top-1 router), DBRX; then the other families (see the comments at each)."""
    import transformers as T

    build = _builder(attn)
    moe = dict(num_hidden_layers=LAYERS, hidden_size=H, num_attention_heads=HEADS,
               num_key_value_heads=2, intermediate_size=FF, vocab_size=VOCAB,
               max_position_embeddings=64)
    ids = dict(pad_token_id=0, bos_token_id=0, eos_token_id=0)  # within the small vocabulary
    enc = dict(num_hidden_layers=LAYERS, hidden_size=H, num_attention_heads=HEADS,
               intermediate_size=FF, vocab_size=VOCAB, max_position_embeddings=64)
    vis = dict(hidden_size=H, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
               intermediate_size=FF)
    group = dict(n_routed_experts=2 * EXPERTS, n_group=2, topk_group=1, n_shared_experts=1,
                 first_k_dense_replace=1, moe_intermediate_size=FF, num_experts_per_tok=2)
    return {
        "glm4_moe": build(T.Glm4MoeConfig, T.Glm4MoeModel, **group, **moe),
        "dots1": build(T.Dots1Config, T.Dots1Model, **group, **moe),
        "granitemoe": build(T.GraniteMoeConfig, T.GraniteMoeModel, num_local_experts=EXPERTS,
                            num_experts_per_tok=2, **moe),
        "ernie4_5_moe": build(T.Ernie4_5_MoeConfig, T.Ernie4_5_MoeModel,
                              moe_num_experts=EXPERTS, moe_k=2, moe_intermediate_size=FF,
                              moe_num_shared_experts=1, **moe),
        "jetmoe": build(T.JetMoeConfig, T.JetMoeModel, num_hidden_layers=LAYERS, hidden_size=H,
                        num_key_value_heads=2, kv_channels=16, intermediate_size=FF,
                        vocab_size=VOCAB, max_position_embeddings=64,
                        num_local_experts=EXPERTS, num_experts_per_tok=2),
        "deepseek_v2": build(T.DeepseekV2Config, T.DeepseekV2Model, n_routed_experts=EXPERTS,
                             n_group=2, topk_group=1, first_k_dense_replace=1,
                             moe_intermediate_size=FF, q_lora_rank=32, kv_lora_rank=32,
                             qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16,
                             num_experts_per_tok=2, **moe),
        "llama4": build(T.Llama4TextConfig, T.Llama4TextModel, num_local_experts=EXPERTS,
                        intermediate_size_mlp=FF, head_dim=H // HEADS, **moe),
        # fused Wqkv clipped, experts as one stacked weight looped over in the forward
        "dbrx": build(T.DbrxConfig, T.DbrxModel, d_model=H, n_heads=HEADS, n_layers=LAYERS,
                      max_seq_len=64, vocab_size=VOCAB,
                      attn_config=dict(kv_n_heads=2, clip_qkv=8.0, rope_theta=10000.0),
                      ffn_config=dict(ffn_hidden_size=FF, moe_num_experts=EXPERTS, moe_top_k=2)),
        # state-space models of other sizes than the zoo's (state, expansion, window)
        "mamba_wide": build(T.MambaConfig, T.MambaModel, attention=False, hidden_size=H,
                            num_hidden_layers=LAYERS, vocab_size=VOCAB, state_size=8, expand=4,
                            conv_kernel=3),
        "falcon_mamba_narrow": build(T.FalconMambaConfig, T.FalconMambaModel, attention=False,
                                     hidden_size=H, num_hidden_layers=LAYERS, vocab_size=VOCAB,
                                     state_size=32, expand=1, conv_kernel=2),
        "mamba2_groups": build(T.Mamba2Config, T.Mamba2Model, attention=False, hidden_size=H,
                               num_hidden_layers=LAYERS, vocab_size=VOCAB, state_size=16,
                               num_heads=8, head_dim=16, n_groups=2, chunk_size=8),
        # hybrids: a Mamba layer with a dense MLP, then an attention layer with experts
        "jamba": build(T.JambaConfig, T.JambaModel, num_experts=EXPERTS, attn_layer_period=2,
                       attn_layer_offset=1, expert_layer_period=2, expert_layer_offset=1,
                       mamba_d_state=16, **moe),
        # a Mamba2 layer, then an attention layer (each with a gated MLP)
        "bamba": build(T.BambaConfig, T.BambaModel, attn_layer_indices=[1], mamba_n_heads=8,
                       mamba_d_head=16, mamba_n_groups=1, mamba_d_state=16, mamba_chunk_size=8,
                       **moe),
        # decoders outside the zoo: parallel block with a LayerNorm without bias (Cohere),
        # fused QKV and gate/up (Phi-3), soft-capped logits and sliding layers (Gemma 2),
        # norms after attention and MLP with Q/K norms (OLMo 2)
        "cohere": build(T.CohereConfig, T.CohereModel, **ids, **moe),
        "phi3": build(T.Phi3Config, T.Phi3Model, **ids, **moe),
        "gemma2": build(T.Gemma2Config, T.Gemma2Model, head_dim=H // HEADS, sliding_window=8,
                        **moe),
        "olmo2": build(T.Olmo2Config, T.Olmo2Model, **ids, **moe),
        # an encoder with rotary, GeGLU and alternating local/global attention
        "modernbert": build(T.ModernBertConfig, T.ModernBertModel, local_attention=8,
                            cls_token_id=0, sep_token_id=0, **ids, **enc),
        # vision: a ViT with layer scale (DINOv2), ConvNeXt with global response norms
        "dinov2": build(T.Dinov2Config, T.Dinov2Model, key="pixel_values",
                        shape=(2, 3, 32, 32), image_size=32, patch_size=8, **vis),
        "convnextv2": build(T.ConvNextV2Config, T.ConvNextV2Model, key="pixel_values",
                            shape=(2, 3, 32, 32), image_size=32, hidden_sizes=[16, 32],
                            depths=[1, 1], num_stages=2, patch_size=4),
        # speech: WavLM's gated relative position bias over a convolutional front end
        "wavlm": build(T.WavLMConfig, T.WavLMModel, key="input_values", shape=(2, 400),
                       conv_dim=(32, 32), conv_stride=(5, 2), conv_kernel=(10, 3),
                       num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4,
                       vocab_size=VOCAB, **vis),
    }


def select_held_out(names, attn: str = "sdpa") -> dict | None:
    """The held-out builders named in ``names`` (every one when empty); None, after printing
    what is accepted, when a name is not one of them (the benchmarks exit 2)."""
    import sys

    zoo = held_out_builders(attn)
    unknown = sorted(set(names) - set(zoo))
    if unknown:
        print(f"error: unknown held-out model(s) {', '.join(unknown)} (accepted: "
              f"{', '.join(zoo)})", file=sys.stderr)
        return None
    return {k: v for k, v in zoo.items() if not names or k in names}
