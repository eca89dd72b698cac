import pytest
import torch

from lmrepro.errors import ParameterError
from lmrepro.model import VOCAB_SIZE, ByteTransformer, ModelConfig, lm_loss


def small(**kw) -> ModelConfig:
    base = dict(n_layers=3, d_model=32, n_heads=4, context=16)
    base.update(kw)
    return ModelConfig(**base)


def test_shapes_and_hidden_states():
    torch.manual_seed(0)
    model = ByteTransformer(small())
    x = torch.randint(0, 256, (2, 16))
    logits, hidden = model(x, return_hidden=True)
    assert logits.shape == (2, 16, VOCAB_SIZE)
    assert len(hidden) == 3 and all(h.shape == (2, 16, 32) for h in hidden)
    # the logits are the decoder applied to the last hidden state: stages can cut anywhere
    torch.testing.assert_close(model.decoder(hidden[-1]), logits)
    # and the hidden states are the blocks applied in turn
    h = model.embed(x)
    for block, expected in zip(model.blocks, hidden):
        h = block(h)
        torch.testing.assert_close(h, expected)


def test_causality_output_at_t_ignores_later_bytes():
    torch.manual_seed(0)
    model = ByteTransformer(small()).eval()
    x = torch.randint(0, 256, (1, 16))
    y = x.clone()
    y[0, 9:] = torch.randint(0, 256, (7,))
    with torch.no_grad():
        a, b = model(x), model(y)
    torch.testing.assert_close(a[0, :9], b[0, :9])
    assert not torch.allclose(a[0, 9:], b[0, 9:])


def test_initial_loss_near_uniform():
    torch.manual_seed(0)
    model = ByteTransformer(small())
    x = torch.randint(0, 256, (4, 16))
    loss = lm_loss(model(x), torch.randint(0, 256, (4, 16)))
    assert abs(loss.item() - torch.log(torch.tensor(256.0)).item()) < 0.1


def test_tied_embeddings_share_storage():
    model = ByteTransformer(small(tie_embeddings=True))
    assert model.decoder.head.weight is model.embed.tok.weight


def test_sequence_longer_than_context_is_rejected():
    model = ByteTransformer(small())
    with pytest.raises(ValueError, match="model.context = 16"):
        model(torch.zeros(1, 17, dtype=torch.long))


@pytest.mark.parametrize("kw,name", [
    (dict(n_heads=5), "model.n_heads"), (dict(n_layers=0), "model.n_layers"),
    (dict(dropout=1.0), "model.dropout"), (dict(context=0), "model.context"),
])
def test_bad_config_names_the_parameter(kw, name):
    with pytest.raises(ParameterError, match=name):
        small(**kw)
