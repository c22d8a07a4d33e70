package main

import (
	"bytes"
	"database/sql"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// ks runs the keyshift CLI ($KEYSHIFT_CLI, else the build tree's) with
// keyring k and no other KEYSHIFT_ variable of the caller's.
func ks(t *testing.T, k string, args ...string) {
	cli := os.Getenv("KEYSHIFT_CLI")
	if cli == "" {
		cli = "../../../build/bin/keyshift"
	}
	if _, err := os.Stat(cli); err != nil {
		t.Skipf("no keyshift CLI (set KEYSHIFT_CLI): %v", err)
	}
	cmd := exec.Command(cli, args...)
	cmd.Env = []string{"KEYSHIFT_KEYRING=" + k}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "KEYSHIFT_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("keyshift %v: %v: %s", args, err, out)
	}
}

// In write-upgrade of a rollout from plaintext to pay/kek:1, with tenant
// acme as the canary, the example reads every row (plaintext and
// envelopes) and writes acme's rows sealed, globex's as plaintext, in the
// rows of a real SQLite table; it registered and deregistered.
func TestRollout(t *testing.T) {
	d := t.TempDir()
	k, path := filepath.Join(d, "keyring"), filepath.Join(d, "shop.db")
	ks(t, k, "keys", "init")
	ks(t, k, "keys", "create", "pay/kek")
	db, err := sql.Open("sqlite3", path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err = db.Exec(`CREATE TABLE pay (id INTEGER PRIMARY KEY, tenant TEXT NOT NULL, card BLOB)`); err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= 40; i++ {
		tenant := []string{"acme", "globex"}[i%2]
		if _, err = db.Exec(`INSERT INTO pay VALUES ($1, $2, $3)`, i, tenant, fmt.Sprintf(`{"id":%d}`, i)); err != nil {
			t.Fatal(err)
		}
	}
	r := []string{"--db", path, "--table", "pay", "--column", "card"}
	ks(t, k, append([]string{"rollout", "start", "--source", "plaintext", "--target",
		"v1:xchacha20-poly1305:pay/kek:1", "--min-soak", "0"}, r...)...)
	ks(t, k, "rollout", "advance", "--db", path)
	ks(t, k, "rollout", "advance", "--db", path, "--tenants", "acme")
	args := append(r, "--tenant-column", "tenant", "--context", "pay:{id}:card", "--keyring", k,
		"--instance", "go-example-1", "--ops", "400", "--write-percent", "50", "--seed", "3", "--json")
	var out, errb bytes.Buffer
	if rc := run(args, &out, &errb, nil, nil); rc != 0 {
		t.Fatalf("exit %d: %s%s", rc, out.String(), errb.String())
	}
	var s summary
	if err := json.Unmarshal(out.Bytes(), &s); err != nil {
		t.Fatal(err)
	}
	if s.Ops != 400 || s.Reads != 400 || s.FailedReads != 0 || s.Writes["plaintext"] == 0 ||
		s.Writes["v1:xchacha20-poly1305:pay/kek:1"] == 0 || len(s.WriteFails) != 0 {
		t.Fatalf("summary %+v", s)
	}
	var sealed, plainGlobex, readers int
	db.QueryRow(`SELECT count(*) FROM pay WHERE tenant = 'globex' AND substr(card, 1, 3) = X'4B5345'`).Scan(&sealed)
	db.QueryRow(`SELECT count(*) FROM pay WHERE tenant = 'globex' AND card LIKE '%go-example-1%'`).Scan(&plainGlobex)
	db.QueryRow(`SELECT count(*) FROM keyshift_readers`).Scan(&readers)
	if sealed != 0 || plainGlobex == 0 || readers != 0 {
		t.Fatalf("globex sealed %d, globex written %d, readers left %d", sealed, plainGlobex, readers)
	}
	if rc := run([]string{"-h"}, &bytes.Buffer{}, &bytes.Buffer{}, nil, nil); rc != 0 {
		t.Errorf("-h: exit %d, want 0", rc)
	}
	for _, bad := range [][]string{{"--db", path}, append(append([]string{}, args...), "--encoding", "ebcdic"),
		append(append([]string{}, args...), "--seconds", "1")} {
		if rc := run(bad, &bytes.Buffer{}, &bytes.Buffer{}, nil, nil); rc != 64 {
			t.Errorf("%v: exit %d, want 64", bad, rc)
		}
	}
}
