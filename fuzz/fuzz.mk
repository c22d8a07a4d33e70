# fuzz/fuzz.mk -- fuzz targets, corpus replay, coverage gate (included by the Makefile).
#
# Every fuzz/<target>.c is built four ways, under $(B)/fuzz/:
#   lf/      libFuzzer  (clang-14, ASan+UBSan, library with fuzzer-no-link)
#   afl/     AFL++      (afl-clang-fast, ASan+UBSan, libAFLDriver via -fsanitize=fuzzer; + cmplog)
#   replay/  plain main over files and directories (fuzz/replay_main.c), ASan+UBSan
#   cov/     replay main with clang source-based coverage (-DNDEBUG: see docs/fuzzing.md)
#
#   make fuzz-replay     replay corpus/<target>/ and corpus/regressions/ under ASan+UBSan
#   make coverage        llvm-cov over the same inputs; print each gated file's lines and
#                        branches and gate each group (FUZZ_COV_GROUPS): the parsers of
#                        untrusted bytes, parser/ and format/ at 95/90, the stateful code
#                        (migrate/crypto/, migrate/engine/, rollout guard.c, policy.c) at 85/75
#   make fuzz-smoke      the gate: every target has a line in fuzz/gates.txt, the canary is
#                        found (fuzz-canary), the host's speed is measured (fuzz-calib), then
#                        each libFuzzer target for FUZZ_SMOKE_SECONDS from a copy of the
#                        corpus, failing below its features or its exec/s floor scaled to the
#                        host (fuzz-smoke, fuzz, fuzz-afl: each with its own dictionary, fuzz_dict)
#   make fuzz-canary     fuzz/canary/fuzz_canary.c (a planted over-read) until found, at most
#                        FUZZ_CANARY_SECONDS
#   make fuzz-calib      fuzz/calib/fuzz_calib.c (fixed work per input), two copies at once for
#                        FUZZ_CALIB_SECONDS: the host's speed the exec/s floors scale by
#   make fuzz-struct     the envelope targets plain and with fuzz/envelope_mutator.h, for
#                        FUZZ_STRUCT_SECONDS each, to compare their features
#   make fuzz            each libFuzzer target for FUZZ_SECONDS, corpus kept in $(B)/fuzz/run/
#   make fuzz-afl        each target under afl-fuzz -V $(AFL_SECONDS)
#   make oss-fuzz-check  run fuzz/oss-fuzz/build.sh locally and check what it leaves in $OUT
#   make fuzz-seeds      regenerate corpus/<target>/ seeds (spec vectors + built-in)
#
# Nothing here writes into corpus/ except fuzz-seeds.

FUZZ_TARGETS := fuzz_parse fuzz_differential fuzz_open fuzz_keyring fuzz_migrate fuzz_rollout \
                fuzz_providers fuzz_p11meta fuzz_plugin_resp fuzz_faults fuzz_pg_rows fuzz_text \
                fuzz_agent_policy \
                fuzz_aws_creds \
                fuzz_agent_request \
                fuzz_aead
# Not in FUZZ_TARGETS (nor OSS-Fuzz): the structure-aware variants of
# fuzz/struct/ (make fuzz-struct, make fuzz), the canary (make fuzz-canary)
# and the calibration (make fuzz-calib).
FUZZ_STRUCT_TARGETS := fuzz_parse_struct fuzz_open_struct
FUZZ_GATES := fuzz/gates.txt
FUZZ_SMOKE_SECONDS ?= 10
FUZZ_CANARY_SECONDS ?= 60
FUZZ_CALIB_SECONDS ?= 3
FUZZ_STRUCT_SECONDS ?= 60
FUZZ_SECONDS ?= 60
AFL_SECONDS ?= 20
FUZZ_TIMEOUT ?= 5
FUZZ_RSS_MB ?= 2560
FUZZ_COV_MIN_LINES ?= 95
FUZZ_COV_MIN_BRANCHES ?= 90
# Each target's dictionary: corpus/envelope.dict unless FUZZ_DICT_<target>
# names another.  fuzz/build.sh (dict_for) holds the same mapping for
# OSS-Fuzz; oss-fuzz-check fails when the two disagree.
FUZZ_DICT_DEFAULT := corpus/envelope.dict
FUZZ_DICT_fuzz_keyring := corpus/keyring.dict
FUZZ_DICT_fuzz_rollout := corpus/rollout.dict
FUZZ_DICT_fuzz_p11meta := corpus/p11meta.dict
FUZZ_DICT_fuzz_providers := corpus/providers.dict
FUZZ_DICT_fuzz_plugin_resp := corpus/plugin.dict
FUZZ_DICT_fuzz_pg_rows := corpus/pg_rows.dict
FUZZ_DICT_fuzz_text := corpus/text.dict
FUZZ_DICT_fuzz_agent_policy := corpus/agent_policy.dict
FUZZ_DICT_fuzz_aws_creds := corpus/aws_creds.dict
FUZZ_DICT_fuzz_agent_request := corpus/agent.dict
fuzz_dict = $(or $(FUZZ_DICT_$(1)),$(FUZZ_DICT_DEFAULT))
AFL_CC ?= afl-clang-fast
LLVM_PROFDATA ?= llvm-profdata-14
LLVM_COV ?= llvm-cov-14
CLANGXX ?= $(if $(shell command -v clang++-14),clang++-14,$(CLANG))

FZ := $(B)/fuzz
FUZZ_BASE := -O1 -g -fno-omit-frame-pointer -DFUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION
FUZZ_SAN := -fsanitize=address,undefined -fno-sanitize-recover=all
FUZZ_INC := $(INC) -I$(B)/gen
FUZZ_LIBS := -lprotobuf-nanopb $(LIB_LIBS)
# max_len of a target, from its committed .options file (shared with OSS-Fuzz);
# a structure-aware variant (<target>_struct) uses its target's.
fuzz_max_len = $(shell sed -n 's/^max_len *= *//p' fuzz/$(patsubst %_struct,%,$(1)).options)

FUZZ_LIB_C := $(LIB_SRCS) $(NANOPB_C)
# Sources outside the library that a target also links (the code of a
# program under tools/ that it fuzzes): FUZZ_EXTRA_<target>.  fuzz/build.sh
# (extra_for) holds the same mapping for OSS-Fuzz.
FUZZ_EXTRA_fuzz_agent_policy := tools/agent/policy.c
FUZZ_EXTRA_C := $(sort $(foreach t,$(FUZZ_TARGETS),$(FUZZ_EXTRA_$(t))))
FUZZ_DEPS := $(LIB_HDRS) $(NANOPB_H) $(wildcard tests/*.h fuzz/*.h) fuzz/fuzz.mk

# ---- object files per flavour -------------------------------------------
# $(B)/fuzz/<flavour>/obj/<path>.o; build/gen/envelope.pb.c lands under obj/build/gen/.

FUZZ_LF_CFLAGS := $(FUZZ_BASE) $(FUZZ_SAN) -fsanitize=fuzzer-no-link
FUZZ_RP_CFLAGS := $(FUZZ_BASE) $(FUZZ_SAN)
FUZZ_CV_CFLAGS := -O0 -g -fprofile-instr-generate -fcoverage-mapping -DNDEBUG

$(FZ)/lf/obj/%.o: %.c $(FUZZ_DEPS)
	@mkdir -p $(dir $@)
	$(CLANG) $(WARN) $(FUZZ_LF_CFLAGS) $(FUZZ_INC) -c $< -o $@
$(FZ)/replay/obj/%.o: %.c $(FUZZ_DEPS)
	@mkdir -p $(dir $@)
	$(CLANG) $(WARN) $(FUZZ_RP_CFLAGS) $(FUZZ_INC) -c $< -o $@
$(FZ)/cov/obj/%.o: %.c $(FUZZ_DEPS)
	@mkdir -p $(dir $@)
	$(CLANG) $(WARN) $(FUZZ_CV_CFLAGS) $(FUZZ_INC) -c $< -o $@

# fuzz_aws_creds compiles in the keyshift-kms-aws readers it fuzzes.
FUZZ_AWS_CREDS_C := tools/kms-aws/kms_ini.c tools/kms-aws/creds_parse.c tools/kms-aws/sigv4.c \
                    tools/kms-aws/kms.h tools/kms-aws/creds.h tools/kms-aws/sigv4.h
$(FZ)/lf/obj/fuzz/fuzz_aws_creds.o $(FZ)/replay/obj/fuzz/fuzz_aws_creds.o $(FZ)/cov/obj/fuzz/fuzz_aws_creds.o \
    $(FZ)/afl/fuzz_aws_creds $(FZ)/afl/fuzz_aws_creds.cmplog: $(FUZZ_AWS_CREDS_C)

FUZZ_LF_OBJS := $(FUZZ_LIB_C:%.c=$(FZ)/lf/obj/%.o)
FUZZ_RP_OBJS := $(FUZZ_LIB_C:%.c=$(FZ)/replay/obj/%.o)
FUZZ_CV_OBJS := $(FUZZ_LIB_C:%.c=$(FZ)/cov/obj/%.o)

FUZZ_LF_BINS := $(FUZZ_TARGETS:%=$(FZ)/lf/%)
FUZZ_RP_BINS := $(FUZZ_TARGETS:%=$(FZ)/replay/%)
FUZZ_CV_BINS := $(FUZZ_TARGETS:%=$(FZ)/cov/%)
FUZZ_STRUCT_BINS := $(FUZZ_STRUCT_TARGETS:%=$(FZ)/lf/%)
FUZZ_AFL_BINS := $(FUZZ_TARGETS:%=$(FZ)/afl/%) $(FUZZ_TARGETS:%=$(FZ)/afl/%.cmplog)

# ---- binaries -------------------------------------------------------------

$(FUZZ_LF_BINS): $(FZ)/lf/%: $(FZ)/lf/obj/fuzz/%.o $(FUZZ_LF_OBJS)
	$(CLANG) $(FUZZ_BASE) $(FUZZ_SAN) -fsanitize=fuzzer $^ $(FUZZ_LIBS) -o $@

$(FUZZ_RP_BINS): $(FZ)/replay/%: $(FZ)/replay/obj/fuzz/%.o $(FZ)/replay/obj/fuzz/replay_main.o $(FUZZ_RP_OBJS)
	$(CLANG) $(FUZZ_RP_CFLAGS) $^ $(FUZZ_LIBS) -o $@

$(FUZZ_CV_BINS): $(FZ)/cov/%: $(FZ)/cov/obj/fuzz/%.o $(FZ)/cov/obj/fuzz/replay_main.o $(FUZZ_CV_OBJS)
	$(CLANG) $(FUZZ_CV_CFLAGS) $^ $(FUZZ_LIBS) -o $@

# A target's FUZZ_EXTRA_<target> objects join its link in each flavour ($^);
# they and the target's object depend on the extras' headers (X.c: X.h).
$(foreach t,$(FUZZ_TARGETS),$(foreach f,lf replay cov,$(if $(FUZZ_EXTRA_$(t)), \
    $(eval $(FZ)/$(f)/$(t): $(FUZZ_EXTRA_$(t):%.c=$(FZ)/$(f)/obj/%.o)) \
    $(eval $(FZ)/$(f)/obj/fuzz/$(t).o $(FUZZ_EXTRA_$(t):%.c=$(FZ)/$(f)/obj/%.o): \
        $(FUZZ_EXTRA_$(t):%.c=%.h)))))

# AFL++: one compiler call per binary (afl-clang-fast instruments at compile time).
$(FUZZ_TARGETS:%=$(FZ)/afl/%): $(FZ)/afl/%: fuzz/%.c $(FUZZ_LIB_C) $(FUZZ_EXTRA_C) $(FUZZ_EXTRA_C:%.c=%.h) $(FUZZ_DEPS)
	@mkdir -p $(dir $@)
	AFL_QUIET=1 AFL_USE_ASAN=1 AFL_USE_UBSAN=1 $(AFL_CC) $(WARN) $(FUZZ_BASE) $(FUZZ_INC) \
	    -fsanitize=fuzzer $< $(FUZZ_EXTRA_$*) $(FUZZ_LIB_C) $(FUZZ_LIBS) -o $@
$(FUZZ_TARGETS:%=$(FZ)/afl/%.cmplog): $(FZ)/afl/%.cmplog: fuzz/%.c $(FUZZ_LIB_C) $(FUZZ_EXTRA_C) $(FUZZ_EXTRA_C:%.c=%.h) $(FUZZ_DEPS)
	@mkdir -p $(dir $@)
	AFL_QUIET=1 AFL_USE_ASAN=1 AFL_LLVM_CMPLOG=1 $(AFL_CC) $(WARN) $(FUZZ_BASE) $(FUZZ_INC) \
	    -fsanitize=fuzzer $< $(FUZZ_EXTRA_$*) $(FUZZ_LIB_C) $(FUZZ_LIBS) -o $@

.PRECIOUS: $(FZ)/lf/obj/%.o $(FZ)/replay/obj/%.o $(FZ)/cov/obj/%.o
.PHONY: fuzz-build fuzz-seeds oss-fuzz-check fuzz-canary fuzz-calib fuzz-struct

fuzz-build: $(FUZZ_LF_BINS) $(FUZZ_RP_BINS)

fuzz-seeds:
	$(PYTHON_DEBIAN) fuzz/seeds.py

# ---- replay -----------------------------------------------------------------
# Each input in an exact-size malloc buffer; ASan+UBSan abort on the first
# problem, an oracle failure aborts; both fail the target.

fuzz-replay: $(FUZZ_RP_BINS)
	@set -e; total=0; \
	 for t in $(FUZZ_TARGETS); do \
	     out=$$($(FZ)/replay/$$t corpus/$$t corpus/regressions) || { echo "$$out"; \
	         echo "fuzz-replay: $$t FAILED (rerun with REPLAY_VERBOSE=1 to see the input)"; exit 1; }; \
	     echo "fuzz-replay: $$out"; \
	     n=$$(echo "$$out" | sed -n 's/.*replayed \([0-9]*\) inputs.*/\1/p'); total=$$((total + n)); \
	 done; \
	 echo "fuzz-replay: $$total inputs replayed under ASan+UBSan, no failure"

# ---- coverage gate ------------------------------------------------------------

FUZZ_COV_DIR := $(FZ)/cov
# Coverage groups, each gated on its lines and branches together (fuzz/gate.py
# coverage prints every file's figures, then the group's):
#   parsers   the parsers and encoders of untrusted bytes, at 95 / 90
#   stateful  the crypto core, the migration engine, the rollout guard and
#             policy, at 85 / 75
# (a group below its floors may be given FUZZ_COV_ALLOW_<group> := lines
# branches 'reason': enforced at those figures, the reason printed)
FUZZ_COV_GROUPS := parsers stateful
FUZZ_COV_SRCS_parsers := parser/envelope.c parser/text.c parser/cursor.h format/text.c format/aad.c format/encode.c \
                 format/format.c migrate/keys/keyring_format.c \
                 migrate/keys/registry_format.c migrate/rollout/guard.c migrate/rollout/retire.c \
                 migrate/keys/p11_meta.c migrate/keys/plugin_proto.c tools/agent/policy.c
FUZZ_COV_MIN_parsers := $(FUZZ_COV_MIN_LINES) $(FUZZ_COV_MIN_BRANCHES)
# migrate/engine/workers.c is left out: its worker threads claim chunks
# from a PostgreSQL chunk table, which no fuzz target has (it is run by
# tests/test_workers_pg.c under ASan, and under TSan by the nightly make
# tsan-pg, with kill -9 and takeover).
# The crypto headers' inline code (the AEAD dispatch, the seal slot's
# tuple match) is the hot path's too.
FUZZ_COV_SRCS_stateful := $(sort $(filter-out migrate/engine/workers.c, \
                 $(wildcard migrate/crypto/*.c migrate/engine/*.c))) \
                 migrate/crypto/aead.h migrate/crypto/dek_writer.h migrate/crypto/shard.h \
                 migrate/rollout/guard.c migrate/rollout/policy.c
FUZZ_COV_MIN_stateful := 85 75
# The legacy name: every gated file.
FUZZ_COV_SRCS := $(sort $(foreach g,$(FUZZ_COV_GROUPS),$(FUZZ_COV_SRCS_$(g))))

coverage: $(FUZZ_CV_BINS)
	@set -e; rm -rf $(FUZZ_COV_DIR)/prof; mkdir -p $(FUZZ_COV_DIR)/prof; \
	 for t in $(FUZZ_TARGETS); do \
	     LLVM_PROFILE_FILE='$(FUZZ_COV_DIR)/prof/'$$t'-%p.profraw' $(FUZZ_COV_DIR)/$$t \
	         corpus/$$t corpus/regressions >/dev/null; \
	 done; \
	 $(LLVM_PROFDATA) merge -sparse $(FUZZ_COV_DIR)/prof/*.profraw -o $(FUZZ_COV_DIR)/all.profdata; \
	 objs="$(firstword $(FUZZ_CV_BINS)) $(patsubst %,-object %,$(wordlist 2,99,$(FUZZ_CV_BINS)))"; \
	 prof=-instr-profile=$(FUZZ_COV_DIR)/all.profdata; status=0; \
	 $(LLVM_COV) show $$objs $$prof -show-branches=count -format=text $(FUZZ_COV_SRCS) \
	     > $(FUZZ_COV_DIR)/parser.txt; \
	 $(foreach g,$(FUZZ_COV_GROUPS), \
	     $(LLVM_COV) export $$objs $$prof -summary-only $(FUZZ_COV_SRCS_$(g)) > $(FUZZ_COV_DIR)/$(g).json; \
	     $(PYTHON_DEBIAN) fuzz/gate.py coverage $(FUZZ_COV_DIR)/$(g).json $(g) \
	         $(FUZZ_COV_MIN_$(g)) $(FUZZ_COV_ALLOW_$(g)) || status=1;) \
	 if [ $$status != 0 ]; then \
	     echo "coverage: FAILED: below the gate; the annotated source is in $(FUZZ_COV_DIR)/parser.txt"; exit 1; fi; \
	 echo "coverage: ok (annotated source in $(FUZZ_COV_DIR)/parser.txt)"

# ---- libFuzzer runs -----------------------------------------------------------
# $(call fuzz_once,target,seconds,workdir,fresh): one run from workdir/corpus,
# which is seeded from corpus/<target>/ (a <target>_struct variant: its
# target's) and corpus/regressions/ (fresh=1: emptied first); a finding
# fails at once, with its input.
define fuzz_once
	w=$(3)/$(1); \
	 if [ "$(4)" = 1 ]; then rm -rf $$w; fi; mkdir -p $$w/corpus $$w/artifacts; \
	 find corpus/$(patsubst %_struct,%,$(1)) corpus/regressions -maxdepth 1 -type f ! -name 'README*' -exec cp -f {} $$w/corpus/ \; ; \
	 if ! $(PYTHON_DEBIAN) fuzz/gate.py run $$w/log -- env ASAN_OPTIONS=$(ASAN_OPTIONS):detect_leaks=1 \
	     $(FZ)/lf/$(1) -max_total_time=$(2) \
	     -max_len=$(call fuzz_max_len,$(1)) -timeout=$(FUZZ_TIMEOUT) -rss_limit_mb=$(FUZZ_RSS_MB) \
	     -dict=$(call fuzz_dict,$(1)) -detect_leaks=1 -print_final_stats=1 $(if $(5),$(FUZZ_SMOKE_FLAGS)) \
	     -artifact_prefix=$$w/artifacts/ $$w/corpus; then \
	     tail -n 60 $$w/log; \
	     echo "$(1): FAILED; crash input in $$w/artifacts/: $$(ls $$w/artifacts)"; exit 1; \
	 fi
endef

# $(call fuzz_run,target,seconds,workdir,fresh[,gate]): fuzz_once, then its
# figures.  gate non-empty: fail below the target's floors in $(FUZZ_GATES),
# after one more run from a fresh corpus: the host's neighbours can halve a
# target's speed for seconds (fuzz_migrate: 981 exec/s in one smoke run,
# 1,235 to 1,951 in the next eight), while what the floors are there to
# catch, a target made slow, is slow in both runs.  A finding is never run
# again.  Else only print the figures.
define fuzz_run
	set -e; $(call fuzz_once,$(1),$(2),$(3),$(4),$(5)); \
	 if ! $(PYTHON_DEBIAN) fuzz/gate.py check $(if $(5),$(FUZZ_GATES),-) $(1) $$w/log $(2) $$w/corpus \
	         $(FUZZ_HOST); then \
	     if [ -z "$(5)" ]; then exit 1; fi; \
	     echo "$(1): below a floor in one run: running it once more (a slow target fails both)"; \
	     $(call fuzz_once,$(1),$(2),$(3),1,$(5)); \
	     $(PYTHON_DEBIAN) fuzz/gate.py check $(FUZZ_GATES) $(1) $$w/log $(2) $$w/corpus $(FUZZ_HOST); \
	 fi
endef

# fuzz-smoke is also the gate: every target needs a line in $(FUZZ_GATES)
# (features floor, exec/s floor, reason), the canary must be found, and each
# run must reach its line's floors (fuzz/gate.py), the exec/s floor scaled
# to the host's speed that fuzz-calib measures first, alone.
# The targets run FUZZ_SMOKE_JOBS at a time (default: the machine's cores),
# each a single-threaded libFuzzer process on a core of its own, so the
# exec/s floors hold as they do for one run alone; the slowest targets
# start first.  make test runs nothing else beside the smoke run.
FUZZ_SMOKE_JOBS ?= $(shell nproc 2>/dev/null || echo 2)
# The smoke runs mutate without libFuzzer's entropic schedule.  Its
# bookkeeping runs on every execution, for every feature still rare, so it
# grows with a target's features: a quarter of fuzz_rollout's time (12,600
# features; perf), which then ran at 960 to 1,000 exec/s beside another
# target and at 1,300 to 2,000 without it.  A smoke run reaches the same
# features either way; the nightly and longer runs keep the schedule.
FUZZ_SMOKE_FLAGS ?= -entropic=0
# Every run takes FUZZ_SMOKE_SECONDS, so they start in pairs in this
# order: each target that drives SQLite files (fuzz_rollout, fuzz_migrate,
# fuzz_faults, fuzz_open, fuzz_providers) beside one that works in memory,
# so that two file-heavy runs never share the machine's I/O and system time.
FUZZ_SMOKE_HEAVY := fuzz_rollout fuzz_migrate fuzz_faults fuzz_open fuzz_providers
FUZZ_SMOKE_LIGHT := $(filter-out $(FUZZ_SMOKE_HEAVY),$(FUZZ_TARGETS))
fuzz_interleave = $(if $(1)$(2),$(firstword $(1)) $(firstword $(2)) \
                  $(call fuzz_interleave,$(wordlist 2,99,$(1)),$(wordlist 2,99,$(2))))
FUZZ_SMOKE_ORDER := $(strip $(call fuzz_interleave,$(FUZZ_SMOKE_HEAVY),$(FUZZ_SMOKE_LIGHT)))
FUZZ_SMOKE_RUNS := $(FUZZ_SMOKE_ORDER:%=fuzz-smoke-run-%)
.PHONY: fuzz-smoke-lines $(FUZZ_SMOKE_RUNS)

fuzz-smoke-lines:
	@$(PYTHON_DEBIAN) fuzz/gate.py lines $(FUZZ_GATES) $(FUZZ_TARGETS)

$(FUZZ_SMOKE_RUNS): fuzz-smoke-run-%: $(FZ)/lf/% fuzz-smoke-lines
	@$(call fuzz_run,$*,$(FUZZ_SMOKE_SECONDS),$(FZ)/smoke,1,gate)

fuzz-smoke: $(FUZZ_LF_BINS) $(FZ)/lf/fuzz_calib fuzz-canary fuzz-smoke-lines
	@$(MAKE) --no-print-directory fuzz-calib
	@$(MAKE) --no-print-directory -j$(FUZZ_SMOKE_JOBS) --output-sync=target $(FUZZ_SMOKE_RUNS)
	@echo "fuzz-smoke: all targets ran $(FUZZ_SMOKE_SECONDS) s without a finding, above their floors in $(FUZZ_GATES)"

fuzz: $(FUZZ_LF_BINS) $(FUZZ_STRUCT_BINS)
	@$(foreach t,$(FUZZ_TARGETS) $(FUZZ_STRUCT_TARGETS),$(call fuzz_run,$(t),$(FUZZ_SECONDS),$(FZ)/run,0) && ) true

# ---- the negative canary ------------------------------------------------------
# fuzz/canary/fuzz_canary.c has a planted out-of-bounds read; a fuzzer that
# does not find it within FUZZ_CANARY_SECONDS, from an empty corpus, fails
# the gate.  Built here only: not in FUZZ_TARGETS, OSS-Fuzz or install.

$(FZ)/lf/fuzz_canary: fuzz/canary/fuzz_canary.c fuzz/fuzz.mk
	@mkdir -p $(dir $@)
	$(CLANG) $(WARN) $(FUZZ_BASE) $(FUZZ_SAN) -fsanitize=fuzzer $< -o $@

fuzz-canary: $(FZ)/lf/fuzz_canary
	@set -e; w=$(FZ)/smoke/fuzz_canary; rm -rf $$w; mkdir -p $$w/corpus $$w/artifacts; \
	 ASAN_OPTIONS=$(ASAN_OPTIONS):detect_leaks=0 $(PYTHON_DEBIAN) fuzz/gate.py canary \
	     $(FUZZ_CANARY_SECONDS) $$w/log -- $(FZ)/lf/fuzz_canary -max_total_time=$(FUZZ_CANARY_SECONDS) \
	     -max_len=64 -artifact_prefix=$$w/artifacts/ $$w/corpus

# ---- the host's speed --------------------------------------------------------
# fuzz/calib/fuzz_calib.c does the same work for every input (SQLite
# statements, heap blocks, a byte loop), so its exec/s per CPU second is the
# host's: FUZZ_CALIB_JOBS copies run at once, as the smoke runs go, and
# fuzz/gate.py calib writes their mean to FUZZ_HOST.  fuzz/gates.txt's
# host-reference line says how fast a host must be for the exec/s floors to
# hold as written; on a slower one each floor scales by speed / reference
# (fuzz/gate.py check).  Built here only: not in FUZZ_TARGETS, OSS-Fuzz or
# install, and it links nothing of the library, so no change to keyshift
# moves it.
FUZZ_CALIB_JOBS ?= $(FUZZ_SMOKE_JOBS)
FUZZ_HOST := $(FZ)/smoke/fuzz_calib/host

$(FZ)/lf/fuzz_calib: fuzz/calib/fuzz_calib.c fuzz/fuzz.mk
	@mkdir -p $(dir $@)
	$(CLANG) $(WARN) $(FUZZ_BASE) $(FUZZ_SAN) -fsanitize=fuzzer $< -lsqlite3 -o $@

fuzz-calib: $(FZ)/lf/fuzz_calib
	@set -e; w=$(FZ)/smoke/fuzz_calib; rm -rf $$w; mkdir -p $$w; pids=; \
	 for i in $$(seq $(FUZZ_CALIB_JOBS)); do mkdir $$w/corpus.$$i; \
	     $(PYTHON_DEBIAN) fuzz/gate.py run $$w/log.$$i -- env ASAN_OPTIONS=$(ASAN_OPTIONS):detect_leaks=1 \
	         $(FZ)/lf/fuzz_calib -max_total_time=$(FUZZ_CALIB_SECONDS) -detect_leaks=1 \
	         -print_final_stats=1 $(FUZZ_SMOKE_FLAGS) $$w/corpus.$$i & pids="$$pids $$!"; \
	 done; \
	 for p in $$pids; do wait $$p || { tail -n 30 $$w/log.*; \
	     echo "fuzz_calib: FAILED (logs in $$w)"; exit 1; }; done; \
	 $(PYTHON_DEBIAN) fuzz/gate.py calib $(FUZZ_GATES) $(FUZZ_HOST) $$w/log.*

# ---- structure-aware variants -------------------------------------------------
# fuzz/struct/<target>_struct.c: the target with fuzz/envelope_mutator.h.
# fuzz-struct runs the plain target and its variant for FUZZ_STRUCT_SECONDS
# each from the same seeds and prints both runs' features.

$(FUZZ_STRUCT_BINS): $(FZ)/lf/%: $(FZ)/lf/obj/fuzz/struct/%.o $(FUZZ_LF_OBJS)
	$(CLANG) $(FUZZ_BASE) $(FUZZ_SAN) -fsanitize=fuzzer $^ $(FUZZ_LIBS) -o $@
# A variant includes its target's source whole: rebuild when that changes.
$(FUZZ_STRUCT_TARGETS:%=$(FZ)/lf/obj/fuzz/struct/%.o): $(FZ)/lf/obj/fuzz/struct/%_struct.o: fuzz/%.c

fuzz-struct: $(FUZZ_LF_BINS) $(FUZZ_STRUCT_BINS)
	@$(foreach t,$(FUZZ_STRUCT_TARGETS),$(call fuzz_run,$(t:_struct=),$(FUZZ_STRUCT_SECONDS),$(FZ)/struct,1) && \
	  $(call fuzz_run,$(t),$(FUZZ_STRUCT_SECONDS),$(FZ)/struct,1) && ) true

# ---- AFL++ --------------------------------------------------------------------
# AFL++ requires these sanitizer options (abort_on_error, symbolize=0).
AFL_ENV := AFL_SKIP_CPUFREQ=1 AFL_I_DONT_CARE_ABOUT_MISSING_CRASHES=1 AFL_NO_UI=1 \
           AFL_NO_AFFINITY=1 \
           ASAN_OPTIONS=abort_on_error=1:symbolize=0:detect_leaks=0 \
           UBSAN_OPTIONS=halt_on_error=1:abort_on_error=1:symbolize=0

fuzz-afl: $(FUZZ_AFL_BINS)
	@set -e; for td in $(foreach t,$(FUZZ_TARGETS),$(t):$(call fuzz_dict,$(t))); do \
	     t=$${td%%:*}; d=$${td#*:}; \
	     o=$(FZ)/afl/out/$$t; rm -rf $$o; mkdir -p $$o; \
	     $(AFL_ENV) afl-fuzz -V $(AFL_SECONDS) -i corpus/$$t -o $$o -x $$d \
	         -c $(FZ)/afl/$$t.cmplog -- $(FZ)/afl/$$t > $$o.log 2>&1 || { tail -n 40 $$o.log; \
	         echo "fuzz-afl: afl-fuzz failed for $$t"; exit 1; }; \
	     s=$$o/default/fuzzer_stats; \
	     crashes=$$(sed -n 's/^saved_crashes *: *//p' $$s); \
	     echo "fuzz-afl: $$t: $$(sed -n 's/^execs_done *: *//p' $$s) execs, \
	$$(sed -n 's/^execs_per_sec *: *//p' $$s) execs/s, corpus $$(sed -n 's/^corpus_count *: *//p' $$s), \
	crashes $$crashes, hangs $$(sed -n 's/^saved_hangs *: *//p' $$s)"; \
	     if [ "$$crashes" != 0 ]; then echo "fuzz-afl: crashes in $$o/default/crashes/"; exit 1; fi; \
	 done

# ---- OSS-Fuzz build, locally ----------------------------------------------------
# $SRC/keyshift is a symlink to this checkout; $OUT and $WORK are under $(B).

OSS_DIR := $(FZ)/oss-fuzz
OSS_CFLAGS := -O1 -fno-omit-frame-pointer -gline-tables-only -DFUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION \
              -fsanitize=address,undefined -fsanitize-address-use-after-scope -fsanitize=fuzzer-no-link

oss-fuzz-check:
	@set -e; rm -rf $(OSS_DIR); mkdir -p $(OSS_DIR)/src $(OSS_DIR)/out $(OSS_DIR)/work; \
	 ln -s $(CURDIR) $(OSS_DIR)/src/keyshift; \
	 echo "oss-fuzz-check: CC=$(CLANG) CXX=$(CLANGXX)"; \
	 env CC=$(CLANG) CXX=$(CLANGXX) CFLAGS="$(OSS_CFLAGS)" CXXFLAGS="$(OSS_CFLAGS)" \
	     LIB_FUZZING_ENGINE=-fsanitize=fuzzer SRC=$(CURDIR)/$(OSS_DIR)/src \
	     OUT=$(CURDIR)/$(OSS_DIR)/out WORK=$(CURDIR)/$(OSS_DIR)/work \
	     bash fuzz/oss-fuzz/build.sh > $(OSS_DIR)/build.log 2>&1 || { tail -n 40 $(OSS_DIR)/build.log; \
	     echo "oss-fuzz-check: build.sh failed"; exit 1; }; \
	 repo=$$(sed -n 's/^ARG KEYSHIFT_REPO=//p' fuzz/oss-fuzz/Dockerfile); \
	 main=$$(sed -n 's/^main_repo: *"\(.*\)"/\1/p' fuzz/oss-fuzz/project.yaml); \
	 [ -n "$$repo" ] && [ "$$repo" = "$$main" ] || { \
	     echo "oss-fuzz-check: Dockerfile's KEYSHIFT_REPO default ($$repo) is not project.yaml's main_repo ($$main)"; exit 1; }; \
	 out=$(OSS_DIR)/out; \
	 built=$$(cd $$out && for f in fuzz_*; do [ -f "$$f" ] && [ -x "$$f" ] && echo "$$f"; done | sort | xargs); \
	 want=$$(echo $(FUZZ_TARGETS) | tr ' ' '\n' | sort | xargs); \
	 files=$$(for f in fuzz/fuzz_*.c; do basename $$f .c; done | sort | xargs); \
	 [ "$$built" = "$$want" ] && [ "$$files" = "$$want" ] || { \
	     echo "oss-fuzz-check: targets differ: fuzz/*.c: $$files; built: $$built; FUZZ_TARGETS: $$want"; exit 1; }; \
	 for td in $(foreach t,$(FUZZ_TARGETS),$(t):$(call fuzz_dict,$(t))); do \
	     t=$${td%%:*}; d=$${td#*:}; \
	     for f in $$t $${t}_seed_corpus.zip $$t.dict $$t.options; do \
	         [ -s $$out/$$f ] || { echo "oss-fuzz-check: missing $$out/$$f"; exit 1; }; \
	     done; \
	     [ -x $$out/$$t ] || { echo "oss-fuzz-check: $$out/$$t not executable"; exit 1; }; \
	     cmp -s $$d $$out/$$t.dict || { echo "oss-fuzz-check: $$out/$$t.dict is not $$d"; exit 1; }; \
	     grep -q '^\[libfuzzer\]' $$out/$$t.options && grep -q '^max_len *= *[0-9]' $$out/$$t.options && \
	         grep -q "^dict *= *$$t.dict" $$out/$$t.options || { echo "oss-fuzz-check: bad $$t.options"; exit 1; }; \
	     n=$$(unzip -Z1 $$out/$${t}_seed_corpus.zip | wc -l); \
	     (cd $$out && ./$$t -runs=2000 -dict=$$t.dict -max_len=4096 >$$t.log 2>&1) || \
	         { tail -n 30 $$out/$$t.log; echo "oss-fuzz-check: $$t does not run"; exit 1; }; \
	     echo "oss-fuzz-check: $$t ok ($$n seeds in zip, dict $$d, options, 2000 runs)"; \
	 done
