"""A ConvNeXt written the way timm's ``timm/models/convnext.py`` writes it, not the way transformers does: test
material for diff, above all for activations whose dimensions lie in another order where two of them have the same
size (square images: ``[B, H, W, C]`` against ``[B, C, H, W]`` with ``H == W``).

transformers' ``ConvNextForImageClassification`` wraps ``embeddings`` (``patch_embeddings``, a channels-first
``layernorm``), an ``encoder`` of ``stages`` (a ``downsampling_layer`` list, ``layers`` of ``ConvNextLayer`` with
``dwconv``, a channels-last ``layernorm``, ``pwconv1``, ``act``, ``pwconv2`` and a layer-scale parameter), a final
``layernorm`` over the pooled features and a ``classifier``. This port has a ``stem`` (``nn.Sequential`` of a
convolution and a ``LayerNorm2d`` written timm's way: permute, ``F.layer_norm``, permute back), ``stages`` of
``ConvNeXtStage`` (a ``downsample`` ``nn.Sequential`` from the second stage on, an ``nn.Identity`` in the first, and
``blocks``), ``ConvNeXtBlock`` with ``conv_dw``, ``norm``, an ``Mlp`` (``fc1``, ``act``, ``drop1``, ``norm``
identity, ``fc2``, ``drop2``), ``gamma`` and a ``drop_path`` identity, and a ``head`` that pools (``global_pool``),
norms (``LayerNorm2d`` on ``[B, C, 1, 1]``), flattens and classifies (``fc``). The faithful variant ``conv_mlp`` is
timm's ``conv_mlp=True``: each block norms with ``LayerNorm2d`` and runs its MLP as 1x1 convolutions, channels-first,
so its norm and MLP return ``[B, C, H, W]`` where transformers' return ``[B, H, W, C]``, with ``H == W``. ``port_of``
copies the weights of the original. Each ``bug`` injects one porting mistake (see ``BUGS``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from tests.port_traces import randomized

BUGS = (
    "no_gamma",  # stage 1's block 0 forgets to multiply by its layer-scale gamma
    "stem_eps",  # the stem's norm with eps 1e-5 where ConvNeXt uses 1e-6
    "dw_kernel3",  # stage 0's block 1 depthwise convolution with kernel 3, padding 1 (the 7x7 kernel's centre)
    "tanh_gelu",  # stage 1's block 1 MLP uses the tanh approximation of GELU
    "hw_transposed",  # stage 0's block 0 permutes back with permute(0, 3, 2, 1): H and W transposed
    "no_downsample_norm",  # stage 1's downsample skips its norm
    "norm_before_pool",  # the head norms the feature map before pooling instead of the pooled features
)

VARIANTS = ("conv_mlp",)  # faithful, not a bug: timm's conv_mlp=True, the blocks' norm and MLP channels-first

RULES = (
    "convnext.embeddings.patch_embeddings=stem.0",
    "convnext.embeddings.layernorm=stem.1",
    "convnext.embeddings=stem",
    "convnext.encoder.stages.{i}.downsampling_layer=stages.{i}.downsample",
    "convnext.encoder.stages.{i}.layers=stages.{i}.blocks",
    "convnext.encoder.stages.{i}=stages.{i}",
    "convnext.layernorm=head.norm",
    "classifier=head.fc",
    "dwconv=conv_dw",
    "layernorm=norm",
    "pwconv1=mlp.fc1",
    "act=mlp.act",
    "pwconv2=mlp.fc2",
)


class LayerNorm2d(nn.LayerNorm):
    """LayerNorm over the channels of a ``[B, C, H, W]`` tensor (timm's)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.permute(0, 2, 3, 1)
        x = F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)
        return x.permute(0, 3, 1, 2)


class Mlp(nn.Module):
    """timm's Mlp; with ``conv`` its ConvMlp (1x1 convolutions on ``[B, C, H, W]``)."""

    def __init__(self, dim: int, hidden: int, approximate: str, conv: bool) -> None:
        super().__init__()
        self.fc1: nn.Module = nn.Conv2d(dim, hidden, 1) if conv else nn.Linear(dim, hidden)
        self.act = nn.GELU(approximate=approximate)
        self.drop1 = nn.Dropout(0.0)
        self.norm = nn.Identity()
        self.fc2: nn.Module = nn.Conv2d(hidden, dim, 1) if conv else nn.Linear(hidden, dim)
        self.drop2 = nn.Dropout(0.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.drop1(self.act(self.fc1(x)))
        return self.drop2(self.fc2(self.norm(x)))


class ConvNeXtBlock(nn.Module):
    def __init__(self, dim: int, bug: str | None, conv_mlp: bool) -> None:
        super().__init__()
        self.bug, self.conv_mlp = bug, conv_mlp
        kernel = 3 if bug == "dw_kernel3" else 7
        self.conv_dw = nn.Conv2d(dim, dim, kernel_size=kernel, padding=kernel // 2, groups=dim)
        self.norm = LayerNorm2d(dim, eps=1e-6) if conv_mlp else nn.LayerNorm(dim, eps=1e-6)
        self.mlp = Mlp(dim, 4 * dim, "tanh" if bug == "tanh_gelu" else "none", conv_mlp)
        self.gamma = nn.Parameter(torch.ones(dim))
        self.drop_path = nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shortcut = x
        x = self.conv_dw(x)
        if self.conv_mlp:
            x = self.mlp(self.norm(x))
            x = x if self.bug == "no_gamma" else x.mul(self.gamma.reshape(1, -1, 1, 1))
        else:
            x = x.permute(0, 2, 3, 1)
            x = self.mlp(self.norm(x))
            x = x if self.bug == "no_gamma" else x * self.gamma
            x = x.permute(0, 3, 2, 1) if self.bug == "hw_transposed" else x.permute(0, 3, 1, 2)
        return self.drop_path(x) + shortcut


class ConvNeXtStage(nn.Module):
    def __init__(self, dims: tuple[int, int], depth: int, bugs: list[str | None], conv_mlp: bool) -> None:
        super().__init__()
        previous, dim = dims
        if previous == dim:
            self.downsample: nn.Module = nn.Identity()
        elif "no_downsample_norm" in bugs:
            self.downsample = nn.Sequential(nn.Conv2d(previous, dim, kernel_size=2, stride=2))
        else:
            self.downsample = nn.Sequential(LayerNorm2d(previous, eps=1e-6), nn.Conv2d(previous, dim, 2, stride=2))
        self.blocks = nn.Sequential(*(ConvNeXtBlock(dim, bugs[j], conv_mlp) for j in range(depth)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.blocks(self.downsample(x))


class NormClassifierHead(nn.Module):
    """timm's NormMlpClassifierHead without its hidden layer: pool, norm, flatten, classify."""

    def __init__(self, dim: int, classes: int, eps: float, bug: str | None) -> None:
        super().__init__()
        self.norm_first = bug == "norm_before_pool"
        self.global_pool = nn.AdaptiveAvgPool2d(1)
        self.norm = LayerNorm2d(dim, eps=eps)
        self.flatten = nn.Flatten(1)
        self.pre_logits = nn.Identity()
        self.drop = nn.Dropout(0.0)
        self.fc = nn.Linear(dim, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.global_pool(self.norm(x)) if self.norm_first else self.norm(self.global_pool(x))
        return self.fc(self.drop(self.pre_logits(self.flatten(x))))


# where each bug lives: (stage, block); -1 for a stage's own modules
_WHERE = {"no_gamma": (1, 0), "dw_kernel3": (0, 1), "tanh_gelu": (1, 1), "hw_transposed": (0, 0)}


class ConvNeXt(nn.Module):
    def __init__(self, config, bug: str | None = None, conv_mlp: bool = False) -> None:  # type: ignore[no-untyped-def]
        super().__init__()
        sizes, depths = config.hidden_sizes, config.depths
        patch = config.patch_size
        self.stem = nn.Sequential(
            nn.Conv2d(config.num_channels, sizes[0], kernel_size=patch, stride=patch),
            LayerNorm2d(sizes[0], eps=1e-5 if bug == "stem_eps" else 1e-6),
        )
        stages = []
        for i, (depth, dim) in enumerate(zip(depths, sizes)):
            bugs = [bug if _WHERE.get(bug or "") == (i, j) else None for j in range(depth)]
            if bug == "no_downsample_norm" and i == 1:
                bugs.append(bug)
            stages.append(ConvNeXtStage((sizes[max(i - 1, 0)], dim), depth, bugs, conv_mlp))
        self.stages = nn.Sequential(*stages)
        self.head = NormClassifierHead(sizes[-1], config.num_labels, config.layer_norm_eps, bug)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.stages(self.stem(x)))


def hf_convnext(seed: int = 0):  # type: ignore[no-untyped-def]
    from transformers import ConvNextConfig, ConvNextForImageClassification

    torch.manual_seed(seed)
    config = ConvNextConfig(
        num_channels=3,
        patch_size=4,
        hidden_sizes=[16, 32],
        depths=[2, 2],
        num_stages=2,
        num_labels=10,
        image_size=32,
        layer_scale_init_value=1e-6,
        layer_norm_eps=1e-6,
    )
    model = randomized(ConvNextForImageClassification(config).eval(), 0.2)
    with torch.no_grad():  # layer-scale gammas near 0.5, so that every block matters
        # the stem at ConvNeXt's own init scale (std 0.02): its output's variance is then small enough that the norm's
        # eps matters
        for parameter in model.convnext.embeddings.patch_embeddings.parameters():
            parameter.normal_(0.0, 0.02)
        for stage in model.convnext.encoder.stages:
            for layer in stage.layers:
                layer.layer_scale_parameter.normal_(0.5, 0.1)
    return model


def _load_norm(norm: nn.LayerNorm, original: nn.Module) -> None:
    norm.weight.copy_(original.weight)
    norm.bias.copy_(original.bias)


def port_of(hf, bug: str | None = None) -> ConvNeXt:  # type: ignore[no-untyped-def]
    """The port of ``hf`` (transformers' ConvNextForImageClassification), its weights copied; ``"conv_mlp"`` is the
    faithful channels-first variant, also with a bug (``"conv_mlp+tanh_gelu"``)."""
    variant, _, bug = (bug or "").rpartition("+")
    conv_mlp = "conv_mlp" in (variant, bug)
    bug = None if bug in ("", "conv_mlp") else bug
    port = ConvNeXt(hf.config, bug, conv_mlp).eval()
    original = hf.convnext
    with torch.no_grad():
        port.stem[0].load_state_dict(original.embeddings.patch_embeddings.state_dict())
        _load_norm(port.stem[1], original.embeddings.layernorm)
        for stage, hf_stage in zip(port.stages, original.encoder.stages):
            if isinstance(stage.downsample, nn.Sequential):
                norm, conv = hf_stage.downsampling_layer
                if len(stage.downsample) == 2:
                    _load_norm(stage.downsample[0], norm)
                stage.downsample[-1].load_state_dict(conv.state_dict())
            for block, layer in zip(stage.blocks, hf_stage.layers):
                weight = layer.dwconv.weight
                if block.conv_dw.kernel_size[0] == 3:  # the centre of the 7x7 kernel
                    weight = weight[:, :, 2:5, 2:5]
                block.conv_dw.weight.copy_(weight)
                block.conv_dw.bias.copy_(layer.dwconv.bias)
                _load_norm(block.norm, layer.layernorm)
                for fc, linear in ((block.mlp.fc1, layer.pwconv1), (block.mlp.fc2, layer.pwconv2)):
                    fc.weight.copy_(linear.weight.view(fc.weight.shape))
                    fc.bias.copy_(linear.bias)
                block.gamma.copy_(layer.layer_scale_parameter)
        _load_norm(port.head.norm, original.layernorm)
        port.head.fc.load_state_dict(hf.classifier.state_dict())
    return port


def pixels(seed: int = 1) -> torch.Tensor:
    """A batch of two square images: ``H == W``, as every real CNN input is."""
    return torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(seed))


# (arch, bug, fused, the port's module that must be named); "" is the model's own code
CASES = [
    ("convnext", "no_gamma", False, "stages.1.blocks.0"),
    ("convnext", "stem_eps", False, "stem.1"),
    ("convnext", "dw_kernel3", False, "stages.0.blocks.1.conv_dw"),
    ("convnext", "tanh_gelu", False, "stages.1.blocks.1.mlp.act"),
    ("convnext", "hw_transposed", False, "stages.0.blocks.0"),
    ("convnext", "no_downsample_norm", False, "stages.1.downsample"),
    ("convnext", "norm_before_pool", False, "head"),
]

STATS_EXPECTED: dict[tuple[str, str], str] = {}

__all__ = [
    "BUGS",
    "CASES",
    "RULES",
    "STATS_EXPECTED",
    "VARIANTS",
    "ConvNeXt",
    "hf_convnext",
    "pixels",
    "port_of",
]
