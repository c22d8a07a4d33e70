# tools/prove.mk -- `make prove`: Frama-C over the parser and the canonical
# encoder (included by the Makefile; docs/fuzzing.md "Proof").
#
# One Frama-C session over tools/prove/driver.c, parser/ and format/:
#   1. RTE annotates every possible runtime error (memory access,
#      initialisation, signed and unsigned overflow and downcast);
#   2. Eva runs the driver, which calls the parser on every input of every
#      length 0..PROVE_MAX_LEN and the encoder on what it accepts, and
#      checks every annotation and every call's precondition (the cursor's
#      invariant among them, parser/cursor.h);
#   3. WP proves the cursor functions against their ACSL contracts with
#      Z3 through Why3;
#   4. tools/prove/check.py reads the consolidated statuses and fails on
#      any property not proved that tools/prove/alarms.txt does not justify.
# Needs the Debian packages frama-c-base, why3 and z3 (tools/deps.sh); about
# 3 to 5 minutes on the 2-core machine, run nightly.

PROVE_MAX_LEN ?= 96
PROVE_SLEVEL  ?= 200
PROVE_WP_TIMEOUT ?= 20
FRAMA_C ?= frama-c
WHY3    ?= why3
PV := $(B)/prove

PROVE_SRCS := tools/prove/driver.c parser/envelope.c format/encode.c format/format.c
prove_comma := ,
prove_space := $(subst ,, )
PROVE_CURSOR_FNS := $(subst $(prove_space),$(prove_comma),$(strip ks_cursor_init ks_cursor_remaining ks_cursor_is_empty \
    ks_cursor_offset ks_cursor_read_u8 ks_cursor_read_view ks_cursor_read_sub ks_cursor_read_varint32))
PROVE_RTE := -rte -warn-signed-overflow -warn-unsigned-overflow -warn-signed-downcast \
             -warn-unsigned-downcast
PROVE_EVA := -eva -eva-slevel $(PROVE_SLEVEL) -eva-auto-loop-unroll 128 -eva-split-return auto
# z3-ce is Why3's second Z3 configuration: it settles goals on which the
# first one fails outright.
PROVE_WP  := -wp -wp-fct $(PROVE_CURSOR_FNS) -wp-prover z3-ce,z3 -wp-timeout $(PROVE_WP_TIMEOUT)

.PHONY: prove
prove: $(PROVE_SRCS) $(LIB_HDRS) tools/prove/alarms.txt tools/prove/check.py
	@mkdir -p $(PV)
	@WHY3CONFIG=$(PV)/why3.conf $(WHY3) config detect >/dev/null 2>&1
	@start=$$(date +%s); \
	 WHY3CONFIG=$(PV)/why3.conf $(FRAMA_C) -cpp-extra-args="-Iinclude -DKS_PROVE_MAX_LEN=$(PROVE_MAX_LEN)" \
	    $(PROVE_SRCS) $(PROVE_RTE) -then $(PROVE_EVA) -then $(PROVE_WP) \
	    -then -report-csv $(PV)/report.csv > $(PV)/frama-c.log 2>&1 \
	    || { tail -30 $(PV)/frama-c.log; exit 1; }; \
	 sed -n '/alarms generated/,/-----/p' $(PV)/frama-c.log | grep -v -- '-----' \
	    | sed 's/^ */prove: eva: /'; \
	 grep -A3 'Proved goals' $(PV)/frama-c.log | sed 's/^\(\[wp\]\)\? */prove: wp: /'; \
	 echo "prove: inputs of 0..$(PROVE_MAX_LEN) bytes, $$(( $$(date +%s) - start )) s"
	@$(PYTHON_DEBIAN) tools/prove/check.py $(PV)/report.csv tools/prove/alarms.txt
