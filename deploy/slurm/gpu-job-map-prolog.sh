#!/bin/sh
# Slurm Prolog (PrologFlags=Alloc): write the job's ID into the mapping file of each GPU it holds,
# as gpu-exporter (slurm.job_mapping_dir) and dcgm-exporter (--hpc-job-mapping-dir) read them.
dir=${GPU_JOB_MAP_DIR:-/run/gpu-job-map}
mkdir -p -m 755 "$dir" && exec 9>"$dir/.lock" && flock 9 || exit 0   # never fail a job for this
for gpu in $(echo "${SLURM_JOB_GPUS:-$CUDA_VISIBLE_DEVICES}" | tr ',' ' '); do
  { grep -vx "$SLURM_JOB_ID" "$dir/$gpu" 2>/dev/null; echo "$SLURM_JOB_ID"; } >"$dir/.$gpu.new"
  mv "$dir/.$gpu.new" "$dir/$gpu"   # a rename: a reader sees the old file or the new one, whole
done
exit 0
