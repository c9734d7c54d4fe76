import pytest

from controlplane.core.kvgeometry import kv_bytes_per_block, kv_bytes_per_token


def test_llama_33_70b_bf16_is_320_kib_per_token():
    assert kv_bytes_per_token(80, 8, 128, 2) == 327_680 == 320 * 1024


def test_llama_33_70b_fp8_is_160_kib_per_token():
    assert kv_bytes_per_token(80, 8, 128, 1) == 163_840


def test_llama_31_8b_bf16_is_128_kib_per_token():
    assert kv_bytes_per_token(32, 8, 128, 2) == 131_072


def test_explicit_size_wins_for_mla_models():
    assert kv_bytes_per_token(61, 1, 576, 1, explicit=70_272) == 70_272


def test_a_4000_token_fp8_prompt_is_about_066_gb():
    assert kv_bytes_per_token(80, 8, 128, 1) * 4000 == pytest.approx(0.655e9, rel=0.01)


@pytest.mark.parametrize(
    "args", [(0, 8, 128, 2), (80, 0, 128, 2), (80, 8, -1, 2), (80, 8, 128, 0)]
)
def test_non_positive_geometry_is_rejected(args):
    with pytest.raises(ValueError, match="must be positive"):
        kv_bytes_per_token(*args)


def test_block_bytes():
    assert kv_bytes_per_block(163_840, 16) == 2_621_440
    with pytest.raises(ValueError):
        kv_bytes_per_block(163_840, 0)
