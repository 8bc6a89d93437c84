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
        return build, lambda: (torch.rand(2, 3, size, size, generator=g),)

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
    g = torch.Generator().manual_seed(SEED)
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
        "vit": (vit, lambda: (torch.rand(2, 3, 32, 32, generator=g),)),
        "whisper_encoder": (whisper, lambda: (torch.rand(2, 16, 64, generator=g),)),
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
        "wav2vec2": (wav2vec2, lambda: (torch.rand(2, 400, generator=g) * 2 - 1,)),
    }


def families(attn: str = "sdpa"):
    """More architectures, as users build them (outside the frozen zoo): a partial-rotary
    decoder (GPT-NeoX, Phi), encoder-decoders (T5, BART: the decoder's causal self-attention
    and its cross-attention) and mixture-of-experts decoders (Mixtral, Qwen2-MoE, OLMoE)."""
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
        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, x):
            return self.model(input_ids=x).last_hidden_state

    def build(cfg_cls, model_cls, wrap=Hidden, **kw):
        def make():
            torch.manual_seed(SEED)
            return wrap(model_cls(cfg_cls(**kw, **common)).eval())
        return make, lambda: _text_inputs(torch)

    decoder = dict(num_hidden_layers=LAYERS, hidden_size=H, num_attention_heads=HEADS,
                   intermediate_size=FF, vocab_size=VOCAB, max_position_embeddings=64)
    moe = dict(decoder, num_key_value_heads=2, num_experts_per_tok=2)
    return {
        "gpt_neox": build(T.GPTNeoXConfig, T.GPTNeoXModel, rotary_pct=0.25, **decoder),
        "phi": build(T.PhiConfig, T.PhiModel, partial_rotary_factor=0.5, **decoder),
        "t5": build(T.T5Config, T.T5Model, Seq2Seq, num_layers=LAYERS, d_model=H,
                    d_kv=H // HEADS, num_heads=HEADS, d_ff=FF, vocab_size=VOCAB,
                    decoder_start_token_id=0),
        "bart": build(T.BartConfig, T.BartModel, Seq2Seq, encoder_layers=LAYERS,
                      decoder_layers=LAYERS, d_model=H, encoder_attention_heads=HEADS,
                      decoder_attention_heads=HEADS, encoder_ffn_dim=FF, decoder_ffn_dim=FF,
                      vocab_size=VOCAB, max_position_embeddings=64),
        "mixtral": build(T.MixtralConfig, T.MixtralModel, num_local_experts=4, **moe),
        "qwen2_moe": build(T.Qwen2MoeConfig, T.Qwen2MoeModel, num_experts=4,
                           moe_intermediate_size=FF, shared_expert_intermediate_size=FF,
                           **moe),
        "olmoe": build(T.OlmoeConfig, T.OlmoeModel, num_experts=4, pad_token_id=0,
                       eos_token_id=0, **moe),
    }


def attention_layers(model, args) -> int:
    """The attention layers a model runs: its calls of scaled_dot_product_attention and of
    softmax in one forward (no grad)."""
    import torch
    from torch.overrides import TorchFunctionMode

    F = torch.nn.functional
    counted = {F.scaled_dot_product_attention, F.softmax, torch.softmax, torch.Tensor.softmax}

    class Count(TorchFunctionMode):
        calls = 0

        def __torch_function__(self, func, types, a=(), kw=None):
            Count.calls += func in counted
            return func(*a, **(kw or {}))

    with torch.no_grad(), Count():
        model(*args)
    return Count.calls


def select(names, attn: str = "sdpa", more: bool = False) -> dict | None:
    """The zoo's builders named in ``names`` (every one when empty), in zoo order, built with
    the attention implementation ``attn`` (with ``more``, the ``families`` too); None, after
    printing what is accepted, when a name is not in the zoo (the benchmarks exit 2)."""
    zoo = builders(attn) | (families(attn) if more else {})
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
