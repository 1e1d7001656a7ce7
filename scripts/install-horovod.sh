#!/usr/bin/env bash
# Build and install horovod 0.28.1 (PyTorch + Gloo) into a Python environment.
#
# Usage: scripts/install-horovod.sh [PYTHON]     (PYTHON defaults to python3)
#
# Why a script: horovod 0.28.1 is the last release and its CMake files pin
# C++14, but torch >= 2.1 headers need C++17, so `pip install horovod` fails.
# We patch the sdist, build a wheel once, and cache it per
# (horovod, torch, python[, cuda]) so later installs take seconds.
#
# Environment:
#   RAYDIST_WHEEL_CACHE  wheel cache root (default ~/.cache/raydist/wheels)
#   HOROVOD_NCCL_HOME / HOROVOD_NCCL_INCLUDE / HOROVOD_NCCL_LIB  passed through
#                        to the CUDA build (see horovod's docs).
set -euo pipefail

HOROVOD_VERSION=0.28.1
PY=${1:-python3}

log() { echo "install-horovod: $*"; }
die() { echo "install-horovod: ERROR: $*" >&2; exit 1; }

command -v "$PY" >/dev/null 2>&1 || die "python interpreter '$PY' not found"
# Make the path absolute (we cd into the source tree later) but don't resolve
# symlinks: a venv's python is a symlink and must stay one to find its venv.
PY=$(command -v "$PY")
[[ $PY == /* ]] || PY="$(cd "$(dirname "$PY")" && pwd)/$(basename "$PY")"
pip() { "$PY" -m pip --disable-pip-version-check "$@"; }

# Cache key parts, read from the target interpreter (this also checks that
# torch is importable). '+' in local versions (2.13.0+cpu) becomes '_' so the
# folder name is plain.
info=$("$PY" - <<'EOF'
import sys, torch
impl = {"cpython": "cp", "pypy": "pp"}.get(sys.implementation.name, sys.implementation.name)
print(torch.__version__.replace("+", "_"), torch.version.cuda or "none",
      f"{impl}{sys.version_info[0]}{sys.version_info[1]}")
EOF
) || die "torch is not importable with $PY; install torch first"
read -r TORCH_VERSION TORCH_CUDA PY_TAG <<<"$info"

# GPU ops only when torch is a CUDA build AND nvcc can compile the kernels;
# otherwise a CPU-only (gloo) build.
USE_CUDA=0
if [[ "$TORCH_CUDA" != none ]] && command -v nvcc >/dev/null 2>&1; then
    USE_CUDA=1
fi
BUILD_KIND=$([[ $USE_CUDA == 1 ]] && echo "NCCL+gloo" || echo "CPU/gloo")

KEY="horovod-${HOROVOD_VERSION}-torch${TORCH_VERSION}-${PY_TAG}"
if [[ $USE_CUDA == 1 ]]; then KEY+="-cuda${TORCH_CUDA}"; fi
CACHE_ROOT=${RAYDIST_WHEEL_CACHE:-$HOME/.cache/raydist/wheels}
CACHE_DIR="$CACHE_ROOT/$KEY"

# Is the right horovod installed and usable? A bare `import horovod.torch` is
# not enough: it only prints a warning when the compiled extension is missing.
# Loading horovod.torch.mpi_ops loads the extension (which also fails if it no
# longer matches the installed torch) and tells us what it was built with.
horovod_ok() {
    "$PY" - "$HOROVOD_VERSION" "$USE_CUDA" <<'EOF'
import sys
import horovod
import horovod.torch.mpi_ops as ops
ok = horovod.__version__ == sys.argv[1] and ops.gloo_built()
if sys.argv[2] == "1":
    ok = ok and bool(ops.nccl_built())
sys.exit(0 if ok else 1)
EOF
}

verify() {
    horovod_ok || die "horovod installed, but its torch extension does not load or lacks ${BUILD_KIND}"
    local ver
    ver=$("$PY" -c "import horovod.torch as hvd, horovod; print(getattr(hvd, '__version__', '') or horovod.__version__)")
    log "OK: horovod $ver (torch ${TORCH_VERSION}, ${PY_TAG}, ${BUILD_KIND}) in $("$PY" -c 'import sys; print(sys.prefix)')"
}

if horovod_ok >/dev/null 2>&1; then
    log "horovod $HOROVOD_VERSION (${BUILD_KIND}) already installed for $PY"
    exit 0
fi

install_wheel() {
    # Remove any (broken/stale) horovod first: pip would otherwise treat the
    # same-version wheel as "already satisfied" and skip it.
    if pip show -q horovod >/dev/null 2>&1; then
        pip uninstall -y -q horovod
    fi
    log "installing $1"
    pip install -q "$1"
}

shopt -s nullglob
cached=("$CACHE_DIR"/horovod-"$HOROVOD_VERSION"-*.whl)
shopt -u nullglob
if (( ${#cached[@]} )); then
    log "using cached wheel ($KEY)"
    install_wheel "${cached[0]}"
    verify
    exit 0
fi

# ---- Build from source -----------------------------------------------------
log "no cached wheel for $KEY; building from source (a few minutes)"

# pip's cmake 4.x refuses horovod's bundled gloo (cmake_minimum_required < 3.5);
# prefer the system cmake, otherwise any cmake on PATH or next to $PY (a
# pip-installed one in the target venv), telling cmake 4 to accept old policies.
if [[ -x /usr/bin/cmake ]]; then
    export HOROVOD_CMAKE=/usr/bin/cmake
elif HOROVOD_CMAKE=$(command -v cmake || command -v "$(dirname "$PY")/cmake"); then
    export HOROVOD_CMAKE
    export CMAKE_POLICY_VERSION_MINIMUM=3.5
else
    die "cmake not found. Install it with 'apt-get install cmake' (preferred), or
    '$PY -m pip install cmake' (this script then sets CMAKE_POLICY_VERSION_MINIMUM=3.5 for it)."
fi
if ! command -v "${CXX:-c++}" >/dev/null 2>&1 && ! command -v g++ >/dev/null 2>&1; then
    die "no C++ compiler found (e.g. 'apt-get install g++')"
fi
log "using $("$HOROVOD_CMAKE" --version | head -n1) at $HOROVOD_CMAKE"

# --no-build-isolation builds against the target env's torch, so the target
# env needs horovod's setup_requires; setup.py would otherwise try to fetch
# them itself via easy_install.
log "installing build dependencies into target env"
pip install -q setuptools wheel packaging psutil pyyaml cloudpickle 'cffi>=1.4.0'

WORK=$(mktemp -d "${TMPDIR:-/tmp}/install-horovod.XXXXXX")
trap 'rm -rf "$WORK"' EXIT

log "downloading horovod $HOROVOD_VERSION sdist"
pip download -q --no-deps --no-binary :all: -d "$WORK" "horovod==$HOROVOD_VERSION"
tar -xzf "$WORK/horovod-$HOROVOD_VERSION.tar.gz" -C "$WORK"
SRC="$WORK/horovod-$HOROVOD_VERSION"

# torch >= 2.1 headers need C++17; horovod pins C++14 in these two places.
for f in CMakeLists.txt horovod/torch/CMakeLists.txt; do
    grep -q 'CMAKE_CXX_STANDARD 14' "$SRC/$f" \
        || die "expected 'CMAKE_CXX_STANDARD 14' in $f; sdist changed, patch needs updating"
    sed -i 's/CMAKE_CXX_STANDARD 14/CMAKE_CXX_STANDARD 17/' "$SRC/$f"
    if grep -q 'CMAKE_CXX_STANDARD 14' "$SRC/$f" || ! grep -q 'CMAKE_CXX_STANDARD 17' "$SRC/$f"; then
        die "C++17 patch did not apply to $f"
    fi
done
log "patched CMake files to C++17"

export HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 \
       HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 \
       HOROVOD_CPU_OPERATIONS=gloo
export MAKEFLAGS="-j$(nproc 2>/dev/null || echo 2)"

if [[ $USE_CUDA == 1 ]]; then
    # NOTE: CUDA path is untested (no GPU where this script was written).
    export HOROVOD_GPU_OPERATIONS=NCCL
    # Recent CUDA (CCCL) headers need C++17 in the .cu kernels too.
    sed -i 's/CMAKE_CUDA_STANDARD 11/CMAKE_CUDA_STANDARD 17/' \
        "$SRC/horovod/common/ops/cuda/CMakeLists.txt"
    # Without explicit NCCL paths, use the nvidia-nccl wheel that CUDA torch
    # depends on; it only ships libnccl.so.2, so add the unversioned link
    # that CMake's find_library looks for.
    if [[ -z "${HOROVOD_NCCL_HOME:-}${HOROVOD_NCCL_INCLUDE:-}${HOROVOD_NCCL_LIB:-}" ]]; then
        nccl_dir=$("$PY" -c "import nvidia.nccl, os; print(os.path.dirname(nvidia.nccl.__file__) if nvidia.nccl.__file__ else list(nvidia.nccl.__path__)[0])" 2>/dev/null || true)
        if [[ -n "$nccl_dir" && -f "$nccl_dir/include/nccl.h" && -e "$nccl_dir/lib/libnccl.so.2" ]]; then
            mkdir -p "$WORK/nccl-lib"
            ln -s "$nccl_dir/lib/libnccl.so.2" "$WORK/nccl-lib/libnccl.so"
            export HOROVOD_NCCL_INCLUDE="$nccl_dir/include" HOROVOD_NCCL_LIB="$WORK/nccl-lib" HOROVOD_NCCL_LINK=SHARED
            log "using NCCL from $nccl_dir"
        fi
    fi
    log "building with CUDA ${TORCH_CUDA} (NCCL GPU ops, gloo controller)"
else
    log "building CPU-only (gloo)"
fi

# Build into the temp dir, then move into the cache under a temporary name and
# rename, so an interrupted build never leaves a half-written cached wheel.
(cd "$SRC" && pip wheel --no-build-isolation --no-deps -w "$WORK/dist" .) \
    || die "horovod build failed (see output above)"
built=("$WORK"/dist/horovod-"$HOROVOD_VERSION"-*.whl)
[[ -f "${built[0]}" ]] || die "build produced no wheel"
mkdir -p "$CACHE_DIR"
name=$(basename "${built[0]}")
cp "${built[0]}" "$CACHE_DIR/.$name.partial"
mv -f "$CACHE_DIR/.$name.partial" "$CACHE_DIR/$name"
log "cached wheel at $CACHE_DIR/$name"

install_wheel "$CACHE_DIR/$name"
verify
