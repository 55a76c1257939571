"""Regenerate the committed protobuf/gRPC code: ``python -m clients.gen_proto``.

Code is generated from ``proto/`` with ``-Iproto`` into ``clients/_proto`` so that generated imports
(``from xaudit.v1 import audit_pb2``) work through the ``xaudit`` package mapping in pyproject.toml.
grpcio-tools is a dev dependency, imported only here and only when run.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

__all__ = ["OUT_ROOT", "PROTO_ROOT", "generate", "main"]

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "proto"
OUT_ROOT = ROOT / "clients" / "_proto"

_INIT = '"""Generated protobuf/gRPC code (python -m clients.gen_proto); do not edit."""\n'


def generate(out_root: Path = OUT_ROOT, proto_root: Path = PROTO_ROOT) -> list[Path]:
    """Generate every .proto under ``proto_root`` into ``out_root``; returns the files written."""
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
    # Packages for every generated directory, so the mapped `xaudit` import package is a regular package.
    for directory in {(out_root / p).parent for p in protos}:
        while directory != out_root:
            init = directory / "__init__.py"
            if not init.exists():
                init.write_text(_INIT)
            directory = directory.parent
    return sorted(p for p in out_root.rglob("*") if p.is_file() and "__pycache__" not in p.parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT_ROOT, help="output root (default clients/_proto)")
    args = parser.parse_args(argv)
    for path in generate(args.out):
        print(path.relative_to(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
