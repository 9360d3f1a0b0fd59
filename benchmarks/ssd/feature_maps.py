"""The sizes of SSD's feature maps for an input size: arithmetic, no jax. The config checks an
image size with it before jax starts; the model and the default boxes are built from it."""

from __future__ import annotations


def feature_sizes(image_size: int, extra_blocks) -> tuple[int, ...]:
  """Sizes of the square feature maps for this input size (38, 19, 10, 5, 3, 1 for 300)."""
  s = (image_size + 6 - 7) // 2 + 1          # stem 7x7/2, padding 3
  s = (s + 2 - 3) // 2 + 1                   # max pool 3x3/2, padding 1
  s = (s + 2 - 3) // 2 + 1                   # conv3_1, stride 2
  sizes = [s]
  for stride in extra_blocks:
    s = (s + 2 - 3) // 2 + 1 if stride else s - 2
    if s < 1:
      raise ValueError(f"image size {image_size} is too small for extra blocks {extra_blocks}")
    sizes.append(s)
  return tuple(sizes)
