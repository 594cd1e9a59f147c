#!/usr/bin/env python3
"""Checks the include directions of docs/architecture.md ("Layers").

Every source and header under src/ and include/concerto/ belongs to one layer
(its folder; schedule/schedule.h and src/schedule/schedule.cc are the layer
"schedule-types", the rest of schedule/ is "schedulers"). A file may include
the headers of its own layer and of the layers listed for it below, nothing
else; and third-party headers that pull a heavy dependency (solvers, BLAS, MPI)
only from the files named for them. Prints every violation as
FILE:LINE: message and exits 1 when there is any. Run by CTest (layer_check).

Usage: check_layers.py [ROOT]
"""
import pathlib
import re
import sys

# layer -> the layers it may include (besides itself). Acyclic by construction:
# each layer lists only layers above it in this table.
ALLOWED = {
    "util": [],
    "ir": ["util"],
    "cost": ["ir", "util"],
    "lower": ["ir", "util"],
    "decompose": ["cost", "ir", "util"],
    "schedule-types": ["ir", "util"],
    "sim": ["schedule-types", "cost", "ir", "util"],
    "schedulers": ["sim", "schedule-types", "decompose", "cost", "ir", "util"],
    "report": ["sim", "schedule-types", "cost", "ir", "util"],
    # The runtime executes a ScheduledProgram: it knows the IR, the schedule's
    # types and the simulator's Timeline (its measured records), nothing that
    # lowers, prices or schedules.
    "runtime": ["sim", "schedule-types", "ir", "util"],
    "profile": ["runtime", "lower", "sim", "schedule-types", "cost", "ir", "util"],
    "driver": ["profile", "runtime", "report", "schedulers", "sim", "schedule-types", "decompose", "lower",
               "cost", "ir", "util"],
}

# Third-party headers that only these files may include (path suffixes).
RESTRICTED = [
    (re.compile(r"^gecode/"), ("src/schedule/solver_gecode.cc", "src/schedule/solver_gecode_bound.cc"),
     "Gecode"),
    (re.compile(r"^(coin/|Cbc|Osi|Clp|Coin)"), ("src/schedule/solver_cbc.cc",), "COIN-OR CBC"),
    (re.compile(r"^cblas\.h$"), ("src/runtime/kernels.cc",), "OpenBLAS"),
    (re.compile(r"^mpi\.h$"), ("src/runtime/mpi_communicator.cc",), "MPI"),
]

INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]')


def layer_of_header(path: str) -> str:
    """The layer of an include path 'concerto/LAYER/file.h'."""
    parts = path.split("/")
    if parts[1] == "schedule":
        return "schedule-types" if parts[2] == "schedule.h" else "schedulers"
    return parts[1]


def layer_of_file(rel: pathlib.PurePosixPath) -> str:
    parts = rel.parts
    folder = parts[2] if parts[0] == "include" else parts[1]
    if folder == "schedule":
        return "schedule-types" if rel.name in ("schedule.h", "schedule.cc") else "schedulers"
    return folder


def main() -> int:
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).resolve().parent.parent)
    files = sorted(list((root / "src").rglob("*.cc")) + list((root / "src").rglob("*.h")) +
                   list((root / "include" / "concerto").rglob("*.h")))
    violations = []
    for f in files:
        rel = pathlib.PurePosixPath(f.relative_to(root).as_posix())
        layer = layer_of_file(rel)
        if layer not in ALLOWED:
            violations.append(f"{rel}:1: folder '{layer}' is not a layer of docs/architecture.md "
                              f"(add it to scripts/check_layers.py and the document)")
            continue
        for number, line in enumerate(f.read_text(errors="replace").splitlines(), 1):
            m = INCLUDE.match(line)
            if not m:
                continue
            bracket, target = m.groups()
            if bracket == '"' and target.startswith("concerto/"):
                other = layer_of_header(target)
                if other != layer and other not in ALLOWED[layer]:
                    violations.append(f"{rel}:{number}: layer '{layer}' includes {target} (layer '{other}'); "
                                      f"'{layer}' may include only {', '.join(ALLOWED[layer]) or 'nothing'}")
                continue
            for pattern, owners, what in RESTRICTED:
                if pattern.search(target) and str(rel) not in owners:
                    violations.append(f"{rel}:{number}: includes <{target}>: only {', '.join(owners)} "
                                      f"may include {what} headers")
    for v in violations:
        print(v)
    print(f"check_layers: {len(files)} files, {len(violations)} violations")
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())
