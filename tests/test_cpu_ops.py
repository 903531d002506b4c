"""minillm.kernels.cpu_ops (chapter 9's fused small ops in C) against the readable model's PyTorch ops."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from minillm.kernels import cpu_build, cpu_ops
from minillm.models.llama import RMSNorm
from tests.rotary_case import check_q_and_k_rotated_in_place

pytestmark = pytest.mark.skipif(cpu_build.unavailable_reason() is not None, reason="no C compiler here")


@pytest.fixture
def norm() -> RMSNorm:
    torch.manual_seed(0)
    norm = RMSNorm(80, eps=1e-5)
    norm.weight.data = torch.randn(80)
    return norm


@torch.no_grad()
@pytest.mark.parametrize("rows", [1, 7, 300])
def test_rms_norm_and_the_add_before_it(norm, rows):
    x, residual = torch.randn(rows, 80) * 30, torch.randn(rows, 80)
    torch.testing.assert_close(cpu_ops.rms_norm(x, norm.weight, norm.eps), norm(x))
    expected_stream = residual + x
    out = cpu_ops.add_rms_norm(x, residual, norm.weight, norm.eps)
    torch.testing.assert_close(residual, expected_stream)  # updated in place
    torch.testing.assert_close(out, norm(expected_stream))


def test_add_rms_norm_refuses_a_residual_it_cannot_update_in_place(norm):
    with pytest.raises(ValueError, match="residual in place: it must be contiguous"):
        cpu_ops.add_rms_norm(torch.randn(4, 80), torch.randn(80, 4).T, norm.weight, norm.eps)


def test_rotary_embedding_rotates_q_and_k_inside_one_row_in_place():
    check_q_and_k_rotated_in_place(cpu_ops.rotary_embedding_)


def test_rotary_embedding_refuses_heads_that_are_not_contiguous():
    """The C loop walks each token's heads as one run of floats: a view with heads apart is refused."""
    x = torch.randn(4, 16, 2).transpose(1, 2)  # [4, 2, 16] with head_dim's stride 2
    with pytest.raises(ValueError, match=r"needs each token's heads contiguous, got strides \(32, 1, 2\)"):
        cpu_ops.rotary_embedding_(x, torch.arange(4), torch.randn(8, 16))


def test_silu_and_mul_across_the_exponentials_range():
    """Gates from -200 to 200: e^-g overflows a float past 88, and silu must still be g or 0 there."""
    gate = torch.cat((torch.linspace(-200, 200, 4001), torch.tensor([0.0, -87.5, 88.5, 1e-30])))
    up = torch.randn_like(gate)
    got = cpu_ops.silu_and_mul(torch.cat((gate, up))[None])[0]
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, F.silu(gate) * up, rtol=1e-6, atol=1e-30)


@pytest.mark.parametrize("rows", [1, 3, 16])
def test_linear_few_rows_writes_each_part_into_its_columns(rows):
    """q, k and v of different widths (45 and 11: not whole blocks of the kernel's eight output
    features), k = 83 (not a whole number of vectors), biases on two of them."""
    torch.manual_seed(0)
    x = torch.randn(rows, 83)
    parts = [
        (torch.randn(45, 83), torch.randn(45)),
        (torch.randn(16, 83), None),
        (torch.randn(11, 83), torch.randn(11)),
    ]
    expected = torch.cat([F.linear(x, w, b) for w, b in parts], dim=-1)
    torch.testing.assert_close(cpu_ops.linear_few_rows(x, parts), expected, rtol=1e-5, atol=1e-5)
