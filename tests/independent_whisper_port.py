"""A Whisper written the way openai-whisper's own ``whisper/model.py`` writes it, not the way transformers does: test
material for diff, above all for an encoder-decoder whose front end is convolutional and whose output projection is
no module at all.

transformers' ``WhisperForConditionalGeneration`` wraps an encoder and a decoder in ``model``, looks its encoder's
sinusoidal positions up in an ``nn.Embedding`` (``embed_positions``), its decoder's in a ``WhisperPositionalEmbedding``
module, scales q alone by ``d_head ** -0.5`` inside its attention, gives each attention ``k_proj``/``q_proj``/
``v_proj``/``out_proj`` and projects the decoder's output with a tied ``proj_out``. This port has an ``AudioEncoder``
(``conv1``, ``conv2``, its sinusoids computed into a buffer, ``blocks`` of ``ResidualAttentionBlock``, ``ln_post``)
and a ``TextDecoder`` (``token_embedding``, a learned ``positional_embedding`` Parameter added in the decoder's own
code, ``ln``, logits as ``x @ token_embedding.weight.T`` in the decoder's own code). Its attention scales q and k by
``d_head ** -0.25`` each and returns its pre-softmax scores beside its output, its MLP is an ``nn.Sequential`` and its
norms, linears and convolutions are subclasses that cast to the input's dtype. ``port_of`` copies the weights of the
original. Each ``bug`` injects one porting mistake (see ``BUGS``).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from tests.port_traces import randomized

BUGS = (
    "conv2_padding",  # the encoder's second convolution without padding: one frame fewer, every frame shifted
    "sin_cos_swapped",  # the encoder's sinusoids laid out [cos sin] instead of [sin cos]
    "unscaled_k",  # encoder block 0's attention scales q by d_head ** -0.25 but forgets k
    "tanh_gelu",  # encoder block 1's MLP uses the tanh approximation of GELU where Whisper uses the exact one
    "no_ln_post",  # the encoder's output goes to the decoder without its final norm
    "no_causal_mask",  # decoder block 0's self-attention ignores the causal mask it is given
    "cross_reads_decoder",  # decoder block 1's cross-attention takes keys and values from the decoder's state
)
# (a bias given to ``key`` is no bug one can see: it adds q . b to every score of a query, which softmax cancels)

# transformers' decoder ends before proj_out, the port's holds the logits: the two decoders are other quantities and
# are not mapped, only what they hold
RULES = (
    "model.encoder=encoder",
    "model.decoder.layers.{i}=decoder.blocks.{i}",
    "model.decoder.embed_tokens=decoder.token_embedding",
    "model.decoder.layer_norm=decoder.ln",
    "encoder.layers.{i}=encoder.blocks.{i}",
    "encoder.layer_norm=encoder.ln_post",
    "self_attn_layer_norm=attn_ln",
    "self_attn=attn",
    "encoder_attn_layer_norm=cross_attn_ln",
    "encoder_attn=cross_attn",
    "q_proj=query",
    "k_proj=key",
    "v_proj=value",
    "out_proj=out",
    "final_layer_norm=mlp_ln",
    "fc1=mlp.0",
    "activation_fn=mlp.1",
    "fc2=mlp.2",
)


class LayerNorm(nn.LayerNorm):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x.float()).type(x.dtype)


class Linear(nn.Linear):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bias = None if self.bias is None else self.bias.to(x.dtype)
        return F.linear(x, self.weight.to(x.dtype), bias)


class Conv1d(nn.Conv1d):
    def _conv_forward(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return super()._conv_forward(x, weight.to(x.dtype), None if bias is None else bias.to(x.dtype))


def sinusoids(length: int, channels: int, max_timescale: float = 10000, swapped: bool = False) -> torch.Tensor:
    """Returns sinusoids for positional embedding"""
    log_timescale_increment = math.log(max_timescale) / (channels // 2 - 1)
    inv_timescales = torch.exp(-log_timescale_increment * torch.arange(channels // 2))
    scaled_time = torch.arange(length)[:, None] * inv_timescales[None, :]
    halves = [torch.sin(scaled_time), torch.cos(scaled_time)]
    return torch.cat(halves[::-1] if swapped else halves, dim=1)


class MultiHeadAttention(nn.Module):
    def __init__(self, n_state: int, n_head: int, scale_k: bool = True, masked: bool = True, own_kv: bool = False):
        super().__init__()
        self.n_head = n_head
        self.query = Linear(n_state, n_state)
        self.key = Linear(n_state, n_state, bias=False)
        self.value = Linear(n_state, n_state)
        self.out = Linear(n_state, n_state)
        self.scale_k, self.masked, self.own_kv = scale_k, masked, own_kv

    def forward(
        self, x: torch.Tensor, xa: torch.Tensor | None = None, mask: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        source = x if xa is None or self.own_kv else xa
        q = self.query(x)
        k = self.key(source)
        v = self.value(source)
        wv, qk = self.qkv_attention(q, k, v, mask if self.masked else None)
        return self.out(wv), qk

    def qkv_attention(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        n_batch, n_ctx, n_state = q.shape
        scale = (n_state // self.n_head) ** -0.25
        q = q.view(*q.shape[:2], self.n_head, -1).permute(0, 2, 1, 3) * scale
        k = k.view(*k.shape[:2], self.n_head, -1).permute(0, 2, 3, 1) * (scale if self.scale_k else 1.0)
        v = v.view(*v.shape[:2], self.n_head, -1).permute(0, 2, 1, 3)
        qk = q @ k
        if mask is not None:
            qk = qk + mask[:n_ctx, :n_ctx]
        qk = qk.float()
        w = F.softmax(qk, dim=-1).to(q.dtype)
        return (w @ v).permute(0, 2, 1, 3).flatten(start_dim=2), qk.detach()


class ResidualAttentionBlock(nn.Module):
    def __init__(self, n_state: int, n_head: int, n_mlp: int, cross_attention: bool, bug: str | None) -> None:
        super().__init__()
        self.attn = MultiHeadAttention(n_state, n_head, bug != "unscaled_k", bug != "no_causal_mask")
        self.attn_ln = LayerNorm(n_state)
        self.cross_attn = (
            MultiHeadAttention(n_state, n_head, own_kv=bug == "cross_reads_decoder") if cross_attention else None
        )
        self.cross_attn_ln = LayerNorm(n_state) if cross_attention else None
        gelu = nn.GELU(approximate="tanh" if bug == "tanh_gelu" else "none")
        self.mlp = nn.Sequential(Linear(n_state, n_mlp), gelu, Linear(n_mlp, n_state))
        self.mlp_ln = LayerNorm(n_state)

    def forward(
        self, x: torch.Tensor, xa: torch.Tensor | None = None, mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        x = x + self.attn(self.attn_ln(x), mask=mask)[0]
        if self.cross_attn is not None and self.cross_attn_ln is not None:
            x = x + self.cross_attn(self.cross_attn_ln(x), xa)[0]
        return x + self.mlp(self.mlp_ln(x))


def _bug_in(bug: str | None, block: int, where: dict[str, int]) -> str | None:
    return bug if where.get(bug or "") == block else None


class AudioEncoder(nn.Module):
    def __init__(self, n_mels: int, n_ctx: int, n_state: int, n_head: int, n_mlp: int, n_layer: int, bug: str | None):
        super().__init__()
        self.conv1 = Conv1d(n_mels, n_state, kernel_size=3, padding=1)
        self.conv2 = Conv1d(n_state, n_state, kernel_size=3, stride=2, padding=0 if bug == "conv2_padding" else 1)
        self.register_buffer("positional_embedding", sinusoids(n_ctx, n_state, swapped=bug == "sin_cos_swapped"))
        where = {"unscaled_k": 0, "tanh_gelu": 1}
        self.blocks = nn.ModuleList(
            ResidualAttentionBlock(n_state, n_head, n_mlp, False, _bug_in(bug, i, where)) for i in range(n_layer)
        )
        self.ln_post = LayerNorm(n_state)
        self.skip_ln_post = bug == "no_ln_post"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x : torch.Tensor, shape = (batch_size, n_mels, n_ctx): the mel spectrogram of the audio"""
        x = F.gelu(self.conv1(x))
        x = F.gelu(self.conv2(x))
        x = x.permute(0, 2, 1)
        x = (x + self.positional_embedding[: x.shape[1]]).to(x.dtype)  # shorter audio: fewer positions
        for block in self.blocks:
            x = block(x)
        return x if self.skip_ln_post else self.ln_post(x)


class TextDecoder(nn.Module):
    def __init__(self, n_vocab: int, n_ctx: int, n_state: int, n_head: int, n_mlp: int, n_layer: int, bug: str | None):
        super().__init__()
        self.token_embedding = nn.Embedding(n_vocab, n_state)
        self.positional_embedding = nn.Parameter(torch.empty(n_ctx, n_state))
        where = {"no_causal_mask": 0, "cross_reads_decoder": 1}
        self.blocks = nn.ModuleList(
            ResidualAttentionBlock(n_state, n_head, n_mlp, True, _bug_in(bug, i, where)) for i in range(n_layer)
        )
        self.ln = LayerNorm(n_state)
        self.register_buffer("mask", torch.empty(n_ctx, n_ctx).fill_(-math.inf).triu_(1), persistent=False)

    def forward(self, x: torch.Tensor, xa: torch.Tensor) -> torch.Tensor:
        """x : the text tokens (batch_size, <= n_ctx); xa : the encoded audio features to be attended on"""
        x = self.token_embedding(x) + self.positional_embedding[: x.shape[-1]]
        x = x.to(xa.dtype)
        for block in self.blocks:
            x = block(x, xa, mask=self.mask)
        x = self.ln(x)
        return (x @ torch.transpose(self.token_embedding.weight.to(x.dtype), 0, 1)).float()


class Whisper(nn.Module):
    def __init__(self, config, bug: str | None = None) -> None:  # type: ignore[no-untyped-def]
        super().__init__()
        self.encoder = AudioEncoder(
            config.num_mel_bins,
            config.max_source_positions,
            config.d_model,
            config.encoder_attention_heads,
            config.encoder_ffn_dim,
            config.encoder_layers,
            bug,
        )
        self.decoder = TextDecoder(
            config.vocab_size,
            config.max_target_positions,
            config.d_model,
            config.decoder_attention_heads,
            config.decoder_ffn_dim,
            config.decoder_layers,
            bug,
        )

    def forward(self, mel: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        return self.decoder(tokens, self.encoder(mel))


def hf_whisper(seed: int = 0):  # type: ignore[no-untyped-def]
    """transformers' WhisperForConditionalGeneration, tiny, with random weights (its encoder's positions are the
    sinusoids Whisper fixes them to)."""
    from transformers import WhisperConfig, WhisperForConditionalGeneration
    from transformers.models.whisper.modeling_whisper import sinusoids as hf_sinusoids

    torch.manual_seed(seed)
    config = WhisperConfig(
        vocab_size=128,
        num_mel_bins=12,
        d_model=32,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        max_source_positions=8,
        max_target_positions=16,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        decoder_start_token_id=1,
        use_cache=False,
        attn_implementation="eager",
    )
    model = randomized(WhisperForConditionalGeneration(config).eval(), 0.3)
    with torch.no_grad():
        positions = model.model.encoder.embed_positions.weight
        positions.copy_(hf_sinusoids(*positions.shape))
    return model


def _attention(port: MultiHeadAttention, original: nn.Module) -> None:
    port.query.load_state_dict(original.q_proj.state_dict())
    port.key.load_state_dict(original.k_proj.state_dict())
    port.value.load_state_dict(original.v_proj.state_dict())
    port.out.load_state_dict(original.out_proj.state_dict())


def _block(port: ResidualAttentionBlock, layer: nn.Module) -> None:
    _attention(port.attn, layer.self_attn)
    port.attn_ln.load_state_dict(layer.self_attn_layer_norm.state_dict())
    if port.cross_attn is not None and port.cross_attn_ln is not None:
        _attention(port.cross_attn, layer.encoder_attn)
        port.cross_attn_ln.load_state_dict(layer.encoder_attn_layer_norm.state_dict())
    port.mlp[0].load_state_dict(layer.fc1.state_dict())
    port.mlp[2].load_state_dict(layer.fc2.state_dict())
    port.mlp_ln.load_state_dict(layer.final_layer_norm.state_dict())


def port_of(hf, bug: str | None = None) -> Whisper:  # type: ignore[no-untyped-def]
    """The port of ``hf`` (transformers' WhisperForConditionalGeneration), its weights copied."""
    port = Whisper(hf.config, bug).eval()
    encoder, decoder = hf.model.encoder, hf.model.decoder
    with torch.no_grad():
        port.encoder.conv1.load_state_dict(encoder.conv1.state_dict())
        port.encoder.conv2.load_state_dict(encoder.conv2.state_dict())
        for block, layer in zip(port.encoder.blocks, encoder.layers):
            _block(block, layer)
        port.encoder.ln_post.load_state_dict(encoder.layer_norm.state_dict())
        port.decoder.token_embedding.weight.copy_(decoder.embed_tokens.weight)
        port.decoder.positional_embedding.copy_(decoder.embed_positions.weight)
        for block, layer in zip(port.decoder.blocks, decoder.layers):
            _block(block, layer)
        port.decoder.ln.load_state_dict(decoder.layer_norm.state_dict())
    return port


def inputs(seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """(input_features [1, 12, 16], decoder_input_ids [1, 5])."""
    generator = torch.Generator().manual_seed(seed)
    mel = torch.randn(1, 12, 16, generator=generator)
    return mel, torch.randint(0, 128, (1, 5), generator=generator)


def hf_inputs(mel: torch.Tensor, tokens: torch.Tensor) -> dict[str, torch.Tensor]:
    return {"input_features": mel, "decoder_input_ids": tokens}


# (arch, bug, fused, the port's module that must be named); "" is the model's own code
CASES = [
    ("whisper", "conv2_padding", False, "encoder.conv2"),
    ("whisper", "sin_cos_swapped", False, "encoder"),
    ("whisper", "unscaled_k", False, "encoder.blocks.0.attn"),
    ("whisper", "tanh_gelu", False, "encoder.blocks.1.mlp.1"),
    ("whisper", "no_ln_post", False, "encoder"),
    ("whisper", "no_causal_mask", False, "decoder.blocks.0.attn"),
    ("whisper", "cross_reads_decoder", False, "decoder.blocks.1.cross_attn"),
]

STATS_EXPECTED: dict[tuple[str, str], str] = {}

__all__ = ["BUGS", "CASES", "RULES", "STATS_EXPECTED", "Whisper", "hf_inputs", "hf_whisper", "inputs", "port_of"]
