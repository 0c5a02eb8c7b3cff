#!/usr/bin/env bash
# One-step set-up on a fresh machine: ffmpeg, a virtual environment in .venv, torch
# (the local CPU build by default), wtx with its bundled weights and the test tools.
#   TORCH_SPEC  which torch to install (default: torch==2.13.0, the CPU build on this image)
#   VENV        where the virtual environment goes (default: .venv)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}

if ! command -v ffmpeg >/dev/null 2>&1; then
    # The system ffmpeg is preferred; without root, imageio-ffmpeg's binary is the fallback.
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq ffmpeg >/dev/null) \
            || echo "setup: apt-get could not install ffmpeg; using imageio-ffmpeg's binary" >&2
    fi
fi

if [ ! -x "$VENV/bin/python" ]; then
    python3 -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip install -q --disable-pip-version-check)
# torch first and pinned, so that nothing below pulls a multi-GB CUDA build.
"${PIP[@]}" "$TORCH_SPEC"
"${PIP[@]}" -e ".[models,dev]" "$TORCH_SPEC"
echo "setup: done ($("$VENV/bin/python" -c 'import torch; print("torch", torch.__version__)'))" >&2
