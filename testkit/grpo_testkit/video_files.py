"""Tiny real videos for tests: an mp4 written with OpenCV, or a list of encoded frames."""

from __future__ import annotations

from pathlib import Path

from .datasets import png

# The codec OpenCV's wheel can write here (FFmpeg's MPEG-4 part 2; its H.264 encoder,
# avc1, needs a hardware device this machine lacks).
FOURCC = "mp4v"


def frame_color(i: int) -> tuple[int, int, int]:
    """Frame ``i``'s colour: each frame a different one, so a test can tell which frame it
    got (mp4v's lossy compression keeps a flat colour within a few levels)."""
    return (20 * i % 256, 255 - 20 * i % 256, 90)


def write_mp4(path: Path, frames: int, fps: float, size: tuple[int, int]) -> Path:
    """An mp4 of ``frames`` flat frames (``frame_color``) of ``size`` (width, height)."""
    import cv2
    import numpy as np

    writer = cv2.VideoWriter(str(path), cv2.VideoWriter.fourcc(*FOURCC), fps, size)
    if not writer.isOpened():
        raise RuntimeError(f"OpenCV cannot write {FOURCC} video to {path}")
    try:
        for i in range(frames):
            r, g, b = frame_color(i)
            writer.write(np.full((size[1], size[0], 3), (b, g, r), dtype=np.uint8))  # BGR
    finally:
        writer.release()
    return path


def frame_list(frames: int, size: tuple[int, int]) -> list[bytes]:
    """A video as a frame list: ``frames`` PNGs of ``size`` (``frame_color``)."""
    return [png(frame_color(i), size) for i in range(frames)]
