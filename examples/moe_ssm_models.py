"""Mixture-of-experts and state-space models for the zoo, built as users build them: each from
its ``transformers`` config with the library's defaults (attention implementation, experts
implementation, Mamba's associative scan), 2 layers, hidden size 64, seeded weights, no
download. ``builders()`` has the same form as ``export_models.builders``: name -> (build the
model, example inputs); ``FAMILY`` says which family each belongs to. ``held_out_builders()``
has further architectures built the same way, kept out of the zoo (``HELD_OUT_FAMILY``: MoE
decoders, state-space models of other sizes and hybrids, decoders, an encoder, vision,
speech and time-series models): the mechanisms are tuned on the zoo, these check that
they carry over.

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
    # a second held-out set
    **dict.fromkeys(("starcoder2", "gemma3_text", "helium", "glm", "cohere2", "nemotron", "opt",
                     "codegen", "biogpt", "xglm"), "decoder"),
    **dict.fromkeys(("distilbert", "xlm_roberta", "mpnet", "convbert", "funnel"), "encoder"),
    **dict.fromkeys(("pegasus", "marian", "mbart", "m2m100", "umt5", "longt5"),
                    "encoder-decoder"),
    **dict.fromkeys(("recurrent_gemma", "zamba2", "falcon_h1", "rwkv"), "state-space"),
    **dict.fromkeys(("switch_transformers", "granitemoehybrid"), "mixture-of-experts"),
    **dict.fromkeys(("beit", "data2vec_vision", "swinv2", "segformer", "levit", "mobilevit",
                     "focalnet"), "vision"),
    **dict.fromkeys(("sew", "unispeech", "data2vec_audio"), "audio"),
    # a third held-out set
    **dict.fromkeys(("olmo", "smollm3", "arcee", "glm4", "gpt_neo", "exaone4"), "decoder"),
    **dict.fromkeys(("roformer", "esm", "megatron_bert", "deberta"), "encoder"),
    **dict.fromkeys(("blenderbot", "plbart"), "encoder-decoder"),
    **dict.fromkeys(("hunyuan_v1_moe", "flex_olmo"), "mixture-of-experts"),
    **dict.fromkeys(("lfm2", "nemotron_h"), "state-space"),
    **dict.fromkeys(("hiera", "pvt_v2", "vitdet", "dinov2_with_registers"), "vision"),
    **dict.fromkeys(("ast", "wav2vec2_conformer"), "audio"),
    "chinese_clip": "dual encoder",
    # -- a fourth held-out set: decoders, MoE, state-space --
    **dict.fromkeys(("ministral", "seed_oss", "bitnet", "ernie4_5", "hunyuan_v1_dense", "olmo3",
                     "vaultgemma", "doge", "apertus"), "decoder"),
    **dict.fromkeys(("granitemoeshared", "longcat_flash", "nllb_moe", "lfm2_moe"),
                    "mixture-of-experts"),
    **dict.fromkeys(("qwen3_next", "minimax", "xlstm", "zamba"), "state-space"),
    "olmo3_generate": "kv-cache",

    # -- a fifth held-out set: encoders, encoder-decoders, vision, audio, dual --
    **dict.fromkeys(("bigbird", "longformer", "fnet", "mobilebert", "squeezebert", "canine",
                     "mra"), "encoder"),
    **dict.fromkeys(("led", "prophetnet", "fsmt", "mt5", "bigbird_pegasus"),
                    "encoder-decoder"),
    **dict.fromkeys(("yolos", "cvt", "mobilevitv2", "swiftformer", "glpn", "videomae"),
                    "vision"),
    **dict.fromkeys(("unispeech_sat", "wav2vec2_bert", "speech_to_text", "moonshine"),
                    "audio"),
    **dict.fromkeys(("owlvit", "groupvit", "altclip"), "dual encoder"),
    # -- a sixth held-out set: decoders, MoE, encoders, vision, audio, time series --
    **dict.fromkeys(("ctrl", "xlnet", "diffllama", "minicpm3"), "decoder"),
    **dict.fromkeys(("afmoe", "cohere2_moe", "glm4_moe_lite", "exaone_moe", "deepseek_v32"),
                    "mixture-of-experts"),
    **dict.fromkeys(("kimi_linear", "olmo_hybrid"), "state-space"),
    **dict.fromkeys(("rembert", "xmod", "nomic_bert", "yoso", "eurobert"), "encoder"),
    **dict.fromkeys(("timesformer", "pvt", "mobilenet_v2_hf", "dpt", "vivit"), "vision"),
    **dict.fromkeys(("patchtst", "patchtsmixer"), "time series"),
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

    class Seq2Seq(Hidden):
        """An encoder-decoder fed the same ids on both sides; the decoder's last hidden
        state."""

        def forward(self, x):
            return self.model(input_ids=x, decoder_input_ids=x).last_hidden_state

    class Speech2Seq(Hidden):
        """An encoder-decoder fed ``key`` (features, a waveform) on the encoder's side and
        token ids on the decoder's; the decoder's last hidden state."""

        def __init__(self, model, key):
            super().__init__(model)
            self.key = key

        def forward(self, x, ids):
            return self.model(**{self.key: x}, decoder_input_ids=ids).last_hidden_state

    class Dual(Hidden):
        """A text + image dual encoder: its image-text similarity logits."""

        def forward(self, ids, pixels):
            return self.model(input_ids=ids, pixel_values=pixels).logits_per_image

    def build(cfg_cls, model_cls, attention=True, key=None, shape=None, seq2seq=False,
              dual=False, **kw):
        """``key``/``shape``: a model fed a float tensor of ``shape`` (uniform in [0, 1))
        under that keyword instead of token ids; ``seq2seq``: an encoder-decoder fed the
        ids on both sides (with ``key``: fed that float tensor on the encoder's side, the
        ids on the decoder's); ``dual``: a dual encoder fed the ids and images of ``shape``."""
        def make():
            torch.manual_seed(SEED)
            cfg = cfg_cls(**kw, **(common if attention else {}))
            model = model_cls(cfg).eval()
            if seq2seq:
                return Speech2Seq(model, key) if key else Seq2Seq(model)
            if dual:
                return Dual(model)
            return Named(model, key) if key else Hidden(model)

        def inputs():
            pixels = torch.rand(*shape, generator=torch.Generator().manual_seed(SEED)) \
                if shape else None
            if dual:
                return _inputs(torch)[0], pixels
            if seq2seq and key:
                return pixels, _inputs(torch)[0]
            return (pixels,) if key else _inputs(torch)
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
    top-1 router), DBRX; then the other families (see the comments at each); then a second
    set across the families (decoders, encoders, encoder-decoders, state-space and recurrent
    models, MoE, vision and speech), 2 layers, hidden size 64 (the vision stages smaller); then
    a third set likewise (with a text + image dual encoder, ``dual``); a fourth, fifth and
    sixth set likewise (the sixth with time-series models fed ``past_values``)."""
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
    s2s = dict(d_model=H, encoder_layers=LAYERS, decoder_layers=LAYERS,
               encoder_attention_heads=HEADS, decoder_attention_heads=HEADS,
               encoder_ffn_dim=FF, decoder_ffn_dim=FF, vocab_size=VOCAB,
               decoder_start_token_id=0, **ids)
    clip_text = dict(hidden_size=H, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                     intermediate_size=FF, vocab_size=VOCAB, max_position_embeddings=16)
    group = dict(n_routed_experts=2 * EXPERTS, n_group=2, topk_group=1, n_shared_experts=1,
                 first_k_dense_replace=1, moe_intermediate_size=FF, num_experts_per_tok=2)

    def generate(cfg_cls, model_cls, **kw):
        """A KV-cache ``generate()`` loop of a causal LM (``export_models.Generate``) over
        the first 8 ids of the inputs, as the zoo's ``llama_generate``."""
        import torch
        from export_models import Generate

        def make():
            torch.manual_seed(SEED)
            eager = dict(attn_implementation="eager") if attn == "eager" else {}
            return Generate(model_cls(cfg_cls(**kw, **eager)).eval())
        return make, lambda: (_inputs(torch)[0][:, :8],)

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
        # -- a second held-out set --
        # decoders: sliding windows with LayerNorm and biased GELU MLPs (Starcoder2), Q/K
        # norms and alternating sliding layers (Gemma 3), partial rotary (GLM, Nemotron's
        # LayerNorm1p and squared ReLU), a parallel block with sliding layers (Cohere 2),
        # learned positions with ReLU (OPT, XGLM's sinusoids), GPT-J style rotary (CodeGen)
        "starcoder2": build(T.Starcoder2Config, T.Starcoder2Model, sliding_window=8, **ids,
                            **moe),
        "gemma3_text": build(T.Gemma3TextConfig, T.Gemma3TextModel, head_dim=H // HEADS,
                             sliding_window=8, **ids, **moe),
        "helium": build(T.HeliumConfig, T.HeliumModel, head_dim=H // HEADS, **ids, **moe),
        "glm": build(T.GlmConfig, T.GlmModel, head_dim=H // HEADS, **ids, **moe),
        "cohere2": build(T.Cohere2Config, T.Cohere2Model, sliding_window=8, **ids, **moe),
        "nemotron": build(T.NemotronConfig, T.NemotronModel, head_dim=H // HEADS, **ids,
                          **moe),
        "opt": build(T.OPTConfig, T.OPTModel, hidden_size=H, num_hidden_layers=LAYERS,
                     ffn_dim=FF, num_attention_heads=HEADS, vocab_size=VOCAB,
                     max_position_embeddings=64, word_embed_proj_dim=H, **ids),
        "codegen": build(T.CodeGenConfig, T.CodeGenModel, n_layer=LAYERS, n_embd=H,
                         n_head=HEADS, n_inner=FF, vocab_size=VOCAB, n_positions=64, n_ctx=64,
                         rotary_dim=8, bos_token_id=0, eos_token_id=0),
        "biogpt": build(T.BioGptConfig, T.BioGptModel, **ids, **enc),
        "xglm": build(T.XGLMConfig, T.XGLMModel, d_model=H, num_layers=LAYERS,
                      attention_heads=HEADS, ffn_dim=FF, vocab_size=VOCAB,
                      max_position_embeddings=64, **ids),
        # encoders: DistilBERT, XLM-R, MPNet's relative bias, ConvBERT's span convolutions,
        # Funnel's pooled blocks
        "distilbert": build(T.DistilBertConfig, T.DistilBertModel, dim=H, n_layers=LAYERS,
                            n_heads=HEADS, hidden_dim=FF, vocab_size=VOCAB,
                            max_position_embeddings=64, pad_token_id=0),
        "xlm_roberta": build(T.XLMRobertaConfig, T.XLMRobertaModel, pad_token_id=1, **enc),
        "mpnet": build(T.MPNetConfig, T.MPNetModel, pad_token_id=1, **enc),
        "convbert": build(T.ConvBertConfig, T.ConvBertModel, embedding_size=H, pad_token_id=0,
                          **enc),
        "funnel": build(T.FunnelConfig, T.FunnelBaseModel, block_sizes=[1, 1], d_model=H,
                        n_head=HEADS, d_head=H // HEADS, d_inner=FF, vocab_size=VOCAB,
                        pad_token_id=0),
        # encoder-decoders: Pegasus (sinusoidal positions), Marian, mBART (pre-norm),
        # M2M-100, UMT5 (a relative bias per layer), LongT5 (local attention)
        **{name: build(cfg, model, seq2seq=True, d_model=H, encoder_layers=LAYERS,
                       decoder_layers=LAYERS, encoder_attention_heads=HEADS,
                       decoder_attention_heads=HEADS, encoder_ffn_dim=FF, decoder_ffn_dim=FF,
                       vocab_size=VOCAB, max_position_embeddings=64, decoder_start_token_id=0,
                       **ids)
           for name, cfg, model in (("pegasus", T.PegasusConfig, T.PegasusModel),
                                    ("marian", T.MarianConfig, T.MarianModel),
                                    ("mbart", T.MBartConfig, T.MBartModel),
                                    ("m2m100", T.M2M100Config, T.M2M100Model))},
        "umt5": build(T.UMT5Config, T.UMT5Model, seq2seq=True, num_layers=LAYERS, d_model=H,
                      d_kv=H // HEADS, num_heads=HEADS, d_ff=FF, vocab_size=VOCAB,
                      decoder_start_token_id=0, pad_token_id=0, eos_token_id=0),
        "longt5": build(T.LongT5Config, T.LongT5Model, seq2seq=True, num_layers=LAYERS,
                        d_model=H, d_kv=H // HEADS, num_heads=HEADS, d_ff=FF, vocab_size=VOCAB,
                        local_radius=4, decoder_start_token_id=0, pad_token_id=0,
                        eos_token_id=0),
        # state-space and recurrent: RecurrentGemma (an RG-LRU layer, then local attention),
        # Zamba2 (Mamba2 with a shared attention block), Falcon-H1 (attention and Mamba2 in
        # parallel), RWKV (a WKV recurrence)
        "recurrent_gemma": build(T.RecurrentGemmaConfig, T.RecurrentGemmaModel, lru_width=H,
                                 attention_window_size=8, block_types=["recurrent",
                                                                       "attention"],
                                 num_key_value_heads=1, **ids, **{k: v for k, v in moe.items()
                                                                  if k not in (
                                                                      "num_key_value_heads",
                                                                      "max_position_embeddings")}),
        "zamba2": build(T.Zamba2Config, T.Zamba2Model, hidden_size=H, num_hidden_layers=LAYERS,
                        layers_block_type=["mamba", "hybrid"], mamba_d_state=16,
                        n_mamba_heads=8, mamba_ngroups=1, chunk_size=8, intermediate_size=FF,
                        num_attention_heads=HEADS, num_key_value_heads=HEADS,
                        vocab_size=VOCAB, max_position_embeddings=64, **ids),
        "falcon_h1": build(T.FalconH1Config, T.FalconH1Model, mamba_n_heads=8, mamba_d_head=16,
                           mamba_n_groups=1, mamba_d_state=16, mamba_chunk_size=8,
                           mamba_d_ssm=128, **ids, **moe),
        "rwkv": build(T.RwkvConfig, T.RwkvModel, attention=False, hidden_size=H,
                      num_hidden_layers=LAYERS, attention_hidden_size=H, intermediate_size=FF,
                      vocab_size=VOCAB, context_length=64, bos_token_id=0, eos_token_id=0),
        # mixtures of experts: Switch Transformers' top-1 router in an encoder-decoder,
        # GraniteMoE hybrid (Mamba2 and attention layers with experts)
        "switch_transformers": build(T.SwitchTransformersConfig,
                                     T.SwitchTransformersModel, seq2seq=True,
                                     num_layers=LAYERS, num_sparse_encoder_layers=1,
                                     num_sparse_decoder_layers=1, d_model=H, d_kv=H // HEADS,
                                     num_heads=HEADS, d_ff=FF, num_experts=EXPERTS,
                                     vocab_size=VOCAB, decoder_start_token_id=0,
                                     pad_token_id=0, eos_token_id=0),
        "granitemoehybrid": build(T.GraniteMoeHybridConfig, T.GraniteMoeHybridModel,
                                  layer_types=["mamba", "attention"], num_local_experts=EXPERTS,
                                  num_experts_per_tok=2, mamba_n_heads=8, mamba_d_head=16,
                                  mamba_n_groups=1, mamba_d_state=16, mamba_chunk_size=8,
                                  **ids, **moe),
        # vision: BEiT (relative position bias, layer scale), Data2Vec-vision, Swin v2
        # (cosine attention, a log-spaced position bias), SegFormer (reduced keys, mix-FFN),
        # LeViT, MobileViT, FocalNet (focal modulation)
        "beit": build(T.BeitConfig, T.BeitModel, key="pixel_values", shape=(2, 3, 32, 32),
                      image_size=32, patch_size=8, use_relative_position_bias=True, **vis),
        "data2vec_vision": build(T.Data2VecVisionConfig, T.Data2VecVisionModel,
                                 key="pixel_values", shape=(2, 3, 32, 32), image_size=32,
                                 patch_size=8, use_relative_position_bias=True, **vis),
        "swinv2": build(T.Swinv2Config, T.Swinv2Model, key="pixel_values",
                        shape=(2, 3, 32, 32), image_size=32, patch_size=4, embed_dim=32,
                        depths=[1, 1], num_heads=[2, 4], window_size=4, mlp_ratio=2.0),
        "segformer": build(T.SegformerConfig, T.SegformerModel, key="pixel_values",
                           shape=(2, 3, 32, 32), num_encoder_blocks=2, depths=[1, 1],
                           sr_ratios=[2, 1], hidden_sizes=[32, 64], patch_sizes=[7, 3],
                           strides=[4, 2], num_attention_heads=[1, 2], mlp_ratios=[2, 2]),
        "levit": build(T.LevitConfig, T.LevitModel, key="pixel_values", shape=(2, 3, 64, 64),
                       image_size=64, hidden_sizes=[32, 64, 96], num_attention_heads=[1, 2, 3],
                       depths=[1, 1, 1], key_dim=[8, 8, 8]),
        "mobilevit": build(T.MobileViTConfig, T.MobileViTModel, key="pixel_values",
                           shape=(2, 3, 64, 64), image_size=64, hidden_sizes=[32, 48, 64],
                           neck_hidden_sizes=[8, 16, 24, 24, 32, 40, 160]),
        "focalnet": build(T.FocalNetConfig, T.FocalNetModel, key="pixel_values",
                          shape=(2, 3, 32, 32), image_size=32, patch_size=4, embed_dim=32,
                          depths=[1, 1], hidden_sizes=[32, 64]),
        # speech: SEW (squeezed frames), UniSpeech, Data2Vec-audio (stacked positional convs)
        **{name: build(cfg, model, key="input_values", shape=(2, 400), conv_dim=(32, 32),
                       conv_stride=(5, 2), conv_kernel=(10, 3), num_conv_pos_embeddings=16,
                       num_conv_pos_embedding_groups=4, vocab_size=VOCAB, **vis)
           for name, cfg, model in (("sew", T.SEWConfig, T.SEWModel),
                                    ("unispeech", T.UniSpeechConfig, T.UniSpeechModel),
                                    ("data2vec_audio", T.Data2VecAudioConfig,
                                     T.Data2VecAudioModel))},
        # -- a third held-out set --
        # decoders: OLMo (LayerNorm without parameters, clipped QKV off by default), SmolLM3
        # (layers without rotary), Arcee (squared-ReLU MLP), GLM-4 (norms after attention and
        # MLP, partial rotary), GPT-Neo (alternating global and local windows, unscaled
        # scores), EXAONE 4 (Q/K norms, norms after the blocks)
        "olmo": build(T.OlmoConfig, T.OlmoModel, **ids, **moe),
        "smollm3": build(T.SmolLM3Config, T.SmolLM3Model, no_rope_layer_interval=2, **ids,
                         **moe),
        "arcee": build(T.ArceeConfig, T.ArceeModel, **ids, **moe),
        "glm4": build(T.Glm4Config, T.Glm4Model, head_dim=H // HEADS, **ids, **moe),
        "gpt_neo": build(T.GPTNeoConfig, T.GPTNeoModel, num_layers=LAYERS, hidden_size=H,
                         num_heads=HEADS, intermediate_size=FF, vocab_size=VOCAB,
                         max_position_embeddings=64, window_size=8,
                         attention_types=[[["global", "local"], 1]], bos_token_id=0,
                         eos_token_id=0),
        "exaone4": build(T.Exaone4Config, T.Exaone4Model, sliding_window=8, **ids, **moe),
        # encoders: RoFormer (rotary), ESM (rotary, pre-norm), Megatron-BERT (pre-norm),
        # DeBERTa (disentangled relative attention)
        "roformer": build(T.RoFormerConfig, T.RoFormerModel, embedding_size=H, pad_token_id=0,
                          **enc),
        "esm": build(T.EsmConfig, T.EsmModel, pad_token_id=1, mask_token_id=2,
                     position_embedding_type="rotary", **enc),
        "megatron_bert": build(T.MegatronBertConfig, T.MegatronBertModel, pad_token_id=0,
                               **enc),
        "deberta": build(T.DebertaConfig, T.DebertaModel, pad_token_id=0, **enc),
        # encoder-decoders: Blenderbot (pre-norm), PLBart
        **{name: build(cfg, model, seq2seq=True, d_model=H, encoder_layers=LAYERS,
                       decoder_layers=LAYERS, encoder_attention_heads=HEADS,
                       decoder_attention_heads=HEADS, encoder_ffn_dim=FF, decoder_ffn_dim=FF,
                       vocab_size=VOCAB, max_position_embeddings=64, decoder_start_token_id=0,
                       **ids)
           for name, cfg, model in (("blenderbot", T.BlenderbotConfig, T.BlenderbotModel),
                                    ("plbart", T.PLBartConfig, T.PLBartModel))},
        # mixtures of experts: HunYuan MoE (Q/K norms, a shared MLP), FlexOlmo (Q/K norms,
        # norms after the blocks)
        "hunyuan_v1_moe": build(T.HunYuanMoEV1Config, T.HunYuanMoEV1Model, num_experts=EXPERTS,
                                moe_topk=2, head_dim=H // HEADS, **ids, **moe),
        "flex_olmo": build(T.FlexOlmoConfig, T.FlexOlmoModel, num_experts=EXPERTS,
                           num_experts_per_tok=2, **ids, **moe),
        # hybrids: LFM2 (gated short convolutions, then attention), Nemotron-H (Mamba2,
        # attention and MLP layers)
        "lfm2": build(T.Lfm2Config, T.Lfm2Model, layer_types=["conv", "full_attention"],
                      **ids, **moe),
        "nemotron_h": build(T.NemotronHConfig, T.NemotronHModel,
                            hybrid_override_pattern="M*-", mamba_num_heads=8,
                            mamba_head_dim=16, n_groups=1, ssm_state_size=16, chunk_size=8,
                            **ids, **{**moe, "num_hidden_layers": 3}),
        # vision: Hiera (masked-unit windows, pooled stages), PVT v2 (reduced keys),
        # ViTDet (windowed and global blocks with relative positions), DINOv2 with registers
        "hiera": build(T.HieraConfig, T.HieraModel, key="pixel_values", shape=(2, 3, 32, 32),
                       image_size=[32, 32], patch_size=[3, 3], patch_stride=[2, 2],
                       patch_padding=[1, 1], embed_dim=16, num_heads=[1, 2],
                       depths=[1, 1], query_stride=[2, 2], masked_unit_size=[4, 4],
                       num_query_pool=1, mlp_ratio=2.0),
        "pvt_v2": build(T.PvtV2Config, T.PvtV2Model, key="pixel_values", shape=(2, 3, 32, 32),
                        image_size=32, num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1],
                        hidden_sizes=[32, 64], patch_sizes=[7, 3], strides=[4, 2],
                        num_attention_heads=[1, 2], mlp_ratios=[2, 2]),
        "vitdet": build(T.VitDetConfig, T.VitDetModel, key="pixel_values",
                        shape=(2, 3, 32, 32), image_size=32, pretrain_image_size=32,
                        patch_size=4, window_size=4, window_block_indices=[0],
                        use_relative_position_embeddings=True, **vis),
        "dinov2_with_registers": build(T.Dinov2WithRegistersConfig,
                                       T.Dinov2WithRegistersModel, key="pixel_values",
                                       shape=(2, 3, 32, 32), image_size=32, patch_size=8,
                                       num_register_tokens=4, **vis),
        # speech: the Audio Spectrogram Transformer, the Wav2Vec2 Conformer (rotary, a
        # depthwise convolution module)
        "ast": build(T.ASTConfig, T.ASTModel, key="input_values", shape=(2, 32, 16),
                     max_length=32, num_mel_bins=16, patch_size=8, frequency_stride=8,
                     time_stride=8, **vis),
        "wav2vec2_conformer": build(T.Wav2Vec2ConformerConfig, T.Wav2Vec2ConformerModel,
                                    key="input_values", shape=(2, 400), conv_dim=(32, 32),
                                    conv_stride=(5, 2), conv_kernel=(10, 3),
                                    num_conv_pos_embeddings=16,
                                    num_conv_pos_embedding_groups=4, vocab_size=VOCAB,
                                    position_embeddings_type="rotary",
                                    conv_depthwise_kernel_size=7, **vis),
        # a text + image dual encoder: Chinese-CLIP (a BERT text tower)
        "chinese_clip": build(T.ChineseCLIPConfig, T.ChineseCLIPModel, dual=True,
                              shape=(2, 3, 32, 32),
                              text_config=dict(enc, pad_token_id=0),
                              vision_config=dict(vis, image_size=32, patch_size=8)),
        # -- a fourth held-out set: decoders, MoE, state-space --
        # decoders: Ministral (sliding windows), Seed-OSS (biased QKV), BitNet (a norm inside
        # attention and MLP, squared ReLU), ERNIE 4.5, HunYuan dense (Q/K norms), OLMo 3
        # (sliding and full layers, norms after the blocks), VaultGemma (Gemma's scaled
        # embedding, soft caps), Doge (dynamic-mask attention), Apertus (xIELU activation)
        "ministral": build(T.MinistralConfig, T.MinistralModel, head_dim=H // HEADS,
                           sliding_window=8,
                           layer_types=["sliding_attention", "full_attention"], **ids, **moe),
        "seed_oss": build(T.SeedOssConfig, T.SeedOssModel, head_dim=H // HEADS, **ids, **moe),
        "bitnet": build(T.BitNetConfig, T.BitNetModel, **ids, **moe),
        "ernie4_5": build(T.Ernie4_5Config, T.Ernie4_5Model, head_dim=H // HEADS, **ids, **moe),
        "hunyuan_v1_dense": build(T.HunYuanDenseV1Config, T.HunYuanDenseV1Model,
                                  head_dim=H // HEADS, **ids, **moe),
        "olmo3": build(T.Olmo3Config, T.Olmo3Model, sliding_window=8,
                       layer_types=["sliding_attention", "full_attention"], **ids, **moe),
        "vaultgemma": build(T.VaultGemmaConfig, T.VaultGemmaModel, head_dim=H // HEADS,
                            sliding_window=8, **ids, **moe),
        "doge": build(T.DogeConfig, T.DogeModel, keep_window_size=8, **ids,
                      **{k: v for k, v in moe.items() if k != "num_key_value_heads"},
                      num_key_value_heads=HEADS),
        "apertus": build(T.ApertusConfig, T.ApertusModel, **ids, **moe),
        # mixtures of experts: GraniteMoE with a shared expert, LongCat-Flash (zero experts,
        # latent attention, two attention blocks per layer), NLLB-MoE (an encoder-decoder
        # with top-2 experts and capacity), LFM2-MoE (short convolutions, a biased router)
        "granitemoeshared": build(T.GraniteMoeSharedConfig, T.GraniteMoeSharedModel,
                                  num_local_experts=EXPERTS, num_experts_per_tok=2,
                                  shared_intermediate_size=FF, **ids, **moe),
        "longcat_flash": build(T.LongcatFlashConfig, T.LongcatFlashModel, num_layers=1,
                               hidden_size=H, num_attention_heads=HEADS,
                               num_key_value_heads=HEADS, ffn_hidden_size=FF, q_lora_rank=32,
                               kv_lora_rank=32, qk_nope_head_dim=8, qk_rope_head_dim=8,
                               head_dim=8, v_head_dim=16, qk_head_dim=16, moe_topk=2,
                               n_routed_experts=EXPERTS, zero_expert_num=2,
                               expert_ffn_hidden_size=FF, vocab_size=VOCAB,
                               max_position_embeddings=64, **ids),
        "nllb_moe": build(T.NllbMoeConfig, T.NllbMoeModel, seq2seq=True, d_model=H,
                          encoder_layers=LAYERS, decoder_layers=LAYERS,
                          encoder_attention_heads=HEADS, decoder_attention_heads=HEADS,
                          encoder_ffn_dim=FF, decoder_ffn_dim=FF, vocab_size=VOCAB,
                          max_position_embeddings=64, num_experts=EXPERTS, expert_capacity=16,
                          encoder_sparse_step=2, decoder_sparse_step=2,
                          decoder_start_token_id=0, **ids),
        "lfm2_moe": build(T.Lfm2MoeConfig, T.Lfm2MoeModel, num_experts=EXPERTS,
                          num_experts_per_tok=2, moe_intermediate_size=FF, num_dense_layers=1,
                          layer_types=["conv", "full_attention"], **ids, **moe),
        # state-space and linear attention: Qwen3-Next (gated delta-net then attention, with
        # experts), MiniMax (lightning attention then softmax attention, with experts),
        # xLSTM (chunkwise mLSTM blocks; query/key as wide as the values, the library's
        # chunkwise kernel failing in eager with narrower ones), Zamba (a Mamba layer, then two
        # hybrid layers sharing one attention block)
        "qwen3_next": build(T.Qwen3NextConfig, T.Qwen3NextModel, head_dim=H // HEADS,
                            layer_types=["linear_attention", "full_attention"],
                            linear_key_head_dim=16, linear_value_head_dim=16,
                            linear_num_key_heads=2, linear_num_value_heads=4,
                            num_experts=EXPERTS, num_experts_per_tok=2,
                            moe_intermediate_size=FF, shared_expert_intermediate_size=FF,
                            **ids, **moe),
        "minimax": build(T.MiniMaxConfig, T.MiniMaxModel, head_dim=H // HEADS, block_size=8,
                         layer_types=["linear_attention", "full_attention"],
                         num_local_experts=EXPERTS, **ids, **moe),
        "xlstm": build(T.xLSTMConfig, T.xLSTMModel, attention=False, hidden_size=H,
                       embedding_dim=H, num_hidden_layers=LAYERS, num_blocks=LAYERS,
                       num_heads=HEADS, vocab_size=VOCAB, chunk_size=8, qk_dim_factor=1.0, **ids),
        "zamba": build(T.ZambaConfig, T.ZambaModel, hidden_size=H, attention_hidden_size=2 * H,
                       intermediate_size=FF, num_hidden_layers=3, num_attention_heads=HEADS,
                       attention_head_dim=2 * H // HEADS, num_key_value_heads=HEADS,
                       n_mamba_heads=2, mamba_dt_rank=8,
                       layers_block_type=["mamba", "hybrid", "hybrid"],
                       vocab_size=VOCAB, max_position_embeddings=64,
                       **ids),
        # a KV-cache generate() loop of a decoder with Q/K norms and sliding layers
        "olmo3_generate": generate(T.Olmo3Config, T.Olmo3ForCausalLM, sliding_window=8,
                                   layer_types=["sliding_attention", "full_attention"],
                                   **ids, **moe),

        # -- a fifth held-out set: encoders, encoder-decoders, vision, audio, dual --
        # encoders: BigBird (block-sparse attention: sliding, global and random blocks),
        # Longformer (sliding windows), FNet (Fourier mixing, no attention), MobileBERT
        # (bottlenecks, NoNorm), SqueezeBERT (grouped 1x1 convolutions), CANINE (hashed
        # characters, a downsampling convolution), MRA (multi-resolution block attention).
        # (Nystromformer is not here: under torch.compile, whatever the backend, Dynamo
        # fails on its landmark scores plus a 4-d mask that eager never builds.)
        "bigbird": build(T.BigBirdConfig, T.BigBirdModel, attention_type="block_sparse",
                         block_size=2, num_random_blocks=1, **ids, **enc),
        "longformer": build(T.LongformerConfig, T.LongformerModel, attention_window=4,
                            pad_token_id=1, **enc),
        "fnet": build(T.FNetConfig, T.FNetModel, attention=False, hidden_size=H,
                      num_hidden_layers=LAYERS, intermediate_size=FF, vocab_size=VOCAB,
                      max_position_embeddings=64, pad_token_id=0),
        "mobilebert": build(T.MobileBertConfig, T.MobileBertModel, embedding_size=32,
                            intra_bottleneck_size=32, num_feedforward_networks=2,
                            pad_token_id=0, **enc),
        "squeezebert": build(T.SqueezeBertConfig, T.SqueezeBertModel, attention=False,
                             embedding_size=H, **ids, **enc),
        "canine": build(T.CanineConfig, T.CanineModel, hidden_size=H, num_hidden_layers=LAYERS,
                        num_attention_heads=HEADS, intermediate_size=FF,
                        max_position_embeddings=64, downsampling_rate=4, num_hash_buckets=64,
                        num_hash_functions=4, local_transformer_stride=8, **ids),
        "mra": build(T.MraConfig, T.MraModel, block_per_row=2, **ids, **enc),
        # encoder-decoders: LED (a Longformer encoder), ProphetNet (n-gram streams with
        # relative buckets), FSMT, mT5, BigBird-Pegasus (a block-sparse encoder)
        "led": build(T.LEDConfig, T.LEDModel, seq2seq=True, attention_window=4,
                     max_encoder_position_embeddings=64, max_decoder_position_embeddings=64,
                     **s2s),
        "prophetnet": build(T.ProphetNetConfig, T.ProphetNetModel, seq2seq=True, hidden_size=H,
                            num_encoder_layers=LAYERS, num_decoder_layers=LAYERS,
                            num_encoder_attention_heads=HEADS,
                            num_decoder_attention_heads=HEADS, encoder_ffn_dim=FF,
                            decoder_ffn_dim=FF, vocab_size=VOCAB, max_position_embeddings=64,
                            ngram=2, num_buckets=8, relative_max_distance=16,
                            decoder_start_token_id=0, **ids),
        "fsmt": build(T.FSMTConfig, T.FSMTModel, seq2seq=True, langs=["en", "de"],
                      src_vocab_size=VOCAB, tgt_vocab_size=VOCAB, d_model=H,
                      encoder_layers=LAYERS, decoder_layers=LAYERS,
                      encoder_attention_heads=HEADS, decoder_attention_heads=HEADS,
                      encoder_ffn_dim=FF, decoder_ffn_dim=FF, max_position_embeddings=64,
                      decoder_start_token_id=0, **ids),
        "mt5": build(T.MT5Config, T.MT5Model, seq2seq=True, num_layers=LAYERS, d_model=H,
                     d_kv=H // HEADS, num_heads=HEADS, d_ff=FF, vocab_size=VOCAB,
                     decoder_start_token_id=0, pad_token_id=0, eos_token_id=0),
        "bigbird_pegasus": build(T.BigBirdPegasusConfig, T.BigBirdPegasusModel, seq2seq=True,
                                 attention_type="block_sparse", block_size=2,
                                 num_random_blocks=1, max_position_embeddings=64, **s2s),
        # vision: YOLOS (detection tokens), CvT (convolutional projections; stage i needs
        # more than i layers: the library indexes its drop-path rates by stage), MobileViT v2
        # (separable linear attention), SwiftFormer (additive attention), GLPN (a SegFormer
        # encoder), VideoMAE (tubelets of frames)
        "yolos": build(T.YolosConfig, T.YolosModel, key="pixel_values", shape=(2, 3, 32, 32),
                       image_size=[32, 32], patch_size=8, num_detection_tokens=4, **vis),
        "cvt": build(T.CvtConfig, T.CvtModel, key="pixel_values", shape=(2, 3, 32, 32),
                     embed_dim=[16, 32, 48], num_heads=[1, 2, 3], depth=[1, 2, 3],
                     mlp_ratio=[2.0, 2.0, 2.0], drop_path_rate=[0.0, 0.0, 0.0]),
        "mobilevitv2": build(T.MobileViTV2Config, T.MobileViTV2Model, key="pixel_values",
                             shape=(2, 3, 64, 64), image_size=64, width_multiplier=0.5),
        "swiftformer": build(T.SwiftFormerConfig, T.SwiftFormerModel, key="pixel_values",
                             shape=(2, 3, 32, 32), image_size=32, depths=[1, 1, 1, 1],
                             embed_dims=[16, 24, 32, 48]),
        "glpn": build(T.GLPNConfig, T.GLPNModel, key="pixel_values", shape=(2, 3, 32, 32),
                      num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1],
                      hidden_sizes=[32, 64], patch_sizes=[7, 3], strides=[4, 2],
                      num_attention_heads=[1, 2], mlp_ratios=[2, 2], decoder_hidden_size=32),
        "videomae": build(T.VideoMAEConfig, T.VideoMAEModel, key="pixel_values",
                          shape=(2, 4, 3, 32, 32), image_size=32, patch_size=8, num_frames=4,
                          tubelet_size=2, **vis),
        # speech: UniSpeech-SAT, Wav2Vec2-BERT (a Conformer over filter-bank features),
        # Speech2Text (a convolutional subsampler, an encoder-decoder), Moonshine (a
        # waveform encoder with rotary, a decoder)
        "unispeech_sat": build(T.UniSpeechSatConfig, T.UniSpeechSatModel, key="input_values",
                               shape=(2, 400), conv_dim=(32, 32), conv_stride=(5, 2),
                               conv_kernel=(10, 3), num_conv_pos_embeddings=16,
                               num_conv_pos_embedding_groups=4, vocab_size=VOCAB, **vis),
        "wav2vec2_bert": build(T.Wav2Vec2BertConfig, T.Wav2Vec2BertModel,
                               key="input_features", shape=(2, 20, 160),
                               feature_projection_input_dim=160, conv_depthwise_kernel_size=7,
                               vocab_size=VOCAB, **vis),
        "speech_to_text": build(T.Speech2TextConfig, T.Speech2TextModel, seq2seq=True,
                                key="input_features", shape=(2, 32, 20),
                                input_feat_per_channel=20, conv_channels=32,
                                max_source_positions=64, max_target_positions=64, **s2s),
        "moonshine": build(T.MoonshineConfig, T.MoonshineModel, seq2seq=True,
                           key="input_values", shape=(2, 1600), hidden_size=H,
                           intermediate_size=FF, encoder_num_hidden_layers=LAYERS,
                           decoder_num_hidden_layers=LAYERS,
                           encoder_num_attention_heads=HEADS,
                           decoder_num_attention_heads=HEADS, vocab_size=VOCAB,
                           max_position_embeddings=64, decoder_start_token_id=0, **ids),
        # text + image dual encoders: OWL-ViT, GroupViT (grouping tokens), AltCLIP (an
        # XLM-R text tower)
        "owlvit": build(T.OwlViTConfig, T.OwlViTModel, dual=True, shape=(2, 3, 32, 32),
                        text_config=dict(clip_text, **ids),
                        vision_config=dict(vis, image_size=32, patch_size=8)),
        "groupvit": build(T.GroupViTConfig, T.GroupViTModel, dual=True, shape=(2, 3, 32, 32),
                          text_config=dict(clip_text, **ids),
                          vision_config=dict(hidden_size=H, intermediate_size=FF,
                                             num_hidden_layers=LAYERS, depths=[1, 1],
                                             num_group_tokens=[8, 0],
                                             num_output_groups=[4, 4],
                                             num_attention_heads=HEADS, image_size=32,
                                             patch_size=8),
                          projection_dim=32, projection_intermediate_dim=64),
        "altclip": build(T.AltCLIPConfig, T.AltCLIPModel, dual=True, shape=(2, 3, 32, 32),
                         text_config=dict(enc, project_dim=H, pad_token_id=1),
                         vision_config=dict(vis, image_size=32, patch_size=8)),

        # -- a sixth held-out set: decoders, MoE, encoders, vision, audio, time series --
        # decoders: CTRL (sinusoidal positions, scaled embeddings), XLNet (two-stream
        # relative attention with segment biases, its einsums), DiffLlama (differential
        # attention: two softmaxes subtracted, a group norm), MiniCPM3 (latent attention,
        # scaled embedding and residuals)
        "ctrl": build(T.CTRLConfig, T.CTRLModel, n_layer=LAYERS, n_embd=H, n_head=HEADS,
                      dff=FF, vocab_size=VOCAB, n_positions=64, **ids),
        "xlnet": build(T.XLNetConfig, T.XLNetModel, n_layer=LAYERS, d_model=H, n_head=HEADS,
                       d_head=H // HEADS, d_inner=FF, vocab_size=VOCAB, **ids),
        "diffllama": build(T.DiffLlamaConfig, T.DiffLlamaModel, head_dim=H // HEADS, **ids,
                           **moe),
        "minicpm3": build(T.MiniCPM3Config, T.MiniCPM3Model, q_lora_rank=32, kv_lora_rank=32,
                          qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=16,
                          head_dim=16, **ids, **moe),
        # mixtures of experts: AFMoE (sliding and global layers, gated attention, a sigmoid
        # router with shared experts), Cohere 2 MoE, GLM-4-MoE-Lite (latent attention with a
        # group-limited router), EXAONE-MoE (sliding layers, a shared expert), DeepSeek-V3.2
        # (latent attention with a top-k indexer over the keys)
        "afmoe": build(T.AfmoeConfig, T.AfmoeModel, head_dim=H // HEADS, num_experts=EXPERTS,
                       num_experts_per_tok=2, num_shared_experts=1, num_dense_layers=1,
                       moe_intermediate_size=FF, sliding_window=8,
                       global_attn_every_n_layers=2, **ids, **moe),
        "cohere2_moe": build(T.Cohere2MoeConfig, T.Cohere2MoeModel, head_dim=H // HEADS,
                             num_experts=EXPERTS, num_experts_per_tok=2, sliding_window=8,
                             **ids, **moe),
        "glm4_moe_lite": build(T.Glm4MoeLiteConfig, T.Glm4MoeLiteModel, q_lora_rank=32,
                               kv_lora_rank=32, qk_rope_head_dim=8, qk_nope_head_dim=8,
                               v_head_dim=16, **group, **ids, **moe),
        "exaone_moe": build(T.ExaoneMoeConfig, T.ExaoneMoeModel, num_experts=EXPERTS,
                            num_experts_per_tok=2, num_shared_experts=1, first_k_dense_replace=1,
                            moe_intermediate_size=FF, sliding_window=8, n_group=1,
                            topk_group=1, **ids, **moe),
        "deepseek_v32": build(T.DeepseekV32Config, T.DeepseekV32Model, n_routed_experts=EXPERTS,
                              n_group=2, topk_group=1, first_k_dense_replace=1,
                              num_experts_per_tok=2, moe_intermediate_size=FF, q_lora_rank=32,
                              kv_lora_rank=32, qk_rope_head_dim=8, qk_nope_head_dim=8,
                              v_head_dim=16, index_topk=8, index_head_dim=16, index_n_heads=2,
                              **ids, **{k: v for k, v in moe.items()
                                        if k != "num_key_value_heads"},
                              num_key_value_heads=HEADS),
        # linear attention hybrids: Kimi Linear (kimi delta attention then latent attention,
        # with experts), OLMo hybrid (gated delta-net layers then attention)
        "kimi_linear": build(T.KimiLinearConfig, T.KimiLinearModel, q_lora_rank=32,
                             kv_lora_rank=32, qk_rope_head_dim=8, qk_nope_head_dim=8,
                             v_head_dim=16, num_local_experts=EXPERTS, num_experts_per_tok=2,
                             moe_intermediate_size=FF, linear_head_dim=16, linear_num_heads=4,
                             layer_types=["linear_attention", "full_attention"], **ids, **moe),
        "olmo_hybrid": build(T.OlmoHybridConfig, T.OlmoHybridModel,
                             layer_types=["linear_attention", "full_attention"],
                             linear_num_key_heads=2, linear_num_value_heads=4,
                             linear_key_head_dim=16, linear_value_head_dim=16, **ids, **moe),
        # encoders: RemBERT (decoupled embeddings), X-MOD (language adapters), NomicBERT
        # (rotary, SwiGLU), YOSO (LSH attention in its expectation form), EuroBERT (a
        # Llama-style encoder)
        "rembert": build(T.RemBertConfig, T.RemBertModel, input_embedding_size=32,
                         output_embedding_size=32, **ids, **enc),
        "xmod": build(T.XmodConfig, T.XmodModel, languages=["en_XX", "de_DE"],
                      default_language="en_XX", pad_token_id=1, **enc),
        "nomic_bert": build(T.NomicBertConfig, T.NomicBertModel, **ids, **enc),
        "yoso": build(T.YosoConfig, T.YosoModel, use_expectation=True, hash_code_len=4,
                      num_hash=8, **ids, **enc),
        "eurobert": build(T.EuroBertConfig, T.EuroBertModel, head_dim=H // HEADS,
                          mask_token_id=1, **ids, **moe),
        # vision: TimeSformer (divided space-time attention), PVT (spatial reduction of
        # keys), MobileNetV2 (inverted residuals, ReLU6, TF-style padding), DPT (a ViT with
        # a reassembling neck), ViViT (tubelet embeddings)
        "timesformer": build(T.TimesformerConfig, T.TimesformerModel, key="pixel_values",
                             shape=(2, 4, 3, 32, 32), image_size=32, patch_size=8,
                             num_frames=4, **vis),
        "pvt": build(T.PvtConfig, T.PvtModel, key="pixel_values", shape=(2, 3, 32, 32),
                     image_size=32, num_encoder_blocks=2, depths=[1, 1],
                     sequence_reduction_ratios=[2, 1], hidden_sizes=[32, 64],
                     patch_sizes=[4, 2], strides=[4, 2], num_attention_heads=[1, 2],
                     mlp_ratios=[2, 2]),
        "mobilenet_v2_hf": build(T.MobileNetV2Config, T.MobileNetV2Model, attention=False,
                                 key="pixel_values", shape=(2, 3, 32, 32), image_size=32,
                                 depth_multiplier=0.35),
        "dpt": build(T.DPTConfig, T.DPTModel, key="pixel_values", shape=(2, 3, 32, 32),
                     image_size=32, patch_size=8, backbone_out_indices=[0, 1],
                     neck_hidden_sizes=[16, 32], reassemble_factors=[2, 1],
                     fusion_hidden_size=32, **vis),
        "vivit": build(T.VivitConfig, T.VivitModel, key="pixel_values",
                       shape=(2, 4, 3, 32, 32), image_size=32, num_frames=4,
                       tubelet_size=[2, 8, 8], **vis),
        # time series: PatchTST (patches of each channel, mean scaling, batch norm),
        # PatchTSMixer (MLP mixing over patches and features, gated attention)
        "patchtst": build(T.PatchTSTConfig, T.PatchTSTModel, attention=False,
                          key="past_values", shape=(2, 32, 3), num_input_channels=3,
                          context_length=32, patch_length=8, patch_stride=8,
                          num_hidden_layers=LAYERS, d_model=H, num_attention_heads=HEADS,
                          ffn_dim=FF),
        "patchtsmixer": build(T.PatchTSMixerConfig, T.PatchTSMixerModel, attention=False,
                              key="past_values", shape=(2, 32, 3), num_input_channels=3,
                              context_length=32, patch_length=8, patch_stride=8,
                              num_layers=LAYERS, d_model=H, gated_attn=True, self_attn=True,
                              self_attn_heads=HEADS),
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
