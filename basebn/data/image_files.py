"""One image file: decode it (cv2), check it is whole without decoding it, tell colour from grey by its header.

cv2 decodes a truncated JPEG without an error (the missing rows come out grey), so completeness is
checked from the bytes: a JPEG needs an end-of-image marker (FF D9) after its last start-of-scan (FF DA),
a PNG its IEND chunk, a WebP/BMP the size its header declares. ``file_problem`` reads only the first and
last few KiB, so it can check every file of a split cheaply; ``decode_image`` applies the same rule to
the bytes it decodes.
"""

import os
import struct
from typing import Optional

import cv2
import numpy as np
from PIL import Image

from .errors import DataError

__all__ = ["decode_image", "file_problem", "bytes_problem", "is_colour_image"]

_HEAD = 32
_TAIL = 4096
_GREY_MODES = {"1", "L", "LA", "La", "I", "F", "I;16", "I;16L", "I;16B", "I;16N"}


def bytes_problem(head: bytes, tail: bytes, size: int) -> Optional[str]:
    """What is wrong with an image file of ``size`` bytes from its first and last bytes, or None.

    ``tail`` is the file's last bytes (all of them for a small file); only incompleteness and
    unknown formats are found here, not damage inside the data.
    """
    if size == 0:
        return "empty file"
    if head.startswith(b"\xff\xd8"):
        end, scan = tail.rfind(b"\xff\xd9"), tail.rfind(b"\xff\xda")
        if end < 0 or end < scan:
            return "truncated JPEG (no end-of-image marker after the image data)"
        return None
    if head.startswith(b"\x89PNG\r\n\x1a\n"):
        return None if b"IEND" in tail[-64:] else "truncated PNG (no IEND chunk)"
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        declared = struct.unpack("<I", head[4:8])[0] + 8
        return None if size >= declared else f"truncated WebP ({size} of {declared} bytes)"
    if head[:2] == b"BM" and len(head) >= 6:
        declared = struct.unpack("<I", head[2:6])[0]
        return None if size >= declared else f"truncated BMP ({size} of {declared} bytes)"
    return "not a JPEG, PNG, WebP or BMP file"


def file_problem(path: str) -> Optional[str]:
    """``bytes_problem`` of the file at ``path`` (reads its first and last bytes), or why it cannot be read."""
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            head = f.read(_HEAD)
            f.seek(max(0, size - _TAIL))
            tail = f.read(_TAIL)
    except OSError as e:
        return f"cannot read it: {e.strerror or e}"
    return bytes_problem(head, tail, size)


def decode_image(path: str, channels: int) -> np.ndarray:
    """The image at ``path`` as uint8 (h, w, channels): RGB for 3, grey for 1; DataError if it is unreadable,
    corrupt or truncated."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise DataError(f"cannot read image {path}: {e.strerror or e}") from e
    problem = bytes_problem(data[:_HEAD], data[-_TAIL:], len(data))
    flag = cv2.IMREAD_GRAYSCALE if channels == 1 else cv2.IMREAD_COLOR
    img = None if problem else cv2.imdecode(np.frombuffer(data, np.uint8), flag)
    if img is None:
        raise DataError(f"cannot decode image {path}: {problem or 'corrupt image data'}; delete or replace it")
    if channels == 3:
        return cv2.cvtColor(img, cv2.COLOR_BGR2RGB)
    return img.reshape(img.shape[0], img.shape[1], 1)


def is_colour_image(path: str) -> Optional[bool]:
    """Whether the file's header describes a colour image (None: unreadable). Palette images count as
    grey when every palette entry is; WebP images are always colour."""
    try:
        with Image.open(path) as im:
            if im.mode == "P":
                pal = np.asarray(im.getpalette() or [0, 0, 0]).reshape(-1, 3)
                return not bool((pal == pal[:, :1]).all())
            return im.mode not in _GREY_MODES
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError):  # PIL's errors for bad files
        return None
