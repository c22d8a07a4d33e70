#!/bin/bash -eu
# fuzz/build.sh -- build keyshift's fuzz targets the OSS-Fuzz way.
#
# Called by fuzz/oss-fuzz/build.sh (OSS-Fuzz), .clusterfuzzlite/build.sh
# (ClusterFuzzLite) and `make oss-fuzz-check`.  Uses only the OSS-Fuzz
# interface: $CC, $CXX, $CFLAGS, $LIB_FUZZING_ENGINE, $SRC, $OUT (and $WORK
# for intermediate files when set).  Links with $CXX, as OSS-Fuzz requires
# even for C.
#
# The targets are every fuzz/fuzz_*.c, the library every format/*.c,
# parser/*.c, migrate/*.c, migrate/*/*.c and migrate/*/*/*.c (the same sources as LIB_SRCS in the
# Makefile): both lists come from the files, so a new target or source
# needs no change here, unless the target also links code from outside the
# library (extra_for below).  For each target it leaves in $OUT:
#   <target>                 the fuzzer
#   <target>_seed_corpus.zip corpus/<target>/ + corpus/regressions/
#   <target>.dict            the target's dictionary (dict_for below)
#   <target>.options         fuzz/<target>.options ([libfuzzer] max_len, dict)
#
# nanopb: the system package (nanopb + libnanopb-dev, 0.4.x) by default.  If
# a nanopb source tree is at $NANOPB_SRC (default $SRC/nanopb when present),
# its generator and pb_*.c are used instead, compiled with $CFLAGS.
#
# libsodium (migrate/ needs it, with threads): the system package
# (libsodium-dev), linked with -lsodium -lsqlite3 -lpthread; OpenSSL's
# libcrypto (libssl-dev, -lcrypto) likewise, the payload AEAD's second
# engine (migrate/crypto/aead.c); p11-kit
# (libp11-kit-dev) likewise, for the pkcs11 provider, and jansson
# (libjansson-dev, -ljansson) for the KMS plugin protocol's JSON reader, and
# libpq (libpq-dev) for the PostgreSQL row store.  Like the packaged nanopb
# it is not instrumented: fine for ASan, UBSan and coverage feedback on our
# own code (libsodium is not what is being fuzzed), not for MSan, which is
# not enabled.
cd "$(dirname "$0")/.."

: "${CC:?}" "${CXX:?}" "${LIB_FUZZING_ENGINE:?}" "${OUT:?}"
CFLAGS=${CFLAGS:-}
WORK=${WORK:-build/oss-fuzz-work}
TARGETS=$(for f in fuzz/fuzz_*.c; do basename "${f%.c}"; done)
LIB_SRCS=$(ls format/*.c parser/*.c migrate/*.c migrate/*/*.c migrate/*/*/*.c)
[ -n "$TARGETS" ] && [ -n "$LIB_SRCS" ]

# The dictionary of a target: corpus/envelope.dict (envelope tokens) unless
# listed here.  fuzz/fuzz.mk holds the same mapping (FUZZ_DICT_<target>) for
# the local runs; `make oss-fuzz-check` compares the two.
dict_for() {
    case $1 in
        fuzz_keyring) echo corpus/keyring.dict ;;
        fuzz_rollout) echo corpus/rollout.dict ;;
        fuzz_p11meta) echo corpus/p11meta.dict ;;
        fuzz_providers) echo corpus/providers.dict ;;
        fuzz_plugin_resp) echo corpus/plugin.dict ;;
        fuzz_pg_rows) echo corpus/pg_rows.dict ;;
        fuzz_text) echo corpus/text.dict ;;
        fuzz_agent_policy) echo corpus/agent_policy.dict ;;
        fuzz_aws_creds) echo corpus/aws_creds.dict ;;
        fuzz_agent_request) echo corpus/agent.dict ;;
        *) echo corpus/envelope.dict ;;
    esac
}

# The sources outside the library that a target also links (a program's
# code under tools/ that it fuzzes); fuzz/fuzz.mk holds the same mapping
# (FUZZ_EXTRA_<target>).
extra_for() {
    case $1 in
        fuzz_agent_policy) echo tools/agent/policy.c ;;
    esac
}

GEN=$WORK/keyshift-gen
OBJ=$WORK/keyshift-obj
rm -rf "$GEN" "$OBJ"
mkdir -p "$GEN" "$OBJ" "$OUT"

NANOPB_SRC=${NANOPB_SRC:-${SRC:-/nonexistent}/nanopb}
NANOPB_OBJS=""
if [ -f "$NANOPB_SRC/pb_decode.c" ]; then
    python3 "$NANOPB_SRC/generator/nanopb_generator.py" -q -I format -D "$GEN" format/envelope.proto
    for f in pb_common pb_decode pb_encode; do
        $CC $CFLAGS -I"$NANOPB_SRC" -c "$NANOPB_SRC/$f.c" -o "$OBJ/$f.o"
        NANOPB_OBJS="$NANOPB_OBJS $OBJ/$f.o"
    done
    NANOPB_INC="-I$NANOPB_SRC"
    NANOPB_LIB=""
else
    # Debian/Ubuntu package; its script's shebang names the system python3,
    # which has the protobuf module (a python3 earlier on PATH may not).
    gen=$(command -v nanopb_generator.py || command -v nanopb_generator)
    "$gen" -q -I format -D "$GEN" format/envelope.proto
    NANOPB_INC=""
    NANOPB_LIB="-lprotobuf-nanopb"
fi

# p11-kit: the pkcs11 provider (migrate/keys/) needs its pkcs11.h and links
# its URI parser.
P11_CFLAGS=$(pkg-config --cflags p11-kit-1)
P11_LIBS=$(pkg-config --libs p11-kit-1)
# libpq: the PostgreSQL row store (migrate/store/pg/).
PQ_CFLAGS=$(pkg-config --cflags libpq)
PQ_LIBS=$(pkg-config --libs libpq)
INCS="-Iinclude -I$GEN $NANOPB_INC $P11_CFLAGS $PQ_CFLAGS"
for src in $LIB_SRCS "$GEN/envelope.pb.c"; do
    rel=${src#"$WORK"/}
    o="$OBJ/$(echo "${rel%.c}" | tr / _).o"   # format/aad.c -> format_aad.o
    $CC $CFLAGS -std=c11 $INCS -c "$src" -o "$o"
    LIB_OBJS="${LIB_OBJS:-} $o"
done

for t in $TARGETS; do
    $CC $CFLAGS -std=c11 $INCS -c "fuzz/$t.c" -o "$OBJ/$t.o"
    extra_objs=""
    for src in $(extra_for "$t"); do
        o="$OBJ/$t-$(echo "${src%.c}" | tr / _).o"
        $CC $CFLAGS -std=c11 $INCS -c "$src" -o "$o"
        extra_objs="$extra_objs $o"
    done
    # shellcheck disable=SC2086
    $CXX $CFLAGS "$OBJ/$t.o" $extra_objs $LIB_OBJS $NANOPB_OBJS $LIB_FUZZING_ENGINE $NANOPB_LIB \
        -lsodium -lcrypto -lsqlite3 $PQ_LIBS -ljansson $P11_LIBS -ldl -lpthread -o "$OUT/$t"

    seeds="$WORK/keyshift-seeds-$t"
    rm -rf "$seeds" && mkdir -p "$seeds"
    find "corpus/$t" corpus/regressions -maxdepth 1 -type f ! -name 'README*' ! -name '.*' \
        -exec cp -f {} "$seeds/" \;
    rm -f "$OUT/${t}_seed_corpus.zip"
    (cd "$seeds" && zip -q -r "$OUT/${t}_seed_corpus.zip" .)
    cp "$(dict_for "$t")" "$OUT/$t.dict"
    cp "fuzz/$t.options" "$OUT/$t.options"
done
