"""One image for rollout and update (grpo_trainer.media.images): Qwen's smart-resize to the
pixel bounds, applied once, as a fixed point, and the token count it implies."""

from __future__ import annotations

import io

import pytest
from PIL import Image

from grpo_api.trainer_config import DataConfig
from grpo_trainer.config_error import ConfigError
from grpo_trainer.media.images import PixelBounds, image_size, pixel_bounds

pytestmark = pytest.mark.unit

# Qwen2/2.5-VL: 14-pixel patches merged 2 x 2; the operator's bounds for maxPixels 1003520.
QWEN25 = PixelBounds(min_pixels=3136, max_pixels=1003520, factor=28)
QWEN3 = PixelBounds(min_pixels=3136, max_pixels=1003520, factor=32)  # 16-pixel patches


@pytest.mark.parametrize("bounds", [QWEN25, QWEN3])
@pytest.mark.parametrize(
    "size", [(4032, 3024), (3024, 4032), (1920, 1080), (640, 480), (50, 40), (12, 9),
             (10, 1900), (5000, 26), (999, 1001), (224, 224)],
)
def test_a_resized_image_is_within_the_bounds_and_resizing_it_again_changes_nothing(
    bounds: PixelBounds, size: tuple[int, int]
) -> None:
    """What the processor and vLLM will do to the image (smart-resize with the same bounds)
    leaves it as it is, so both see these very pixels; sides are whole tokens."""
    from transformers.models.qwen2_vl.image_processing_qwen2_vl import smart_resize

    w, h = bounds.size(*size)
    assert w % bounds.factor == 0 and h % bounds.factor == 0
    assert bounds.min_pixels <= w * h <= bounds.max_pixels
    assert smart_resize(h, w, bounds.factor, bounds.min_pixels, bounds.max_pixels) == (h, w)
    assert bounds.tokens(*size) == (w // bounds.factor) * (h // bounds.factor)


def test_an_image_over_max_pixels_is_brought_under_it_keeping_its_shape() -> None:
    """A 12 MP photo: the checkpoint's own limit (12,845,056 pixels) would keep nearly all
    of it (15,552 tokens); the bounds keep about 1 MP (1,230 tokens)."""
    w, h = QWEN25.size(4032, 3024)
    assert (w, h) == (1148, 840) and QWEN25.tokens(4032, 3024) == 41 * 30
    own = PixelBounds(min_pixels=3136, max_pixels=12845056, factor=28)
    assert own.tokens(4032, 3024) == 15552


def test_a_thin_image_held_at_one_token_wide_reaches_its_fixed_point() -> None:
    """smart-resize keeps a side at least one token wide: an image too thin to fit
    max_pixels in one pass comes out above it, and the next resize (the processor's,
    vLLM's) would shrink it again. The bounds iterate to where it stops."""
    from transformers.models.qwen2_vl.image_processing_qwen2_vl import smart_resize

    small = PixelBounds(min_pixels=784, max_pixels=2 * 784, factor=28)
    once = smart_resize(200, 10, 28, 784, 2 * 784)
    assert once[0] * once[1] > small.max_pixels  # one pass is not enough
    w, h = small.size(10, 200)
    assert (h, w) == (56, 28) and smart_resize(h, w, 28, 784, 2 * 784) == (h, w)


def test_bounds_no_size_can_meet_are_a_config_error() -> None:
    """min = max = 3136 pixels with 32-pixel tokens: every size is 3072 or 4096 pixels;
    smart-resize would alternate forever."""
    with pytest.raises(ConfigError) as err:
        PixelBounds(3136, 3136, 32).size(100, 100)
    assert err.value.field == "data.image_max_pixels" and "widen the bounds" in str(err.value)


def test_fit_resizes_a_real_image_and_reads_sizes_from_the_header() -> None:
    buf = io.BytesIO()
    Image.new("RGB", (1000, 600), (9, 8, 7)).save(buf, format="PNG")
    assert image_size(buf.getvalue()) == (1000, 600)
    fitted = PixelBounds(784, 20000, 28).fit(Image.open(buf))
    assert fitted.size == PixelBounds(784, 20000, 28).size(1000, 600) == (168, 84)


def test_the_configs_bounds_or_else_the_processors_own() -> None:
    from transformers.models.qwen2_vl.image_processing_qwen2_vl import Qwen2VLImageProcessor

    # Qwen2.5-VL's preprocessor_config.json: 14-pixel patches, 2 x 2, up to 12,845,056 pixels.
    qwen = Qwen2VLImageProcessor(size={"shortest_edge": 3136, "longest_edge": 12845056},
                                 patch_size=14, merge_size=2)
    set_max = DataConfig(train_files=["x"], image_max_pixels=1003520, image_min_pixels=3136)
    assert pixel_bounds(set_max, qwen) == PixelBounds(3136, 1003520, 28)
    assert pixel_bounds(DataConfig(train_files=["x"]), qwen) == PixelBounds(3136, 12845056, 28)


def test_min_pixels_above_max_pixels_is_refused_naming_both() -> None:
    with pytest.raises(ValueError, match="image_min_pixels 5000 is more than image_max_pixels"):
        DataConfig(train_files=["x"], image_min_pixels=5000, image_max_pixels=4000)
