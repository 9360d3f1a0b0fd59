"""What a sweep runs: its variants, the optimization sets of `--optimizations_grid` crossed with
the placements (mesh and layout) of `--layouts`. No jax here: everything is checked on specs.

Optimization sets of a grid a, b, c: `none` (the baseline), each alone, all but one (each; only
when the grid has more than two names, else they are the ones alone) and all on; identical sets
appear once. The grid's default is every optimization that acts on the benchmark
(`optimizations.check_applies`) and can apply alone to at least one of the sweep's placements
(`optimizations.plan`; grad_sum_2d needs the batch over two mesh axes, spatial_partitioning a
spatial axis): the ones left out are named with the reason. An optimization that takes an
argument gets the preset's (`grad_accum:4` in the preset's `--optimizations`) or DEFAULT_ARGS'.

A variant's ratios are against its baseline: the `none` of its own placement (or, when the grid
has no `none`, the sweep's first variant).
"""

from __future__ import annotations

import dataclasses

import optimizations
from mesh.spec import parse_layout, parse_mesh
from runtime.errors import UserError

LAYOUT_SEPARATOR = "|"      # layouts hold ',' and ';' themselves (mesh.spec)
MESH_SEPARATOR = "@"        # MESH@LAYOUT: a placement with its own mesh
PRESET = "preset"           # --optimizations_grid=preset (or empty): the preset's set only
# An argument for an optimization that takes one, when neither the grid nor the preset gives it:
# two micro-batches, as the ResNet ablation (benchmarks/resnet/config.py: ABLATIONS).
DEFAULT_ARGS = {"grad_accum": "2"}


@dataclasses.dataclass(frozen=True)
class Placement:
  name: str       # "" : the config's own (no --layouts)
  mesh: str
  layout: str


@dataclasses.dataclass(frozen=True)
class Variant:
  key: str            # unique and file-system safe: its run folder and its resume key
  label: str          # for tables and plots
  group: str          # its placement's name
  mesh: str
  layout: str
  optimizations: str  # an --optimizations text ("none" for none)
  baseline: str       # the key of the variant its ratios are against


def _show(text: str) -> str:
  return repr(text)[1:-1]


def parse_layouts(text: str | None, mesh: str, layout: str, named: dict | None = None
                  ) -> list[Placement]:
  """`--layouts`: placements separated by `|`, each LAYOUT (on --mesh), MESH@LAYOUT, or a name
  of the benchmark's LAYOUTS (`data`, `model`, `hybrid` for the Transformer). None or empty: the
  config's own mesh and layout."""
  named = named or {}
  if not (text or "").strip():
    return [Placement("", mesh, layout)]
  out = []
  for i, item in enumerate((t.strip() for t in text.split(LAYOUT_SEPARATOR)), 1):
    where = f"--layouts: item {i} '{_show(item)}'"
    if not item:
      raise UserError(f"--layouts={_show(text)}: item {i} is empty; separate layouts with "
                      f"'{LAYOUT_SEPARATOR}', e.g. --layouts='batch:data|x:4,y:2@batch:x+y'")
    if item in named:
      m, lay, name = *named[item], item
    else:
      m, sep, lay = item.rpartition(MESH_SEPARATOR)
      m, lay, name = (m.strip() if sep else mesh), lay.strip(), f"L{i}"
    try:
      parse_mesh(m), parse_layout(lay)
    except UserError as e:
      raise UserError(f"{where}: {e}") from None
    out.append(Placement(name, m, lay))
  names = [p.name for p in out]
  if len(set(names)) != len(names) or len({(p.mesh, p.layout) for p in out}) != len(out):
    raise UserError(f"--layouts={_show(text)} names a layout twice")
  return out


def check_placements(placements: list[Placement], num_devices: int, dims: tuple[str, ...],
                     benchmark: str) -> None:
  """Each placement's mesh covers the devices and its layout names only the mesh's axes and
  the benchmark's dimensions (`dims`)."""
  for p in placements:
    try:
      layout = parse_layout(p.layout)
      layout.check_dimensions(dims, benchmark)
      layout.check_against(parse_mesh(p.mesh).resolve(num_devices))
    except UserError as e:
      where = f"--layouts: {p.name} '{p.mesh}{MESH_SEPARATOR}{p.layout}'" if p.name else (
          f"--mesh={p.mesh} --layout={p.layout}")
      raise UserError(f"{where}: {e}") from None


def _with_args(parsed, preset: str) -> tuple[tuple[str, str | None], ...]:
  """Arguments filled in from the preset's --optimizations, else DEFAULT_ARGS."""
  given = dict(optimizations.parse(preset))
  return tuple((n, a if a is not None else given.get(n) or DEFAULT_ARGS.get(n))
               for n, a in parsed)


def _applies(parsed_one, placement: Placement, num_devices: int) -> str | None:
  """None when the one optimization builds a plan on the placement, else why not."""
  try:
    mesh = parse_mesh(placement.mesh).resolve(num_devices)
    optimizations.plan(optimizations.unparse(parsed_one), parse_layout(placement.layout), mesh)
  except UserError as e:
    return str(e)
  return None


def grid(text: str | None, preset: str, benchmark: str, dimensions, placements, num_devices,
         say=print) -> tuple[tuple[str, str | None], ...] | None:
  """The grid's optimizations (parsed, arguments filled), or None for the preset's set only.
  `text` None: the default grid (module docstring)."""
  if text is not None and text.strip() in ("", PRESET):
    return None
  if text is None:
    chosen = []
    for name in optimizations.names():
      one = _with_args(((name, None),), preset)
      try:
        optimizations.check_applies(one, benchmark, dimensions)
      except UserError:
        continue        # acts on a dimension this benchmark lacks: not a variant at all
      why = [_applies(one, p, num_devices) for p in placements]
      if all(why):
        say(f"sweep: grid: leaving out {name}: {why[0]}")
      else:
        chosen.extend(one)
    return tuple(chosen)
  try:
    parsed = optimizations.parse(text)
    optimizations.check_applies(parsed, benchmark, dimensions)
  except UserError as e:
    msg = str(e)
    raise UserError("--optimizations_grid" + msg.removeprefix("--optimizations")
                    if msg.startswith("--optimizations") else f"--optimizations_grid: {msg}"
                    ) from None
  if not parsed:
    raise UserError("--optimizations_grid=none: name the optimizations to sweep (a,b,...), or "
                    "give it empty (or preset) to sweep layouts with the preset's set")
  return _with_args(parsed, preset)


def option_sets(names) -> list[tuple[str, str, str]]:
  """(key, label, --optimizations text) of each set of the grid (module docstring)."""
  order = list(optimizations.names())
  names = sorted(names, key=lambda p: order.index(p[0]))
  sets = [("none", "none", ())]
  sets += [(p[0], f"+ {optimizations.unparse((p,))}", (p,)) for p in names]
  if len(names) > 2:
    sets += [(f"all-but-{p[0]}", f"all - {p[0]}", tuple(q for q in names if q != p))
             for p in names]
  sets.append(("all", "all", tuple(names)))
  out, seen = [], set()
  for key, label, chosen in sets:
    if frozenset(chosen) not in seen:
      seen.add(frozenset(chosen))
      out.append((key, label, optimizations.unparse(chosen)))
  return out


def variants(placements: list[Placement], names, preset: str) -> list[Variant]:
  """The sweep's variants: each placement x each optimization set (`names` None: the preset's
  set only), in that order."""
  sets = ([(PRESET, f"preset: {optimizations.unparse(optimizations.parse(preset))}", preset)]
          if names is None else option_sets(names))
  out = []
  for p in placements:
    prefix = f"{p.name}-" if p.name else ""
    for key, label, opts in sets:
      if p.name:   # the preset's set on each layout: the layout's name says it
        label = p.name if names is None else f"{p.name} {label}"
      out.append(Variant(key=prefix + key, label=label,
                         group=p.name, mesh=p.mesh, layout=p.layout, optimizations=opts,
                         baseline=prefix + "none" if names is not None else ""))
  return [v if v.baseline else dataclasses.replace(v, baseline=out[0].key) for v in out]
