"""Mesh and layout specs in Mesh-TensorFlow syntax.

A mesh spec names the axes of the device mesh and their sizes: `data:4,model:2`. One size may be
`-1` to take the devices that are left. A layout is an ordered list of rules from a logical tensor
dimension to mesh axes: `batch:data;heads:model;d_ff:model`; one dimension may be split over
several mesh axes (`batch:x+y`), and pairs may be separated by `,` or `;`. A dimension that no rule
names is not split.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
from typing import Iterable

from runtime.errors import UserError

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_SIZE = re.compile(r"-?[0-9]+")
# More devices than any machine has: a bound that keeps every size printable (Python refuses to
# print integers of more than 4300 digits) and every product cheap.
MAX_DEVICES = 2 ** 31


@dataclasses.dataclass(frozen=True)
class MeshSpec:
  """Axis names and sizes of a device mesh (sizes may hold one -1 until `resolve`)."""
  axes: tuple[tuple[str, int], ...]

  @property
  def names(self) -> tuple[str, ...]:
    return tuple(n for n, _ in self.axes)

  @property
  def shape(self) -> tuple[int, ...]:
    return tuple(s for _, s in self.axes)

  @property
  def size(self) -> int:
    return math.prod(self.shape)

  def axis_size(self, name: str) -> int:
    return dict(self.axes)[name]

  def resolve(self, num_devices: int) -> MeshSpec:
    """Fills a -1 size and checks that the mesh covers exactly `num_devices` devices."""
    known = math.prod(s for s in self.shape if s != -1)
    axes = self.axes
    if -1 in self.shape:
      if num_devices % known:
        raise UserError(
            f"mesh '{self}' cannot fill {num_devices} devices: the fixed axes multiply to {known}, "
            f"which does not divide {num_devices}")
      axes = tuple((n, num_devices // known if s == -1 else s) for n, s in axes)
    resolved = MeshSpec(axes)
    if resolved.size != num_devices:
      raise UserError(
          f"mesh '{resolved}' has {resolved.size} devices but {num_devices} are available; make "
          f"the axis sizes multiply to {num_devices} (or use -1 for one axis)")
    return resolved

  def __str__(self) -> str:
    return ",".join(f"{n}:{s}" for n, s in self.axes)


@dataclasses.dataclass(frozen=True)
class Layout:
  """Ordered rules: logical dimension name -> tuple of mesh axis names."""
  rules: tuple[tuple[str, tuple[str, ...]], ...]

  def axes_for(self, dim: str | None) -> tuple[str, ...]:
    if dim is None:
      return ()
    for name, axes in self.rules:
      if name == dim:
        return axes
    return ()

  @property
  def mesh_axes(self) -> set[str]:
    return {a for _, axes in self.rules for a in axes}

  def check_against(self, mesh: MeshSpec) -> None:
    for dim, axes in self.rules:
      for axis in axes:
        if axis not in mesh.names:
          raise UserError(
              f"layout rule '{dim}:{'+'.join(axes)}' names mesh axis '{axis}', but the mesh "
              f"'{mesh}' has axes {', '.join(mesh.names)}")

  def check_dimensions(self, dims: Iterable[str], model: str) -> None:
    """Every rule names a logical dimension `model` has: a misspelt one (`bacth:data`) would
    split nothing, so every device would compute the whole batch and the run would train as if
    the layout were empty."""
    dims = tuple(dims)
    for dim, axes in self.rules:
      if dim not in dims:
        near = difflib.get_close_matches(dim, dims, n=1)
        hint = f"did you mean '{near[0]}'? " if near else ""
        raise UserError(f"layout rule '{dim}:{'+'.join(axes)}' names dimension '{dim}', which "
                        f"{model} does not have; {hint}its dimensions are {', '.join(dims)}")

  def __str__(self) -> str:
    return ";".join(f"{d}:{'+'.join(a)}" for d, a in self.rules)


def _pairs(text: str, what: str, example: str) -> list[tuple[str, str]]:
  if not text or not text.strip():
    raise UserError(f"empty {what}; write it like '{example}'")
  out = []
  for part in re.split(r"[,;]", text):
    part = part.strip()
    if not part:
      raise UserError(f"{what} {text!r} has an empty entry; write it like '{example}'")
    if part.count(":") != 1:
      raise UserError(f"{what} entry {part!r} must be name:value; write it like '{example}'")
    name, value = (s.strip() for s in part.split(":"))
    if not _NAME.match(name):
      raise UserError(f"{what} entry {part!r}: {name!r} is not a valid name (letters, digits, _)")
    out.append((name, value))
  return out


def parse_mesh(text: str) -> MeshSpec:
  """Parses `data:4,model:2` (one size may be -1)."""
  example = "data:4,model:2"
  axes = []
  for name, value in _pairs(text, "mesh", example):
    if not _SIZE.fullmatch(value):
      raise UserError(f"mesh axis '{name}' has size {value!r}, which is not an integer")
    if len(value.lstrip("-0")) > len(str(MAX_DEVICES)):
      raise UserError(f"mesh axis '{name}' has size {value[:12]}...; a mesh has at most "
                      f"{MAX_DEVICES} devices")
    size = int(value)
    if size == 0 or size < -1:
      raise UserError(f"mesh axis '{name}' has size {size}; sizes are positive (or -1 once)")
    axes.append((name, size))
  names = [n for n, _ in axes]
  if len(set(names)) != len(names):
    raise UserError(f"mesh {text!r} names an axis twice")
  if [s for _, s in axes].count(-1) > 1:
    raise UserError(f"mesh {text!r} uses -1 more than once; at most one axis can fill the rest")
  known = 1
  for name, size in axes:
    known *= abs(size)
    if known > MAX_DEVICES:
      shown = repr(text) if len(text) <= 40 else repr(text[:40]) + "..."
      raise UserError(f"mesh {shown} has more than {MAX_DEVICES} devices (at axis '{name}'); "
                      f"a mesh covers the devices of one job")
  return MeshSpec(tuple(axes))


def parse_layout(text: str) -> Layout:
  """Parses `batch:data;heads:model` or `batch:x+y` (empty string: nothing is split)."""
  if text is None or not text.strip():
    return Layout(())
  example = "batch:data;heads:model"
  rules = []
  for dim, value in _pairs(text, "layout", example):
    axes = tuple(a.strip() for a in value.split("+"))
    if any(not _NAME.match(a) for a in axes):
      raise UserError(f"layout rule {dim + ':' + value!r} must map to mesh axes like 'data' or "
                      f"'x+y'")
    if len(set(axes)) != len(axes):
      raise UserError(f"layout rule {dim + ':' + value!r} names a mesh axis twice")
    if dim in dict(rules):
      raise UserError(f"layout names dimension '{dim}' twice; give one rule per dimension")
    rules.append((dim, axes))
  return Layout(tuple(rules))
