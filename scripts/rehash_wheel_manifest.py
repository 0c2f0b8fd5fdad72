#!/usr/bin/env python3
"""Rewrite ctbench/_prebuilt/manifest.json inside built wheels from the bytes they now hold.

Wheel repair tools (auditwheel on Linux, delocate on macOS, delvewheel on
Windows) bundle the OpenMP runtime and patch the kernel libraries' run paths
or imports, so the libraries' bytes change after CMake recorded their SHA-256.
cibuildwheel runs this after the repair tool ([tool.cibuildwheel]
repair-wheel-command): each library entry gets the size and SHA-256 of the
file as shipped, and the wheel's RECORD gets the manifest's new hash.  The
source hashes and flags are kept.  The wheel is rewritten through a temporary
file and renamed into place.

    python scripts/rehash_wheel_manifest.py dist/ctbench-*.whl
"""

from __future__ import annotations

import base64
import csv
import glob
import hashlib
import io
import json
import os
import sys
import tempfile
import zipfile

MANIFEST = "ctbench/_prebuilt/manifest.json"


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def rehash(wheel: str) -> list[str]:
    """Rewrite ``wheel`` in place; returns the library files whose recorded hash changed."""
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        if MANIFEST not in names:
            raise SystemExit(f"{wheel}: no {MANIFEST} (not a wheel with prebuilt kernels)")
        manifest = json.loads(zf.read(MANIFEST))
        changed = []
        for entry in manifest["libraries"]:
            data = zf.read(f"ctbench/_prebuilt/{entry['file']}")
            digest = hashlib.sha256(data).hexdigest()
            if digest != entry["sha256"] or len(data) != entry["size"]:
                changed.append(entry["file"])
            entry["sha256"], entry["size"] = digest, len(data)
        new_manifest = (json.dumps(manifest, indent=1) + "\n").encode()
        record_name = next(n for n in names if n.endswith(".dist-info/RECORD"))
        rows = list(csv.reader(io.StringIO(zf.read(record_name).decode())))
        for row in rows:
            if row and row[0] == MANIFEST:
                row[1], row[2] = _record_hash(new_manifest), str(len(new_manifest))
        out = io.StringIO()
        csv.writer(out, lineterminator="\n").writerows(rows)
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(wheel)), suffix=".whl.tmp")
        os.close(fd)
        try:
            with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as dst:
                for info in zf.infolist():
                    if info.filename == MANIFEST:
                        dst.writestr(info, new_manifest)
                    elif info.filename == record_name:
                        dst.writestr(info, out.getvalue().encode())
                    else:
                        dst.writestr(info, zf.read(info.filename))
            os.replace(tmp, wheel)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    return changed


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    # patterns are expanded here: Windows shells pass "*.whl" through unexpanded
    wheels = [w for pattern in argv for w in (sorted(glob.glob(pattern)) or [pattern])]
    for wheel in wheels:
        changed = rehash(wheel)
        print(f"{wheel}: manifest rehashed ({len(changed)} libraries changed by the repair: {', '.join(changed)})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
