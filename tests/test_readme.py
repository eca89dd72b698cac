"""The README's Python examples run as written (given a model and a loss, which they assume)."""

from __future__ import annotations

import re
from pathlib import Path

import torch

from lmrepro.model import ByteTransformer, ModelConfig, lm_loss

ROOT = Path(__file__).resolve().parents[1]


def python_blocks(text: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


def test_the_readme_python_examples_run() -> None:
    blocks = python_blocks((ROOT / "README.md").read_text(encoding="utf-8"))
    assert blocks, "the README shows the optimizer's use in a python block"
    for code in blocks:
        torch.manual_seed(0)
        model = ByteTransformer(ModelConfig(n_layers=1, d_model=16, n_heads=2, context=8))
        x = torch.randint(0, 256, (2, 8))
        loss = lm_loss(model(x), torch.randint(0, 256, (2, 8)))
        namespace = {"model": model, "loss": loss}
        before = [p.detach().clone() for p in model.parameters()]
        exec(compile(code, "README.md", "exec"), namespace)   # noqa: S102 - our own README
        assert any(not torch.equal(a, p) for a, p in zip(before, model.parameters()))
