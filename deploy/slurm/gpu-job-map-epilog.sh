#!/bin/sh
# Slurm Epilog: take the job's ID out of the mapping file of each GPU it held.
dir=${GPU_JOB_MAP_DIR:-/run/gpu-job-map}
[ -d "$dir" ] && exec 9>"$dir/.lock" && flock 9 || exit 0
for gpu in $(echo "${SLURM_JOB_GPUS:-$CUDA_VISIBLE_DEVICES}" | tr ',' ' '); do
  [ -f "$dir/$gpu" ] || continue
  grep -vx "$SLURM_JOB_ID" "$dir/$gpu" >"$dir/.$gpu.new"
  if [ -s "$dir/.$gpu.new" ]; then mv "$dir/.$gpu.new" "$dir/$gpu"; else rm -f "$dir/.$gpu.new" "$dir/$gpu"; fi
done
exit 0
