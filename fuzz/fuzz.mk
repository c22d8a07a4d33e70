# fuzz/fuzz.mk -- fuzz targets, corpus replay, coverage gate (included by the Makefile).
fuzz-replay fuzz-smoke fuzz fuzz-afl coverage:
	@echo "$@: not yet"
