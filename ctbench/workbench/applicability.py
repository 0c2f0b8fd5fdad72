"""Which reconstruction algorithms a scan can use, and why not, in words a GUI user understands.

The iterative methods (SIRT, CGLS, TV) work with any trajectory.  FBP/FDK
needs a rotation about the z axis: a circular orbit (cone beam), a helix
(approximate helical FDK), or parallel rays perpendicular to z.  The check
is the one the solvers make before they start, so a method offered as usable
does not fail later for its geometry.
"""

from __future__ import annotations

from .design import ScanGeometry
from .workflow import ALGORITHMS


def unusable_reason(algorithm: str, geometry: ScanGeometry) -> str | None:
    """None if ``algorithm`` can reconstruct scans of ``geometry``, else a one-sentence reason."""
    if algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm must be one of {list(ALGORITHMS)}, got {algorithm!r}")
    if ALGORITHMS[algorithm].iterative:
        return None
    from ..solvers.weights import orbit_of

    label = ALGORITHMS[algorithm].label
    scan = geometry.describe()
    projector = geometry.projector("reference")
    helical = geometry.beam == "cone" and not geometry.is_2d and geometry.kind == "spiral"
    try:
        orbit_of(projector, require="helical" if helical else "circular", who=label)
    except ValueError:
        need = "a circular orbit or a helix about the z axis" if geometry.beam == "cone" and not geometry.is_2d \
            else "a rotation about the z axis"
        return (f"{label} needs {need}; this scan ({scan}) is not one. "
                "Use SIRT, CGLS or TV, which work with any trajectory.")
    return None


def usable_algorithms(geometry: ScanGeometry) -> dict[str, str | None]:
    """Every algorithm with None (usable) or the reason it is not."""
    return {name: unusable_reason(name, geometry) for name in ALGORITHMS}
