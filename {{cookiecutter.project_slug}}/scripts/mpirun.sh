#!/usr/bin/env bash
# Train under OpenMPI's mpirun: one process per GPU on the hosts of a hostfile.
#
#   bash scripts/mpirun.sh HOSTFILE [train.py arguments...]
#
# HOSTFILE lists one host per line with its GPU count as slots, e.g.
#   gpu-node-01 slots=8
#   gpu-node-02 slots=8
# train.py reads OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_LOCAL_RANK and OMPI_COMM_WORLD_SIZE; the rendezvous is
# MASTER_ADDR:MASTER_PORT (default: the first host of the hostfile, port 29500), passed to every rank with -x.
# --bind-to none: mpirun binds each rank to one core by default, which would squeeze the rank and all its
# DataLoader workers onto that core. The output folder must be shared by all hosts (see the README).
set -euo pipefail

if [ $# -lt 1 ] || [ ! -f "$1" ]; then
    echo "ERROR: usage: bash scripts/mpirun.sh HOSTFILE [train.py arguments...] (HOSTFILE: 'host slots=N' lines)" >&2
    exit 2
fi
HOSTFILE="$1"
shift
NP=$(awk '!/^#/ && NF { n = 1; for (i = 2; i <= NF; i++) if ($i ~ /^slots=/) { split($i, kv, "="); n = kv[2] } total += n }
          END { print total + 0 }' "$HOSTFILE")
MASTER_ADDR="${MASTER_ADDR:-$(awk '!/^#/ && NF { print $1; exit }' "$HOSTFILE")}"
MASTER_PORT="${MASTER_PORT:-29500}"

exec mpirun -np "$NP" --hostfile "$HOSTFILE" --bind-to none --map-by slot \
    -x MASTER_ADDR="$MASTER_ADDR" -x MASTER_PORT="$MASTER_PORT" -x OMP_NUM_THREADS=1 -x PATH -x LD_LIBRARY_PATH \
    python train.py --config "${CONFIG:-config.json}" "$@"
