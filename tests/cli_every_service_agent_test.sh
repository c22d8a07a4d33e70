#!/usr/bin/env bash
# tests/cli_every_service_agent_test.sh -- tests/cli_every_service_test.sh
# once more with the Python application going through the agent instead
# of the library (EVERY_SERVICE_AGENT=1: a `keyshift serve` on a Unix
# socket of the test's directory is its registered reader, with its key
# versions, and its health reporter; an old agent blocks write-upgrade
# until SIGHUP reloads a registry with pay/kek:2), on the SQLite database
# only by default: the scenario is the same on PostgreSQL, where that
# script runs it in process, and both side by side take twice the CPU
# (EVERY_SERVICE_KINDS="sqlite pg" runs both).  Same variables as that
# script; needs curl.
EVERY_SERVICE_AGENT=1 EVERY_SERVICE_KINDS=${EVERY_SERVICE_KINDS:-sqlite} \
    exec "$(dirname "$0")/cli_every_service_test.sh"
