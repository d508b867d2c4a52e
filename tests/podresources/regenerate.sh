#!/usr/bin/env bash
# Regenerates the committed Python modules from api.proto:
#   api_pb2.py       messages (grpcio-tools' protoc)
#   api_pb2_grpc.py  client stub and server base class (grpcio-tools' gRPC plugin)
#   api_pb2.pyi, api_pb2_grpc.pyi  type stubs for mypy (mypy-protobuf)
# Needs: pip install grpcio-tools mypy-protobuf.  Uses $PYTHON, else the repository's .venv, else python3.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
python="${PYTHON:-}"
if [[ -z "$python" ]]; then
    if [[ -x "$root/.venv/bin/python" ]]; then python="$root/.venv/bin/python"; else python=python3; fi
fi
bindir="$(dirname "$("$python" -c 'import sys; print(sys.executable)')")"
plugin="$bindir/protoc-gen-mypy"
grpc_plugin="$bindir/protoc-gen-mypy_grpc"
[[ -x "$plugin" && -x "$grpc_plugin" ]] || { echo "mypy-protobuf is missing: pip install mypy-protobuf" >&2; exit 1; }

cd "$root"
# Compiled from the repository root, so the descriptor is registered as
# "tests/podresources/api.proto" and cannot clash with another library's "api.proto".
"$python" -m grpc_tools.protoc -I. \
    --python_out=. --grpc_python_out=. \
    --plugin=protoc-gen-mypy="$plugin" --mypy_out=. \
    --plugin=protoc-gen-mypy_grpc="$grpc_plugin" --mypy_grpc_out=. \
    tests/podresources/api.proto

cd "$here"
# The generated modules import their siblings by absolute package path; make that package-relative.
sed -i 's/^from tests\.podresources import api_pb2 as /from . import api_pb2 as /' api_pb2_grpc.py api_pb2_grpc.pyi
grep -q '^from \. import api_pb2 as ' api_pb2_grpc.py
# mypy-protobuf marks lines for flake8-pyi (Y015), a code ruff does not know (RUF102).
sed -i 's/  # noqa: Y015$//' api_pb2.pyi api_pb2_grpc.pyi
# Generated code: keep the linter and the type checker out of the .py files (the .pyi carry the types),
# and the linter out of the stubs.
for f in api_pb2.py api_pb2_grpc.py; do
    { printf '# ruff: noqa\n# mypy: ignore-errors\n'; cat "$f"; } > "$f.tmp" && mv "$f.tmp" "$f"
done
for f in api_pb2.pyi api_pb2_grpc.pyi; do
    { printf '# ruff: noqa\n'; cat "$f"; } > "$f.tmp" && mv "$f.tmp" "$f"
done
