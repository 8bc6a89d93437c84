"""Build small real architectures from Hugging Face configs (random weights, no download) and
export each through graphkernel's FX importer to ``examples/models/<name>.json`` (+ .npz).

    python examples/export_models.py            # regenerates the zoo (needs torch, transformers)

Every model is 2 layers, hidden size 64. ``builders(attn)`` builds them with the library's
default attention (``sdpa``: ``F.scaled_dot_product_attention``) or with ``eager`` attention
(explicit matmul/softmax ops); the frozen exports under ``examples/models`` are the eager
ones. The example inputs are saved beside each graph as ``<name>_inputs.npz`` and the eager
outputs as ``<name>_expected.npz``.
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

HERE = Path(__file__).resolve().parent
OUT = HERE / "models"
SEED = 0
H, HEADS, FF, VOCAB, LAYERS = 64, 4, 128, 256, 2


def _text_inputs(torch):
    g = torch.Generator().manual_seed(SEED)
    return (torch.randint(0, VOCAB, (2, 16), generator=g),)


def _rand(torch, *shape):
    """Uniform [0, 1) values from a generator seeded anew: every call of a model's inputs
    returns the same tensor, whichever models were drawn for before (a generator shared by
    the zoo made a model's inputs depend on which models a run had selected before it)."""
    return torch.rand(*shape, generator=torch.Generator().manual_seed(SEED))


ATTENTION = ("sdpa", "eager")  # the library's default first


def builders(attn: str = "sdpa"):
    """name -> (build model, example inputs); the model returns one tensor. ``attn`` is the
    attention implementation the models are built with: ``sdpa`` (the library default:
    ``F.scaled_dot_product_attention``) or ``eager`` (explicit matmuls and softmax)."""
    import torch
    import transformers as T

    if attn not in ATTENTION:
        raise ValueError(f"attention implementation {attn!r} (accepted: "
                         f"{', '.join(ATTENTION)})")
    # sdpa: the configs as users write them, without attn_implementation (the library picks
    # sdpa wherever the architecture has it; BLOOM has not, and stays eager)
    common = dict(attn_implementation="eager") if attn == "eager" else {}

    class Hidden(torch.nn.Module):
        """Wraps a model so that it returns its last hidden state only."""

        def __init__(self, model, key="input_ids"):
            super().__init__()
            self.model, self.key = model, key

        def forward(self, x):
            return self.model(**{self.key: x}).last_hidden_state

    def text(cfg_cls, model_cls, **kw):
        def build():
            torch.manual_seed(SEED)
            return Hidden(model_cls(cfg_cls(**kw, **common)).eval())
        return build, lambda: _text_inputs(torch)

    def vit():
        torch.manual_seed(SEED)
        cfg = T.ViTConfig(hidden_size=H, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                          intermediate_size=FF, image_size=32, patch_size=8, **common)
        return Hidden(T.ViTModel(cfg, add_pooling_layer=False).eval(), "pixel_values")

    def whisper():
        torch.manual_seed(SEED)
        from transformers.models.whisper.modeling_whisper import WhisperEncoder

        cfg = T.WhisperConfig(d_model=H, encoder_layers=LAYERS, encoder_attention_heads=HEADS,
                              encoder_ffn_dim=FF, num_mel_bins=16, max_source_positions=32,
                              vocab_size=VOCAB, pad_token_id=0, bos_token_id=0, eos_token_id=0,
                              decoder_start_token_id=0, **common)
        return Hidden(WhisperEncoder(cfg).eval(), "input_features")

    def vision(cfg_cls, model_cls, size=32, pooler=False, **kw):
        def build():
            torch.manual_seed(SEED)
            cfg = cfg_cls(image_size=size, num_channels=3, **kw, **common)
            # (ConvNeXt has no switch for its pooler; its last hidden state does not use it)
            model = model_cls(cfg) if pooler else model_cls(cfg, add_pooling_layer=False)
            return Hidden(model.eval(), "pixel_values")
        return build, lambda: (_rand(torch, 2, 3, size, size),)

    def wav2vec2():
        torch.manual_seed(SEED)
        cfg = T.Wav2Vec2Config(hidden_size=H, num_hidden_layers=LAYERS,
                               num_attention_heads=HEADS, intermediate_size=FF,
                               conv_dim=(32, 32), conv_stride=(5, 2), conv_kernel=(10, 3),
                               num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4,
                               vocab_size=VOCAB, **common)
        return Hidden(T.Wav2Vec2Model(cfg).eval(), "input_values")

    decoder = dict(num_hidden_layers=LAYERS, hidden_size=H, num_attention_heads=HEADS,
                   num_key_value_heads=2, intermediate_size=FF, vocab_size=VOCAB,
                   max_position_embeddings=64)
    encoder = dict(num_hidden_layers=LAYERS, hidden_size=H, num_attention_heads=HEADS,
                   intermediate_size=FF, vocab_size=VOCAB, max_position_embeddings=64)
    return {
        "gpt2": text(T.GPT2Config, T.GPT2Model, n_layer=LAYERS, n_embd=H, n_head=HEADS,
                     n_inner=FF, vocab_size=VOCAB, n_positions=64, bos_token_id=0,
                     eos_token_id=0),
        "bert": text(T.BertConfig, T.BertModel, num_hidden_layers=LAYERS, hidden_size=H,
                     num_attention_heads=HEADS, intermediate_size=FF, vocab_size=VOCAB,
                     max_position_embeddings=64),
        "llama": text(T.LlamaConfig, T.LlamaModel, num_hidden_layers=LAYERS, hidden_size=H,
                      num_attention_heads=HEADS, num_key_value_heads=2, intermediate_size=FF,
                      vocab_size=VOCAB, max_position_embeddings=64),
        "qwen2": text(T.Qwen2Config, T.Qwen2Model, num_hidden_layers=LAYERS, hidden_size=H,
                      num_attention_heads=HEADS, num_key_value_heads=2, intermediate_size=FF,
                      vocab_size=VOCAB, max_position_embeddings=64),
        "t5_encoder": text(T.T5Config, T.T5EncoderModel, num_layers=LAYERS, d_model=H,
                           d_kv=H // HEADS, num_heads=HEADS, d_ff=FF, vocab_size=VOCAB),
        "vit": (vit, lambda: (_rand(torch, 2, 3, 32, 32),)),
        "whisper_encoder": (whisper, lambda: (_rand(torch, 2, 16, 64),)),
        "mistral": text(T.MistralConfig, T.MistralModel, sliding_window=8, **decoder),
        "gemma": text(T.GemmaConfig, T.GemmaModel, head_dim=H // HEADS, **decoder),
        "falcon": text(T.FalconConfig, T.FalconModel, num_hidden_layers=LAYERS, hidden_size=H,
                       num_attention_heads=HEADS, vocab_size=VOCAB),
        "bloom": text(T.BloomConfig, T.BloomModel, n_layer=LAYERS, hidden_size=H, n_head=HEADS,
                      vocab_size=VOCAB),
        "albert": text(T.AlbertConfig, T.AlbertModel, embedding_size=32, **encoder),
        "electra": text(T.ElectraConfig, T.ElectraModel, embedding_size=32, **encoder),
        "deit": vision(T.DeiTConfig, T.DeiTModel, hidden_size=H, num_hidden_layers=LAYERS,
                       num_attention_heads=HEADS, intermediate_size=FF, patch_size=8),
        "convnext": vision(T.ConvNextConfig, T.ConvNextModel, hidden_sizes=[16, 32],
                           depths=[1, 1], num_stages=2, patch_size=4, pooler=True),
        "wav2vec2": (wav2vec2, lambda: (_rand(torch, 2, 400) * 2 - 1,)),
    }


# The family of each model: the tables group by it. Mixture-of-experts and state-space models
# come from their own provider (``PROVIDERS``: ``moe_ssm_models``), which adds its families.
FAMILY = {
    "gpt2": "decoder", "llama": "decoder", "qwen2": "decoder", "mistral": "decoder",
    "gemma": "decoder", "qwen3": "decoder",
    "falcon": "mqa-gqa", "gpt_bigcode": "mqa-gqa", "granite": "mqa-gqa",
    "gpt_neox": "parallel", "gptj": "parallel", "falcon_new": "parallel", "phi": "parallel",
    "stablelm": "partial-rotary", "persimmon": "partial-rotary",
    "bloom": "alibi", "mpt": "alibi",
    "bert": "encoder", "albert": "encoder", "electra": "encoder", "t5_encoder": "encoder",
    "roberta": "encoder", "deberta_v2": "encoder", "deberta_v3": "relative",
    "t5": "encoder-decoder", "bart": "encoder-decoder", "whisper": "encoder-decoder",
    "vit": "vision", "deit": "vision", "convnext": "vision", "swin": "vision",
    "whisper_encoder": "audio", "wav2vec2": "audio", "hubert": "audio",
    "clip": "dual-encoder", "siglip": "dual-encoder",
    "llama_generate": "kv-cache",
}


def family(name: str) -> str:
    """The family ``name`` is measured in (``other`` for a model no family lists)."""
    return FAMILY.get(name, "other")


def families(attn: str = "sdpa"):
    """More architectures, as users build them (outside the frozen zoo), each from its
    library's config: dense and grouped-/multi-query decoders (Qwen3, GPT-BigCode, Granite),
    parallel attention + MLP (GPT-NeoX, GPT-J, Falcon's new architecture, Phi), partial rotary
    (StableLM, Persimmon; GPT-NeoX, GPT-J and Phi rotate part of each head too), ALiBi (MPT),
    encoders (RoBERTa, DeBERTa-v2's relative positions), encoder-decoders (T5's relative
    bias, BART, Whisper whole), windowed attention (Swin), audio (HuBERT), text + vision dual
    encoders (CLIP, SigLIP) and a KV-cache ``generate()`` loop; then what ``PROVIDERS`` add
    (the mixture-of-experts and state-space models of ``moe_ssm_models``)."""
    import torch
    import transformers as T

    if attn not in ATTENTION:
        raise ValueError(f"attention implementation {attn!r} (accepted: "
                         f"{', '.join(ATTENTION)})")
    common = dict(attn_implementation="eager") if attn == "eager" else {}

    class Seq2Seq(torch.nn.Module):
        """An encoder-decoder fed the same ids on both sides; the decoder's last hidden
        state."""

        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, x):
            return self.model(input_ids=x, decoder_input_ids=x).last_hidden_state

    class Hidden(torch.nn.Module):
        def __init__(self, model, key="input_ids"):
            super().__init__()
            self.model, self.key = model, key

        def forward(self, x):
            return self.model(**{self.key: x}).last_hidden_state

    class Speech2Text(torch.nn.Module):
        """Whisper whole: log-mel features into the encoder, token ids into the decoder."""

        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, features, ids):
            return self.model(input_features=features, decoder_input_ids=ids).last_hidden_state

    class DualEncoder(torch.nn.Module):
        """CLIP/SigLIP: text and image towers, their image-text similarity logits."""

        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, ids, pixels):
            return self.model(input_ids=ids, pixel_values=pixels).logits_per_image

    def build(cfg_cls, model_cls, wrap=Hidden, eager_only=False, **kw):
        def make():
            torch.manual_seed(SEED)
            cfg = cfg_cls(**kw, **({} if eager_only else common))
            return wrap(model_cls(cfg).eval())
        return make, lambda: _text_inputs(torch)

    def vision(cfg_cls, model_cls, size=32, **kw):
        def make():
            torch.manual_seed(SEED)
            cfg = cfg_cls(image_size=size, num_channels=3, **kw, **common)
            return Hidden(model_cls(cfg, add_pooling_layer=False).eval(), "pixel_values")
        return make, lambda: (_rand(torch, 2, 3, size, size),)

    def whisper():
        torch.manual_seed(SEED)
        cfg = T.WhisperConfig(d_model=H, encoder_layers=LAYERS, decoder_layers=LAYERS,
                              encoder_attention_heads=HEADS, decoder_attention_heads=HEADS,
                              encoder_ffn_dim=FF, decoder_ffn_dim=FF, num_mel_bins=16,
                              max_source_positions=32, max_target_positions=64,
                              vocab_size=VOCAB, pad_token_id=0, bos_token_id=0, eos_token_id=0,
                              decoder_start_token_id=0, **common)
        return Speech2Text(T.WhisperModel(cfg).eval())

    def whisper_inputs():
        g = torch.Generator().manual_seed(SEED)
        return torch.rand(2, 16, 64, generator=g), _text_inputs(torch)[0]

    def hubert():
        torch.manual_seed(SEED)
        cfg = T.HubertConfig(hidden_size=H, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                             intermediate_size=FF, conv_dim=(32, 32), conv_stride=(5, 2),
                             conv_kernel=(10, 3), num_conv_pos_embeddings=16,
                             num_conv_pos_embedding_groups=4, vocab_size=VOCAB, **common)
        return Hidden(T.HubertModel(cfg).eval(), "input_values")

    def dual(cfg_cls, model_cls):
        tower = dict(hidden_size=H, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                     intermediate_size=FF)

        def make():
            torch.manual_seed(SEED)
            cfg = cfg_cls(text_config=dict(tower, vocab_size=VOCAB, max_position_embeddings=64,
                                           bos_token_id=0, eos_token_id=1, pad_token_id=0),
                          vision_config=dict(tower, image_size=32, patch_size=8), **common)
            return DualEncoder(model_cls(cfg).eval())

        def inputs():
            g = torch.Generator().manual_seed(SEED)
            return _text_inputs(torch)[0], torch.rand(2, 3, 32, 32, generator=g)
        return make, inputs

    def generate():
        torch.manual_seed(SEED)
        cfg = T.LlamaConfig(**decoder, num_key_value_heads=2, **common)
        return Generate(T.LlamaForCausalLM(cfg).eval())

    decoder = dict(num_hidden_layers=LAYERS, hidden_size=H, num_attention_heads=HEADS,
                   intermediate_size=FF, vocab_size=VOCAB, max_position_embeddings=64)
    encoder = decoder
    gpt = dict(n_layer=LAYERS, n_embd=H, n_head=HEADS, n_inner=FF, vocab_size=VOCAB,
               n_positions=64, bos_token_id=0, eos_token_id=0)
    zoo = {
        "qwen3": build(T.Qwen3Config, T.Qwen3Model, num_key_value_heads=2, head_dim=H // HEADS,
                       **decoder),
        "gpt_bigcode": build(T.GPTBigCodeConfig, T.GPTBigCodeModel, multi_query=True, **gpt),
        "granite": build(T.GraniteConfig, T.GraniteModel, num_key_value_heads=1, **decoder),
        "gpt_neox": build(T.GPTNeoXConfig, T.GPTNeoXModel, rotary_pct=0.25, **decoder),
        "gptj": build(T.GPTJConfig, T.GPTJModel, rotary_dim=8, **gpt),
        "falcon_new": build(T.FalconConfig, T.FalconModel, num_hidden_layers=LAYERS,
                            hidden_size=H, num_attention_heads=HEADS, num_kv_heads=2,
                            new_decoder_architecture=True, vocab_size=VOCAB),
        "phi": build(T.PhiConfig, T.PhiModel, partial_rotary_factor=0.5, **decoder),
        "stablelm": build(T.StableLmConfig, T.StableLmModel, num_key_value_heads=2, **decoder),
        "persimmon": build(T.PersimmonConfig, T.PersimmonModel, partial_rotary_factor=0.5,
                           **decoder),
        "mpt": build(T.MptConfig, T.MptModel, eager_only=True, n_layers=LAYERS, d_model=H,
                     n_heads=HEADS, expansion_ratio=2, vocab_size=VOCAB, max_seq_len=64),
        "roberta": build(T.RobertaConfig, T.RobertaModel, pad_token_id=1, **encoder),
        "deberta_v2": build(T.DebertaV2Config, T.DebertaV2Model, eager_only=True, **encoder),
        # disentangled relative attention as DeBERTa-v3's configs set it (c2p and p2c terms
        # from log-bucketed relative positions, a shared key projection)
        "deberta_v3": build(T.DebertaV2Config, T.DebertaV2Model, eager_only=True,
                            relative_attention=True, pos_att_type=["p2c", "c2p"],
                            position_buckets=256, norm_rel_ebd="layer_norm", share_att_key=True,
                            max_relative_positions=-1, position_biased_input=False, **encoder),
        "t5": build(T.T5Config, T.T5Model, Seq2Seq, num_layers=LAYERS, d_model=H,
                    d_kv=H // HEADS, num_heads=HEADS, d_ff=FF, vocab_size=VOCAB,
                    decoder_start_token_id=0),
        "bart": build(T.BartConfig, T.BartModel, Seq2Seq, encoder_layers=LAYERS,
                      decoder_layers=LAYERS, d_model=H, encoder_attention_heads=HEADS,
                      decoder_attention_heads=HEADS, encoder_ffn_dim=FF, decoder_ffn_dim=FF,
                      vocab_size=VOCAB, max_position_embeddings=64),
        "whisper": (whisper, whisper_inputs),
        "swin": vision(T.SwinConfig, T.SwinModel, patch_size=4, embed_dim=32, depths=[1, 1],
                       num_heads=[2, 4], window_size=4, mlp_ratio=2.0),
        "hubert": (hubert, lambda: (torch.rand(2, 400, generator=torch.Generator()
                                               .manual_seed(SEED)) * 2 - 1,)),
        "clip": dual(T.CLIPConfig, T.CLIPModel),
        "siglip": dual(T.SiglipConfig, T.SiglipModel),
        "llama_generate": (generate, lambda: (_text_inputs(torch)[0][:, :8],)),
    }
    for provide in PROVIDERS:
        zoo.update(provide(attn))
    return zoo


# Further model sets: each a function of the attention implementation returning builders as
# ``families`` does (name -> (build, inputs)); a provider's families go into ``FAMILY``.
PROVIDERS: list = []


def _register(module) -> None:
    """A provider module: its ``builders(attn)`` and its ``FAMILY`` table (with the families
    of its held-out models, ``HELD_OUT_FAMILY``, when it has some)."""
    PROVIDERS.append(module.builders)
    for name, fam in (module.FAMILY | getattr(module, "HELD_OUT_FAMILY", {})).items():
        FAMILY.setdefault(name, fam)


sys.path.insert(0, str(HERE))  # (the providers live beside this file)
import moe_ssm_models  # noqa: E402

_register(moe_ssm_models)

GENERATE_STEPS = 6  # new tokens of the generate() loop


class Generate:
    """A KV-cache ``generate()`` loop as users compile it: the causal LM's ``forward`` is
    what ``torch.compile`` gets (``compile_model``), and ``generate`` calls it once for the
    prompt and once per new token with a cache that grows by one position each step. Calling
    the object returns the greedy tokens; it trains nothing (no parameters of its own)."""

    def __init__(self, model, step=None):
        self.model, self.step = model, step

    def __call__(self, ids):
        import torch

        if self.step is not None:  # the compiled forward, for this call only
            self.model.forward = self.step
        try:
            with torch.no_grad():
                return self.model.generate(ids, max_new_tokens=GENERATE_STEPS,
                                           do_sample=False, pad_token_id=0)
        finally:
            self.model.__dict__.pop("forward", None)


def compile_model(model, **kw):
    """``torch.compile(model, **kw)`` as users apply it: the module itself, or for a
    ``generate()`` loop the causal LM's forward that the loop calls."""
    import torch

    if isinstance(model, Generate):
        return Generate(model.model, torch.compile(model.model.forward, **kw))
    return torch.compile(model, **kw)


def trainable(model) -> bool:
    """Whether a training step applies (a generate() loop is inference only)."""
    return not isinstance(model, Generate)


def attention_layers(model, args) -> int:
    """The attention layers a model runs: its calls of scaled_dot_product_attention, of
    nn.MultiheadAttention's forward and of softmax over attention scores in one forward (no
    grad). Scores have a head or batch axis
    besides the query's and key's ([B, H, L, S] or [B*H, L, S]) and the softmax runs over
    the keys, their last axis; a softmax over a 2-D tensor (a mixture of experts' router
    over [tokens, experts]) or over another axis (ConvBERT's span-based convolution
    weights, [B·S·H, k, 1] over k) is no attention layer."""
    import torch
    from torch.overrides import TorchFunctionMode

    F = torch.nn.functional
    softmax = {F.softmax, torch.softmax, torch.Tensor.softmax}

    class Count(TorchFunctionMode):
        calls = 0

        def __torch_function__(self, func, types, a=(), kw=None):
            if func in (F.scaled_dot_product_attention, F.multi_head_attention_forward):
                Count.calls += 1  # (nn.MultiheadAttention: its softmax runs unseen inside)
            elif func in softmax:
                x = a[0] if a else (kw or {}).get("input")
                dim = a[1] if len(a) > 1 else (kw or {}).get("dim")
                Count.calls += isinstance(x, torch.Tensor) and x.dim() >= 3 and \
                    isinstance(dim, int) and dim % x.dim() == x.dim() - 1
            return func(*a, **(kw or {}))

    if isinstance(model, Generate):  # the layers of one forward of the loop's model
        model = model.model
    with torch.no_grad(), Count():
        model(*args)
    return Count.calls


def select(names, attn: str = "sdpa", more: bool = False) -> dict | None:
    """The builders named in ``names`` (every one of the zoo when empty; with ``more``, of
    the ``families`` too), in order, built with the attention implementation ``attn``; None,
    after printing what is accepted, when a name is unknown (the benchmarks exit 2)."""
    zoo = builders(attn)
    if more or set(names) - set(zoo):
        zoo |= families(attn)
    unknown = sorted(set(names) - set(zoo))
    if unknown:
        print(f"error: unknown model(s) {', '.join(unknown)} (accepted: {', '.join(zoo)})",
              file=sys.stderr)
        return None
    return {k: v for k, v in zoo.items() if not names or k in names}


def export_all(names=None) -> list[Path]:
    import torch

    import graphkernel.torch as gt
    from graphkernel.fileio import save_npz
    from graphkernel.frontends.fx import to_numpy
    from graphkernel.frontends.json_format import save_graph

    OUT.mkdir(exist_ok=True)
    written = []
    for name, (build, inputs) in builders("eager").items():
        if names and name not in names:
            continue
        model, args = build(), inputs()
        with torch.no_grad():
            expected = model(*args)
        g = gt.export_graph(model, args, name=name)
        g.validate()
        written += save_graph(g, OUT / f"{name}.json")
        save_npz(OUT / f"{name}_inputs.npz",
                 {v.name: to_numpy(a) for v, a in zip(g.inputs, args, strict=True)})
        save_npz(OUT / f"{name}_expected.npz", {g.outputs[0].name: to_numpy(expected)})
        opaque = sorted({n.attrs["label"] for n in g.nodes if n.op == "Opaque"})
        print(f"{name}: {len(g)} nodes; opaque: {', '.join(opaque) or 'none'}")
    return written


if __name__ == "__main__":
    warnings.simplefilter("ignore")
    sys.exit(0 if export_all(sys.argv[1:]) else 1)
