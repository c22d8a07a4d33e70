# keyshift -- envelope encryption format and key-rotation toolkit.
#
#   make            build the libraries, the CLI, keyshift-kms-aws and
#                   keyshift-demo-app (release, hardened)
#   make test       everything CI checks: deps, -Werror build (every
#                   binary first, JOBS at a time), cmocka unit tests under
#                   ASan+UBSan then the threaded ones under TSan, CLI tests
#                   under ASan+UBSan, exported-symbol check, man-lint and
#                   completion-test, corpus replay,
#                   coverage gates, fuzz smoke gated on fuzz/gates.txt, and
#                   the negative canary (make prove and make mutate run
#                   nightly)
#   make cli-test   the CLI tests (tests/cli_*.sh) against the ASan+UBSan
#                   CLI, the PostgreSQL ones (tests/cli_migrate_pg_test.sh,
#                   tests/cli_migrate_workers_pg_test.sh,
#                   tests/cli_keys_pg_test.sh,
#                   tests/cli_rollout_lifecycle_pg_test.sh,
#                   tests/cli_every_service_test.sh)
#                   on a throw-away cluster of their own
#   make kms-aws-test  the AWS KMS client (tools/kms-aws/) and the
#                   keyshift-kms-aws plugin against moto_server (also run
#                   by cli-test)
#   make unit       the cmocka unit tests (tests/test_*.c) under ASan+UBSan
#                   (the AEAD's tests again on each engine forced),
#                   with the fault-injection sweeps (tests/test_faults.c)
#                   and the PostgreSQL store's tests on a throw-away
#                   cluster (tests/pg_cluster.sh)
#   make tsan       the library and the threaded unit tests (TSAN_TESTS:
#                   test_fork and test_threads with the OpenSSL AEAD engine
#                   forced, test_crypto, test_migrate,
#                   test_rollout, test_rowstore_sqlite, test_pkcs11,
#                   test_plugin, test_rowstore_pg, test_rollout_pg_life,
#                   test_workers_pg) under clang's TSan, built in
#                   build/tsan/, halting on the first report
#   make fuzz       run each libFuzzer target (FUZZ_SECONDS, default 60)
#   make fuzz-afl   run each target under afl-fuzz -V 20
#   make coverage   llvm-cov over the committed corpus; each file's figures,
#                   gates on the parsers (95/90) and the stateful code
#   make bench      JSON lines, each against a baseline in the same run:
#                   parser vs nanopb, seal/open vs raw AEAD, migration vs
#                   raw SQLite (rollback journal; WAL at synchronous FULL
#                   and NORMAL), HSM and KMS plugin vs the local keyring
#                   (then make go-bench: the Go package vs crypto/cipher,
#                   and make py-bench: the Python package vs pyca's AESGCM)
#   make go-test    the Go package (tools/go/keyshift): vet, go test -race,
#                   its fuzz seeds and a 5 s fuzz smoke, the README example,
#                   its agent client (agent/) also without cgo;
#                   vet and test of the example service (tools/go/example)
#   make demo       encrypt, rotate and verify a 100,000-row sample database
#   make py-test    the Python package's tests (tools/python/tests) under
#                   Debian's python3 (pytest) and the python3 on PATH
#   make man-lint   mandoc -T lint over the manual pages (docs/man/), then
#                   tests/man_help_test.py: every --help option in its page
#                   and the other way round (also run by make test)
#   make prom-test  the Prometheus text files, alerting rules and dashboard
#   make completion-test  the bash completion (tools/completion/keyshift)
#                   driven through COMPREPLY (also run by make test)
#   make install    PREFIX=/usr/local DESTDIR= (headers, libs, CLI,
#                   keyshift-kms-aws, keyshift.pc, the Python package, the
#                   manual pages in MANDIR, the bash completion in
#                   BASHCOMPDIR, docs/*.md and tools/prometheus/ in DOCDIR,
#                   the agent's systemd units in SYSTEMDUNITDIR, not enabled)
#   make clean

.DEFAULT_GOAL := all
.SUFFIXES:
.DELETE_ON_ERROR:

PREFIX  ?= /usr/local
DESTDIR ?=
LIBDIR  ?= $(PREFIX)/lib
INCDIR  ?= $(PREFIX)/include
BINDIR  ?= $(PREFIX)/bin
PCDIR   ?= $(LIBDIR)/pkgconfig
MANDIR  ?= $(PREFIX)/share/man
DOCDIR  ?= $(PREFIX)/share/doc/keyshift
BASHCOMPDIR ?= $(PREFIX)/share/bash-completion/completions
SYSTEMDUNITDIR ?= $(PREFIX)/lib/systemd/system

CC      ?= cc
CLANG   ?= clang-14
PYTHON_DEBIAN := /usr/bin/python3
NANOPB_GEN    := /usr/bin/nanopb_generator.py

B := build

# The version's one source: KS_VERSION_MAJOR, _MINOR and _PATCH in
# include/keyshift/common.h (KS_VERSION_STRING is made from them there).
VERSION := $(shell awk '$$1 ~ /define$$/ && $$2 ~ /^KS_VERSION_(MAJOR|MINOR|PATCH)$$/ { v[$$2] = $$3 } \
             END { print v["KS_VERSION_MAJOR"] "." v["KS_VERSION_MINOR"] "." v["KS_VERSION_PATCH"] }' \
             include/keyshift/common.h)
SOMAJOR := $(firstword $(subst ., ,$(VERSION)))

WARN    := -std=c11 -Wall -Wextra -Werror -Wshadow -Wstrict-prototypes -Wmissing-prototypes \
           -Wformat=2 -Wvla -Wpointer-arith -Wcast-qual -Wundef
# Link-time optimisation of the release build: a seal or an open runs
# through crypto.c, aead.c, dek_writer.c, shard.c, ctx.c and the parser,
# and only the link can inline across them (docs/PERFORMANCE.md,
# "Single-thread overhead").  Fat objects keep libkeyshift.a usable by a link
# without -flto; the links pass $(WARN) too, so that what the link-time
# compiler finds fails the build as the compile would.
LTO     := -flto=auto -ffat-lto-objects
LTO_LD  := $(WARN) -O2 -flto=auto
HARDEN  := -O2 -DNDEBUG -D_FORTIFY_SOURCE=2 -fstack-protector-strong -fstack-clash-protection -fPIC \
           -fvisibility=hidden
LDHARDEN := -Wl,-z,relro,-z,now,-z,noexecstack
# PKCS#11 (migrate/keys/provider_pkcs11.c): p11-kit's pkcs11.h and its URI parser.
P11_CFLAGS := $(shell pkg-config --cflags p11-kit-1 2>/dev/null)
P11_LIBS   := $(shell pkg-config --libs p11-kit-1 2>/dev/null)
# jansson (migrate/keys/plugin_proto.c): the KMS plugin protocol's JSON reader.
JANSSON_LIBS := $(shell pkg-config --libs jansson 2>/dev/null)
# libpq (migrate/store/pg/): the PostgreSQL row store.
PQ_CFLAGS := $(shell pkg-config --cflags libpq 2>/dev/null)
PQ_LIBS   := $(shell pkg-config --libs libpq 2>/dev/null || echo -lpq)
INC     := -Iinclude $(P11_CFLAGS) $(PQ_CFLAGS)
SAN     := -O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=all
# Test builds compile in the test hooks (e.g. docs/keyring.md [K-FILE-6]).
SAN_HOOKS := -DKS_TEST_HOOKS

# The library.  Nothing under parser/ may include libsodium or SQLite.
LIB_SRCS := format/format.c format/encode.c format/aad.c format/text.c parser/envelope.c parser/text.c $(sort $(wildcard migrate/*.c migrate/*/*.c migrate/*/*/*.c))
LIB_HDRS := $(wildcard include/keyshift/*.h) format/rules.h parser/cursor.h $(wildcard migrate/*.h migrate/*/*.h migrate/*/*/*.h)
# libsodium, SQLite (and threads) for migrate/; parser/ and format/ need none;
# OpenSSL's libcrypto for the payload AEAD's second engine (migrate/crypto/aead.c);
# p11-kit and dlopen for the pkcs11 provider; libpq for the PostgreSQL store.
LIB_LIBS := -lsodium -lcrypto -lsqlite3 $(PQ_LIBS) $(JANSSON_LIBS) $(P11_LIBS) -ldl -pthread
# The agent behind `keyshift serve` (tools/agent/, docs/agent.md), linked
# into the CLI with libmicrohttpd and libsystemd (sd_listen_fds).
AGENT_SRCS := $(wildcard tools/agent/*.c)
AGENT_LIBS := $(shell pkg-config --libs libmicrohttpd libsystemd 2>/dev/null)
# The helpers every command shares (tools/cli/cli.h), which the demo
# application links too: messages and options, input, keys, databases.
CLI_LIB_SRCS := tools/cli/cli.c tools/cli/cli_input.c tools/cli/cli_keys.c tools/cli/cli_db.c
CLI_SRCS := tools/cli/keyshift.c $(CLI_LIB_SRCS) tools/cli/throttle.c tools/cli/textfile.c $(wildcard tools/cli/cmd_*.c) $(AGENT_SRCS)
CLI_HDRS := $(wildcard tools/*/*.h)

REL_OBJS := $(LIB_SRCS:%.c=$(B)/rel/%.o)
SAN_OBJS := $(LIB_SRCS:%.c=$(B)/san/%.o)

STATIC  := $(B)/lib/libkeyshift.a
SHARED  := $(B)/lib/libkeyshift.so.$(VERSION)
SONAME  := libkeyshift.so.$(SOMAJOR)
CLI     := $(B)/bin/keyshift
CLI_SAN := $(B)/san/bin/keyshift
# An application process for rollout tests and demos (not installed): the
# logic in demo_app.c, its SQL behind tools/demo/demo_app.h (SQLite, PostgreSQL).
DEMO_APP_SRCS := tools/demo/demo_app.c tools/demo/demo_app_sqlite.c tools/demo/demo_app_pg.c $(CLI_LIB_SRCS)
DEMO_APP     := $(B)/bin/keyshift-demo-app
DEMO_APP_SAN := $(B)/san/bin/keyshift-demo-app
# The Go example service (tools/go/example; not installed; see the Go section).
GO_EXAMPLE   := $(B)/bin/keyshift-go-example
# The AWS KMS plugin (a program of its own, installed; see its section).
KMS_AWS     := $(B)/bin/keyshift-kms-aws
KMS_AWS_SAN := $(B)/san/bin/keyshift-kms-aws

.PHONY: go-test go-bench
.PHONY: all deps test test-build unit tsan cli-test kms-aws-test install-test symbols check-layout fuzz fuzz-afl fuzz-smoke fuzz-replay \
        coverage bench demo install uninstall clean

all: $(STATIC) $(SHARED) $(CLI) $(DEMO_APP) $(KMS_AWS)

deps:
	@tools/deps.sh

# ---- release build ------------------------------------------------------

$(B)/rel/%.o: %.c $(LIB_HDRS) $(CLI_HDRS)
	@mkdir -p $(dir $@)
	$(CC) $(WARN) $(HARDEN) $(LTO) $(INC) $(CLI_DEFS) $(CFLAGS) -c $< -o $@

# The CLI's --help names where `make install' puts docs/ (DOCDIR): cli.c
# is rebuilt when DOCDIR changes (the stamp is rewritten only then).
$(B)/docdir.value: FORCE
	@mkdir -p $(dir $@)
	@if [ "$$(cat $@ 2>/dev/null)" != '$(DOCDIR)' ]; then printf '%s\n' '$(DOCDIR)' > $@; fi
$(B)/rel/tools/cli/cli.o $(B)/san/tools/cli/cli.o: $(B)/docdir.value
$(B)/rel/tools/cli/cli.o $(B)/san/tools/cli/cli.o: CLI_DEFS = -DKS_DOCDIR='"$(DOCDIR)"'

$(STATIC): $(REL_OBJS)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

# -z nodelete: the library registers a thread-exit destructor and atfork
# handlers (migrate/crypto/thread_index.c, ctx.c), so dlclose() must never
# unmap its code while they can still run.
$(SHARED): $(REL_OBJS) tools/libkeyshift.map
	@mkdir -p $(dir $@)
	$(CC) -shared -Wl,-soname,$(SONAME) -Wl,--version-script=tools/libkeyshift.map -Wl,-z,nodelete $(LDHARDEN) $(LTO_LD) \
	    $(LDFLAGS) $(REL_OBJS) $(LIB_LIBS) -o $@
	ln -sf $(notdir $@) $(B)/lib/$(SONAME)
	ln -sf $(SONAME) $(B)/lib/libkeyshift.so

$(CLI): $(CLI_SRCS:%.c=$(B)/rel/%.o) $(STATIC)
	@mkdir -p $(dir $@)
	$(CC) -pie $(LDHARDEN) $(LTO_LD) $(LDFLAGS) $^ $(LIB_LIBS) -o $@ $(AGENT_LIBS)

$(DEMO_APP): $(DEMO_APP_SRCS:%.c=$(B)/rel/%.o) $(STATIC)
	@mkdir -p $(dir $@)
	$(CC) -pie $(LDHARDEN) $(LTO_LD) $(LDFLAGS) $^ $(LIB_LIBS) -o $@

# ---- sanitizer build (tests) --------------------------------------------

$(B)/san/%.o: %.c $(LIB_HDRS) $(CLI_HDRS)
	@mkdir -p $(dir $@)
	$(CC) $(WARN) $(SAN) $(SAN_HOOKS) $(INC) $(CLI_DEFS) -c $< -o $@

$(CLI_SAN): $(CLI_SRCS:%.c=$(B)/san/%.o) $(SAN_OBJS)
	@mkdir -p $(dir $@)
	$(CC) $(SAN) $^ $(LIB_LIBS) $(AGENT_LIBS) -o $@

$(DEMO_APP_SAN): $(DEMO_APP_SRCS:%.c=$(B)/san/%.o) $(SAN_OBJS)
	@mkdir -p $(dir $@)
	$(CC) $(SAN) $^ $(LIB_LIBS) -o $@

# ---- nanopb: the independent second decoder (tests, fuzzing, bench) -----
# Generated at build time from format/envelope.proto and its .options,
# with Debian's python (the pyenv python3 on PATH lacks its modules).

NANOPB_C := $(B)/gen/envelope.pb.c
NANOPB_H := $(B)/gen/envelope.pb.h
$(NANOPB_C) $(NANOPB_H) &: format/envelope.proto format/envelope.options
	@mkdir -p $(B)/gen
	$(PYTHON_DEBIAN) $(NANOPB_GEN) -q -I format -D $(B)/gen format/envelope.proto

# ---- unit tests (cmocka), under ASan+UBSan ------------------------------

UNIT_SRCS := $(wildcard tests/test_*.c)
UNIT_BINS := $(UNIT_SRCS:tests/%.c=$(B)/san/tests/%)
# tests/kms_aws_driver.c is a program of its own (tests/kms_aws_test.sh);
# tests/free_scan.c is an LD_PRELOAD shim that replaces free() and
# realloc() (tests/cli_crypto_test.sh builds it), never linked into a test.
UNIT_SUPPORT := $(filter-out $(UNIT_SRCS) tests/kms_aws_driver.c tests/free_scan.c,$(wildcard tests/*.c))

$(B)/san/tests/%: tests/%.c $(UNIT_SUPPORT) $(SAN_OBJS) $(LIB_HDRS) $(wildcard tests/*.h) $(NANOPB_H)
	@mkdir -p $(dir $@)
	$(CC) $(WARN) $(SAN) $(INC) $(UNIT_EXTRA_CFLAGS) -I$(B)/gen -Iformat -Iparser $< $(UNIT_SUPPORT) $(UNIT_EXTRA) $(SAN_OBJS) \
	    $(NANOPB_C) -lprotobuf-nanopb -lcmocka $(LIB_LIBS) $(UNIT_EXTRA_LIBS) -o $@

# Unit tests of code outside the library: its sources join that test's
# link only (UNIT_EXTRA, UNIT_EXTRA_CFLAGS, UNIT_EXTRA_LIBS are
# target-specific).
KMS_AWS_DIR  := tools/kms-aws
SIGV4_SRCS   := $(KMS_AWS_DIR)/sigv4.c
$(B)/san/tests/test_sigv4: UNIT_EXTRA := $(SIGV4_SRCS)
$(B)/san/tests/test_sigv4: $(SIGV4_SRCS) $(KMS_AWS_DIR)/sigv4.h
# The agent's policy file (tools/agent/policy.c, docs/agent-policy.md).
AGENT_POLICY_SRCS := tools/agent/policy.c tools/agent/policy_load.c
$(B)/san/tests/test_agent_policy: UNIT_EXTRA := $(AGENT_POLICY_SRCS)
$(B)/san/tests/test_agent_policy: UNIT_EXTRA_CFLAGS := $(SAN_HOOKS)
$(B)/san/tests/test_agent_policy: $(AGENT_POLICY_SRCS) tools/agent/policy.h

# ---- the AWS KMS client of keyshift-kms-aws (tools/kms-aws/) ------------
# Checked against moto_server, the AWS emulator, by tests/kms_aws_test.sh
# through a driver program (under ASan+UBSan, not installed).
KMS_AWS_SRCS := $(SIGV4_SRCS) $(KMS_AWS_DIR)/kms.c $(KMS_AWS_DIR)/kms_config.c $(KMS_AWS_DIR)/kms_ini.c \
                $(KMS_AWS_DIR)/creds.c $(KMS_AWS_DIR)/creds_parse.c
KMS_AWS_HDRS := $(wildcard $(KMS_AWS_DIR)/*.h)
KMS_AWS_CFLAGS := $(shell pkg-config --cflags libcurl jansson 2>/dev/null)
KMS_AWS_LIBS := -lsodium $(shell pkg-config --libs libcurl jansson 2>/dev/null) -pthread
KMS_AWS_DRIVER := $(B)/san/bin/kms_aws_driver
$(B)/san/tests/test_kms_aws: UNIT_EXTRA := $(KMS_AWS_SRCS)
$(B)/san/tests/test_kms_aws: UNIT_EXTRA_CFLAGS := $(KMS_AWS_CFLAGS)
$(B)/san/tests/test_kms_aws: UNIT_EXTRA_LIBS := $(KMS_AWS_LIBS)
$(B)/san/tests/test_kms_aws: $(KMS_AWS_SRCS) $(KMS_AWS_HDRS)

$(KMS_AWS_DRIVER): tests/kms_aws_driver.c $(KMS_AWS_SRCS) $(KMS_AWS_HDRS)
	@mkdir -p $(dir $@)
	$(CC) $(WARN) $(SAN) $(KMS_AWS_CFLAGS) tests/kms_aws_driver.c \
	    $(KMS_AWS_SRCS) $(KMS_AWS_LIBS) -o $@

# ---- keyshift-kms-aws, the AWS KMS plugin (installed) --------------------
# A program of its own: the client above and the plugin's files, linked
# with libsodium, libcurl and jansson only (nothing of the library but
# include/keyshift/common.h's version).  Release flags as the CLI's; the
# sanitizer build is the one the tests drive.
# Its --help names DOCDIR as the CLI's does (KS_DOCDIR, the docdir stamp).
KMS_AWS_PLUGIN_SRCS := $(KMS_AWS_SRCS) $(KMS_AWS_DIR)/plugin_main.c $(KMS_AWS_DIR)/plugin_args.c \
    $(KMS_AWS_DIR)/plugin_msg.c
KMS_AWS_DEFS = -DKS_DOCDIR='"$(DOCDIR)"'
$(KMS_AWS): $(KMS_AWS_PLUGIN_SRCS) $(KMS_AWS_HDRS) include/keyshift/common.h $(B)/docdir.value
	@mkdir -p $(dir $@)
	$(CC) $(WARN) $(HARDEN) -Iinclude $(KMS_AWS_CFLAGS) $(KMS_AWS_DEFS) $(CFLAGS) -pie $(LDHARDEN) $(LDFLAGS) \
	    $(KMS_AWS_PLUGIN_SRCS) $(KMS_AWS_LIBS) -o $@

$(KMS_AWS_SAN): $(KMS_AWS_PLUGIN_SRCS) $(KMS_AWS_HDRS) include/keyshift/common.h $(B)/docdir.value
	@mkdir -p $(dir $@)
	$(CC) $(WARN) $(SAN) -Iinclude $(KMS_AWS_CFLAGS) $(KMS_AWS_DEFS) $(KMS_AWS_PLUGIN_SRCS) $(KMS_AWS_LIBS) -o $@

kms-aws-test: cli-run-kms_aws_test cli-run-kms_aws_plugin_test

export UBSAN_OPTIONS := print_stacktrace=1:halt_on_error=1
export ASAN_OPTIONS := detect_leaks=1:abort_on_error=1:strict_string_checks=1

# The tests of the payload AEAD run once more on each of its two engines
# forced (KS_AEAD_ENGINE, migrate/crypto/aead.h), so every crypto test and
# vector passes through OpenSSL and through libsodium, not only where the
# size rule sends it.
AEAD_ENGINE_TESTS := test_crypto test_crypto_vectors test_spec_vectors test_open_memo

unit: $(UNIT_BINS)
	@set -e; for t in $(UNIT_BINS); do echo "== $$t"; KS_SPEC=docs/format.md $$t; done
	@set -e; for e in sodium openssl; do for t in $(AEAD_ENGINE_TESTS); do 	    echo "== $(B)/san/tests/$$t (KS_AEAD_ENGINE=$$e)"; 	    KS_AEAD_ENGINE=$$e KS_SPEC=docs/format.md $(B)/san/tests/$$t; done; done

# ---- thread sanitizer (make tsan) ---------------------------------------
# The library and the unit tests that run threads (or fork while threads
# run) rebuilt with clang's ThreadSanitizer; cmocka, libsodium and SQLite
# stay uninstrumented.  halt_on_error: the first data race or lock-order
# inversion fails the run.

TSAN      := -O1 -g -fno-omit-frame-pointer -fsanitize=thread
TSAN_OBJS := $(LIB_SRCS:%.c=$(B)/tsan/%.o)
# make tsan runs TSAN_TESTS; the PostgreSQL ones (a cluster each, the
# longest under TSan) run in the nightly workflow (make tsan-pg), which
# runs both.
TSAN_TESTS := test_app test_fork test_threads test_crypto test_migrate test_rollout test_rowstore_sqlite test_pkcs11 test_plugin
TSAN_PG_TESTS := test_rowstore_pg test_rollout_pg_life test_workers_pg
TSAN_BINS := $(TSAN_TESTS:%=$(B)/tsan/tests/%)
TSAN_PG_BINS := $(TSAN_PG_TESTS:%=$(B)/tsan/tests/%)
.SECONDARY: $(TSAN_OBJS)
TSAN_RUN_OPTIONS := halt_on_error=1:second_deadlock_stack=1

$(B)/tsan/%.o: %.c $(LIB_HDRS)
	@mkdir -p $(dir $@)
	$(CLANG) $(WARN) $(TSAN) $(SAN_HOOKS) $(INC) -c $< -o $@

$(B)/tsan/tests/%: tests/%.c $(UNIT_SUPPORT) $(TSAN_OBJS) $(LIB_HDRS) $(wildcard tests/*.h) $(NANOPB_H)
	@mkdir -p $(dir $@)
	$(CLANG) $(WARN) $(TSAN) $(INC) -I$(B)/gen -Iformat -Iparser $< $(UNIT_SUPPORT) $(TSAN_OBJS) \
	    $(NANOPB_C) -lprotobuf-nanopb -lcmocka $(LIB_LIBS) -o $@

# The threaded tests' messages are short, which the size rule gives to
# libsodium: these run with the OpenSSL engine forced instead, so that its
# per-thread state (a shard's EVP contexts) is raced and forked under TSan.
TSAN_OPENSSL_TESTS := test_threads test_fork

# $(call tsan_run,BINS): each of BINS, the OpenSSL engine forced for
# TSAN_OPENSSL_TESTS.
define tsan_run
	@set -e; for t in $(1); do echo "== $$t"; \
	    engine=; case " $(TSAN_OPENSSL_TESTS) " in *" $$(basename $$t) "*) engine=openssl;; esac; \
	    KS_AEAD_ENGINE=$$engine KS_SPEC=docs/format.md TSAN_OPTIONS=$(TSAN_RUN_OPTIONS) $$t; done
endef

.PHONY: tsan-pg
tsan: $(TSAN_BINS)
	$(call tsan_run,$(TSAN_BINS))
tsan-pg: $(TSAN_PG_BINS)
	$(call tsan_run,$(TSAN_PG_BINS))

# The CLI and integration scripts, about longest first under ASan+UBSan
# on the 2-core machine (cli_agent_test, with its 30 s load, among the
# first), so that make test's make -j2 cli-test keeps both cores
# busy to the end: each script starts its own servers (PostgreSQL on a
# Unix socket in its own directory, moto_server and the fakes on a free
# port, SoftHSM2 tokens in its own directory), so any two may run side
# by side.  Every script gets every variable; each reads only its own.
CLI_TESTS := cli_plugin_test cli_every_service_test cli_agent_test cli_every_service_text_test \
             cli_spec_decryptor_test cli_every_service_agent_test \
             cli_migrate_workers_pg_test cli_rollout_lifecycle_test cli_migrate_pg_test \
             cli_rollout_lifecycle_pg_test kms_aws_plugin_test cli_kms_aws_test cli_pkcs11_test \
             kms_aws_test cli_rollout_test cli_migrate_test cli_crypto_test cli_providers_test \
             cli_keys_pg_test cli_test cli_migrate_faults_test
CLI_TEST_ENV = KEYSHIFT=$(CLI_SAN) KEYSHIFT_REL=$(CLI) DEMO_APP=$(DEMO_APP_SAN) KMS_AWS_PLUGIN=$(KMS_AWS_SAN) \
               KMS_AWS_DRIVER=$(KMS_AWS_DRIVER) GO_EXAMPLE=$(GO_EXAMPLE) \
               PY_EXAMPLE=$(CURDIR)/tools/python/example_service.py PY_EXAMPLE_PYTHON=$(PYTHON_DEBIAN) \
               KEYSHIFT_LIBRARY=$(CURDIR)/$(B)/lib/$(SONAME)
# The stress test (concurrent writers against migrate run, many rounds)
# runs in the nightly workflow: make cli-run-cli_migrate_stress_test.
CLI_NIGHTLY_TESTS := cli_migrate_stress_test
CLI_TEST_RUNS := $(CLI_TESTS:%=cli-run-%)
CLI_NIGHTLY_RUNS := $(CLI_NIGHTLY_TESTS:%=cli-run-%)
.PHONY: $(CLI_TEST_RUNS) $(CLI_NIGHTLY_RUNS)

$(CLI_TEST_RUNS) $(CLI_NIGHTLY_RUNS): cli-run-%: $(CLI_SAN) $(CLI) $(DEMO_APP_SAN) $(KMS_AWS_SAN) $(KMS_AWS_DRIVER)
	@$(CLI_TEST_ENV) tests/$*.sh
# The every-service rollout (binary and text columns, and the Python
# application through the agent) also runs the Go example (and the Python
# one, on the shared library).
cli-run-cli_every_service_test cli-run-cli_every_service_text_test \
cli-run-cli_every_service_agent_test: $(GO_EXAMPLE) $(SHARED)

cli-test: $(CLI_TEST_RUNS)

# make install into a staging DESTDIR, then build against it via pkg-config.
install-test: all
	@tests/install_test.sh

# The Debian packages (debian/): built by dpkg-buildpackage from a copy of
# the tree in build/deb/, checked by lintian, unpacked with dpkg -x and run
# (tests/deb_test.sh).  make deb builds them the same way.
.PHONY: deb deb-test
deb deb-test:
	@tests/deb_test.sh $(B) $(VERSION)

# Only ks_* may be exported by the shared library, and
# debian/libkeyshift0.symbols lists exactly those.
symbols: $(SHARED)
	@bad=$$(nm -D --defined-only $(SHARED) | awk '{print $$3}' | grep -v '^ks_' | grep -v '^KEYSHIFT_0$$' || true); \
	 if [ -n "$$bad" ]; then echo "symbols: exported non-ks_ symbols: $$bad"; exit 1; fi; \
	 echo "symbols: $$(nm -D --defined-only $(SHARED) | grep -c ' ks_') exported, all ks_*"
	@nm -D --defined-only $(SHARED) | awk '$$3 ~ /^ks_/ { sub(/@.*/, "", $$3); print $$3 }' | sort > $(B)/symbols.lib; \
	 awk '/^ ks_/ { sub(/@.*/, "", $$1); print $$1 }' debian/libkeyshift0.symbols | sort > $(B)/symbols.deb; \
	 if ! cmp -s $(B)/symbols.lib $(B)/symbols.deb; then \
	     echo "symbols: debian/libkeyshift0.symbols differs from the library's exports (< library, > file):"; \
	     diff $(B)/symbols.lib $(B)/symbols.deb | grep '^[<>]'; exit 1; fi

# Nothing under parser/ includes libsodium or SQLite (DEVELOPERS layout rule).
# The layering of migrate/ (docs/rollout.md "Architecture"): a lower layer
# never includes a higher one.  health/ (pure data) is below crypto/ and
# engine/, which reach a database only through include/keyshift/rowstore.h;
# rollout/ reaches its own tables only through the rollout-store interface
# (include/keyshift/rollout_store.h), never a database's internals
# (migrate/store/<db>/, the SQLite helpers of migrate/store/, SQLite
# itself); migrate/store/ never includes migrate/rollout/.  migrate/app/ (the
# application API, include/keyshift/app.h) is the top: nothing else includes it.
check-layout: $(REL_OBJS)
	@if grep -rnE '#\s*include\s*[<"](sodium|sqlite3)' parser/; then \
	    echo "check-layout: parser/ must not include libsodium or SQLite"; exit 1; fi
	@if grep -rnE '#\s*include\s*"[^"]*(rollout|store|crypto|engine|keys)/' migrate/health/ \
	    || grep -rnE '#\s*include\s*[<"](sodium|sqlite3)' migrate/health/; then \
	    echo "check-layout: migrate/health/ must include nothing but public headers"; exit 1; fi
	@if grep -rnE '#\s*include\s*"[^"]*(rollout|store)/' migrate/crypto/ migrate/engine/ \
	    || grep -rnE '#\s*include\s*[<"]sqlite3' migrate/crypto/ migrate/engine/; then \
	    echo "check-layout: migrate/crypto/ and migrate/engine/ must not include migrate/rollout/ or migrate/store/"; \
	    exit 1; fi
	@if grep -rnE '#\s*include\s*"[^"]*store/' migrate/rollout/ \
	    || grep -rnE '#\s*include\s*[<"]sqlite3' migrate/rollout/; then \
	    echo "check-layout: migrate/rollout/ reaches its tables only through keyshift/rollout_store.h"; \
	    exit 1; fi
	@if grep -rnE '#\s*include\s*"[^"]*rollout/' migrate/store/; then \
	    echo "check-layout: migrate/store/ must not include migrate/rollout/"; exit 1; fi
	@if grep -rnE '#\s*include\s*([<"]keyshift/app\.h|"[^"]*app/)' parser/ format/ \
	    $$(ls -d migrate/*/ | grep -v '^migrate/app/$$') migrate/*.c migrate/*.h; then \
	    echo "check-layout: only migrate/app/ (the top layer) includes keyshift/app.h"; exit 1; fi
	@bad=$$(nm -u $(filter $(B)/rel/migrate/rollout/%,$(REL_OBJS)) \
	    | awk '$$1 == "U" && $$2 ~ /^(sqlite3_|ks_sqlite_|ks_rsql_)/ { print $$2 }' | sort -u); \
	 if [ -n "$$bad" ]; then \
	     echo "check-layout: migrate/rollout/ calls a database directly:" $$bad; exit 1; fi
	@nm -u $(filter $(B)/rel/migrate/crypto/% $(B)/rel/migrate/engine/% $(B)/rel/migrate/health/%,$(REL_OBJS)) \
	    | awk '$$1 == "U" { print $$2 }' | sort -u > $(B)/layout-low.txt; \
	 nm --defined-only $(filter $(B)/rel/migrate/rollout/% $(B)/rel/migrate/store/%,$(REL_OBJS)) \
	    | awk 'NF == 3 && $$2 ~ /[TDBR]/ { print $$3 }' | sort -u > $(B)/layout-high.txt; \
	 bad=$$(comm -12 $(B)/layout-low.txt $(B)/layout-high.txt); \
	 if [ -n "$$bad" ]; then \
	     echo "check-layout: migrate/crypto/, engine/ or health/ call into migrate/rollout/ or store/:" $$bad; exit 1; fi

# ---- manual pages and bash completion ------------------------------------
# docs/man/ holds the mdoc sources; @DOCDIR@ in them becomes DOCDIR when
# they are installed.  man-lint lints the pages as installed (in
# build/man, with its own mandoc.db so that every .Xr between them
# resolves), then checks them against every --help.  completion-test
# drives tools/completion/keyshift through bash-completion and checks its
# words against every --help.  A few seconds each.

MAN_SRCS := $(sort $(wildcard docs/man/*.[1-9]))
MAKEWHATIS := $(firstword $(wildcard /usr/sbin/makewhatis /usr/bin/makewhatis) makewhatis)
.PHONY: man-lint completion-test

man-lint: $(CLI) $(KMS_AWS)
	@rm -rf $(B)/man
	@for p in $(MAN_SRCS); do d=$(B)/man/man$${p##*.}; mkdir -p $$d; \
	     sed 's|@DOCDIR@|$(DOCDIR)|g' $$p > $$d/$${p##*/} || exit 1; done
	@$(MAKEWHATIS) $(B)/man
	@out=$$(mandoc -T lint -W style -M $(B)/man $(B)/man/man*/* 2>&1); \
	 if [ -n "$$out" ]; then echo "$$out"; echo "man-lint: mandoc -T lint is not clean"; exit 1; fi
	@echo "man-lint: $(words $(MAN_SRCS)) pages, mandoc -T lint clean"
	@$(PYTHON_DEBIAN) tests/man_help_test.py $(CLI) $(KMS_AWS) docs/man

completion-test: $(CLI) $(KMS_AWS)
	@KEYSHIFT_REL=$(CLI) KMS_AWS=$(KMS_AWS) PYTHON_DEBIAN=$(PYTHON_DEBIAN) tests/completion_test.sh

# prom-test: the Prometheus text files of `rollout metrics --textfile` and
# `migrate run --textfile` (atomic, accepted by promtool check metrics),
# the alerting rules (promtool check rules, promtool test rules) and the
# dashboard (tests/dashboard_check.py).  docs/prometheus.md.  A few seconds.
.PHONY: prom-test
prom-test: $(CLI)
	@KEYSHIFT=$(CLI) PYTHON_DEBIAN=$(PYTHON_DEBIAN) tests/prom_test.sh

# ---- fuzzing (fuzz/fuzz.mk) ---------------------------------------------
include fuzz/fuzz.mk
include tools/mutate.mk
include tools/prove.mk

# ---- the Go package (tools/go/keyshift; docs/embedding.md "From Go") -------
# cgo finds the library through pkg-config: an uninstalled keyshift.pc in
# build/pkgconfig points at build/lib (with an rpath) and include/.  No
# module proxy: the package uses the standard library only.
GO_ENV = GOFLAGS=-mod=mod GOPROXY=off GOCACHE=$(CURDIR)/$(B)/go-cache GOPATH=$(CURDIR)/$(B)/go-path \
         PKG_CONFIG_PATH=$(CURDIR)/$(B)/pkgconfig KEYSHIFT_CLI=$(CURDIR)/$(CLI)
$(B)/pkgconfig/keyshift.pc: $(B)/keyshift.pc.values
	@mkdir -p $(dir $@)
	printf '%s\n' 'Name: keyshift' 'Description: keyshift, uninstalled (build tree)' 'Version: $(VERSION)' \
	    'Libs: -L$(CURDIR)/$(B)/lib -Wl,-rpath,$(CURDIR)/$(B)/lib -lkeyshift' 'Cflags: -I$(CURDIR)/include' > $@

# The example service (tools/go/example, docs/embedding.md "The example
# services"): a module of its own, so that the package keeps to the standard
# library, with Debian's SQL drivers by replace lines (tools/deps.sh).
$(GO_EXAMPLE): tools/go/example/main.go tools/go/example/go.mod $(wildcard tools/go/keyshift/*.go tools/go/keyshift/ksapi/*.go) \
               tools/go/keyshift/ksgo.c tools/go/keyshift/ksgo.h $(SHARED) $(B)/pkgconfig/keyshift.pc
	@mkdir -p $(dir $@)
	cd tools/go/example && $(GO_ENV) go build -o $(CURDIR)/$@ .

# vet, the tests under the race detector (they replay the fuzz seed corpus
# testdata/fuzz/FuzzParse; agent_test.go starts `keyshift serve` for the
# agent client), the agent client built and tested without cgo, the
# example's vet and test, a 5-second fuzz smoke, and the README's example.
go-test: $(SHARED) $(CLI) $(B)/pkgconfig/keyshift.pc
	cd tools/go/keyshift && $(GO_ENV) go vet ./... && $(GO_ENV) go test -race -count=1 ./...
	cd tools/go/keyshift && $(GO_ENV) CGO_ENABLED=0 go test -count=1 ./agent ./ksapi
	cd tools/go/example && $(GO_ENV) go vet ./... && $(GO_ENV) go test -count=1 ./...
	cd tools/go/keyshift && $(GO_ENV) go test -run='^$$' -fuzz=FuzzParse -fuzztime=5s .
	@$(GO_ENV) tools/go/readme_test.sh

# App.Seal/Open against crypto/cipher's AES-256-GCM, batch against a loop:
# JSON lines (tools/go/bench.sh).
go-bench: $(SHARED) $(CLI) $(B)/pkgconfig/keyshift.pc
	@$(GO_ENV) tools/go/bench.sh

# ---- benchmarks ---------------------------------------------------------

BENCH_SRCS := tools/bench/bench.c tools/bench/bench_app.c tools/bench/bench_migrate.c tools/bench/bench_hsm.c tools/bench/bench_plugin.c tools/bench/bench_remote.c tools/bench/bench_pg.c
$(B)/bin/bench: $(BENCH_SRCS) tools/bench/bench.h $(REL_OBJS) $(NANOPB_C) $(NANOPB_H)
	@mkdir -p $(dir $@)
	$(CC) $(LTO_LD) $(INC) -I$(B)/gen $(BENCH_SRCS) $(REL_OBJS) $(NANOPB_C) -lprotobuf-nanopb \
	    $(LIB_LIBS) -Wl,--wrap=malloc,--wrap=calloc,--wrap=realloc -o $@

# The agent (docs/agent.md) against ks_app_seal in the process: JSON lines.
$(B)/bin/bench_agent: tools/bench/bench_agent.c $(REL_OBJS)
	@mkdir -p $(dir $@)
	$(CC) $(LTO_LD) $(INC) $< $(REL_OBJS) $(LIB_LIBS) -o $@

# deps before anything is built, as for make test: a -j make would
# otherwise compile beside tools/deps.sh on a fresh machine.
bench: deps
	@$(MAKE) --no-print-directory $(B)/bin/bench $(B)/bin/bench_agent $(CLI)
	@$(B)/bin/bench
	@$(B)/bin/bench_agent $(CLI)
	@$(MAKE) --no-print-directory go-bench
	@$(MAKE) --no-print-directory py-bench

# ---- the Python package (tools/python/, README "From Python") ----------
# Its tests under Debian's python3 with pytest and under the python3 first
# on PATH with unittest (the same test cases), against the release library
# and CLI; its benchmark (JSON lines) under both.

PYTHON ?= $(PYTHON_DEBIAN)
PY_ENV = KEYSHIFT_LIBRARY=$(CURDIR)/$(B)/lib/$(SONAME) KEYSHIFT_CLI=$(CURDIR)/$(CLI) PYTHONDONTWRITEBYTECODE=1
.PHONY: py-test py-bench

py-test: $(SHARED) $(CLI)
	@$(PY_ENV) $(PYTHON_DEBIAN) -m pytest -q -p no:cacheprovider tools/python/tests
	@$(PY_ENV) python3 -m unittest discover -s tools/python/tests

py-bench: $(SHARED) $(CLI)
	@$(PY_ENV) $(PYTHON_DEBIAN) tools/python/bench.py
	@$(PY_ENV) python3 tools/python/bench.py

# ---- demo: docs/migration.md in one minute (DEMO_ROWS, default 100000) ----

demo: deps
	@$(MAKE) --no-print-directory all
	@tools/demo/demo.sh $(CLI)
	@tools/demo/demo_rollout.sh $(CLI) $(DEMO_APP)

# ---- the whole check ----------------------------------------------------
# deps first, in its own make so that a fresh machine has compilers before
# anything is built.

# Every binary make test runs is built first, JOBS at a time (default:
# the machine's cores).  The unit tests and the TSan tests then run beside
# each other, each suite one test at a time; the CLI scripts JOBS at a time
# (each starts servers of its own), then the Go and Python packages' tests
# side by side, then the install test alone (make install relinks
# build/lib, which the Go example links against), then the corpus replay,
# the coverage run and the Debian packages side by side (none is timed); the fuzz
# smoke runs with nothing else beside it, one target per core, since its
# exec/s floors are measured figures.  The
# fault sweep tries every sixth sqlite-malloc point here and every one in
# the nightly workflow (tests/test_faults.c, KS_FAULTS_STRIDE), which also
# runs the PostgreSQL tests under TSan (make tsan-pg), the migrate
# stress test (make cli-run-cli_migrate_stress_test) and the agent's
# test with its queue-full load at 64 clients for 30 s instead of 3
# (KS_AGENT_QUEUE_LOAD_SECONDS=30 make cli-run-cli_agent_test; its
# bounded load runs 30 s in make test too).  make
# prove (3 min 45 s on the 2-core machine, past the 3 minutes
# docs/fuzzing.md allows it in make test, "Proof") runs nightly.

JOBS ?= $(shell nproc 2>/dev/null || echo 2)
TEST_BINS = $(STATIC) $(SHARED) $(CLI) $(DEMO_APP) $(KMS_AWS) $(UNIT_BINS) $(TSAN_BINS) $(CLI_SAN) \
            $(DEMO_APP_SAN) $(KMS_AWS_SAN) $(KMS_AWS_DRIVER) $(GO_EXAMPLE) $(FUZZ_RP_BINS) $(FUZZ_CV_BINS) \
            $(FUZZ_LF_BINS) $(FZ)/lf/fuzz_canary $(FZ)/lf/fuzz_calib

test-build: $(TEST_BINS)

test:
	@tools/deps.sh
	@$(MAKE) --no-print-directory -j$(JOBS) test-build
	@$(MAKE) --no-print-directory check-layout symbols man-lint completion-test prom-test
	@$(MAKE) --no-print-directory -j$(JOBS) --output-sync=target unit tsan
	@$(MAKE) --no-print-directory -j$(JOBS) --output-sync=target cli-test
	@$(MAKE) --no-print-directory -j$(JOBS) --output-sync=target go-test py-test
	@$(MAKE) --no-print-directory install-test
	@$(MAKE) --no-print-directory -j$(JOBS) --output-sync=target fuzz-replay coverage deb-test
	@$(MAKE) --no-print-directory fuzz-smoke
	@echo "make test: all checks passed"

# ---- install ------------------------------------------------------------

# keyshift.pc holds PREFIX, LIBDIR, INCDIR and the version, which are not
# files: the stamp holds their values and is rewritten only when one of them
# changes, so a second `make install PREFIX=...` never installs a stale .pc.
PC_VALUES := $(PREFIX)|$(LIBDIR)|$(INCDIR)|$(VERSION)
# Where the Python package goes: the site-packages of $(PYTHON) for PREFIX
# (tools/python/sitedir.py).
PYDIR ?= $(shell $(PYTHON) tools/python/sitedir.py $(PREFIX))
.PHONY: FORCE
FORCE:
$(B)/keyshift.pc.values: FORCE
	@mkdir -p $(dir $@)
	@if [ "$$(cat $@ 2>/dev/null)" != '$(PC_VALUES)' ]; then printf '%s\n' '$(PC_VALUES)' > $@; fi

$(B)/keyshift.pc: tools/keyshift.pc.in include/keyshift/common.h $(B)/keyshift.pc.values
	@mkdir -p $(dir $@)
	sed -e 's|@PREFIX@|$(PREFIX)|' -e 's|@LIBDIR@|$(LIBDIR)|' -e 's|@INCDIR@|$(INCDIR)|' \
	    -e 's|@VERSION@|$(VERSION)|' $< > $@

install: all $(B)/keyshift.pc
	install -d $(DESTDIR)$(INCDIR)/keyshift $(DESTDIR)$(LIBDIR) $(DESTDIR)$(BINDIR) $(DESTDIR)$(PCDIR)
	install -m 644 include/keyshift/*.h $(DESTDIR)$(INCDIR)/keyshift/
	install -m 644 $(STATIC) $(DESTDIR)$(LIBDIR)/
	install -m 755 $(SHARED) $(DESTDIR)$(LIBDIR)/
	ln -sf $(notdir $(SHARED)) $(DESTDIR)$(LIBDIR)/$(SONAME)
	ln -sf $(SONAME) $(DESTDIR)$(LIBDIR)/libkeyshift.so
	install -m 755 $(CLI) $(KMS_AWS) $(DESTDIR)$(BINDIR)/
	install -m 644 $(B)/keyshift.pc $(DESTDIR)$(PCDIR)/
	install -d $(DESTDIR)$(PYDIR)/keyshift
	install -m 644 tools/python/keyshift/*.py tools/python/keyshift/py.typed $(DESTDIR)$(PYDIR)/keyshift/
	printf 'LIBDIR = %s\n' "'$(LIBDIR)'" > $(DESTDIR)$(PYDIR)/keyshift/_libdir.py
	install -d $(DESTDIR)$(MANDIR)/man1 $(DESTDIR)$(MANDIR)/man3 $(DESTDIR)$(MANDIR)/man5 \
	    $(DESTDIR)$(DOCDIR) $(DESTDIR)$(BASHCOMPDIR)
	for p in $(MAN_SRCS); do d=$(DESTDIR)$(MANDIR)/man$${p##*.}; \
	    sed 's|@DOCDIR@|$(DOCDIR)|g' $$p > $$d/$${p##*/} && chmod 644 $$d/$${p##*/} || exit 1; done
	ln -sf keyshift-encrypt.1 $(DESTDIR)$(MANDIR)/man1/keyshift-decrypt.1
	install -m 644 docs/*.md $(DESTDIR)$(DOCDIR)/
	install -d $(DESTDIR)$(DOCDIR)/prometheus
	install -m 644 tools/prometheus/keyshift-rules.yml tools/prometheus/keyshift-rules.test.yml \
	    tools/prometheus/keyshift-dashboard.json $(DESTDIR)$(DOCDIR)/prometheus/
	install -m 644 tools/completion/keyshift $(DESTDIR)$(BASHCOMPDIR)/keyshift
	ln -sf keyshift $(DESTDIR)$(BASHCOMPDIR)/keyshift-kms-aws
	@# The agent's units (docs/agent.md section 9), running the keyshift
	@# installed in BINDIR; installed only, never enabled.
	install -d $(DESTDIR)$(SYSTEMDUNITDIR)
	sed 's|/usr/local/bin/keyshift |$(BINDIR)/keyshift |' tools/agent/keyshift-agent.service \
	    > $(DESTDIR)$(SYSTEMDUNITDIR)/keyshift-agent.service
	chmod 644 $(DESTDIR)$(SYSTEMDUNITDIR)/keyshift-agent.service
	install -m 644 tools/agent/keyshift-agent.socket $(DESTDIR)$(SYSTEMDUNITDIR)/

uninstall:
	rm -rf $(DESTDIR)$(INCDIR)/keyshift
	rm -f $(DESTDIR)$(LIBDIR)/libkeyshift.* $(DESTDIR)$(BINDIR)/keyshift \
	    $(DESTDIR)$(BINDIR)/keyshift-kms-aws $(DESTDIR)$(PCDIR)/keyshift.pc
	rm -rf $(DESTDIR)$(PYDIR)/keyshift
	for p in $(MAN_SRCS); do rm -f $(DESTDIR)$(MANDIR)/man$${p##*.}/$${p##*/}; done
	rm -f $(DESTDIR)$(MANDIR)/man1/keyshift-decrypt.1
	rm -rf $(DESTDIR)$(DOCDIR)
	rm -f $(DESTDIR)$(BASHCOMPDIR)/keyshift $(DESTDIR)$(BASHCOMPDIR)/keyshift-kms-aws
	rm -f $(DESTDIR)$(SYSTEMDUNITDIR)/keyshift-agent.service $(DESTDIR)$(SYSTEMDUNITDIR)/keyshift-agent.socket

clean:
	rm -rf $(B)
