#!/usr/bin/env bash
# tests/cli_test.sh -- end-to-end tests of the keyshift CLI: output, exit
# codes (sysexits) and the bounds on untrusted input.
#
# Usage: KEYSHIFT=path/to/keyshift tests/cli_test.sh
# Prints one line per check and a closing "N passed, N failed" line.
set -u

. "$(dirname "$0")/cli_lib.sh"

# ---- fixtures -----------------------------------------------------------
# v1, aes-256-gcm, minimal field sizes.
V1_HEX="4b534501 0801 1201$(strhex t) 1a01$(strhex k) 2001 2a0100 320c000102030405060708090a0b
        7a1000112233445566778899aabbccddeeff"
unhex "$V1_HEX" >"$T/v1.kse"
# v2, xchacha20-poly1305, purpose and commitment, multi-byte ciphertext length.
V2_HEX="4b534502 0802 1204$(strhex acme) 1a0c$(strhex payments/kek) 2003 2a02a0a1
        3218$(rep 07 24) 3a04$(strhex card) 4220$(rep c3 32) 7a9001$(rep 5a 144)"
unhex "$V2_HEX" >"$T/v2.kse"

# ---- valid input --------------------------------------------------------
run "inspect v1 file" 0 "$KS" inspect "$T/v1.kse"
expect_grep "text lists the algorithm" "$T/out" "^algorithm: *aes-256-gcm (1)"
expect_grep "text lists the tenant" "$T/out" "^tenant: *t$"
expect_empty "nothing on stderr for a valid envelope" "$T/err"

run "inspect v1 --json" 0 "$KS" inspect --json "$T/v1.kse"
expect_eq "v1 JSON object" "$T/out" \
    '{"version":1,"algorithm":"aes-256-gcm","tenant":"t","key_id":"k","key_version":1,"wrapped_dek":"00","nonce":"000102030405060708090a0b","ciphertext_len":16,"header_len":31,"total_len":49}'

run "inspect v2 --json from stdin (-)" 0 "$KS" inspect --json - <"$T/v2.kse"
expect_eq "v2 JSON object" "$T/out" \
    "{\"version\":2,\"algorithm\":\"xchacha20-poly1305\",\"tenant\":\"acme\",\"key_id\":\"payments/kek\",\"key_version\":3,\"wrapped_dek\":\"a0a1\",\"nonce\":\"$(rep 07 24)\",\"purpose\":\"card\",\"commitment\":\"$(rep c3 32)\",\"ciphertext_len\":144,\"header_len\":98,\"total_len\":245}"

run "inspect v2 from stdin without FILE" 0 "$KS" inspect <"$T/v2.kse"
expect_grep "text lists the purpose" "$T/out" "^purpose: *card$"
expect_grep "text lists the commitment" "$T/out" "^commitment: *$(rep c3 32)$"

run "options after FILE" 0 "$KS" inspect "$T/v1.kse" --json
run "-- ends options" 0 "$KS" inspect --json -- "$T/v1.kse"

# ---- invalid input: exit 65, one stable line on stderr -------------------
head -c 20 "$T/v1.kse" >"$T/trunc.kse"
run "truncated envelope" 65 "$KS" inspect "$T/trunc.kse"
expect_eq "truncated: stderr line" "$T/err" "keyshift: invalid envelope: truncated at byte 19"
expect_empty "truncated: nothing on stdout" "$T/out"

run "truncated envelope --json" 65 "$KS" inspect --json "$T/trunc.kse"
expect_eq "--json error object" "$T/out" '{"error":"truncated","offset":19}'
expect_eq "--json keeps the stderr line" "$T/err" "keyshift: invalid envelope: truncated at byte 19"

printf 'plain text' >"$T/plain"
run "plaintext is bad-magic" 65 "$KS" inspect "$T/plain"
expect_eq "bad-magic at byte 0" "$T/err" "keyshift: invalid envelope: bad-magic at byte 0"

: >"$T/empty"
run "empty input" 65 "$KS" inspect "$T/empty"
expect_eq "empty: truncated at byte 0" "$T/err" "keyshift: invalid envelope: truncated at byte 0"

unhex "4b534503" >"$T/v3.kse"
run "version 3" 65 "$KS" inspect "$T/v3.kse"
expect_eq "unsupported-version at byte 3" "$T/err" "keyshift: invalid envelope: unsupported-version at byte 3"

cat "$T/v1.kse" >"$T/trail.kse"; printf '\x00' >>"$T/trail.kse"
run "trailing byte" 65 "$KS" inspect "$T/trail.kse"
expect_eq "trailing byte: unknown-field at 49" "$T/err" "keyshift: invalid envelope: unknown-field at byte 49"

unhex "${V1_HEX/1201$(strhex t)/1201$(strhex '/')}" >"$T/charset.kse"
run "tenant charset" 65 "$KS" inspect "$T/charset.kse"
expect_eq "bad-value at the offending byte" "$T/err" "keyshift: invalid envelope: bad-value at byte 8"

# ---- size bounds ---------------------------------------------------------
run "--max-ciphertext lowers the limit" 65 "$KS" inspect --max-ciphertext 100 "$T/v2.kse"
expect_eq "too-large at the length varint" "$T/err" "keyshift: invalid envelope: too-large at byte 99"
run "--max-ciphertext=144 accepts 144" 0 "$KS" inspect --max-ciphertext=144 "$T/v2.kse"

truncate -s 1G "$T/huge"
run "a 1 GiB file is refused before it is read" 65 "$KS" inspect "$T/huge"
expect_grep "huge file: too-large" "$T/err" "invalid envelope: too-large at byte"

# An endless stream must be cut off after the bound, not read forever.
run "endless stdin is refused" 65 bash -c "yes | '$KS' inspect -"
expect_grep "endless stdin: too-large" "$T/err" "invalid envelope: too-large at byte"

# [F-LIMITS-3] The refusal is too-large at max_len (1050086 under the
# default limits) before any byte is examined: a file of zeros one byte
# longer is not bad-magic; one of exactly max_len bytes is parsed.
expect_eq "endless stdin: at max_len" "$T/err" "keyshift: invalid envelope: too-large at byte 1050086"
head -c 1050087 /dev/zero >"$T/over"
run "max_len + 1 zero bytes" 65 "$KS" inspect "$T/over"
expect_eq "max_len + 1: too-large at max_len, not bad-magic" "$T/err" "keyshift: invalid envelope: too-large at byte 1050086"
run "max_len + 1 zero bytes, --json" 65 "$KS" inspect --json "$T/over"
expect_eq "--json: the same error and offset" "$T/out" '{"error":"too-large","offset":1050086}'
IN="$T/over" run "decrypt refuses max_len + 1 bytes the same way" 65 "$KS" decrypt
expect_eq "decrypt: too-large at max_len" "$T/err" "keyshift: invalid envelope: too-large at byte 1050086"
head -c 1050086 /dev/zero >"$T/at-max"
run "max_len zero bytes are parsed" 65 "$KS" inspect "$T/at-max"
expect_eq "max_len: bad-magic at 0" "$T/err" "keyshift: invalid envelope: bad-magic at byte 0"

# ---- other failures --------------------------------------------------------
run "missing file" 66 "$KS" inspect "$T/nope.kse"
expect_grep "missing file: message" "$T/err" "cannot open"
run "directory" 66 "$KS" inspect "$T"
if [ -w /dev/full ]; then
    run "write error (full disk)" 74 sh -c "'$KS' inspect '$T/v1.kse' >/dev/full"
fi

# ---- usage -------------------------------------------------------------------
run "unknown option" 64 "$KS" inspect --bogus
expect_grep "unknown option: hint" "$T/err" "Try 'keyshift inspect --help'"
run "two files" 64 "$KS" inspect "$T/v1.kse" "$T/v2.kse"
run "bad --max-ciphertext" 64 "$KS" inspect --max-ciphertext 15 "$T/v1.kse"
run "--max-ciphertext above the hard cap" 64 "$KS" inspect --max-ciphertext 16777233 "$T/v1.kse"
run "missing --max-ciphertext value" 64 "$KS" inspect --max-ciphertext
run "no command" 64 "$KS"
run "unknown command" 64 "$KS" frobnicate
run "--help" 0 "$KS" --help
expect_grep "--help lists inspect" "$T/out" "inspect"
run "inspect --help" 0 "$KS" inspect --help
expect_grep "inspect --help has EXIT STATUS" "$T/out" "EXIT STATUS"
run "help inspect" 0 "$KS" help inspect
expect_grep "help inspect has SYNOPSIS" "$T/out" "SYNOPSIS"
run "--version" 0 "$KS" --version
expect_grep "--version prints the version" "$T/out" "^keyshift [0-9]"

cli_finish cli
