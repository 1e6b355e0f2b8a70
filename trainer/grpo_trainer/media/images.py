"""One image for rollout and update: resized once, to Qwen's pixel bounds, before encoding.

The processor caps each image at ``data.image_max_pixels``; vLLM, given the raw image,
would resize it to the checkpoint's own limit (12,845,056 pixels for Qwen2/2.5-VL: up to
16k tokens) and sample from a different picture than the one the update trains on. So
each image is resized here, once, with Qwen's smart-resize (sides multiples of patch x
merge, pixels within ``[min_pixels, max_pixels]``, aspect ratio kept), and that image goes
to both. Both resize it again with the same bounds (the processor via ``size``, vLLM via
``mm_processor_kwargs``), which leaves it as it is: ``PixelBounds.size`` is a fixed point
of smart-resize. An image's token count follows from its size alone, so prompt lengths
are known without running the processor (``PixelBounds.tokens``).
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Any

from grpo_api.trainer_config import DataConfig

from ..config_error import ConfigError

# Resizes before giving up: bounds too close for any size with sides multiples of the
# factor (min = max = 3136 with 32-pixel tokens) make smart-resize alternate forever.
MAX_RESIZES = 16


@dataclass(frozen=True)
class PixelBounds:
    min_pixels: int
    max_pixels: int
    factor: int  # patch_size x merge_size: the side, in pixels, of one image token
    # What is resized, for messages: "image", or "video" for video frames (their bounds
    # are data.video_min_pixels/video_max_pixels: grpo_trainer.media.videos).
    what: str = "image"

    def size(self, width: int, height: int) -> tuple[int, int]:
        """(width, height) after Qwen's smart-resize, applied until it changes nothing.

        One application is enough unless the image is so thin that a side was held at
        ``factor`` and the pixels stayed above ``max_pixels``: then a second resize (the
        processor's, vLLM's) would shrink it again. Iterating to the fixed point makes
        those resizes the identity as well."""
        from transformers.models.qwen2_vl.image_processing_qwen2_vl import smart_resize

        h, w = height, width
        for _ in range(MAX_RESIZES):
            nh, nw = smart_resize(h, w, self.factor, self.min_pixels, self.max_pixels)
            if (nh, nw) == (h, w):
                return w, h
            h, w = nh, nw
        raise ConfigError(
            f"data.{self.what}_max_pixels",
            f"no size of a {width}x{height} {self.what} has sides that are multiples of "
            f"{self.factor} (the model's patch x merge) and {self.min_pixels} to "
            f"{self.max_pixels} pixels (data.{self.what}_min_pixels to "
            f"data.{self.what}_max_pixels); widen the bounds",
        )

    def tokens(self, width: int, height: int) -> int:
        """Image tokens of an image of this size: one per ``factor`` x ``factor`` square
        (the processor's ``image_grid_thw.prod() // merge_size**2``)."""
        w, h = self.size(width, height)
        return (w // self.factor) * (h // self.factor)

    def fit(self, image: Any) -> Any:
        """``image`` (PIL) at its resized size; bicubic, as Qwen's processor resizes."""
        from PIL import Image

        size = self.size(*image.size)
        return image if size == image.size else image.resize(size, Image.Resampling.BICUBIC)

    @property
    def processor_size(self) -> dict[str, int]:
        """The bounds as the Hugging Face processor's ``size`` argument."""
        return {"shortest_edge": self.min_pixels, "longest_edge": self.max_pixels}

    @property
    def vllm_kwargs(self) -> dict[str, int]:
        """The bounds as vLLM's ``mm_processor_kwargs`` for Qwen-VL
        (``Qwen2VLProcessingInfo._get_vision_size``)."""
        return {"min_pixels": self.min_pixels, "max_pixels": self.max_pixels}


def processor_bounds(image_processor: Any) -> PixelBounds:
    """A Qwen-VL image processor's own bounds (its ``size``) and token side."""
    own = dict(image_processor.size)
    factor = int(image_processor.patch_size) * int(image_processor.merge_size)
    return PixelBounds(int(own["shortest_edge"]), int(own["longest_edge"]), factor)


def pixel_bounds(data: DataConfig, image_processor: Any) -> PixelBounds:
    """The config's bounds, or where it sets neither, the checkpoint processor's own."""
    own = processor_bounds(image_processor)
    if data.model_fields_set & {"image_min_pixels", "image_max_pixels"}:
        return PixelBounds(data.image_min_pixels, data.image_max_pixels, own.factor)
    return own


def image_size(data: bytes) -> tuple[int, int]:
    """(width, height) of an encoded image, from its header (nothing is decoded)."""
    from PIL import Image

    with Image.open(io.BytesIO(data)) as im:
        return im.size
