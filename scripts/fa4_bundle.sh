#!/usr/bin/env bash
# Pack FlashAttention-4 and the CUTLASS DSL (CuTe) for the GPU machine, which has Python 3.12
# and no network: their wheels for CPython 3.12 on x86_64, unpacked into one site folder,
# compressed, and split into two parts that each fit one device call's carry limit.
#
#   scripts/fa4_bundle.sh              # writes .fa4a/part_aa and .fa4b/part_ab (git-ignored)
#
# On the GPU machine, in two calls that share one warm machine (each carries one part):
#   cp .fa4a/part_aa /tmp/
#   cat /tmp/part_aa .fa4b/part_ab | xz -d | tar x -C /tmp     # gives /tmp/site
# then put /tmp/site and /tmp/site/nvidia_cutlass_dsl/dsl_packages first on the Python path
# (verify.impls.load_fa4 and the CuTe backend look there).
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"

WHEELS=(
    flash-attn-4==4.0.0b36
    nvidia-cutlass-dsl==4.8.1 nvidia-cutlass-dsl-libs-base==4.8.1
    nvidia-cutlass-dsl-libs-core==4.8.1 nvidia-cutlass-dsl-libs-cu13==4.8.1
    quack-kernels==0.6.5 apache-tvm-ffi==0.1.15.post2 torch-c-dlpack-ext==0.1.5
)
PLATFORMS=(manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_24_x86_64
           manylinux_2_17_x86_64 manylinux2014_x86_64)

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp "${PLATFORMS[@]/#/--platform=}" --dest "$tmp/wheels" "${WHEELS[@]}"
mkdir "$tmp/site"
for wheel in "$tmp"/wheels/*.whl; do
    python3 -m zipfile -e "$wheel" "$tmp/site"
done
echo "compressing (a few minutes)..."
tar -C "$tmp" -cf - site | xz -T0 -9 > "$tmp/site.tar.xz"
split --number=2 "$tmp/site.tar.xz" "$tmp/part_"
rm -rf .fa4a .fa4b
mkdir .fa4a .fa4b
mv "$tmp/part_aa" .fa4a/
mv "$tmp/part_ab" .fa4b/
ls -l .fa4a .fa4b
