"""One video for rollout and update: sampled and resized once, before encoding.

A video is a file (decoded with OpenCV) or a list of encoded frame images, in order
(``Record.videos``). Frames are sampled at ``data.video_fps`` from the file's own frame
rate, uniformly over the whole video as qwen_vl_utils samples them, at most
``data.max_frames`` (an even number: Qwen's temporal patch is 2 frames); a frame list is
taken as it is, as frames already sampled at ``data.video_fps``, and thinned uniformly only
when it has more than ``max_frames``. An odd count is padded with a repeat of the last
frame, as the processors and qwen_vl_utils pad it. Every frame is resized once to the
video's size within ``data.video_min_pixels``/``video_max_pixels`` (``PixelBounds``, as
images are: sides multiples of patch x merge), and those frames go to both the processor
and vLLM, each told to neither resample nor resize them (``processor_kwargs``,
``vllm_kwargs``). The frame count and size follow from the headers alone, so prompt lengths
are known without decoding a frame (``probe``, ``VideoSpec.tokens``).

The metadata both sides get (``Video.metadata``) carries the source's frame rate and the
sampled frames' indices: Qwen2.5-VL's temporal positions (``second_per_grid_ts``) and
Qwen3-VL's ``<t seconds>`` text before each frame pair follow from it.
"""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from grpo_api.trainer_config import DataConfig

from .images import PixelBounds

# What a Record holds per video: a file's path, or its frames' encoded bytes in order.
VideoSource = str | list[bytes]


class VideoError(ValueError):
    """A video that cannot be used (unreadable, no frames); the message names it. A
    ValueError, as the prompt-length check and the rest of the data path expect of a
    row that cannot be encoded."""


@dataclass(frozen=True)
class VideoSpec:
    """How videos are sampled and sized: ``data``'s video settings and the model's patch."""

    fps: float  # frames sampled per second of a video file (data.video_fps)
    max_frames: int  # even (data.max_frames rounded down to the temporal patch)
    bounds: PixelBounds  # each frame's pixels (data.video_min_pixels, video_max_pixels)
    temporal_patch: int = 2  # frames per temporal patch (the video processor's)
    # Qwen3-VL writes "<t seconds>" before each frame pair (timestamps_of); its token
    # count is the prompt's too.
    timestamps: bool = False

    def frames(self, total: int, source_fps: float) -> int:
        """Frames sampled from ``total`` at ``source_fps`` (before the even pad): one per
        ``1 / fps`` seconds of the video, at least 1, at most ``max_frames`` and ``total``
        (qwen_vl_utils' ``smart_nframes`` without its 4-frame minimum: a short clip is not
        stretched by repeating frames)."""
        wanted = math.floor(total / source_fps * self.fps) if source_fps > 0 else total
        return max(1, min(wanted, self.max_frames, total))

    def padded(self, frames: int) -> int:
        """``frames`` rounded up to whole temporal patches (the last frame repeated)."""
        return -(-frames // self.temporal_patch) * self.temporal_patch

    def tokens(self, frames: int, width: int, height: int) -> int:
        """Video tokens of ``frames`` (padded) frames of a ``width`` x ``height`` video: one
        per ``factor`` x ``factor`` square of each temporal patch (the processor's
        ``video_grid_thw.prod() // merge_size**2``)."""
        return self.padded(frames) // self.temporal_patch * self.bounds.tokens(width, height)

    @property
    def processor_kwargs(self) -> dict[str, Any]:
        """The Hugging Face processor's ``videos_kwargs``: the frames are already sampled
        and sized (a resize or a per-frame pixel cap could only change them), and the
        bounds for what reads them."""
        return {"do_resize": False, "do_sample_frames": False, "cap_pixels_per_frame": False}

    def vllm_kwargs(self) -> dict[str, Any]:
        """vLLM's ``mm_processor_kwargs["videos_kwargs"]``: the processor's, plus the pixel
        bounds its encoder budget and start-up profile read (scoped: vLLM routes flat
        ``min_pixels``/``max_pixels``, the images', to videos too, and a scoped value wins).
        Qwen3-VL's video bounds are of the whole video (frames x pixels: its
        ``smart_resize``); Qwen2/2.5-VL's of one frame."""
        per = self.max_frames if self.timestamps else 1
        return {**self.processor_kwargs, "min_pixels": self.bounds.min_pixels,
                "max_pixels": self.bounds.max_pixels * per}


def video_spec(data: DataConfig | None, video_processor: Any, timestamps: bool) -> VideoSpec:
    """``data``'s video settings (None: their defaults) for a Qwen-VL video processor (its
    patch, merge and temporal patch); ``timestamps``: the processor writes Qwen3-VL's frame
    times."""
    fields = DataConfig.model_fields
    keys = ("video_fps", "max_frames", "video_min_pixels", "video_max_pixels")
    fps, max_frames, min_pixels, max_pixels = (
        getattr(data, k) if data is not None else fields[k].default for k in keys)
    temporal = int(video_processor.temporal_patch_size)
    factor = int(video_processor.patch_size) * int(video_processor.merge_size)
    bounds = PixelBounds(int(min_pixels), int(max_pixels), factor, "video")
    most = max(temporal, int(max_frames) // temporal * temporal)
    return VideoSpec(float(fps), most, bounds, temporal, timestamps)


@dataclass(frozen=True)
class VideoShape:
    """What a video's prompt tokens depend on, read from headers only (``probe``)."""

    frames: int  # sampled frames, before the even pad
    width: int  # the source's frame size
    height: int
    fps: float  # the source's frame rate (a frame list: data.video_fps)
    indices: tuple[int, ...]  # the sampled frames' indices in the source

    def tokens(self, spec: VideoSpec) -> int:
        return spec.tokens(self.frames, self.width, self.height)


@dataclass
class Video:
    """A video's sampled frames, resized, and where they came from."""

    frames: np.ndarray  # [T, H, W, 3] uint8 RGB, T a multiple of the temporal patch
    fps: float  # the source's frame rate (a frame list: data.video_fps)
    total_frames: int  # the source's frames
    indices: list[int] = field(default_factory=list)  # sampled frames' source indices

    def metadata(self) -> dict[str, Any]:
        """The video metadata both the processor (``VideoMetadata``) and vLLM (the
        ``(frames, metadata)`` item) get. ``frames_indices`` are the sampled frames, the
        pad frame not counted (it is no sample: Qwen2.5-VL's sampled fps, ``len(indices)
        / total_num_frames * fps``, stays the true one; Qwen3-VL pads the indices as it
        pads the frames)."""
        h, w = self.frames.shape[1:3]
        return {
            "total_num_frames": self.total_frames,
            "fps": self.fps,
            "width": int(w),
            "height": int(h),
            "duration": self.total_frames / self.fps,
            "frames_indices": list(self.indices),
            "video_backend": "opencv",
        }


# The processor settings that turn pixels into the tower's input values.
_NORMALISATION = ("do_rescale", "rescale_factor", "do_normalize", "image_mean", "image_std")


def same_normalisation(processor: Any) -> bool:
    """Whether ``processor``'s video processor rescales and normalises pixels as its image
    processor does. vLLM 0.32 normalises every modality on the device with the image
    processor's mean and std (``mm_device_do_normalize``, on by default:
    vllm/model_executor/layers/fusion/mm_input_norm.py ``_load_norm_params``), so where
    they differ its video embeddings would not be the trainer's: the engine then
    normalises on the host, through the processor (vllm_engine.engine_kwargs). Real Qwen
    checkpoints use one mean and std for both; a processor assembled from defaults may not
    (Qwen2VLImageProcessor's CLIP mean beside Qwen3VLVideoProcessor's 0.5)."""
    image = getattr(processor, "image_processor", None)
    video = getattr(processor, "video_processor", None)
    if image is None or video is None:
        return True

    def values(p: Any) -> list[Any]:
        return [list(v) if isinstance(v, list | tuple) else v
                for v in (getattr(p, k, None) for k in _NORMALISATION)]

    return values(image) == values(video)


def timestamps_of(indices: Sequence[int], fps: float, temporal_patch: int) -> list[float]:
    """The seconds Qwen3-VL writes before each temporal patch (``<t seconds>``): the mean
    time of its first and last frame, the indices padded as the frames are
    (``Qwen3VLProcessor._calculate_timestamps``, vLLM's the same)."""
    idx = list(indices)
    if pad := -len(idx) % temporal_patch:
        idx += [idx[-1]] * pad
    secs = [i / fps for i in idx]
    return [(secs[i] + secs[i + temporal_patch - 1]) / 2 for i in range(0, len(secs),
                                                                      temporal_patch)]


def _uniform(total: int, n: int) -> list[int]:
    """``n`` of ``range(total)``, evenly spread, first and last included (qwen_vl_utils'
    ``linspace(0, total - 1, n).round()``)."""
    return [int(i) for i in np.linspace(0, total - 1, n).round().astype(int)]


def _open(path: str) -> Any:
    import cv2

    cap = cv2.VideoCapture(path)
    if not cap.isOpened():
        cap.release()
        raise VideoError(f"video {path}: cannot be opened (missing, unreadable, or not a "
                         "video OpenCV can decode)")
    return cap


def _file_header(path: str) -> tuple[int, float, int, int]:
    """(frames, fps, width, height) of a video file, from its header; frames counted by
    reading through the stream where the header has no count."""
    import cv2

    cap = _open(path)
    try:
        total = int(cap.get(cv2.CAP_PROP_FRAME_COUNT))
        fps = float(cap.get(cv2.CAP_PROP_FPS))
        width = int(cap.get(cv2.CAP_PROP_FRAME_WIDTH))
        height = int(cap.get(cv2.CAP_PROP_FRAME_HEIGHT))
        if total <= 0:  # a stream without a count (some containers): count the frames
            total = 0
            while cap.grab():
                total += 1
    finally:
        cap.release()
    if total <= 0 or width <= 0 or height <= 0:
        raise VideoError(f"video {path}: has no frames")
    if not fps > 0:
        raise VideoError(f"video {path}: its header has no frame rate (fps {fps})")
    return total, fps, width, height


def _frame_size(frame: bytes, i: int) -> tuple[int, int]:
    from PIL import Image

    try:
        with Image.open(io.BytesIO(frame)) as im:
            return im.size
    except Exception as err:  # PIL raises UnidentifiedImageError, OSError, ...
        raise VideoError(f"frame {i} of a video's frame list is not an image: {err}") from err


def _header(video: VideoSource, spec: VideoSpec) -> tuple[int, float, int, int]:
    """(frames, fps, width, height) of a file (its header) or a frame list (its length,
    ``spec.fps``, its first frame's header)."""
    if isinstance(video, str):
        return _file_header(video)
    if not video:
        raise VideoError("a video's frame list is empty: it has no frames")
    return (len(video), spec.fps, *_frame_size(video[0], 0))


def _shape(total: int, fps: float, width: int, height: int, spec: VideoSpec) -> VideoShape:
    n = spec.frames(total, fps)
    return VideoShape(n, width, height, fps, tuple(_uniform(total, n)))


def probe(video: VideoSource, spec: VideoSpec) -> VideoShape:
    """The sampled frame count, source size and indices of ``video`` from its header (a
    file) or its first frame's (a frame list): what ``load`` will produce, without
    decoding the video."""
    return _shape(*_header(video, spec), spec)


def _resized(rgb: Any, size: tuple[int, int]) -> np.ndarray:
    """A PIL image at ``size``, bicubic as Qwen's processor resizes, as uint8 RGB."""
    from PIL import Image

    im = rgb if rgb.size == size else rgb.resize(size, Image.Resampling.BICUBIC)
    return np.asarray(im, dtype=np.uint8)


def _read_file(path: str, indices: Sequence[int], total: int, size: tuple[int, int]
               ) -> list[np.ndarray]:
    """The frames of ``path`` at ``indices`` (ascending), read in order: grabbing every
    frame and decoding only the wanted ones is exact where seeking by frame number is not
    (it lands on key frames in many codecs)."""
    import cv2
    from PIL import Image

    cap = _open(path)
    wanted = iter(indices)
    want = next(wanted, None)
    out: list[np.ndarray] = []
    pos = 0
    try:
        while want is not None and cap.grab():
            while want == pos:  # an index can repeat (a short clip sampled at a higher fps)
                ok, bgr = cap.retrieve()
                if not ok or bgr is None:
                    raise VideoError(f"video {path}: frame {pos} cannot be decoded")
                rgb = Image.fromarray(cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB))
                out.append(_resized(rgb, size))
                want = next(wanted, None)
            pos += 1
    finally:
        cap.release()
    if want is not None:
        raise VideoError(f"video {path}: its header says {total} frames but only {pos} "
                         "could be read")
    return out


def _read_frames(frames: list[bytes], indices: Sequence[int], size: tuple[int, int]
                 ) -> list[np.ndarray]:
    from PIL import Image

    out: list[np.ndarray] = []
    for i in indices:
        try:
            rgb = Image.open(io.BytesIO(frames[i])).convert("RGB")
        except Exception as err:  # PIL raises UnidentifiedImageError, OSError, ...
            raise VideoError(f"frame {i} of a video's frame list is not an image: "
                             f"{err}") from err
        out.append(_resized(rgb, size))
    return out


def load(video: VideoSource, spec: VideoSpec) -> Video:
    """``video``'s sampled frames (``probe``), each resized to the video's size within
    ``spec.bounds`` (a frame list's: its first frame's), an odd count padded with the last
    frame."""
    total, fps, width, height = _header(video, spec)
    shape = _shape(total, fps, width, height, spec)
    size = spec.bounds.size(width, height)
    if isinstance(video, str):
        frames = _read_file(video, shape.indices, total, size)
    else:
        frames = _read_frames(video, shape.indices, size)
    frames += [frames[-1]] * (spec.padded(len(frames)) - len(frames))
    return Video(np.stack(frames), fps, total, list(shape.indices))


def metadata_object(video: Video) -> Any:
    """``video.metadata()`` as the Hugging Face processor takes it."""
    from transformers.video_utils import VideoMetadata

    return VideoMetadata(**video.metadata())
