# Progress for scripts/setup (sourced, not run): each phase prints one line when it starts
# and one with its duration when it ends, so a first setup (minutes of quiet pip work)
# shows where the time goes; the commands themselves stay quiet (pip -q). Kept apart from
# scripts/setup so tests can run a fake phase without building a venv
# (tests/project/test_setup_progress.py).

# fmt_secs MICROSECONDS -> "0.4s", "12.3s", "3m 05s"
fmt_secs() {
    local us="$1"
    if [ "$us" -lt 60000000 ]; then
        printf '%d.%ds' "$((us / 1000000))" "$(((us % 1000000) / 100000))"
    else
        local s=$((us / 1000000))
        printf '%dm %02ds' "$((s / 60))" "$((s % 60))"
    fi
}

# now_us: wall clock in microseconds (bash 5's EPOCHREALTIME, no subprocess)
now_us() { local t="$EPOCHREALTIME"; echo "${t/[.,]/}"; }

SETUP_T0="$(now_us)"

# phase NAME CMD [ARGS...]: run CMD as one named phase. Prints "[setup] NAME ..." first and
# "[setup] NAME: done in 12.3s" (or "failed after 12.3s (exit N)" on stderr, and returns N)
# after; CMD's own output passes through unchanged.
phase() {
    local name="$1"; shift
    local t0 rc=0
    t0="$(now_us)"
    echo "[setup] $name ..."
    "$@" || rc=$?
    local took
    took="$(fmt_secs $(( $(now_us) - t0 )))"
    if [ "$rc" -eq 0 ]; then
        echo "[setup] $name: done in $took"
    else
        echo "[setup] $name: failed after $took (exit $rc)" >&2
    fi
    return "$rc"
}

# setup_total VENV: the closing line, total time and the venv's size on disk
setup_total() {
    local size
    size="$(du -sh "$1" 2>/dev/null | cut -f1)" || size="?"
    echo "[setup] done in $(fmt_secs $(( $(now_us) - SETUP_T0 ))); $1 is ${size:-?}"
}
