"""Gated Linear Networks (Veness et al.): online learning, one example at a time.

See ``gln.model.GLN`` for the public API (``gln.family.GLNFamily``: many models of one
configuration learned together, each served as a model through its ``FamilyMember``) and
``gln.network`` for the paper's Algorithm 1;
``gln.sklearn`` and ``gln.river`` adapt it to scikit-learn and River (imported on their own:
``import gln`` needs neither).
"""

from gln.family import GLNFamily
from gln.family_member import FamilyMember
from gln.model import GLN
from gln.schedules import Constant, InverseTime
from gln.serialize import SnapshotBuffer, SnapshotFormatError

__all__ = ["GLN", "GLNFamily", "FamilyMember", "Constant", "InverseTime", "SnapshotBuffer",
           "SnapshotFormatError"]
__version__ = "0.1.0"
