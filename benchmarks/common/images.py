"""Images for the input pipelines: JPEG bytes decoded at the scale a crop needs, cropped, resized
and flipped into a batch's buffer, uint8 throughout.

- Decoding: libjpeg-turbo through simplejpeg (`decode_jpeg(..., min_factor=s)`), at the
  smallest of the DCT scales 1, 1/2, 1/4, 1/8 that still leaves the crop at least the output's
  pixels: libjpeg's scaled IDCT does the first part of the downscaling for free
  (https://libjpeg-turbo.org/Documentation/Documentation, "scaled decompression"). A stream
  libjpeg-turbo refuses (not a JPEG, cut short, CMYK/YCCK colour) is decoded whole by Pillow.
- Resizing: OpenCV's `resize` (`INTER_LINEAR`, half-pixel centres) from the crop to the output,
  written into the batch's buffer. After the DCT scale the remaining factor is mostly below 2,
  where bilinear sampling needs no prefilter; a larger one (SSD's 640 px to 300, an image Pillow
  decoded whole) is first reduced by its whole part with block averages. The MLPerf TensorFlow
  ResNet reference resized its crops bilinearly without antialiasing (tensorflow/models
  `official/r1/resnet/imagenet_preprocessing.py`, `tf.image.resize_images(..., BILINEAR)`).

OpenCV's own thread pool is off (`cv2.setNumThreads(1)`): the pipelines parallelize over
examples and batches themselves; a second pool per resize only costs CPU on small images.
"""

from __future__ import annotations

import io
import os

import cv2
import numpy as np
import simplejpeg
from PIL import Image

cv2.setNumThreads(1)

_LIBJPEG_COLOURS = ("YCbCr", "Gray")      # what libjpeg-turbo converts to RGB itself


def threads() -> int:
  """Threads an image pipeline runs in one process: one a core, up to 8 (decoding and resizing
  release the GIL; more only queue behind it)."""
  return max(1, min(8, os.cpu_count() or 1))


def open_image(image: np.ndarray | bytes) -> tuple[int, int, object]:
  """(height, width, handle) of decoded pixels or of an encoded image's header: a JPEG's header
  is parsed without decoding; another format is opened by Pillow (its header only)."""
  if isinstance(image, np.ndarray):
    return image.shape[0], image.shape[1], image
  try:
    h, w, colour, _ = simplejpeg.decode_jpeg_header(image)
    if colour in _LIBJPEG_COLOURS:
      return h, w, image
  except ValueError:                # not a JPEG libjpeg-turbo reads: Pillow's
    pass
  im = Image.open(io.BytesIO(image))
  return im.size[1], im.size[0], im


def _rgb(pixels: np.ndarray) -> np.ndarray:
  if pixels.ndim == 2:
    return np.repeat(pixels[:, :, None], 3, axis=2)
  return pixels[:, :, :3]


def _pillow(im: Image.Image) -> np.ndarray:
  return np.asarray(im.convert("RGB") if im.mode != "RGB" else im)


def scale_for(h: int, w: int, box: tuple[float, float, float, float],
              out: tuple[int, int]) -> int:
  """The largest of 1, 2, 4, 8 that still gives `box` (left, top, right, bottom, in the full
  image's pixels) at least `out` = (height, width) pixels when the image is decoded at 1/s."""
  bw, bh = box[2] - box[0], box[3] - box[1]
  for s in (8, 4, 2):
    if bw / s >= out[1] and bh / s >= out[0] and w >= s and h >= s:
      return s
  return 1


def decode(handle, h: int, w: int, scale: int = 1) -> np.ndarray:
  """RGB uint8 pixels of an `open_image` handle, a JPEG at 1/scale (then ceil(h / scale) x
  ceil(w / scale)); Pillow's images and decoded pixels whole."""
  if isinstance(handle, np.ndarray):
    return _rgb(handle)
  if isinstance(handle, Image.Image):
    return _pillow(handle)
  try:
    return simplejpeg.decode_jpeg(handle, "RGB", min_height=-(-h // scale),
                                  min_width=-(-w // scale), min_factor=scale)
  except ValueError:                # e.g. cut short: Pillow decodes what is there, as before
    return _pillow(Image.open(io.BytesIO(handle)))


def crop_resize(pixels: np.ndarray, box: tuple[float, float, float, float], full: tuple[int, int],
                out: np.ndarray, flip: bool = False) -> np.ndarray:
  """`box` (in the pixels of the full (height, width) image `pixels` was decoded from, possibly
  at a reduced scale) resized into `out` (height, width, 3 uint8), mirrored left-right with
  `flip`. Returns out."""
  fy, fx = pixels.shape[0] / full[0], pixels.shape[1] / full[1]
  x0, y0 = int(round(box[0] * fx)), int(round(box[1] * fy))
  x1 = max(x0 + 1, min(pixels.shape[1], int(round(box[2] * fx))))
  y1 = max(y0 + 1, min(pixels.shape[0], int(round(box[3] * fy))))
  roi = pixels[y0:y1, x0:x1]
  oh, ow = out.shape[:2]
  ky, kx = max(1, (y1 - y0) // oh), max(1, (x1 - x0) // ow)
  if kx > 1 or ky > 1:
    # Shrinking by 2 or more: first by whole factors, averaging kx x ky blocks (INTER_AREA's
    # integer path; the box loses at most k - 1 rows or columns, half on each side), then
    # bilinearly by the factor below 2 that is left: an antialiased resize at a fifth of
    # INTER_AREA's cost at a fractional factor.
    h2, w2 = (y1 - y0) // ky, (x1 - x0) // kx
    dy, dx = ((y1 - y0) - h2 * ky) // 2, ((x1 - x0) - w2 * kx) // 2
    roi = cv2.resize(roi[dy:dy + h2 * ky, dx:dx + w2 * kx], (w2, h2),
                     interpolation=cv2.INTER_AREA)
  if flip:
    cv2.flip(cv2.resize(roi, (ow, oh), interpolation=cv2.INTER_LINEAR), 1, dst=out)
  else:
    cv2.resize(roi, (ow, oh), dst=out, interpolation=cv2.INTER_LINEAR)
  return out


def decode_into(handle, h: int, w: int, box: tuple[float, float, float, float],
                out: np.ndarray, flip: bool = False) -> np.ndarray:
  """An `open_image` handle of an h x w image decoded at the scale `box` needs (`scale_for`) and
  the box written at `out`'s size into `out` (`crop_resize`). Returns out."""
  pixels = decode(handle, h, w, scale_for(h, w, box, out.shape[:2]))
  return crop_resize(pixels, box, (h, w), out, flip)


def decode_crop_resize(image: np.ndarray | bytes, box_of, out: np.ndarray,
                       flip: bool = False) -> np.ndarray:
  """Opens `image`, asks `box_of(height, width)` for the crop (left, top, right, bottom in its
  pixels), decodes at the scale the crop needs and writes the crop at `out`'s size into `out`."""
  h, w, handle = open_image(image)
  return decode_into(handle, h, w, box_of(h, w), out, flip)
