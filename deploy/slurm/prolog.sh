#!/bin/bash
# gpulens Slurm prolog: record which job runs on which GPU for gpulens-exporter --job-mapping-dir.
#
# Install: copy to /etc/slurm/prolog.d/gpulens.sh and set `Prolog=/etc/slurm/prolog.d/*.sh` in
# slurm.conf (the epilog.sh beside it removes the entries). Runs as root on the compute node.
#
# For every GPU of the job (SLURM_JOB_GPUS, else CUDA_VISIBLE_DEVICES, else GPU_DEVICE_ORDINAL) it
# adds one line to a file in the mapping directory:
#   GPU index N           -> file "N"
#   GPU-<uuid> / MIG-<uuid> (MIG devices handed out by UUID) -> file named by that UUID
# Line format (GPULENS_MAPPING_FORMAT):
#   jobstats (default)  "<job id> <uid>"  - Princeton jobstats format; the uid lets gpulens tell apart
#                                           jobs sharing one GPU
#   dcgm                "<job id>"        - dcgm-exporter --hpc-job-mapping-dir format
# Several jobs on one GPU (oversubscription, shards) each get their own line; updates are atomic
# (flock + rename) so readers never see half a file.
#
# Settings (environment, e.g. from /etc/default/gpulens-slurm):
#   GPULENS_JOB_MAPPING_DIR  mapping directory (default /run/gpulens/jobs)
#   GPULENS_MAPPING_FORMAT   jobstats | dcgm (default jobstats)
#
# A failing prolog drains the node, so problems are reported on stderr and the script exits 0.

set -u

if [[ -r /etc/default/gpulens-slurm ]]; then
    # shellcheck disable=SC1091
    . /etc/default/gpulens-slurm
fi

dir="${GPULENS_JOB_MAPPING_DIR:-/run/gpulens/jobs}"
format="${GPULENS_MAPPING_FORMAT:-jobstats}"
job="${SLURM_JOB_ID:-}"
uid="${SLURM_JOB_UID:-}"

log() { echo "gpulens prolog: $*" >&2; }

if [[ ! "$job" =~ ^[0-9]+$ ]]; then
    log "SLURM_JOB_ID '${job}' is not a job id; nothing recorded"
    exit 0
fi
case "$format" in
    jobstats)
        if [[ ! "$uid" =~ ^[0-9]+$ ]]; then
            uid="$(id -u "${SLURM_JOB_USER:-nobody}" 2>/dev/null || true)"
        fi
        if [[ ! "$uid" =~ ^[0-9]+$ ]]; then
            log "SLURM_JOB_UID unknown; writing dcgm-format lines for job ${job}"
            line="$job"
        else
            line="$job $uid"
        fi
        ;;
    dcgm) line="$job" ;;
    *)
        log "GPULENS_MAPPING_FORMAT '${format}' is not jobstats or dcgm; nothing recorded"
        exit 0
        ;;
esac

gpus="${SLURM_JOB_GPUS:-${CUDA_VISIBLE_DEVICES:-${GPU_DEVICE_ORDINAL:-}}}"
if [[ -z "$gpus" || "$gpus" == "NoDevFiles" ]]; then
    exit 0  # a job without GPUs
fi

if [[ ! -d "$dir" ]] && ! { mkdir -p -- "$dir" && chmod 0755 -- "$dir"; }; then
    log "cannot create ${dir}"
    exit 0
fi

# add_line FILE LINE: append LINE to FILE unless present, atomically (temp file + rename).
add_line() {
    local file="$1" text="$2" tmp
    tmp="$(mktemp "${dir}/.gpulens.XXXXXX")" || return 1
    if [[ -f "$file" && ! -L "$file" ]]; then
        grep -v -x -F -e "$text" -- "$file" >"$tmp" || true
    fi
    printf '%s\n' "$text" >>"$tmp"
    chmod 0644 "$tmp"
    mv -f -- "$tmp" "$file"
}

exec 9>"${dir}/.lock" || { log "cannot open ${dir}/.lock"; exit 0; }
flock -w 10 9 || log "lock on ${dir}/.lock not acquired in 10 s; writing anyway"

IFS=',' read -r -a ids <<<"$gpus"
for raw in "${ids[@]}"; do
    id="${raw//[[:space:]]/}"
    if [[ "$id" =~ ^[0-9]{1,4}$ || "$id" =~ ^(GPU|MIG)-[0-9A-Za-z-]{1,80}$ ]]; then
        add_line "${dir}/${id}" "$line" || log "cannot write ${dir}/${id}"
    elif [[ -n "$id" ]]; then
        log "GPU id '${id}' is neither an index nor a GPU-/MIG- UUID; skipped"
    fi
done
exit 0
