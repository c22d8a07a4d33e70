# tools/mutate.mk -- mutation testing of parser/ and format/ (included by the Makefile).
#
#   make mutate   every mutant of MUTATE_SRCS (tools/mutate/mutate.py: relational
#                 operators flipped, literals and named bounds shifted by one, named
#                 constants swapped, if/while conditions negated, `return KS_ERR_*`
#                 removed), each built in $(B)/mutate/w<N>/ and run against the replay
#                 of corpus/<target>/ and corpus/regressions/ through MUTATE_REPLAY and
#                 the unit tests MUTATE_UNIT, fastest first, up to the first failure.
#                 Fails below MUTATE_MIN percent killed, counted as
#                 killed / (total - stillborn - allowlisted); tools/mutate/allowlist.txt
#                 justifies the accepted survivors.  docs/fuzzing.md, "Mutation testing".
#
#   MUTATE_JOBS (2) mutants built and tested at once; MUTATE_TIMEOUT (0: 5 times the
#   unmutated run, at least 5 s) seconds per test run; MUTATE_FILTER=parser/cursor.h:12
#   only the mutants at lines starting so; MUTATE_LIST=1 lists the mutants.
#
# Everything is built with the replay flavour's flags (clang, ASan+UBSan, assertions
# on): the library objects of $(FZ)/replay/obj/ serve the unit tests too, so a mutant
# is compiled once.  Only the mutated file is rebuilt, or for a header, the units of
# MUTATE_SRCS and of the tests that include it; migrate/'s copies of the inline
# headers stay unmutated.  The checkout is only read.

MUTATE_SRCS := parser/envelope.c parser/cursor.h format/format.c format/encode.c format/aad.c \
               format/rules.h
MUTATE_REPLAY := fuzz_parse fuzz_differential fuzz_open
MUTATE_UNIT := test_format test_spec_vectors test_crypto_vectors test_envelope
MUTATE_JOBS ?= 2
MUTATE_MIN ?= 95
MUTATE_TIMEOUT ?= 0
MUTATE_FILTER ?=
MUTATE_LIST ?=
MUTATE_ALLOWLIST := tools/mutate/allowlist.txt

MUT := $(B)/mutate
MUTATE_LIB_C := $(filter %.c,$(MUTATE_SRCS))
MUTATE_FIXED := $(filter-out $(MUTATE_LIB_C:%.c=$(FZ)/replay/obj/%.o),$(FUZZ_RP_OBJS))
MUTATE_UNIT_C := $(MUTATE_UNIT:%=tests/%.c) $(UNIT_SUPPORT)
MUTATE_TU := $(MUTATE_LIB_C) $(MUTATE_REPLAY:%=fuzz/%.c) fuzz/replay_main.c $(MUTATE_UNIT_C)
mutate_obj = $(if $(filter tests/%,$(1)),$(MUT)/base/$(1:%.c=%.o),$(FZ)/replay/obj/$(1:%.c=%.o))
MUTATE_OBJS := $(foreach u,$(MUTATE_TU),$(call mutate_obj,$(u)))

# The unit tests' own files, with the replay flags (and the unit rule's include paths).
$(MUT)/base/tests/%.o: tests/%.c $(FUZZ_DEPS)
	@mkdir -p $(dir $@)
	$(CLANG) $(WARN) $(FUZZ_RP_CFLAGS) $(FUZZ_INC) -Iformat -Iparser -c $< -o $@

mutate_comma := ,
mutate_space := $(eval) $(eval)
mutate_json = [$(subst $(mutate_space),$(mutate_comma),$(patsubst %,"%",$(strip $(1))))]
mutate_test = {"name": "$(1)", "objs": $(call mutate_json,$(2)), "extra": $(call mutate_json,$(3)), \
    "libs": $(call mutate_json,$(4)), "args": $(call mutate_json,$(5))}

.PHONY: mutate
mutate: $(MUTATE_OBJS) $(MUTATE_FIXED)
	@mkdir -p $(MUT)
	$(file >$(MUT)/config.json,{"work": "$(MUT)", "cc": "$(CLANG)", \
	    "cflags": "$(FUZZ_RP_CFLAGS) $(FUZZ_INC)", "ldflags": "$(FUZZ_RP_CFLAGS)", \
	    "copy_dirs": ["parser", "format", "tests", "fuzz"], \
	    "mutate": $(call mutate_json,$(MUTATE_SRCS)), "allowlist": "$(MUTATE_ALLOWLIST)", \
	    "env": {"KS_SPEC": "docs/format.md"}, \
	    "base_obj": $(call mutate_json,$(foreach u,$(MUTATE_TU),$(u)=$(call mutate_obj,$(u)))), \
	    "tests": [$(subst } {,}$(mutate_comma) {,$(foreach t,$(MUTATE_REPLAY),$(call mutate_test,$(t),fuzz/$(t).c fuzz/replay_main.c $(MUTATE_LIB_C),$(MUTATE_FIXED),$(FUZZ_LIBS),corpus/$(t) corpus/regressions)) \
	        $(foreach t,$(MUTATE_UNIT),$(call mutate_test,$(t),tests/$(t).c $(UNIT_SUPPORT) $(MUTATE_LIB_C),$(MUTATE_FIXED),-lcmocka $(FUZZ_LIBS),)))]})
	@$(PYTHON_DEBIAN) tools/mutate/mutate.py --config $(MUT)/config.json --jobs $(MUTATE_JOBS) \
	    --min $(MUTATE_MIN) --timeout $(MUTATE_TIMEOUT) $(if $(MUTATE_FILTER),--filter $(MUTATE_FILTER)) \
	    $(if $(MUTATE_LIST),--list)
