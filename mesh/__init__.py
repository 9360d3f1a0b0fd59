"""meshperf's mesh-sharding core: named dimensions, layouts, device meshes, compiled-step costs."""

from mesh.sharding import Sharder, constrain, names_of, use
from mesh.spec import Layout, MeshSpec, parse_layout, parse_mesh
from runtime.errors import UserError

__all__ = ["UserError", "Sharder", "constrain", "names_of", "use", "Layout", "MeshSpec",
           "parse_layout", "parse_mesh"]
