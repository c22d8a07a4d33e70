package main

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// keyring makes an unsealed keyring holding payments/kek with the CLI
// ($KEYSHIFT_CLI, else the build tree's).
func keyring(t *testing.T) string {
	cli := os.Getenv("KEYSHIFT_CLI")
	if cli == "" {
		cli = "../../../../../build/bin/keyshift"
	}
	if _, err := os.Stat(cli); err != nil {
		t.Skipf("no keyshift CLI (set KEYSHIFT_CLI): %v", err)
	}
	k := filepath.Join(t.TempDir(), "keyring")
	for _, args := range [][]string{{"keys", "init", "--keyring", k}, {"keys", "create", "payments/kek", "--keyring", k}} {
		cmd := exec.Command(cli, args...)
		for _, kv := range os.Environ() {
			if !strings.HasPrefix(kv, "KEYSHIFT_") {
				cmd.Env = append(cmd.Env, kv)
			}
		}
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("keyshift %v: %v: %s", args, err, out)
		}
	}
	return k
}

// The demo reads back every row it wrote, with and without a rollout
// database (where it registers as a reader), and counts its operations.
func TestDemo(t *testing.T) {
	k := keyring(t)
	db := filepath.Join(t.TempDir(), "shop.db")
	if err := os.WriteFile(db, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, extra := range [][]string{nil, {"--db", db, "--instance", "go-demo-1"}} {
		var out, errb bytes.Buffer
		args := append([]string{"--keyring", k, "--rows", "20", "--ops", "300", "--json"}, extra...)
		if rc := run(args, &out, &errb); rc != 0 {
			t.Fatalf("run %v: exit %d: %s%s", args, rc, out.String(), errb.String())
		}
		var s summary
		if err := json.Unmarshal(out.Bytes(), &s); err != nil {
			t.Fatal(err)
		}
		if s.Ops != 300 || s.Reads == 0 || s.Writes <= 20 || len(s.WriteFailures) != 0 {
			t.Fatalf("summary %+v", s)
		}
	}
	if rc := run([]string{"--rows", "0"}, &bytes.Buffer{}, &bytes.Buffer{}); rc != 64 {
		t.Fatalf("--rows 0: exit %d", rc)
	}
}
