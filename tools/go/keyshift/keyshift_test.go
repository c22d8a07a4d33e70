package keyshift

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// cliPath is the keyshift CLI the tests drive: $KEYSHIFT_CLI, else the
// build tree's.
func cliPath(t testing.TB) string {
	p := os.Getenv("KEYSHIFT_CLI")
	if p == "" {
		p = "../../../build/bin/keyshift"
	}
	abs, err := filepath.Abs(p)
	if err == nil {
		if _, err = os.Stat(abs); err == nil {
			return abs
		}
	}
	t.Skipf("no keyshift CLI at %s (set KEYSHIFT_CLI): %v", p, err)
	return ""
}

// cliCommand is the command running the CLI with args, in an environment
// without KEYSHIFT_ variables.
func cliCommand(t testing.TB, args ...string) *exec.Cmd {
	cmd := exec.Command(cliPath(t), args...)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "KEYSHIFT_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	return cmd
}

// cli runs the CLI with args and stdin, failing the test on a non-zero
// exit; it returns standard output.
func cli(t testing.TB, stdin []byte, args ...string) []byte {
	t.Helper()
	cmd := cliCommand(t, args...)
	cmd.Stdin = bytes.NewReader(stdin)
	var out, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("keyshift %v: %v: %s", args, err, stderr.String())
	}
	return out.Bytes()
}

// newKeyring makes an unsealed keyring holding payments/kek:1.
func newKeyring(t testing.TB) string {
	k := filepath.Join(t.TempDir(), "keyring")
	cli(t, nil, "keys", "init", "--keyring", k)
	cli(t, nil, "keys", "create", "payments/kek", "--keyring", k)
	return k
}

// openApp opens an App over keyring k sealing (f, alg) by default.
func openApp(t testing.TB, k string, f Format, alg Algorithm) *App {
	t.Helper()
	a, err := Open(Config{Keyring: k, DefaultKeyID: "payments/kek", DefaultFormat: f,
		DefaultAlgorithm: alg})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { a.Close() })
	return a
}

func rec(ctx string) *Record {
	return &Record{Table: "payments", Column: "card", Tenant: []byte("acme"),
		Context: []byte(ctx), Purpose: []byte("card")}
}

func TestRoundTrips(t *testing.T) {
	k := newKeyring(t)
	for _, f := range []Format{FormatV1, FormatV2} {
		for _, alg := range []Algorithm{XChaCha20Poly1305, AES256GCM} {
			t.Run(fmt.Sprintf("v%d-%v", f, alg), func(t *testing.T) {
				a := openApp(t, k, f, alg)
				r := rec("payments:42:card")
				if f == FormatV1 {
					r.Purpose = nil
				}
				for _, n := range []int{0, 1, 100, 70000} {
					pt := bytes.Repeat([]byte{'x'}, n)
					env, err := a.Seal(r, pt)
					if errors.Is(err, ErrConfiguration) && alg == AES256GCM {
						t.Skipf("AES-256-GCM unavailable here: %v", err)
					}
					if err != nil {
						t.Fatalf("Seal %d: %v", n, err)
					}
					h, err := Parse(env)
					if err != nil || h.Version != f || h.Algorithm != alg || h.TotalLen != len(env) ||
						string(h.Tenant.Bytes(env)) != "acme" || string(h.KeyID.Bytes(env)) != "payments/kek" {
						t.Fatalf("Parse: %+v %v", h, err)
					}
					got, err := a.Open(r, env)
					if err != nil || !bytes.Equal(got, pt) {
						t.Fatalf("Open %d: %v", n, err)
					}
					// the append forms extend the caller's buffer
					env2, err := a.AppendSeal([]byte("pre"), r, pt)
					if err != nil || string(env2[:3]) != "pre" {
						t.Fatalf("AppendSeal: %v", err)
					}
					got2, err := a.AppendOpen([]byte("pre"), r, env2[3:])
					if err != nil || !bytes.Equal(got2, append([]byte("pre"), pt...)) {
						t.Fatalf("AppendOpen: %v", err)
					}
					// SealClass names the class it wrote
					env3, c, err := a.SealClass(r, pt)
					want := fmt.Sprintf("v%d:%v:payments/kek:1", f, alg)
					if err != nil || c.Plaintext || c.String() != want {
						t.Fatalf("SealClass: %v %v, want %s", c, err, want)
					}
					if got3, err := a.Open(r, env3); err != nil || !bytes.Equal(got3, pt) {
						t.Fatalf("Open of SealClass's: %v", err)
					}
				}
			})
		}
	}
}

// Every code maps to the class ks_err_class gives and to its sentinel.
func TestErrorClasses(t *testing.T) {
	cases := []struct {
		code     int
		name     string
		class    error
		sentinel error
	}{
		{96, "unavailable", ErrRetryable, ErrUnavailable},
		{97, "timeout", ErrRetryable, ErrUnavailable},
		{161, "busy", ErrRetryable, ErrBusy},
		{66, "no-memory", ErrRetryable, nil},
		{1, "truncated", ErrRefused, ErrMalformed},
		{11, "bad-value", ErrRefused, ErrMalformed},
		{64, "auth-failed", ErrRefused, ErrAuthFailed},
		{196, "phase", ErrRefused, ErrPhase},
		{98, "denied", ErrRefused, ErrKeyUnusable},
		{99, "revoked", ErrRefused, ErrKeyUnusable},
		{100, "not-found", ErrRefused, ErrKeyUnusable},
		{32, "invalid-argument", ErrRefused, ErrInvalidArgument},
		{128, "insecure", ErrConfiguration, nil},
		{129, "io", ErrConfiguration, nil},
		{193, "no-rollout", ErrConfiguration, ErrNoRollout},
		{65, "algorithm-unavailable", ErrConfiguration, nil},
		{250, "unknown-error", ErrConfiguration, nil},
	}
	all := []error{ErrRetryable, ErrRefused, ErrConfiguration}
	for _, c := range cases {
		e := errorOf(c.code)
		if e.Name != c.name {
			t.Errorf("code %d: name %q, want %q", c.code, e.Name, c.name)
		}
		for _, cl := range all {
			if errors.Is(e, cl) != (cl == c.class) {
				t.Errorf("%s: errors.Is(%v) = %v", c.name, cl, !(cl == c.class))
			}
		}
		if c.sentinel != nil && !errors.Is(fmt.Errorf("wrapped: %w", e), c.sentinel) {
			t.Errorf("%s: does not match %v", c.name, c.sentinel)
		}
		if errors.Is(e, ErrClosed) {
			t.Errorf("%s matches ErrClosed", c.name)
		}
	}
}

// Real failures of each class that a test can provoke.
func TestErrors(t *testing.T) {
	k := newKeyring(t)
	a := openApp(t, k, FormatV2, XChaCha20Poly1305)
	r := rec("payments:42:card")
	env, err := a.Seal(r, []byte("4111111111111111"))
	if err != nil {
		t.Fatal(err)
	}
	var ke *Error
	// refused: wrong context, tenant, purpose; tampering
	for name, r2 := range map[string]*Record{
		"context": rec("payments:43:card"),
		"tenant":  {Table: "payments", Column: "card", Tenant: []byte("other"), Context: r.Context, Purpose: r.Purpose},
		"purpose": {Table: "payments", Column: "card", Tenant: r.Tenant, Context: r.Context, Purpose: []byte("ssn")},
	} {
		if pt, err := a.Open(r2, env); !errors.Is(err, ErrAuthFailed) || !errors.Is(err, ErrRefused) || pt != nil {
			t.Errorf("wrong %s: %v", name, err)
		}
	}
	bad := append([]byte(nil), env...)
	bad[len(bad)-1] ^= 1
	if _, err := a.Open(r, bad); !errors.Is(err, ErrAuthFailed) {
		t.Errorf("tampered: %v", err)
	}
	// refused: malformed, with the offset
	_, err = a.Open(r, env[:len(env)/2])
	if !errors.Is(err, ErrMalformed) || !errors.As(err, &ke) || ke.Offset < 0 || ke.Name != "truncated" {
		t.Errorf("truncated: %v", err)
	}
	_, err = a.Open(r, []byte("KSE\x07"))
	if !errors.As(err, &ke) || ke.Name != "unsupported-version" || ke.Offset != 3 {
		t.Errorf("version 7: %v", err)
	}
	if _, err = a.Seal(&Record{Table: "payments", Column: "card"}, []byte("x")); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("no tenant: %v", err)
	}
	// configuration: no default key, no keyring
	b, err := Open(Config{Keyring: k})
	if err != nil {
		t.Fatal(err)
	}
	if _, err = b.Seal(r, []byte("x")); !errors.Is(err, ErrNoRollout) || !errors.Is(err, ErrConfiguration) {
		t.Errorf("no default key: %v", err)
	}
	b.Close()
	_, err = Open(Config{Keyring: filepath.Join(t.TempDir(), "missing")})
	if !errors.Is(err, ErrConfiguration) || !errors.As(err, &ke) || ke.Msg == "" {
		t.Errorf("missing keyring: %v", err)
	}
	// closed
	a.Close()
	if _, err = a.Seal(r, []byte("x")); err != ErrClosed {
		t.Errorf("after Close: %v", err)
	}
	if err = a.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

// Close frees the library's handle at once; the finalizer only catches an
// App nobody closed.
func TestCloseFrees(t *testing.T) {
	k := newKeyring(t)
	before := atomic.LoadInt64(&liveApps)
	a, err := Open(Config{Keyring: k, DefaultKeyID: "payments/kek"})
	if err != nil {
		t.Fatal(err)
	}
	if atomic.LoadInt64(&liveApps) != before+1 {
		t.Fatal("Open did not count the handle")
	}
	a.Close()
	if atomic.LoadInt64(&liveApps) != before {
		t.Fatal("Close did not free the handle")
	}
	func() {
		_, err := Open(Config{Keyring: k, DefaultKeyID: "payments/kek"})
		if err != nil {
			t.Fatal(err)
		}
	}()
	deadline := time.Now().Add(5 * time.Second)
	for atomic.LoadInt64(&liveApps) != before && time.Now().Before(deadline) {
		runtime.GC()
		time.Sleep(10 * time.Millisecond)
	}
	if atomic.LoadInt64(&liveApps) != before {
		t.Fatal("the finalizer did not close an unreachable App")
	}
}

func TestGoroutines(t *testing.T) {
	a := openApp(t, newKeyring(t), FormatV2, XChaCha20Poly1305)
	var wg sync.WaitGroup
	errs := make(chan error, 32)
	for g := 0; g < 32; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			var env, pt []byte
			for i := 0; i < 100; i++ {
				r := rec(fmt.Sprintf("payments:%d:card", g*1000+i))
				want := []byte(fmt.Sprintf("value %d %d", g, i))
				var err error
				if env, err = a.AppendSeal(env[:0], r, want); err != nil {
					errs <- err
					return
				}
				if pt, err = a.AppendOpen(pt[:0], r, env); err != nil || !bytes.Equal(pt, want) {
					errs <- fmt.Errorf("open: %v", err)
					return
				}
			}
		}(g)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

func TestBatch(t *testing.T) {
	a := openApp(t, newKeyring(t), FormatV2, XChaCha20Poly1305)
	items := make([]Item, 50)
	for i := range items {
		items[i] = Item{Tenant: []byte("acme"), Context: []byte(fmt.Sprint(i)), In: []byte(fmt.Sprint("v", i))}
	}
	if err := a.SealBatch("payments", "card", items); err != nil {
		t.Fatal(err)
	}
	opens := make([]Item, len(items))
	for i := range items {
		opens[i] = Item{Tenant: []byte("acme"), Context: []byte(fmt.Sprint(i)), In: items[i].Out}
	}
	opens[7].Context = []byte("wrong")
	buf, err := a.AppendOpenBatch([]byte("pre"), "payments", "card", opens)
	if !errors.Is(err, ErrAuthFailed) || string(buf[:3]) != "pre" {
		t.Fatalf("AppendOpenBatch: %v", err)
	}
	for i := range opens {
		if i == 7 {
			if !errors.Is(opens[i].Err, ErrAuthFailed) || opens[i].Out != nil {
				t.Errorf("item 7: %v", opens[i].Err)
			}
		} else if opens[i].Err != nil || string(opens[i].Out) != fmt.Sprint("v", i) {
			t.Errorf("item %d: %v", i, opens[i].Err)
		}
	}
}

// The append forms make no Go heap allocation when the buffer suffices.
func TestAppendAllocs(t *testing.T) {
	a := openApp(t, newKeyring(t), FormatV2, XChaCha20Poly1305)
	r := rec("payments:42:card")
	pt := make([]byte, 2048)
	env := make([]byte, 0, SealMaxLen(len(pt)))
	out := make([]byte, 0, cap(env))
	var err error
	if n := testing.AllocsPerRun(100, func() { env, err = a.AppendSeal(env[:0], r, pt) }); n != 0 || err != nil {
		t.Errorf("AppendSeal: %v allocations, %v", n, err)
	}
	if n := testing.AllocsPerRun(100, func() { out, err = a.AppendOpen(out[:0], r, env) }); n != 0 || err != nil {
		t.Errorf("AppendOpen: %v allocations, %v", n, err)
	}
}

// An envelope sealed from Go opens with the CLI, and one sealed by the CLI
// opens from Go, in both formats.
func TestInteropCLI(t *testing.T) {
	k := newKeyring(t)
	a := openApp(t, k, FormatV2, XChaCha20Poly1305)
	pt := []byte("4111111111111111")
	r := rec("payments:42:card")
	env, err := a.Seal(r, pt)
	if err != nil {
		t.Fatal(err)
	}
	got := cli(t, env, "decrypt", "--keyring", k, "--context", "payments:42:card", "--tenant", "acme", "--purpose", "card")
	if !bytes.Equal(got, pt) {
		t.Fatalf("CLI decrypt: %q", got)
	}
	for _, f := range []string{"1", "2"} {
		args := []string{"encrypt", "--keyring", k, "--tenant", "acme", "--key-id", "payments/kek",
			"--context", "payments:42:card", "--format", f}
		if f == "2" {
			args = append(args, "--purpose", "card")
		}
		env = cli(t, pt, args...)
		if got, err = a.Open(r, env); err != nil || !bytes.Equal(got, pt) {
			t.Fatalf("format %s from the CLI: %v", f, err)
		}
	}
}

// With a database, the App obeys the rollout and registers as a reader: a
// rollout from plaintext seals plaintext while planned and refuses an
// envelope (phase) until read-compat; Close deregisters.
func TestRollout(t *testing.T) {
	if _, err := exec.LookPath("sqlite3"); err != nil {
		t.Skip("no sqlite3 CLI")
	}
	k := newKeyring(t)
	db := filepath.Join(t.TempDir(), "shop.db")
	if out, err := exec.Command("sqlite3", db,
		"CREATE TABLE payments(id INTEGER PRIMARY KEY, tenant TEXT, card BLOB);").CombinedOutput(); err != nil {
		t.Fatalf("sqlite3: %v: %s", err, out)
	}
	scope := []string{"--db", db, "--table", "payments", "--column", "card", "--keyring", k}
	cli(t, nil, append([]string{"rollout", "start", "--source", "plaintext",
		"--target", "v2:xchacha20-poly1305:payments/kek:1"}, scope...)...)
	a, err := Open(Config{Keyring: k, Database: db, InstanceID: "go-test-1",
		DefaultKeyID: "payments/kek", Interval: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if !bytes.Contains(cli(t, nil, "rollout", "readers", "--db", db), []byte("go-test-1")) {
		t.Error("the App is not registered as a reader")
	}
	r := &Record{Table: "payments", Column: "card", Tenant: []byte("acme"), Context: []byte("payments:1:card")}
	pt := []byte("4111111111111111")
	if v, err := a.Seal(r, pt); err != nil || !bytes.Equal(v, pt) {
		t.Fatalf("planned from plaintext: Seal gave %d bytes, %v", len(v), err)
	}
	env, err := openApp(t, k, FormatV2, XChaCha20Poly1305).Seal(r, pt) // no database: an envelope
	if err != nil {
		t.Fatal(err)
	}
	if _, err = a.Open(r, env); !errors.Is(err, ErrPhase) || !errors.Is(err, ErrRefused) {
		t.Fatalf("an envelope while planned: %v", err)
	}
	cli(t, nil, append([]string{"rollout", "advance"}, scope...)...)
	deadline := time.Now().Add(5 * time.Second)
	for {
		got, err := a.Open(r, env)
		if err == nil && bytes.Equal(got, pt) {
			break
		}
		if !errors.Is(err, ErrPhase) || time.Now().After(deadline) {
			t.Fatalf("an envelope in read-compat: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	a.Close()
	if bytes.Contains(cli(t, nil, "rollout", "readers", "--db", db), []byte("go-test-1")) {
		t.Error("Close did not deregister the reader")
	}
}

// A sealed keyring opens with Config.Passphrase (copied into C memory for
// the call, then wiped) and not with a wrong one.
func TestPassphrase(t *testing.T) {
	dir := t.TempDir()
	k, pf := filepath.Join(dir, "keyring"), filepath.Join(dir, "pass")
	if err := os.WriteFile(pf, []byte("correct horse\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cli(t, nil, "keys", "init", "--keyring", k, "--passphrase-file", pf)
	cli(t, nil, "keys", "create", "payments/kek", "--keyring", k, "--passphrase-file", pf)
	pass := []byte("correct horse")
	a, err := Open(Config{Keyring: k, Passphrase: pass, DefaultKeyID: "payments/kek"})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if string(pass) != "correct horse" {
		t.Error("Open changed the caller's passphrase")
	}
	if _, err = a.Seal(rec("c"), []byte("x")); err != nil {
		t.Fatal(err)
	}
	var ke *Error
	_, err = Open(Config{Keyring: k, Passphrase: []byte("wrong"), DefaultKeyID: "payments/kek"})
	if !errors.Is(err, ErrConfiguration) || !errors.As(err, &ke) || ke.Name != "bad-passphrase" {
		t.Fatalf("a wrong passphrase: %v", err)
	}
}

// A text column: Seal and Open work in the column's encoding, which
// Config.DefaultEncoding gives where no rollout covers the column and the
// rollout's --encoding gives where one does.
func TestTextColumns(t *testing.T) {
	if _, err := exec.LookPath("sqlite3"); err != nil {
		t.Skip("no sqlite3 CLI")
	}
	k := newKeyring(t)
	r := &Record{Table: "users", Column: "email", Tenant: []byte("acme"), Context: []byte("users:1:email")}
	pt := []byte("ada@example.com")
	w, err := Open(Config{Keyring: k, DefaultKeyID: "payments/kek", DefaultEncoding: EncodingBase64})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if e, err := w.ColumnEncoding("users", "email"); err != nil || e != EncodingBase64 || e.String() != "base64" {
		t.Fatalf("ColumnEncoding without a database: %v %v", e, err)
	}
	text, err := w.Seal(r, pt)
	if err != nil || !bytes.HasPrefix(text, []byte("S1NF")) || len(text) > SealMaxLen(len(pt)) {
		t.Fatalf("Seal in base64: %q, %v", text, err)
	}
	if got, err := w.Open(r, text); err != nil || !bytes.Equal(got, pt) {
		t.Fatalf("Open in base64: %v", err)
	}
	bin, err := openApp(t, k, FormatV2, XChaCha20Poly1305).Seal(r, pt)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Open(r, bin); !errors.Is(err, ErrMalformed) {
		t.Fatalf("a binary envelope in a base64 column: %v", err)
	}

	db := filepath.Join(t.TempDir(), "shop.db")
	if out, err := exec.Command("sqlite3", db,
		"CREATE TABLE users(id INTEGER PRIMARY KEY, email TEXT);").CombinedOutput(); err != nil {
		t.Fatalf("sqlite3: %v: %s", err, out)
	}
	scope := []string{"--db", db, "--table", "users", "--column", "email", "--keyring", k}
	cli(t, nil, append([]string{"rollout", "start", "--source", "plaintext", "--encoding", "base64",
		"--target", "v2:xchacha20-poly1305:payments/kek:1"}, scope...)...)
	a, err := Open(Config{Keyring: k, Database: db, InstanceID: "go-text-1", DefaultKeyID: "payments/kek"})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if e, err := a.ColumnEncoding("users", "email"); err != nil || e != EncodingBase64 {
		t.Fatalf("ColumnEncoding of the rollout: %v %v", e, err)
	}
	if e, err := a.ColumnEncoding("users", "name"); err != nil || e != EncodingBinary {
		t.Fatalf("ColumnEncoding of another column: %v %v", e, err)
	}
	if got, err := a.Open(r, pt); err != nil || !bytes.Equal(got, pt) {
		t.Fatalf("plaintext while planned: %v", err)
	}
	if _, err := a.Open(r, text); !errors.Is(err, ErrPhase) {
		t.Fatalf("an envelope while planned: %v", err)
	}
	a.Close()
	if _, err := a.ColumnEncoding("users", "email"); !errors.Is(err, ErrClosed) {
		t.Fatalf("after Close: %v", err)
	}
}
