#!/bin/bash
# gpulens Slurm epilog: remove the job's lines that prolog.sh wrote to the job mapping directory.
#
# Install: copy to /etc/slurm/epilog.d/gpulens.sh and set `Epilog=/etc/slurm/epilog.d/*.sh`.
# Every mapping file is scanned (not only the GPUs in the environment), so entries are removed
# even when the epilog environment lacks the GPU list; a file left empty is deleted.
#
# Settings: GPULENS_JOB_MAPPING_DIR (default /run/gpulens/jobs), read also from
# /etc/default/gpulens-slurm. Always exits 0 (a failing epilog drains the node).

set -u

if [[ -r /etc/default/gpulens-slurm ]]; then
    # shellcheck disable=SC1091
    . /etc/default/gpulens-slurm
fi

dir="${GPULENS_JOB_MAPPING_DIR:-/run/gpulens/jobs}"
job="${SLURM_JOB_ID:-}"

log() { echo "gpulens epilog: $*" >&2; }

if [[ ! "$job" =~ ^[0-9]+$ ]]; then
    log "SLURM_JOB_ID '${job}' is not a job id; nothing removed"
    exit 0
fi
[[ -d "$dir" ]] || exit 0

exec 9>"${dir}/.lock" || { log "cannot open ${dir}/.lock"; exit 0; }
flock -w 10 9 || log "lock on ${dir}/.lock not acquired in 10 s; editing anyway"

shopt -s nullglob
for file in "$dir"/*; do
    name="${file##*/}"
    [[ -f "$file" && ! -L "$file" ]] || continue
    [[ "$name" =~ ^[0-9]{1,4}(\.[0-9]{1,4})?$ || "$name" =~ ^(GPU|MIG)-[0-9A-Za-z-]{1,80}$ ]] || continue
    # only files that mention the job are rewritten
    awk -v job="$job" '$1 == job { found = 1 } END { exit !found }' "$file" || continue
    tmp="$(mktemp "${dir}/.gpulens.XXXXXX")" || { log "cannot create a temporary file in ${dir}"; continue; }
    awk -v job="$job" '$1 != job' "$file" >"$tmp"
    if grep -q '[^[:space:]]' "$tmp"; then
        chmod 0644 "$tmp"
        mv -f -- "$tmp" "$file"
    else
        rm -f -- "$tmp" "$file"
    fi
done
exit 0
