# tools/demo/demo_lib.sh -- helpers shared by the demo scripts (sourced by
# tools/demo/demo.sh and tools/demo/demo_rollout.sh).

# demo_workdir NAME: set D to the absolute path of $DEMO_DIR (created if
# missing) or of a new directory build/demo/NAME.XXXXXX; DB to the sample
# database in it, payments.db; and KEYSHIFT_KEYRING to a new keyring
# there, unsealed (KEYSHIFT_PASSPHRASE unset).  Needs sqlite3.
demo_workdir() {
    command -v sqlite3 >/dev/null || { echo "demo: sqlite3 is missing (run tools/deps.sh)" >&2; exit 69; }
    if [ -n "${DEMO_DIR:-}" ]; then
        D=$DEMO_DIR
        mkdir -p "$D"
    else
        mkdir -p build/demo
        D=$(mktemp -d "build/demo/$1.XXXXXX")
    fi
    D=$(cd "$D" && pwd)
    DB=$D/payments.db
    export KEYSHIFT_KEYRING=$D/keyring
    unset KEYSHIFT_PASSPHRASE
}

# abs_path FILE: FILE's absolute path (its directory must exist).
abs_path() {
    printf '%s/%s\n' "$(cd "$(dirname "$1")" && pwd)" "$(basename "$1")"
}

step=0
# Print a step heading, numbered, bold on a terminal.
heading() {
    step=$((step + 1))
    if [ -t 1 ]; then
        printf '\n\033[1m== %d. %s\033[0m\n' "$step" "$*"
    else
        printf '\n== %d. %s\n' "$step" "$*"
    fi
}
