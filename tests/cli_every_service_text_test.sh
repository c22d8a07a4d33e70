#!/usr/bin/env bash
# tests/cli_every_service_text_test.sh -- tests/cli_every_service_test.sh
# once more on a base64 text column (docs/format.md [F-TEXT-1]): a SQLite
# TEXT and a PostgreSQL text column, the rollout started with --encoding
# base64, the three applications following the encoding the rollout
# records.  Same variables as that script.
EVERY_SERVICE_ENCODING=base64 exec "$(dirname "$0")/cli_every_service_test.sh"
