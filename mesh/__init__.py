"""meshperf's mesh-sharding core: named dimensions, layouts, device meshes, explicit collectives."""

from mesh.sharding import Sharder, constrain, names_of, use
from mesh.spec import Layout, MeshSpec, parse_layout, parse_mesh

__all__ = ["Sharder", "constrain", "names_of", "use", "Layout", "MeshSpec",
           "parse_layout", "parse_mesh"]
