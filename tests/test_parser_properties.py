"""Property-based tests (hypothesis) of the three spec parsers a user writes to: `--mesh`
(`mesh.spec.parse_mesh`, `MeshSpec.resolve`), `--layout` (`mesh.spec.parse_layout`,
`Layout.check_against`) and `--optimizations` (`optimizations.parse`, `plan`).

Properties: what the parser prints parses back to the same value; every well-formed spec
parses to what was written; any text at all either parses or raises `UserError` (one `error:`
line, exit 2), never another exception (a traceback, exit 3)."""

import math
import os
import tempfile

import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st
from hypothesis.configuration import set_hypothesis_home_dir

import optimizations
from benchmarks import registry
from mesh.spec import Layout, MeshSpec, parse_layout, parse_mesh
from runtime.errors import UserError

# 200 examples a property keep the file near 10 s of CPU; no example database, and hypothesis's
# cache in the temp folder (nothing written to the tree): a failure prints its example, which
# then belongs in an @example below.
if not os.environ.get("HYPOTHESIS_STORAGE_DIRECTORY"):
  set_hypothesis_home_dir(os.path.join(tempfile.gettempdir(), "meshperf-hypothesis"))
FAST = settings(max_examples=200, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow])

# --- strategies -------------------------------------------------------------------------------

NAMES = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,7}", fullmatch=True)
SPACE = st.sampled_from(["", "", " ", "  ", "\t"])
SEP = st.sampled_from([",", ";", " , ", "; "])
# Text near the grammar (its punctuation, digits, a few names) finds more than uniform text.
NEAR = st.text(alphabet=":,;+-_ \t\n" + "0123456789" + "abdxyz" + "\u00a0\u0663\uff14", max_size=24)
ANY_TEXT = st.one_of(st.text(max_size=40), NEAR)


def _join(draw, parts):
  out = draw(SPACE) + parts[0]
  for p in parts[1:]:
    out += draw(SEP) + p
  return out + draw(SPACE)


@st.composite
def mesh_axes(draw):
  """(name, size) pairs as a user may write them: distinct names, at most one -1."""
  names = draw(st.lists(NAMES, min_size=1, max_size=4, unique=True))
  sizes = [draw(st.integers(1, 64)) for _ in names]
  if draw(st.booleans()):
    sizes[draw(st.integers(0, len(names) - 1))] = -1
  return tuple(zip(names, sizes))


@st.composite
def mesh_texts(draw):
  axes = draw(mesh_axes())
  parts = [f"{n}{draw(SPACE)}:{draw(SPACE)}{s}" for n, s in axes]
  return axes, _join(draw, parts)


@st.composite
def layout_rules(draw):
  dims = draw(st.lists(NAMES, min_size=1, max_size=4, unique=True))
  return tuple((d, tuple(draw(st.lists(NAMES, min_size=1, max_size=3, unique=True))))
               for d in dims)


@st.composite
def layout_texts(draw):
  rules = draw(layout_rules())
  parts = [f"{d}{draw(SPACE)}:{draw(SPACE)}" + f"{draw(SPACE)}+{draw(SPACE)}".join(a)
           for d, a in rules]
  return rules, _join(draw, parts)


@st.composite
def optimization_texts(draw):
  """A valid --optimizations value: distinct known names, grad_accum with its K."""
  chosen = draw(st.lists(st.sampled_from(optimizations.names()), min_size=1, unique=True))
  parsed = tuple((n, str(draw(st.integers(1, 64))) if n == "grad_accum" else None)
                 for n in chosen)
  parts = [n if a is None else f"{n}{draw(SPACE)}:{draw(SPACE)}{a}" for n, a in parsed]
  text = draw(SPACE) + f"{draw(SPACE)},{draw(SPACE)}".join(parts) + draw(SPACE)
  return parsed, text


def _parses_or_user_error(fn, text):
  """fn(text), or None when it raised UserError; any other exception fails the test."""
  try:
    return fn(text)
  except UserError as e:
    assert len(str(e).splitlines()) == 1, f"not one line: {e!r}"
    return None


# --- --mesh -----------------------------------------------------------------------------------

@pytest.mark.slow
@FAST
@given(mesh_texts())
def test_mesh_well_formed_parses_to_what_was_written(case):
  axes, text = case
  m = parse_mesh(text)
  assert m.axes == axes
  assert parse_mesh(str(m)) == m and str(parse_mesh(str(m))) == str(m)


@FAST
@given(ANY_TEXT)
@example("data:4,model:2")
@example("x:-1;y:2")
@example("0\n0")              # found: a two-line error message (fixed: repr of the user's text)
@example(",\r")
@example("0\x1e0")
@example("a:" + "9" * 5000)   # found: ValueError printing a size over 4300 digits (fixed)
def test_mesh_any_text_parses_or_is_a_user_error(text):
  m = _parses_or_user_error(parse_mesh, text)
  if m is not None:
    assert isinstance(m, MeshSpec) and m.axes
    assert all(s >= 1 or s == -1 for s in m.shape) and m.shape.count(-1) <= 1
    assert len(set(m.names)) == len(m.names)
    assert parse_mesh(str(m)) == m


def _resolved(mesh: MeshSpec, n: int) -> MeshSpec | None:
  try:
    return mesh.resolve(n)
  except UserError:
    return None


@FAST
@given(st.one_of(mesh_texts().map(lambda c: c[1]), ANY_TEXT), st.integers(1, 4096))
def test_mesh_resolve_covers_exactly_the_devices_or_is_a_user_error(text, n):
  m = _parses_or_user_error(parse_mesh, text)
  assume(m is not None)
  r = _resolved(m, n)
  known = math.prod(s for s in m.shape if s != -1)
  fits = n % known == 0 if -1 in m.shape else m.size == n
  assert (r is not None) == fits
  if r is not None:
    assert r.names == m.names and math.prod(r.shape) == n and min(r.shape) >= 1
    assert all(a == b for a, b in zip(m.shape, r.shape) if a != -1)
    assert r.resolve(n) == r and parse_mesh(str(r)) == r


# --- --layout ---------------------------------------------------------------------------------

@FAST
@given(layout_texts())
def test_layout_well_formed_parses_to_what_was_written(case):
  rules, text = case
  lay = parse_layout(text)
  assert lay.rules == rules
  assert parse_layout(str(lay)) == lay and str(parse_layout(str(lay))) == str(lay)
  for d, a in rules:
    assert lay.axes_for(d) == a


@FAST
@given(ANY_TEXT)
@example("batch:data;heads:model,d_ff:model")
@example("batch:x+y")
@example("0\r:")              # found: a two-line error message (fixed)
@example("b:x\n+x")
def test_layout_any_text_parses_or_is_a_user_error(text):
  lay = _parses_or_user_error(parse_layout, text)
  if lay is not None:
    assert isinstance(lay, Layout)
    assert parse_layout(str(lay)) == lay
    dims = [d for d, _ in lay.rules]
    assert len(set(dims)) == len(dims)
    assert all(a and len(set(a)) == len(a) for _, a in lay.rules)


@st.composite
def mesh_and_layout(draw):
  """A parsed mesh and a layout whose axes are mostly the mesh's (sometimes another name)."""
  mesh = parse_mesh(draw(mesh_texts())[1])
  axis = st.one_of(st.sampled_from(mesh.names), NAMES) if draw(st.booleans()) else \
      st.sampled_from(mesh.names)
  dims = draw(st.lists(NAMES, min_size=0, max_size=4, unique=True))
  rules = tuple((d, tuple(draw(st.lists(axis, min_size=1, max_size=3, unique=True))))
                for d in dims)
  return mesh, parse_layout(";".join(f"{d}:{'+'.join(a)}" for d, a in rules))


@FAST
@given(mesh_and_layout())
def test_layout_check_against_a_mesh_raises_only_user_error(case):
  mesh, lay = case
  ok = lay.mesh_axes <= set(mesh.names)
  try:
    lay.check_against(mesh)
    assert ok
  except UserError as e:
    assert not ok and len(str(e).splitlines()) == 1


@FAST
@given(st.sampled_from(sorted(registry.BENCHMARKS)), layout_rules(), st.data())
def test_layout_check_against_the_models_dimensions(benchmark, rules, data):
  """A layout is accepted iff every rule names one of the model's dimensions; a refusal is
  one line that names the first unknown dimension (never a rule that would split nothing)."""
  dims = registry.BENCHMARKS[benchmark].dimensions()
  # Mostly the model's own names, sometimes a misspelling of one or any other name.
  own, other = st.sampled_from(dims), st.one_of(NAMES, st.sampled_from([d[:-1] for d in dims]))
  mixed = tuple((data.draw(st.one_of(own, own, own, other)), a) for _, a in rules)
  names = [d for d, _ in mixed]
  assume(len(set(names)) == len(names) and all(names))
  lay = parse_layout(";".join(f"{d}:{'+'.join(a)}" for d, a in mixed))
  unknown = [d for d in names if d not in dims]
  try:
    lay.check_dimensions(dims, benchmark)
    assert not unknown
  except UserError as e:
    assert unknown and len(str(e).splitlines()) == 1
    assert f"names dimension '{unknown[0]}', which {benchmark} does not have" in str(e)


# --- --optimizations --------------------------------------------------------------------------

@FAST
@given(optimization_texts())
def test_optimizations_well_formed_parse_to_what_was_written(case):
  parsed, text = case
  assert optimizations.parse(text) == parsed
  assert optimizations.parse(optimizations.unparse(parsed)) == parsed


@FAST
@given(st.one_of(ANY_TEXT, optimization_texts().map(lambda c: c[1]),
                 st.lists(st.sampled_from(optimizations.names() + ("none", ":", "grad_accum:x")),
                          max_size=4).map(",".join)))
@example("none")
@example("")
@example("grad_accum:4,distributed_eval")
@example("0\x1e0")            # found: a two-line error message (fixed)
@example("distributed_eval:\n")
def test_optimizations_any_text_parses_or_is_a_user_error(text):
  parsed = _parses_or_user_error(optimizations.parse, text)
  if parsed is not None:
    names = [n for n, _ in parsed]
    assert set(names) <= set(optimizations.names()) and len(set(names)) == len(names)
    assert optimizations.parse(optimizations.unparse(parsed)) == parsed


@st.composite
def resolved_mesh_and_layout(draw):
  """A resolved mesh (sizes 1, 2, 4) and a layout over its axes, often splitting the batch."""
  names = draw(st.lists(st.sampled_from(["data", "x", "y", "spatial", "model"]), min_size=1,
                        max_size=3, unique=True))
  mesh = MeshSpec(tuple((n, draw(st.sampled_from([1, 2, 4]))) for n in names))
  dims = draw(st.lists(st.sampled_from(["batch", "height", "width", "heads", "d_ff"]),
                       max_size=3, unique=True))
  rules = ";".join(f"{d}:" + "+".join(draw(st.lists(st.sampled_from(names), min_size=1,
                                                     max_size=2, unique=True))) for d in dims)
  return mesh, parse_layout(rules)


@FAST
@given(st.one_of(optimization_texts().map(lambda c: c[1]), ANY_TEXT), resolved_mesh_and_layout())
def test_plan_raises_only_user_error(opts, case):
  """A plan of any --optimizations on a mesh and a layout over its axes: built, or a UserError."""
  mesh, lay = case
  p = _parses_or_user_error(lambda t: optimizations.plan(t, lay, mesh), opts)
  if p is not None:
    assert p.enabled == tuple(n if a is None else f"{n}:{a}"
                              for n, a in optimizations.parse(opts))
    assert set(p.batch_axes) <= set(mesh.names) and p.accumulation_steps >= 1
    p.layout.check_against(mesh)


# --- applicability of an optimization to a benchmark --------------------------------------------

@FAST
@given(st.one_of(optimization_texts().map(lambda c: c[1]), ANY_TEXT),
       st.sampled_from(["resnet", "transformer", "ssd", "lm"]))
def test_applicability_check_raises_only_user_error(opts, benchmark):
  from benchmarks.registry import BENCHMARKS
  parsed = _parses_or_user_error(optimizations.parse, opts)
  assume(parsed is not None)
  entry = BENCHMARKS[benchmark]
  _parses_or_user_error(lambda p: optimizations.check_applies(p, benchmark, entry.dimensions()),
                        parsed)


def test_huge_sizes_are_user_errors():
  """Sizes too long for Python's int-to-text limit (4300 digits) are still one error line."""
  big = "9" * 3000
  for text in (f"a:{big},b:{big}", f"a:-1,b:{big},c:{big}", "a:" + "9" * 5000):
    with pytest.raises(UserError):
      parse_mesh(text).resolve(8)

