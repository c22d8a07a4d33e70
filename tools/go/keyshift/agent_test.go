package keyshift

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"keyshift.local/keyshift/agent"
)

// startAgent starts `keyshift serve` over keyring k on a socket in a
// temporary directory, serving payments.card and payments.note with the
// key payments/kek, under a policy that lets this uid seal, open and parse
// payments.card and nothing of payments.note; it returns a Client once
// /healthz answers, and stops the agent at the end of the test.
func startAgent(t *testing.T, k string) *agent.Client {
	t.Helper()
	dir := t.TempDir()
	sock := filepath.Join(dir, "agent.sock")
	policy := filepath.Join(dir, "policy")
	rules := fmt.Sprintf("keyshift-agent-policy 1\nallow uid %d scope payments.card tenant * ops seal,open,parse\n",
		os.Getuid())
	if err := os.WriteFile(policy, []byte(rules), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := cliCommand(t, "serve", "--listen", "unix:"+sock, "--policy", policy,
		"--keyring", k, "--scope", "payments.card", "--scope", "payments.note", "--key", "payments/kek",
		"--workers", "2")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Signal(os.Interrupt)
		cmd.Wait()
	})
	for i := 0; i < 200; i++ {
		if c, err := agent.Dial(sock); err == nil {
			t.Cleanup(func() { c.Close() })
			return c
		}
		time.Sleep(25 * time.Millisecond)
	}
	t.Fatalf("the agent did not start: %s", stderr.String())
	return nil
}

// The agent client seals and opens like the App, an envelope of either
// opens in the other, and its errors match the same sentinels.
func TestAgentClient(t *testing.T) {
	k := newKeyring(t)
	c := startAgent(t, k)
	a := openApp(t, k, FormatV2, XChaCha20Poly1305)
	r := rec("payments:42:card")
	for _, n := range []int{0, 1, 70000} {
		pt := bytes.Repeat([]byte{'x'}, n)
		env, err := c.Seal(r, pt)
		if err != nil {
			t.Fatalf("agent Seal %d: %v", n, err)
		}
		if got, err := c.Open(r, env); err != nil || !bytes.Equal(got, pt) {
			t.Fatalf("agent Open %d: %v", n, err)
		}
		if got, err := a.Open(r, env); err != nil || !bytes.Equal(got, pt) {
			t.Fatalf("App Open of the agent's %d: %v", n, err)
		}
		env2, err := a.Seal(r, pt)
		if err != nil {
			t.Fatal(err)
		}
		if got, err := c.Open(r, env2); err != nil || !bytes.Equal(got, pt) {
			t.Fatalf("agent Open of the App's %d: %v", n, err)
		}
	}
	// any tenant: a nil tenant opens
	env, _ := c.Seal(r, []byte("4111"))
	anyTenant := *r
	anyTenant.Tenant = nil
	if got, err := c.Open(&anyTenant, env); err != nil || string(got) != "4111" {
		t.Fatalf("agent Open of any tenant: %q %v", got, err)
	}

	var ae *agent.Error
	wrong := rec("payments:43:card")
	_, err := c.Open(wrong, env)
	if !errors.Is(err, ErrAuthFailed) || !errors.Is(err, ErrRefused) || errors.Is(err, ErrMalformed) ||
		!errors.As(err, &ae) || ae.Status != 422 {
		t.Fatalf("wrong context: %v", err)
	}
	_, err = c.Open(r, env[:20])
	if !errors.Is(err, ErrMalformed) || !errors.As(err, &ae) || ae.Offset < 0 {
		t.Fatalf("truncated: %v", err)
	}
	_, err = c.Open(r, []byte("plain"))
	if !errors.Is(err, ErrMalformed) || !errors.As(err, &ae) || ae.Name != "bad-magic" || ae.Offset != 0 {
		t.Fatalf("bad magic: %v", err)
	}
	note := &Record{Table: "payments", Column: "note", Tenant: []byte("acme")}
	if _, err = c.Seal(note, []byte("x")); !errors.Is(err, agent.ErrNotAuthorized) || !errors.Is(err, ErrRefused) ||
		errors.Is(err, ErrKeyUnusable) {
		t.Fatalf("a scope the policy does not allow: %v", err)
	}
	// a batch: one record's error does not stop the others
	items := []Item{{Tenant: []byte("acme"), Context: []byte("c1"), In: []byte("one")},
		{Tenant: []byte("acme"), In: []byte("two")}}
	if err := c.SealBatch("payments", "card", items); err != nil {
		t.Fatalf("SealBatch: %v", err)
	}
	open := []Item{{Tenant: []byte("acme"), Context: []byte("c1"), In: items[0].Out},
		{Tenant: []byte("acme"), Context: []byte("c2"), In: items[1].Out},
		{In: []byte("plain")}}
	err = c.OpenBatch("payments", "card", open)
	if !errors.Is(err, ErrAuthFailed) || string(open[0].Out) != "one" || !errors.Is(open[1].Err, ErrAuthFailed) ||
		!errors.Is(open[2].Err, ErrMalformed) {
		t.Fatalf("OpenBatch: %v %q %v %v", err, open[0].Out, open[1].Err, open[2].Err)
	}
	if err := a.OpenBatch("payments", "card", open[:1]); err != nil || string(open[0].Out) != "one" {
		t.Fatalf("App OpenBatch of the agent's: %v", err)
	}
	h, err := c.Parse("payments", "card", env)
	if err != nil || h.Version != 2 || h.Algorithm != "xchacha20-poly1305" || h.Tenant != "acme" ||
		h.KeyID != "payments/kek" || h.KeyVersion != 1 || h.Purpose != "card" || h.TotalLen != len(env) {
		t.Fatalf("Parse: %+v %v", h, err)
	}
	if hh, err := Parse(env); err != nil || hh.HeaderLen != h.HeaderLen || hh.Ciphertext.Len != h.CiphertextLen {
		t.Fatalf("Parse in process: %+v %v", hh, err)
	}
	if _, err = c.Parse("payments", "card", env[:20]); !errors.Is(err, ErrMalformed) {
		t.Fatalf("Parse of a truncated envelope: %v", err)
	}
	if _, err = agent.Dial(filepath.Join(t.TempDir(), "absent.sock")); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("Dial of no agent: %v", err)
	}
	bad := &Record{Table: "payments", Column: "card", Tenant: []byte("ac me")}
	if _, err = c.Seal(bad, []byte("x")); !errors.Is(err, agent.ErrBadRequest) || !errors.As(err, &ae) ||
		ae.Member != "tenant" {
		t.Fatalf("a bad tenant: %v", err)
	}
}
