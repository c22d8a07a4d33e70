#!/bin/bash
# The bash completion (tools/completion/keyshift) against the programs'
# --help: through bash-completion's own loader, each command line below is
# completed as bash would (COMP_WORDS, COMP_CWORD, COMP_LINE, COMP_POINT,
# then the function `complete -p' names), and COMPREPLY must offer exactly
# the commands, subcommands, options and option values that --help names
# (tests/man_help_test.py --list reads them).  Every difference is named.
#
#   KEYSHIFT_REL=build/bin/keyshift KMS_AWS=build/bin/keyshift-kms-aws \
#       tests/completion_test.sh
set -u
KS=${KEYSHIFT_REL:-build/bin/keyshift}
KMS=${KMS_AWS:-build/bin/keyshift-kms-aws}
PY=${PYTHON_DEBIAN:-/usr/bin/python3}
cd "$(dirname "$0")/.." || exit 1

# shellcheck disable=SC1091
source /usr/share/bash-completion/bash_completion
# shellcheck disable=SC1091
source tools/completion/keyshift
fail=0

# Whether the words of "$1" and of "$2" are the same set; $missing and
# $extra get the words only in "$2" and only in "$1" (no process started).
same_words() {
    local -A a=() b=()
    local x
    missing="" extra=""
    for x in $1; do a[$x]=1; done
    for x in $2; do b[$x]=1; [[ -z ${a[$x]-} ]] && missing+="$x "; done
    for x in $1; do [[ -z ${b[$x]-} ]] && extra+="$x "; done
    [[ -z $missing && -z $extra ]]
}

# The completion function of each program, from `complete -p'.
declare -A func_of=()
for p in keyshift keyshift-kms-aws; do
    spec=$(complete -p "$p" 2>/dev/null) || { echo "completion_test: no completion for $p"; exit 1; }
    func=${spec#*-F }
    func_of[$p]=${func%% *}
done

# Complete the command line "$1" (the cursor at its end, the last word
# being completed) and put the offers in $got.
complete_line() {
    COMP_LINE=$1
    COMP_POINT=${#COMP_LINE}
    read -ra COMP_WORDS <<<"$COMP_LINE"
    [[ $COMP_LINE == *" " ]] && COMP_WORDS+=("")
    COMP_CWORD=$((${#COMP_WORDS[@]} - 1))
    COMPREPLY=()
    "${func_of[${COMP_WORDS[0]}]}" "${COMP_WORDS[0]}" "${COMP_WORDS[COMP_CWORD]}" \
        "${COMP_WORDS[COMP_CWORD - 1]}" 2>/dev/null
    got="${COMPREPLY[*]}"
}

# Expect the offers for "$1" to be exactly the words of "$2", and name
# every difference.
expect() {
    complete_line "$1"
    same_words "$got" "$2" && return
    echo "completion_test: '$1<TAB>':${missing:+ missing (--help names them): $missing}${extra:+ offered, but no --help names them: $extra}"
    fail=1
}

list=$("$PY" tests/man_help_test.py --list "$KS" "$KMS") || { echo "$list"; exit 1; }
declare -A subs=() opts=()
commands="" enums=()
while read -r kind a b; do
    case $kind in
        command) commands+="$a " ;;
        sub) subs[$a]+="$b " ;;
        opts) opts[$a]=$b ;;
        enum) enums+=("$a $b") ;;
    esac
done <<<"$list"

# Commands, and the subcommands of each; the leaves are the command lines
# that take options.
expect "keyshift " "$commands help --help --version"
expect "keyshift help " "$commands"
leaves=""
add_leaves() {  # path
    local s
    if [[ -z ${subs[$1]-} ]]; then leaves+="$1 "; return; fi
    expect "keyshift ${1//\// } " "${subs[$1]} --help"
    for s in ${subs[$1]}; do add_leaves "$1/$s"; done
}
for c in $commands; do add_leaves "$c"; done

# Options: what every leaf of a command offers together is what the
# command's --help texts name together.
for c in $commands; do
    union=""
    for leaf in $leaves; do
        [[ $leaf == "$c" || $leaf == "$c"/* ]] || continue
        complete_line "keyshift ${leaf//\// } --"
        union+="$got "
    done
    if ! same_words "$union" "${opts[$c]}"; then
        echo "completion_test: keyshift $c:${missing:+ options --help names, not offered: $missing}${extra:+ options offered, not in --help: $extra}"
        fail=1
    fi
done
want=""
for o in ${opts[keyshift-kms-aws]}; do
    case $o in --help | --version) want+="$o " ;; *) want+="$o= " ;; esac
done
expect "keyshift-kms-aws --" "$want"

# Option values: each a|b of a SYNOPSIS, after that option on every leaf
# of the command that takes it.
for e in "${enums[@]}"; do
    read -r c opt vals <<<"$e"
    for leaf in $leaves; do
        [[ $leaf == "$c" || $leaf == "$c"/* ]] || continue
        complete_line "keyshift ${leaf//\// } --"
        [[ " $got " == *" $opt "* ]] && expect "keyshift ${leaf//\// } $opt " "$vals"
    done
done

# Values --help names in prose: each must be there.
check_named() {  # command word...
    local cmd=$1 help w
    help=$("$KS" "$cmd" --help)
    shift
    for w in "$@"; do
        grep -qw -- "$w" <<<"$help" ||
            { echo "completion_test: offers '$w', which 'keyshift $cmd --help' does not name"; fail=1; }
    done
}
expect "keyshift migrate run --algorithm " "xchacha20-poly1305 aes-256-gcm"
check_named migrate xchacha20-poly1305 aes-256-gcm
expect "keyshift encrypt --algorithm " "xchacha20-poly1305 aes-256-gcm"
expect "keyshift keys set-state payments/kek 1 " "active decrypt-only disabled destroyed"
check_named keys active decrypt-only disabled destroyed
expect "keyshift keys set-state payments/kek " ""
expect "keyshift rollout start --source " \
    "plaintext v1:xchacha20-poly1305: v1:aes-256-gcm: v2:xchacha20-poly1305: v2:aes-256-gcm:"
check_named rollout plaintext xchacha20-poly1305 aes-256-gcm
expect "keyshift rollout advance --db shop.db --percent 5 --al" "--all"
expect "keyshift migrate run --json --mo" "--mode"
expect "keyshift migrate run --to-key " ""
expect "keyshift mig" "migrate"
expect "keyshift serve --listen " "unix: tcp:127.0.0.1:"
expect "keyshift serve --listen t" "tcp:127.0.0.1:"
check_named serve unix tcp 127.0.0.1
expect "keyshift serve --scope pay.card --" "${opts[serve]} --help"
# Files where a file is wanted.
T=$(mktemp -d) && trap 'rm -rf "$T"' EXIT
touch "$T/shop.db"
expect "keyshift census --db $T/sh" "$T/shop.db"
expect "keyshift inspect $T/sh" "$T/shop.db"
expect "keyshift serve --policy $T/sh" "$T/shop.db"
# Bash replaces the word after the last ':' only (COMP_WORDBREAKS), so the
# offer drops what comes before it.
expect "keyshift serve --listen unix:$T/sh" "$T/shop.db"

if [[ $fail -ne 0 ]]; then
    echo "completion_test: the completion (tools/completion/keyshift) and --help differ; fix whichever is wrong"
    exit 1
fi
echo "completion_test: every command, subcommand, option and value of --help completes, and nothing else"
