"""Real architectures from transformers config classes, at small sizes with random weights (never from a hub).

Each builder returns ``(model, inputs)``: the model in eval mode with weights from a fixed seed, and a dict of
keyword arguments for its forward. Three layers everywhere, so that layer pruning has something to drop.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

Example = tuple[torch.nn.Module, dict[str, Any]]

VOCAB = 99
LAYERS = 3


def _ids(batch: int = 1, length: int = 7, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


def _pixels(size: int = 32, channels: int = 3, seed: int = 2) -> torch.Tensor:
    return torch.randn(1, channels, size, size, generator=torch.Generator().manual_seed(seed))


def _build(model_class: Any, config: Any, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return model_class(config).eval()


def llama(layers: int = LAYERS) -> Example:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    return _build(LlamaForCausalLM, config), {"input_ids": _ids()}


def bert() -> Example:
    from transformers import BertConfig, BertModel

    config = BertConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=LAYERS,
        num_attention_heads=4,
        max_position_embeddings=64,
    )
    ids = _ids()
    return _build(BertModel, config), {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def gpt2() -> Example:
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=LAYERS, n_head=4, n_positions=64)
    return _build(GPT2LMHeadModel, config), {"input_ids": _ids()}


def t5() -> Example:
    from transformers import T5Config, T5ForConditionalGeneration

    config = T5Config(
        vocab_size=VOCAB,
        d_model=32,
        d_kv=8,
        d_ff=64,
        num_layers=LAYERS,
        num_decoder_layers=LAYERS,
        num_heads=4,
        decoder_start_token_id=0,
    )
    return _build(T5ForConditionalGeneration, config), {"input_ids": _ids(), "decoder_input_ids": _ids(length=4)}


def vit() -> Example:
    from transformers import ViTConfig, ViTModel

    config = ViTConfig(
        image_size=32,
        patch_size=8,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=LAYERS,
        num_attention_heads=4,
    )
    return _build(ViTModel, config), {"pixel_values": _pixels()}


# -- the fx zoo: every architecture issue 3 lists, at small sizes ----------------------------------------------------


def _decoder(config_class: Any, model_class: Any, **extra: Any) -> Example:
    config = config_class(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=LAYERS,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        **extra,
    )
    return _build(model_class, config), {"input_ids": _ids()}


def mistral() -> Example:
    from transformers import MistralConfig, MistralForCausalLM

    return _decoder(MistralConfig, MistralForCausalLM, sliding_window=4)


def qwen2() -> Example:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    return _decoder(Qwen2Config, Qwen2ForCausalLM)


def gemma2() -> Example:
    from transformers import Gemma2Config, Gemma2ForCausalLM

    return _decoder(Gemma2Config, Gemma2ForCausalLM, head_dim=8, sliding_window=4)


def phi() -> Example:
    from transformers import PhiConfig, PhiForCausalLM

    return _decoder(PhiConfig, PhiForCausalLM)


def mixtral() -> Example:
    from transformers import MixtralConfig, MixtralForCausalLM

    return _decoder(MixtralConfig, MixtralForCausalLM, num_local_experts=4, num_experts_per_tok=2)


def mamba() -> Example:
    from transformers import MambaConfig, MambaForCausalLM

    config = MambaConfig(vocab_size=VOCAB, hidden_size=32, state_size=8, num_hidden_layers=LAYERS, expand=2)
    return _build(MambaForCausalLM, config), {"input_ids": _ids()}


def roberta() -> Example:
    from transformers import RobertaConfig, RobertaModel

    config = RobertaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=LAYERS,
        num_attention_heads=4,
        max_position_embeddings=64,
    )
    ids = _ids()
    return _build(RobertaModel, config), {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def distilbert() -> Example:
    from transformers import DistilBertConfig, DistilBertModel

    config = DistilBertConfig(vocab_size=VOCAB, dim=32, hidden_dim=64, n_layers=LAYERS, n_heads=4)
    ids = _ids()
    return _build(DistilBertModel, config), {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def bart() -> Example:
    from transformers import BartConfig, BartForConditionalGeneration

    config = BartConfig(
        vocab_size=VOCAB,
        d_model=32,
        encoder_layers=LAYERS,
        decoder_layers=LAYERS,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        max_position_embeddings=64,
    )
    return _build(BartForConditionalGeneration, config), {"input_ids": _ids(), "decoder_input_ids": _ids(length=4)}


def whisper() -> Example:
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    config = WhisperConfig(
        vocab_size=VOCAB,
        num_mel_bins=8,
        d_model=32,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        max_source_positions=16,
        max_target_positions=32,
        decoder_start_token_id=0,
        pad_token_id=0,
        bos_token_id=0,
        eos_token_id=0,
    )
    features = torch.randn(1, 8, 32, generator=torch.Generator().manual_seed(3))
    return _build(WhisperForConditionalGeneration, config), {
        "input_features": features,
        "decoder_input_ids": _ids(length=4),
    }


def swin() -> Example:
    from transformers import SwinConfig, SwinModel

    config = SwinConfig(
        image_size=32,
        patch_size=4,
        embed_dim=16,
        depths=[1, 2],
        num_heads=[2, 4],
        window_size=4,
    )
    return _build(SwinModel, config), {"pixel_values": _pixels()}


def resnet() -> Example:
    from transformers import ResNetConfig, ResNetModel

    config = ResNetConfig(embedding_size=8, hidden_sizes=[8, 16], depths=[1, 2], layer_type="basic")
    return _build(ResNetModel, config), {"pixel_values": _pixels()}


def convnext() -> Example:
    from transformers import ConvNextConfig, ConvNextModel

    config = ConvNextConfig(hidden_sizes=[8, 16], depths=[1, 2], num_stages=2)
    return _build(ConvNextModel, config), {"pixel_values": _pixels()}


def _clip_vision(image_size: int = 32) -> Any:
    from transformers import CLIPVisionConfig

    return CLIPVisionConfig(
        image_size=image_size,
        patch_size=8,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        projection_dim=16,
    )


def clip() -> Example:
    from transformers import CLIPConfig, CLIPModel, CLIPTextConfig

    text = CLIPTextConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=16,
        projection_dim=16,
    )
    config = CLIPConfig(text_config=text.to_dict(), vision_config=_clip_vision().to_dict(), projection_dim=16)
    ids = _ids(batch=2)
    return _build(CLIPModel, config), {
        "input_ids": ids,
        "attention_mask": torch.ones_like(ids),
        "pixel_values": _pixels().repeat(2, 1, 1, 1),
    }


def llava() -> Example:
    from transformers import LlamaConfig, LlavaConfig, LlavaForConditionalGeneration

    text = LlamaConfig(
        vocab_size=VOCAB + 1,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    config = LlavaConfig(
        vision_config=_clip_vision(image_size=16).to_dict(),
        text_config=text.to_dict(),
        image_token_index=VOCAB,
        image_seq_length=4,
        vision_feature_layer=-1,
    )
    # 16 / 8 = 2 x 2 patches: four image tokens, the CLS position dropped by the default feature selection
    ids = torch.cat([_ids(length=3), torch.full((1, 4), VOCAB), _ids(length=3, seed=4)], dim=1)
    return _build(LlavaForConditionalGeneration, config), {"input_ids": ids, "pixel_values": _pixels(size=16)}


def wav2vec2() -> Example:
    from transformers import Wav2Vec2Config, Wav2Vec2Model

    config = Wav2Vec2Config(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        conv_dim=(16, 16),
        conv_stride=(5, 2),
        conv_kernel=(10, 3),
        num_conv_pos_embeddings=16,
        num_conv_pos_embedding_groups=4,
    )
    audio = torch.randn(1, 800, generator=torch.Generator().manual_seed(5))
    return _build(Wav2Vec2Model, config), {"input_values": audio}


# -- plain models: what transformers' architectures do not exercise --------------------------------------------------


class DataDependentBranch(torch.nn.Module):
    """Chooses a branch by a value inside a tensor, which no graph can capture: the root stays eager."""

    def __init__(self) -> None:
        super().__init__()
        self.up = torch.nn.Linear(8, 8)
        self.down = torch.nn.Linear(8, 8)
        self.norm = torch.nn.LayerNorm(8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.norm(x)
        if x.sum() > 0:
            return self.up(x).relu()
        return self.down(x) * 2


class _Block(torch.nn.Module):
    def __init__(self, shared: torch.nn.Linear) -> None:
        super().__init__()
        self.proj = shared
        self.norm = torch.nn.LayerNorm(8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.norm(self.proj(x))


class SharedWeights(torch.nn.Module):
    """One Linear registered under three names and called three times, an embedding tied to the output head."""

    def __init__(self) -> None:
        super().__init__()
        shared = torch.nn.Linear(8, 8)
        self.embed = torch.nn.Embedding(VOCAB, 8)
        self.blocks = torch.nn.ModuleList(_Block(shared) for _ in range(2))
        self.proj = shared
        self.head = torch.nn.Linear(8, VOCAB, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(input_ids)
        for block in self.blocks:
            x = block(x)
        return self.head(self.proj(x))


@dataclass
class Summary:
    """A dataclass output that is not a ModelOutput."""

    pooled: torch.Tensor
    extras: dict[str, Any]


class NestedOutputs(torch.nn.Module):
    """Returns dicts, lists, tuples, None and a dataclass nested in each other, and passes a dict between modules."""

    def __init__(self) -> None:
        super().__init__()
        self.encode = _DictEncoder()
        self.pool = torch.nn.Linear(8, 4)

    def forward(self, x: torch.Tensor, scale: float = 2.0) -> dict[str, Any]:
        parts = self.encode({"x": x, "mask": None})
        pooled = self.pool(parts["hidden"][0].mean(dim=1))
        return {
            "summary": Summary(pooled=pooled, extras={"scaled": [pooled * scale, None], "count": 2}),
            "parts": parts,
        }


class _DictEncoder(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(8, 8)

    def forward(self, batch: dict[str, Any]) -> dict[str, Any]:
        hidden = self.proj(batch["x"])
        if batch["mask"] is not None:
            hidden = hidden * batch["mask"]
        return {"hidden": (hidden, hidden.tanh()), "mask": batch["mask"]}


def data_dependent_branch() -> Example:
    torch.manual_seed(0)
    return DataDependentBranch().eval(), {"x": torch.randn(2, 3, 8, generator=torch.Generator().manual_seed(6))}


def shared_weights() -> Example:
    torch.manual_seed(0)
    return SharedWeights().eval(), {"input_ids": _ids()}


def nested_outputs() -> Example:
    torch.manual_seed(0)
    return NestedOutputs().eval(), {"x": torch.randn(2, 3, 8, generator=torch.Generator().manual_seed(7))}


FX_ZOO: dict[str, Callable[[], Example]] = {
    "gpt2": gpt2,
    "llama": llama,
    "mistral": mistral,
    "qwen2": qwen2,
    "gemma2": gemma2,
    "phi": phi,
    "mixtral": mixtral,
    "mamba": mamba,
    "bert": bert,
    "roberta": roberta,
    "distilbert": distilbert,
    "t5": t5,
    "bart": bart,
    "whisper": whisper,
    "vit": vit,
    "swin": swin,
    "resnet": resnet,
    "convnext": convnext,
    "clip": clip,
    "llava": llava,
    "wav2vec2": wav2vec2,
    "data_dependent_branch": data_dependent_branch,
    "shared_weights": shared_weights,
    "nested_outputs": nested_outputs,
}
"""Every architecture of the fx coverage table, in its order (docs/fx.md)."""

ORACLE_MODELS: dict[str, Callable[[], Example]] = {
    "llama": llama,
    "bert": bert,
    "gpt2": gpt2,
    "t5": t5,
    "vit": vit,
}
