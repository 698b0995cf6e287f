# Source this on a GPU host without network (the README, "Running on a GPU"): makes
# Snakemake available from a carried wheel folder (.whl, built by snakemake-wheels.sh), puts the
# package on PYTHONPATH, Nsight Systems' missing libdw on LD_LIBRARY_PATH (.libdw, from
# nsys-libs.sh), and keeps NVLink multicast off for NCCL.
#   source scripts/gpu/env.sh
_root=$(pwd)
if [ -d "$_root/.whl" ] && ! python3 -c "import snakemake" 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site "$_root"/.whl/*.whl
fi
export PYTHONPATH="$_root/src:/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
export PATH="/tmp/site/bin:$PATH"
if [ -d "$_root/.libdw" ]; then
  export LD_LIBRARY_PATH="$_root/.libdw/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
for _n in /opt/nvidia/nsight-compute/*/host/target-linux-x64/nsys /opt/nvidia/nsight-systems/*/bin/nsys; do
  [ -x "$_n" ] && [ -z "${NSYS:-}" ] && export NSYS="$_n"
done
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1
