"""How often ``graphtrace diff`` names the right module on independently written ports: the score table of
docs/compare.md.

    python -m benchmarks.compare_ports [--markdown FILE]

The ports (tests/independent_*.py) are written in styles unlike transformers' and take their weights from small
transformers models with random weights. For every case (a faithful port, or one injected bug) and every value mode
(``safetensors``, ``bundle``, and the default ``repr``, which compares by statistics), the original and the port are
captured and compared without rename rules and with them. A faithful port scores when it compares equal; a bug
scores when the module named is the one where the bug lives (by statistics alone, the parts of a fused projection
cannot be told apart: their caller is the answer there).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

import graphtrace  # noqa: E402
from tests import (  # noqa: E402
    independent_bert,
    independent_clip_port,
    independent_convnext_port,
    independent_einsum_port,
    independent_gpt2,
    independent_lean_llama,
    independent_litgpt_port,
    independent_llama,
    independent_mamba,
    independent_moe,
    independent_neox,
    independent_phi3,
    independent_seq_first,
    independent_t5,
    independent_vit,
    independent_vllm,
    independent_whisper_port,
)
from tests.independent_cases import (  # noqa: E402
    BERT_CASES,
    CASES,
    COMPOUND_CASES,
    FAITHFUL,
    MODES,
    NEOX_CASES,
    REORDERED,
    SPLIT_CASES,
    STATS_EXPECTED,
    VIT_CASES,
)


def _port(originals: dict[str, torch.nn.Module], arch: str, bug: str | None, fused: bool) -> torch.nn.Module:
    if arch == "llama":
        return independent_llama.port_of(originals["llama"], fused=fused, bug=bug)
    if arch == "vit":
        return independent_vit.port_of(originals["vit"], bug=bug)
    if arch == "bert":
        return independent_bert.port_of(originals["bert"], bug=bug)
    if arch == "neox":
        return independent_neox.port_of(originals["neox"], bug=bug)
    if arch == "moe":
        return independent_moe.port_of(originals["moe"], bug=bug)
    if arch == "seq-first":
        return independent_seq_first.port_of(originals["seq"], bug)
    if arch == "vllm":
        return independent_vllm.port_of(originals["vllm"], bug)
    if arch == "t5":
        return independent_t5.port_of(originals["t5"], bug=bug)
    if arch == "phi3":
        return independent_phi3.port_of(originals["phi3"], bug=bug)
    if arch == "gpt2-split":
        return independent_gpt2.split_port_of(originals["gpt2"], bug)
    if arch == "llama-lean":
        return independent_lean_llama.port_of(originals["llama"], bug)
    if arch == "mamba":
        return independent_mamba.port_of(originals["mamba"], bug)
    if arch == "whisper":
        return independent_whisper_port.port_of(originals["whisper"], bug)
    if arch == "clip":
        return independent_clip_port.port_of(originals["clip"], bug)
    if arch == "convnext":
        return independent_convnext_port.port_of(originals["convnext"], bug)
    if arch == "litgpt":
        return independent_litgpt_port.port_of(originals["litgpt"], bug)
    if arch == "einsum":
        return independent_einsum_port.port_of(originals["einsum"], bug)
    return independent_gpt2.port_of(originals["gpt2"], bug=bug)


def score(work: Path, ops: bool = False) -> list[tuple[str, str, str, str, str, bool]]:
    """Rows (case, mode, map, named, expected, ok)."""
    originals = {
        "llama": independent_llama.hf_llama(),
        "gpt2": independent_gpt2.hf_gpt2(),
        "vit": independent_vit.hf_vit(),
        "bert": independent_bert.hf_bert(),
        "neox": independent_neox.hf_neox(),
        "phi3": independent_phi3.hf_phi3(),
        "t5": independent_t5.hf_t5(),
        "vllm": independent_vllm.hf_qwen(),
        "seq": independent_llama.hf_llama(),  # the Llama again, given a batch of two
        "moe": independent_moe.hf_mixtral(),
        "mamba": independent_mamba.hf_mamba(),
        "whisper": independent_whisper_port.hf_whisper(),
        "clip": independent_clip_port.hf_clip(),
        "convnext": independent_convnext_port.hf_convnext(),
        "litgpt": independent_litgpt_port.hf_llama_gqa(),
        "einsum": independent_einsum_port.hf_gemma(),  # a Flax-style Gemma: einsum projections, stacked kv
    }
    rules = {
        "llama": independent_llama.RULES,
        "gpt2": independent_gpt2.RULES,
        "vit": independent_vit.RULES,
        "bert": independent_bert.RULES,
        "neox": independent_neox.RULES,
        "phi3": independent_phi3.RULES,
        "t5": independent_t5.RULES,
        "seq-first": independent_seq_first.RULES,
        "vllm": (),  # its names are transformers' already
        "moe": independent_moe.RULES,
        "gpt2-split": (),
        "llama-lean": independent_lean_llama.RULES,
        "mamba": independent_mamba.RULES,
        "whisper": independent_whisper_port.RULES,
        "clip": independent_clip_port.RULES,
        "convnext": independent_convnext_port.RULES,
        "litgpt": independent_litgpt_port.RULES,
        "einsum": independent_einsum_port.RULES,
    }
    token_ids = torch.randint(0, 128, (1, 8), generator=torch.Generator().manual_seed(1))
    pixels = independent_vit.pixels()
    inputs = {arch: ({"input_ids": token_ids}, (token_ids,)) for arch in ("llama", "gpt2")}
    inputs["vit"] = ({"pixel_values": pixels}, (pixels,))
    bert_ids = independent_bert.token_ids()
    inputs["bert"] = ({"input_ids": bert_ids}, (bert_ids,))
    neox_ids = independent_neox.token_ids()
    inputs["neox"] = ({"input_ids": neox_ids}, (neox_ids,))
    inputs["moe"] = independent_moe.inputs(independent_moe.token_ids())
    phi3_ids = independent_phi3.token_ids()
    inputs["phi3"] = ({"input_ids": phi3_ids}, (phi3_ids,))
    t5_ids, t5_target = independent_t5.inputs()
    inputs["t5"] = (independent_t5.hf_inputs(t5_ids, t5_target), (t5_ids, t5_target))
    batch = independent_seq_first.token_ids()
    inputs["seq"] = inputs["seq-first"] = ({"input_ids": batch}, (batch,))
    inputs["vllm"] = inputs["llama"]
    inputs["gpt2-split"] = inputs["gpt2"]
    inputs["llama-lean"] = inputs["llama"]
    mamba_ids = independent_mamba.token_ids()
    inputs["mamba"] = ({"input_ids": mamba_ids}, (mamba_ids,))
    mel, tokens = independent_whisper_port.inputs()
    inputs["whisper"] = (independent_whisper_port.hf_inputs(mel, tokens), (mel, tokens))
    pixels_clip, ids_clip = independent_clip_port.inputs()
    inputs["clip"] = (independent_clip_port.hf_inputs(pixels_clip, ids_clip), (pixels_clip, ids_clip))
    convnext_pixels = independent_convnext_port.pixels()  # square images: H == W
    inputs["convnext"] = ({"pixel_values": convnext_pixels}, (convnext_pixels,))
    litgpt_ids = independent_litgpt_port.token_ids()
    inputs["litgpt"] = ({"input_ids": litgpt_ids}, (litgpt_ids,))
    einsum_ids = independent_einsum_port.token_ids()
    inputs["einsum"] = ({"input_ids": einsum_ids}, (einsum_ids,))
    faithful = (*FAITHFUL, ("vit", False), ("bert", False), ("gpt2-split", False), ("neox", False), ("moe", False))
    faithful += (("llama-lean", False), ("phi3", False), ("t5", False), ("seq-first", False), ("vllm", False))
    cases = [(arch, None, fused, None) for arch, fused in faithful]
    cases += [(arch, variant, False, None) for arch, variant in REORDERED]
    cases += [("phi3", variant, False, None) for variant in independent_phi3.VARIANTS]
    cases += list(CASES) + VIT_CASES + BERT_CASES
    cases += SPLIT_CASES + NEOX_CASES + COMPOUND_CASES + independent_moe.CASES + independent_lean_llama.CASES
    cases += independent_phi3.CASES + independent_phi3.COMPOUND_CASES + independent_t5.CASES
    cases += independent_seq_first.CASES + independent_vllm.CASES
    cases += [("mamba", None, False, None), *independent_mamba.CASES]
    cases += [("whisper", None, False, None), *independent_whisper_port.CASES]  # an openai-whisper style port
    cases += [("clip", None, False, None), *independent_clip_port.CASES]  # an open_clip style port
    cases += [("convnext", variant, False, None) for variant in (None, *independent_convnext_port.VARIANTS)]
    cases += independent_convnext_port.CASES  # a timm style ConvNeXt
    cases += [("litgpt", None, False, None), *independent_litgpt_port.CASES]  # a litgpt style grouped-query Llama
    cases += [
        ("einsum", None, False, None),
        *[("einsum", variant, False, None) for variant in independent_einsum_port.VARIANTS],
    ]
    cases += independent_einsum_port.CASES + independent_einsum_port.COMPOUND_CASES
    rows = []
    for values in MODES:
        for arch in originals:  # gpt2-split's original is gpt2
            original = work / f"{arch}-{values}"
            try:
                graphtrace.capture(originals[arch], inputs[arch][0], path=original, values=values, ops=ops)
            except Exception as exc:  # the cases it leaves unscored show it
                print(f"capturing the original {arch} with values={values} failed: {exc}", file=sys.stderr)
        for arch, bug, fused, expected in cases:
            port = work / f"{arch}-{bug}-{fused}-{values}"
            name = f"{arch} {bug or 'faithful'}{' (fused qkv)' if fused else ''}"
            if bug and expected is None:
                name = f"{arch} faithful, {bug}"
            for mapped in (False, True):
                try:
                    if not port.exists():
                        model = _port(originals, arch, bug, fused)
                        graphtrace.capture(model, inputs[arch][1], path=port, values=values, ops=ops)
                    reference = work / f"{arch.partition('-')[0]}-{values}"
                    result = graphtrace.compare(reference, port, rules=rules[arch] if mapped else ())
                except Exception as exc:  # a version that cannot capture or compare a case scores it as missed
                    named = f"error: {type(exc).__name__}"
                else:
                    first = result.first_divergence
                    named = "equal" if result.equal else (first.b.path.partition(".")[2] if first else "?")
                want = "equal" if expected is None else expected
                if values == "repr":
                    stats_expected = {
                        **STATS_EXPECTED,
                        **independent_moe.STATS_EXPECTED,
                        **independent_lean_llama.STATS_EXPECTED,
                        **independent_phi3.STATS_EXPECTED,
                        **independent_t5.STATS_EXPECTED,
                        **independent_mamba.STATS_EXPECTED,
                        **independent_whisper_port.STATS_EXPECTED,
                        **independent_clip_port.STATS_EXPECTED,
                        **independent_convnext_port.STATS_EXPECTED,
                        **independent_litgpt_port.STATS_EXPECTED,
                        **independent_einsum_port.STATS_EXPECTED,
                    }
                    want = stats_expected.get((arch, bug or ""), want)
                rows.append((name, values, "yes" if mapped else "no", named, want, named == want))
    return rows


def table(rows: list[tuple[str, str, str, str, str, bool]]) -> str:
    """Cases down, (values, --map) across: ✓ when the expected module was named, else what was named."""
    columns = list(dict.fromkeys((values, mapped) for _, values, mapped, *_ in rows))
    wanted: dict[str, list[str]] = {}
    for case, _, _, _, expected, _ in rows:
        if expected not in wanted.setdefault(case, []):
            wanted[case].append(expected)
    cell = {(case, values, mapped): "✓" if ok else f"✗ `{named}`" for case, values, mapped, named, _, ok in rows}
    header = " | ".join(f"{values}{', --map' if mapped == 'yes' else ''}" for values, mapped in columns)
    lines = [f"| case | expected | {header} |", "|---|---|" + "---|" * len(columns)]
    for case, expected in wanted.items():
        cells = " | ".join(cell[(case, values, mapped)] for values, mapped in columns)
        named = " (by statistics: ".join(f"`{name}`" if name else "the model's own code" for name in expected)
        lines.append(f"| {case} | {named}{')' if len(expected) > 1 else ''} | {cells} |")
    hits = sum(ok for *_, ok in rows)
    lines.append(f"\n**{hits} of {len(rows)}** right")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--markdown", type=Path, help="also write the table to this file")
    parser.add_argument("--ops", action="store_true", help="capture with op records (ops=True)")
    options = parser.parse_args()
    with tempfile.TemporaryDirectory() as work:
        text = table(score(Path(work), ops=options.ops))
    print(text)
    if options.markdown:
        options.markdown.write_text(text + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
