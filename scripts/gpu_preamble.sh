# Sourced, from the repository root, by the gpu_*.sh scripts that build this tree and then time
# or test it on the GPU machine: the shell options, $out_dir (${OUT:-out}, created), the
# environment every such run shares, the build (its log in $out_dir/build.txt, its last
# ${BUILD_TAIL:-1} line(s) and its time printed) and $t0, the start, for later timings.
#   source scripts/gpu_preamble.sh
set -uo pipefail
out_dir="${OUT:-out}"
mkdir -p "$out_dir"
export PYTHONUNBUFFERED=1 OPENBLAS_NUM_THREADS=1 IGNIS_BACKEND=cuda
t0=$(date +%s)
bash scripts/gpu_build.sh -j 16 > "$out_dir/build.txt" 2>&1; tail -"${BUILD_TAIL:-1}" "$out_dir/build.txt"
echo "build: $(( $(date +%s) - t0 )) s"
