"""Regenerate the committed protobuf/gRPC code: ``python proto/gen_proto.py``.

Code is generated from ``proto/`` with ``-Iproto`` next to its ``.proto`` sources
(``proto/xaudit/v1/*_pb2.py``, ``*_pb2_grpc.py`` and ``.pyi`` stubs), so the generated imports
(``from xaudit.v1 import audit_pb2``) resolve inside the ``xaudit`` package, whose root is
``proto/xaudit`` (see pyproject.toml). grpcio-tools is a dev dependency, imported only here and only
when run. A test (tests/unit/service/test_generated_proto.py) fails when the committed copy is stale.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

__all__ = ["GENERATED_SUFFIXES", "PROTO_ROOT", "committed", "generate", "main"]

PROTO_ROOT = Path(__file__).resolve().parent
GENERATED_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")


def _generated(root: Path) -> list[Path]:
    return sorted(
        p
        for p in root.rglob("*")
        if p.is_file() and p.name.endswith(GENERATED_SUFFIXES) and "__pycache__" not in p.parts
    )


def committed(proto_root: Path = PROTO_ROOT) -> list[Path]:
    """The generated files currently in the tree."""
    return _generated(proto_root)


def generate(out_root: Path = PROTO_ROOT, proto_root: Path = PROTO_ROOT) -> list[Path]:
    """Generate every .proto under ``proto_root`` into ``out_root``; returns the generated files."""
    import grpc_tools
    from grpc_tools import protoc

    protos = sorted(p.relative_to(proto_root).as_posix() for p in proto_root.rglob("*.proto"))
    well_known = Path(grpc_tools.__file__).parent / "_proto"
    args = [
        "grpc_tools.protoc",
        f"-I{proto_root}",
        f"-I{well_known}",
        f"--python_out={out_root}",
        f"--pyi_out={out_root}",
        f"--grpc_python_out={out_root}",
        *protos,
    ]
    out_root.mkdir(parents=True, exist_ok=True)
    if protoc.main(args) != 0:
        raise RuntimeError(f"protoc failed on {protos}")
    return _generated(out_root)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--out", type=Path, default=PROTO_ROOT, help="output root (default: proto/)")
    args = parser.parse_args(argv)
    for path in generate(args.out):
        print(path.relative_to(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
