"""The tiny video encoder and the cost model: exact normalization, shapes, the raw-uint8 trap."""

import pytest
import torch

from paralab.check import CheckFailed, assert_match
from paralab.models import TinyVideoEncoder, normalize_pixels, random_raw_videos
from paralab.vae_lb import encode_cost


def test_normalize_maps_every_pixel_value_exactly():
    pixels = torch.arange(256, dtype=torch.uint8)
    x = normalize_pixels(pixels)
    assert x.dtype == torch.float64
    assert x[0] == -1.0 and x[255] == 1.0
    assert torch.equal(x, pixels.to(torch.float64) / 127.5 - 1.0)


def test_normalize_refuses_floats():
    with pytest.raises(TypeError, match="uint8"):
        normalize_pixels(torch.zeros(3, 2, 8, 8))


def test_latent_shape_dtype_and_size():
    video = random_raw_videos(1, seed=3)[0]
    _, t, h, w = video.shape
    latent = TinyVideoEncoder()(video)
    assert latent.shape == (4, t // 2, h // 4, w // 4) and latent.dtype == torch.float64
    assert (
        latent.nbytes == t * h * w == encode_cost(video)
    )  # the latent is a third of the raw video's 3THW bytes


def test_sizes_that_do_not_divide_are_rejected_naming_the_dimension():
    with pytest.raises(ValueError, match="height=10"):
        TinyVideoEncoder()(torch.zeros(3, 2, 10, 8, dtype=torch.uint8))
    with pytest.raises(ValueError, match="channels"):
        TinyVideoEncoder()(torch.zeros(1, 2, 8, 8, dtype=torch.uint8))


def test_same_bits_with_one_or_two_threads():
    videos = random_raw_videos(3, seed=4)
    encoder, before = TinyVideoEncoder(), torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        two = [encoder(v) for v in videos]
        torch.set_num_threads(1)
        one = [encoder(v) for v in videos]
    finally:
        torch.set_num_threads(before)
    assert_match(two, one)


def test_raw_uint8_cast_to_float_is_caught():
    videos = random_raw_videos(2, seed=5)
    encoder = TinyVideoEncoder()
    with pytest.raises(CheckFailed, match="2 of 2 tensors"):
        assert_match(
            [encoder.encode_normalized(v.to(torch.float64)) for v in videos],
            [encoder(v) for v in videos],
        )


def test_encode_cost_is_frames_times_height_times_width():
    assert encode_cost(torch.zeros(3, 6, 16, 24, dtype=torch.uint8)) == 6 * 16 * 24
    with pytest.raises(ValueError, match="channels, frames, height, width"):
        encode_cost(torch.zeros(6, 16, 24))
