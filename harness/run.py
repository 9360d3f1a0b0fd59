"""One run, typed: what every verb takes (the loop, compile-only, the dry run, sweeps, perf).

A `Run` is a benchmark's registry entry, its config (a preset with flags over it), the run's
own options (`harness.options.RunOptions`), and what the config's strings mean on the devices
it runs on, each parsed once: the mesh resolved over the devices, the layout, and the
optimization plan (whose layout is the one the step uses). `harness.cli.setup` makes the
command line's run; a tool that builds runs of its own (a sweep's variants, perf's programs, a
scale point) calls `make` with a config, and `Run.variant` is the same run with some config
fields replaced. Bad input (a mesh the devices do not fill, a layout of axes the mesh lacks, an
optimization that cannot apply) raises UserError here, before anything is built.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax

import optimizations
from benchmarks import config as config_lib
from benchmarks.registry import BENCHMARKS, Entry
from benchmarks.task import Spec
from harness.options import RunOptions
from mesh.spec import Layout, MeshSpec, parse_layout, parse_mesh
from optimizations import Plan
from stepmodel import topology as topology_lib
from stepmodel.topology import Topology

# The config fields a Run parses (`Strings`): a variant that changes one is made anew.
STRINGS = ("mesh", "layout", "optimizations")


@dataclasses.dataclass(frozen=True)
class Strings:
  """A config's mesh, layout and optimizations, parsed and checked against the benchmark's
  dimensions (no devices needed, no jax backend)."""
  mesh: MeshSpec                   # as written: -1 stands for the devices left
  layout: Layout
  optimizations: tuple[tuple[str, str | None], ...]   # `optimizations.parse`


def parse(entry: Entry, cfg) -> Strings:
  """`cfg`'s strings, parsed: malformed ones, a layout of dimensions the model lacks and an
  optimization that does nothing on the benchmark are UserErrors."""
  mesh = parse_mesh(cfg.mesh)
  layout = parse_layout(cfg.layout)
  layout.check_dimensions(entry.dimensions(), entry.name)
  chosen = optimizations.parse(cfg.optimizations)
  optimizations.check_applies(chosen, entry.name, entry.dimensions())
  return Strings(mesh, layout, chosen)


@dataclasses.dataclass(frozen=True)
class Run:
  """A benchmark run as asked for, every string parsed once."""
  entry: Entry
  cfg: Any                         # the benchmark's Config
  options: RunOptions
  mesh: MeshSpec                   # resolved over `devices`
  layout: Layout                   # --layout as written
  plan: Plan                       # the optimizations' step plan; plan.layout is what runs
  devices: tuple                   # all devices of the run (a slice's compile-only ones)
  topology: Topology | None = None   # --topology: the TPU slice or GPU hosts compiled for
  process_index: int = 0
  process_count: int = 1
  tool: Any = None                 # a tool's own options (its flags), None for a run
  given: frozenset[str] = frozenset()   # the flags the command line gave

  @property
  def name(self) -> str:
    return self.entry.name

  @property
  def spec(self) -> Spec:
    return self.entry.spec

  @property
  def preset(self) -> str:
    return self.options.config

  @property
  def config_file(self) -> str:
    """Where the run's config comes from, as MLPerf's `config_filename` asks: the preset in
    the benchmark's config module, or `custom` when flags changed it."""
    presets = self.entry.config().PRESETS
    name = self.preset if presets.get(self.preset) == self.cfg else "custom"
    return f"benchmarks/{self.name}/config.py:{name}"

  def variant(self, **fields) -> Run:
    """This run with some config fields replaced; a new mesh, layout or optimizations is
    parsed and planned anew (UserError where it cannot run on the devices)."""
    cfg = config_lib.replace(self.cfg, fields)
    if not any(k in STRINGS for k in fields):
      return dataclasses.replace(self, cfg=cfg)
    return make(self.entry, cfg, self.devices, options=self.options, topology=self.topology,
                process_index=self.process_index, process_count=self.process_count,
                tool=self.tool, given=self.given)

  def with_options(self, **fields) -> Run:
    return dataclasses.replace(self, options=dataclasses.replace(self.options, **fields))


def make(entry: Entry, cfg, devices=None, *, options: RunOptions | None = None,
         topology: Topology | None = None, process_index: int | None = None,
         process_count: int | None = None, tool: Any = None,
         given: frozenset[str] = frozenset(), strings: Strings | None = None) -> Run:
  """The run of `cfg` over `devices` (default: every device), as process `process_index` of
  `process_count` (default: jax's). `strings`: `parse(entry, cfg)` when the caller has it."""
  devices = tuple(devices if devices is not None else jax.devices())
  strings = strings or parse(entry, cfg)
  mesh = strings.mesh.resolve(len(devices))
  if topology is not None:
    topology_lib.check_divides(topology, mesh.axes)
  strings.layout.check_against(mesh)
  plan = optimizations.plan(strings.optimizations, strings.layout, mesh)
  plan.layout.check_against(mesh)
  return Run(entry, cfg, options or RunOptions(), mesh, strings.layout, plan, devices, topology,
             jax.process_index() if process_index is None else process_index,
             jax.process_count() if process_count is None else process_count, tool, given)


def local(name: str, cfg=None, **options) -> Run:
  """A run of the registered benchmark `name` (its `cpu` preset without `cfg`) on this
  process's devices, with these options (tests and tools)."""
  entry = BENCHMARKS[name]
  cfg = cfg if cfg is not None else entry.config().PRESETS["cpu"]
  return make(entry, cfg, options=RunOptions(**options))


def on_slice(entry: Entry, cfg, topology: str, **kw) -> Run:
  """A run of `cfg` compiled for the TPU slice or GPU hosts named `topology`
  (`stepmodel.topology`: their compile-only devices, libtpu or JAX's CUDA plugin), e.g. a scale
  point or a tool's variant."""
  topo = topology_lib.parse(topology)
  return make(entry, cfg, topology_lib.devices(topo), topology=topo, **kw)
