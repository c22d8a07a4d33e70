#!/bin/bash
# tests/prom_test.sh -- the Prometheus side of keyshift (docs/prometheus.md):
# `rollout metrics --textfile` and `migrate run --textfile` write their
# files atomically (no temporary file left, the final name in place) and
# `promtool check metrics` accepts them; then the shipped rules
# (tools/prometheus/) pass `promtool check rules` and `promtool test
# rules`, and the dashboard passes tests/dashboard_check.py.  A few
# seconds: one small SQLite database, no server.
#
# Usage: KEYSHIFT=path/to/release/keyshift tests/prom_test.sh
set -u

. "$(dirname "$0")/cli_lib.sh"
export KEYSHIFT_KEYRING="$T/keyring" KEYSHIFT_PASSPHRASE=prom-test
IN=/dev/null
PROMTOOL=${PROMTOOL:-promtool}
command -v "$PROMTOOL" >/dev/null || { echo "prom_test: promtool is missing (tools/deps.sh)"; exit 1; }
command -v sqlite3 >/dev/null || { echo "prom_test: sqlite3 is missing (tools/deps.sh)"; exit 1; }
D="$T/shop.db"
TF="$T/textfile"
mkdir -p "$TF"

# promtool_ok NAME FILE: promtool check metrics accepts FILE, lint included.
promtool_ok() {
    if "$PROMTOOL" check metrics <"$2" >"$T/lint" 2>&1; then ok "$1: promtool check metrics"
    else bad "$1: promtool check metrics" "$(head -c 600 "$T/lint")"; fi
}

# no_temp NAME: nothing but the final files in the textfile directory.
no_temp() {
    if ls -A "$TF" | grep -qv '\.prom$'; then bad "$1: only .prom files" "$(ls -A "$TF")"
    else ok "$1: only .prom files"; fi
}

run "keys init" 0 "$KS" keys init
run "keys create" 0 "$KS" keys create payments/kek
run "keys add-version" 0 "$KS" keys add-version payments/kek
sqlite3 "$D" "CREATE TABLE pay (id INTEGER PRIMARY KEY, card BLOB);
              CREATE TABLE orders (id INTEGER PRIMARY KEY, note BLOB);
              INSERT INTO orders (note) VALUES ('a'), ('b'), (NULL);"
run "rollout start" 0 "$KS" rollout start --db "$D" --table pay --column card --source plaintext \
    --target v2:xchacha20-poly1305:payments/kek:2
sqlite3 "$D" "INSERT INTO keyshift_metrics(rollout_id, instance_id, source, time, seals, opens,
              auth_failures, parse_errors, provider_calls, provider_errors, seal_ns, open_ns)
              VALUES(1, 'web-1', 'app', strftime('%s','now'), 7, 9, 1, 0, 2, 0,
                     zeroblob(192), zeroblob(192))"

run "rollout metrics --textfile" 0 "$KS" rollout metrics --db "$D" --prometheus --textfile "$TF"
R="$TF/keyshift_rollout_1.prom"
expect_grep "rollout textfile: counter" "$R" '^keyshift_opens_total{rollout="1",scope="column",table="pay",column="card",source="app"} 9$'
expect_grep "rollout textfile: phase" "$R" '^keyshift_rollout_phase{rollout="1",scope="column",table="pay",column="card",phase="planned"} 1$'
promtool_ok "rollout textfile" "$R"
no_temp "rollout textfile"
# A second write replaces the file in place (rename over it).
sqlite3 "$D" "INSERT INTO keyshift_metrics(rollout_id, instance_id, source, time, seals, opens,
              auth_failures, parse_errors, provider_calls, provider_errors, seal_ns, open_ns)
              VALUES(1, 'web-1', 'app', strftime('%s','now'), 1, 1, 0, 0, 0, 0,
                     zeroblob(192), zeroblob(192))"
run "rollout metrics --textfile again" 0 "$KS" rollout metrics --db "$D" --prometheus --textfile "$TF"
expect_grep "rollout textfile: the counter grew" "$R" '^keyshift_opens_total{.*source="app"} 10$'
no_temp "rollout textfile again"

run "migrate run --textfile" 0 "$KS" migrate run --db "$D" --table orders --column note --mode encrypt \
    --to-key payments/kek --tenant acme --textfile "$TF"
M="$TF/keyshift_migrate_orders_note.prom"
expect_grep "migrate textfile: rows done" "$M" '^keyshift_migrate_rows_total{table="orders",column="note",outcome="done"} 2$'
expect_grep "migrate textfile: ended" "$M" '^keyshift_migrate_running{table="orders",column="note"} 0$'
expect_grep "migrate textfile: complete" "$M" '^keyshift_migrate_complete{table="orders",column="note"} 1$'
expect_grep "migrate textfile: progress time" "$M" '^keyshift_migrate_last_progress_timestamp_seconds{table="orders",column="note"} [0-9]\{10\}$'
promtool_ok "migrate textfile" "$M"
no_temp "migrate textfile"
run "migrate --textfile: a file for DIR does not stop the run" 0 "$KS" migrate run --db "$D" --table orders --column note \
    --mode encrypt --to-key payments/kek --tenant acme --textfile "$M"
expect_grep "migrate --textfile: the failure is said" "$T/err" "cannot write the progress to --textfile"

# ---- the rules and the dashboard (tools/prometheus/) ----------------------------------------
P="$(dirname "$0")/../tools/prometheus"
PYTHON=${PYTHON_DEBIAN:-/usr/bin/python3}
run "promtool check rules" 0 "$PROMTOOL" check rules "$P/keyshift-rules.yml"
run "promtool test rules" 0 "$PROMTOOL" test rules "$P/keyshift-rules.test.yml"
expect_grep "promtool test rules: passed" "$T/out" "SUCCESS"
run "dashboard: JSON, titles, exported metrics only" 0 "$PYTHON" "$(dirname "$0")/dashboard_check.py" \
    --rules-out "$T/dashboard-rules.yml" "$P/keyshift-dashboard.json" "$P/keyshift-rules.yml" "$R" "$M"
run "dashboard: its queries parse (promtool)" 0 "$PROMTOOL" check rules "$T/dashboard-rules.yml"
printf '{"title": "x", "uid": "x", "panels": [{"id": 1, "title": "t", "targets": [{"expr": "rate(keyshift_opnes_total[5m])"}]}]}' >"$T/bad.json"
run "dashboard: an unknown metric is refused" 1 "$PYTHON" "$(dirname "$0")/dashboard_check.py" "$T/bad.json" "$P/keyshift-rules.yml" "$R" "$M"
expect_grep "dashboard: names the metric" "$T/out" "keyshift_opnes_total is not a metric keyshift exports"
printf '{"title": ' >"$T/bad.json"
run "dashboard: invalid JSON is refused" 1 "$PYTHON" "$(dirname "$0")/dashboard_check.py" "$T/bad.json" "$P/keyshift-rules.yml" "$R" "$M"

cli_finish prom_test
