#!/usr/bin/env bash
# Makes the virtual environment that the Makefile's targets run in, installing only what is missing:
#   - the venv itself ($VENV, default .venv) from $PYTHON (default python3);
#   - torch, if the venv has none: TORCH=auto (default) takes the CPU build of $TORCH_VERSION where no NVIDIA driver
#     is present and the CUDA build otherwise; TORCH=cpu or TORCH=cuda forces one; anything else is a pip requirement
#     (TORCH="torch==2.11.0");
#   - flashcute in editable mode with its test and bench extras, again whenever pyproject.toml changed.
# A second run with nothing to do returns at once. What is missing (Python, venv support, the package index) is said
# in one line, with the path of pip's log where pip failed.
set -euo pipefail
venv=${VENV:-.venv}
python=${PYTHON:-python3}
torch_choice=${TORCH:-auto}
torch_version=${TORCH_VERSION:-2.13.0}
log=$venv/pip.log

die() {
  echo "make: $*" >&2
  exit 2
}

command -v "$python" > /dev/null 2>&1 || die "no '$python' on PATH: install Python 3.10 or newer (or set PYTHON=...)"
if [ ! -x "$venv/bin/python" ]; then
  "$python" -m venv "$venv" > /dev/null 2>&1 ||
    { rm -rf "$venv"; die "'$python -m venv' cannot make a virtual environment: install venv support (Debian, Ubuntu: python3-venv)"; }
  echo "made $venv"
fi

pip_install() {
  "$venv/bin/python" -m pip install --disable-pip-version-check "$@" >> "$log" 2>&1
}

if [ ! -f "$venv/.torch" ]; then
  case "$torch_choice" in
    auto) if [ -e /proc/driver/nvidia/version ] || command -v nvidia-smi > /dev/null 2>&1; then build=cuda; else build=cpu; fi ;;
    cpu | cuda) build=$torch_choice ;;
    *) build=requirement ;;
  esac
  echo "installing torch ($([ "$build" = requirement ] && echo "$torch_choice" || echo "$torch_version, $build build")) ..."
  case "$build" in
    # The CPU build's index first: its local version (+cpu) sorts above PyPI's, which is the CUDA build on Linux.
    cpu) pip_install "torch==$torch_version" --extra-index-url https://download.pytorch.org/whl/cpu ;;
    cuda) pip_install "torch==$torch_version" ;;
    requirement) pip_install "$torch_choice" ;;
  esac || die "pip could not install torch: is the package index reachable? (pip's log: $log)"
  touch "$venv/.torch"
fi

if [ ! -f "$venv/.flashcute" ] || [ pyproject.toml -nt "$venv/.flashcute" ]; then
  echo "installing flashcute with its test and bench extras ..."
  pip_install -e '.[test,bench]' || die "pip could not install flashcute's requirements: is the package index reachable? (pip's log: $log)"
  touch "$venv/.flashcute"
fi
