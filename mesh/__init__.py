"""meshperf's mesh-sharding core: named dimensions, layouts, device meshes, compiled-step costs."""

from mesh.errors import UserError
from mesh.sharding import Sharder, constrain, names_of, use
from mesh.spec import Layout, MeshSpec, parse_layout, parse_mesh

__all__ = ["UserError", "Sharder", "constrain", "names_of", "use", "Layout", "MeshSpec",
           "parse_layout", "parse_mesh"]
