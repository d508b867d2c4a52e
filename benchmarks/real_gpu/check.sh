#!/usr/bin/env bash
# The exporter against a real NVIDIA driver, in one short run (about 3 minutes): NVML probe (as
# root and as an unprivileged user, and with the oldest nvidia-ml-py the project allows), the process
# records as the driver writes them with two processes on GPU 0 (process_records_probe.py), the
# questions of issue 26 that no fake can settle (fields_probe.py: field values accumulating in a
# reused array, how wide the PCIe counters are and whether they agree with the driver's sample and a
# known host-to-device copy, what field 91 and NvLinkState answer past the last link, what an unknown
# field answers), the per-call CPU profile of a poll (poll_profile.py), `--once`, and the daemon
# scraped while a tensor load and a launch-bound load run.
# Usage: OUT=/some/dir bash benchmarks/real_gpu/check.sh   (dependencies importable by python3; torch
# with CUDA for the copy and the loads, else those steps are skipped and said so)
set -u
OUT=${OUT:-/tmp/real-gpu-check}; mkdir -p "$OUT"
py=${PYTHON:-python3}
here=$(cd "$(dirname "$0")" && pwd)
log="$OUT/log.txt"
say() { echo "== $*" | tee -a "$log"; }
say "$(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1)"
say "probe as root"; $py "$here/nvml_probe.py" >> "$log" 2>&1
say "process records as the driver writes them, two processes on GPU 0 (issue 49)"
$py "$here/process_records_probe.py" > "$OUT/process-records.json" 2>>"$log"; echo "rc=$?" >> "$log"
say "probe as uid 65534"
cp "$here/nvml_probe.py" /tmp/nvml_probe.py && chmod 644 /tmp/nvml_probe.py
setpriv --reuid=65534 --regid=65534 --clear-groups env PYTHONPATH="${PYTHONPATH:-}" "$(command -v $py)" /tmp/nvml_probe.py --quick >> "$log" 2>&1 || say "unprivileged probe failed: $?"
if [ -n "${OLD_NVML:-}" ]; then
  say "probe with nvidia-ml-py from $OLD_NVML"
  PYTHONPATH="$OLD_NVML:${PYTHONPATH:-}" $py "$here/nvml_probe.py" --quick >> "$log" 2>&1
  say "process records with nvidia-ml-py from $OLD_NVML"
  PYTHONPATH="$OLD_NVML:${PYTHONPATH:-}" $py "$here/process_records_probe.py" > "$OUT/process-records-oldest-nvml.json" 2>>"$log"; echo "rc=$?" >> "$log"
  say "--once with nvidia-ml-py from $OLD_NVML"
  PYTHONPATH="$OLD_NVML:${PYTHONPATH:-}" $py -m gpu_exporter --once --format json > "$OUT/once-oldest-nvml.json" 2>>"$log"; echo "rc=$?" >> "$log"
fi
say "fields probe (issue 26): accumulation, PCIe counter width, NVLink past the last link, unknown fields"
if $py -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then copy=--copy
else copy=; say "no torch with CUDA: the host-to-device copy check is skipped"; fi
$py "$here/fields_probe.py" $copy > "$OUT/fields-probe.json" 2>>"$log"; echo "rc=$?" >> "$log"
say "poll profile (per-call CPU of a whole poll)"
$py "$here/poll_profile.py" 30 > "$OUT/poll-profile.json" 2>>"$log"; echo "rc=$?" >> "$log"
say "--once idle"; $py -m gpu_exporter --once >> "$log" 2>&1; echo "rc=$?" >> "$log"
$py -m gpu_exporter --web.listen-address 127.0.0.1:9445 --poll.interval 1s --log.format json 2> "$OUT/daemon.log" &
daemon=$!
get() { $py -c 'import sys,urllib.request as u; sys.stdout.write(u.urlopen("http://127.0.0.1:9445"+sys.argv[1],timeout=5).read().decode())' "$1"; }
for _ in $(seq 50); do get /readyz >/dev/null 2>&1 && break; sleep 0.2; done
scrape() { get /metrics | grep -E '^gpu_(utilization|sm_|tensor|dram|graphics|fp|process_sm|process_memory_util|processes|exporter_poll_duration|exporter_nvml_errors)' > "$OUT/metrics-$1.txt"; }
sleep 3; scrape idle
say "tensor load"; $py "$here/load.py" tensor 25 >> "$log" 2>&1 &
load=$!; sleep 15; scrape tensor
$py -m gpu_exporter --once --format json > "$OUT/once-tensor.json" 2>>"$log"
wait $load
say "tiny-kernel load"; $py "$here/load.py" tiny 20 >> "$log" 2>&1 &
load=$!; sleep 15; scrape tiny; wait $load
get /metrics > "$OUT/metrics-full.txt"
kill $daemon; wait $daemon 2>/dev/null
say "daemon exit: $?"
tail -5 "$OUT/daemon.log" >> "$log"
say "done $(date -u +%FT%TZ)"
