#!/usr/bin/env bash
# Wheels for the GPU host, which has no network (Python 3.12, x86_64, manylinux): transformers and what its import
# needs, for tests/test_transformers_gpu.py, and einops, which flash-attention's own tests import (`flashcute
# flash-attn-tests`). Writes .gpu-extra/ (git-ignored through .git/info/exclude) with the wheels and an install.sh
# that installs them there, offline:
#
#   bash scripts/gpu-extra-wheels.sh            # here, with a network
#   sh .gpu-extra/install.sh                    # on the GPU host, from the repository root
#
# pip resolves transformers' dependencies for the host's platform; the wheels kept are those it names, less the
# packages the host has (torch's image: torch, numpy, triton, pytest and their dependencies) and those that neither
# `import transformers` nor a model built from a config imports, the heavy ones among them tokenizers (optional in
# transformers), hf-xet (hub downloads) and pydantic (the command line's typer). install.sh installs the wheels
# without their dependencies for that reason. PYTHON names the interpreter (default python3).
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
dest=.gpu-extra

host="torch numpy triton pytest packaging pluggy iniconfig pygments filelock fsspec jinja2 markupsafe networkx sympy
  mpmath typing_extensions"
not_imported="tokenizers hf_xet typer click rich pydantic pydantic_core annotated_types annotated_doc
  typing_inspection shellingham markdown_it_py mdurl"
skip=" $(echo $host $not_imported) "

download=$(mktemp -d)
trap 'rm -rf "$download"' EXIT
"$python" -m pip download transformers einops --only-binary=:all: --python-version 3.12 \
  --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform any -d "$download" --quiet --disable-pip-version-check

rm -rf "$dest"
mkdir -p "$dest"
for wheel in "$download"/*.whl; do
  project=$(basename "$wheel" | cut -d- -f1 | tr 'A-Z.-' 'a-z__')  # a wheel's name starts with its project's
  case "$skip" in
    *" $project "*) ;;
    *) cp "$wheel" "$dest/" ;;
  esac
done

cat > "$dest/install.sh" <<'EOF'
#!/bin/sh
# Installs the wheels beside this file, offline and without their dependencies (scripts/gpu-extra-wheels.sh kept
# only those the host lacks and transformers imports): into the current environment where it takes them, else the
# user site, else past a system Python's "externally managed" guard. PYTHON names the interpreter (default python3).
cd "$(dirname "$0")" || exit 1
python=${PYTHON:-python3}
install() { "$python" -m pip install --no-index --no-deps --disable-pip-version-check --quiet "$@" ./*.whl; }
install 2>/dev/null || install --user 2>/dev/null || install --user --break-system-packages 2>/dev/null ||
  install --break-system-packages
"$python" -c 'import einops, transformers; print("transformers", transformers.__version__)'
EOF

exclude=$(git rev-parse --git-path info/exclude)
mkdir -p "$(dirname "$exclude")"
grep -qxF "$dest/" "$exclude" 2>/dev/null || echo "$dest/" >> "$exclude"
ls "$dest"
du -sh "$dest"
