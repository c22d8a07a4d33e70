// Command demo-app is keyshift-demo-app's job written in Go with package
// keyshift: one instance of a service that writes and reads random rows of
// an encrypted column under the rollout policy of its database.
//
//	demo-app --keyring FILE [--passphrase-file FILE] [--db FILE --instance NAME]
//	    [--table T --column C] [--key-id K] [--rows N] [--ops N]
//	    [--write-percent P] [--seed N] [--json]
//
// What it does, exactly: Go's standard library has no SQLite driver, so
// the rows themselves (id, tenant, stored value) live in this process's
// memory; --db is the SQLite file holding the rollout state, which the
// library opens (registering the instance as a reader, heartbeats and
// health reports, the phase checks) as for any application.  It first
// writes every row, then repeats one operation on a random row: with
// probability --write-percent a write (a new JSON plaintext sealed as the
// rollout says for the row's tenant, else under --key-id), otherwise a
// read (the stored value opened with the context "T:ID:C" and the row's
// tenant, then checked to be the JSON last written).  At the end it
// closes the App (a last report, deregistration) and prints counts, never
// a plaintext; it exits 65 if a read failed, 69 if it cannot start.
package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand"
	"os"

	"keyshift.local/keyshift"
)

type row struct {
	id     int
	tenant []byte
	value  []byte // as stored: an envelope, or plaintext before write-upgrade of a rollout from plaintext
	want   []byte // the plaintext last written, to check reads
}

type summary struct {
	Ops, Reads, Writes int
	ReadFailures       map[string]int // by error name
	WriteFailures      map[string]int
}

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run is the program with its arguments; it returns the exit status.
func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("demo-app", flag.ContinueOnError)
	fs.SetOutput(stderr)
	keyring := fs.String("keyring", os.Getenv("KEYSHIFT_KEYRING"), "the keyring `file`")
	passFile := fs.String("passphrase-file", "", "the keyring's passphrase `file` (one trailing newline dropped)")
	db := fs.String("db", "", "the SQLite `file` holding the rollout state (none: no rollout)")
	instance := fs.String("instance", "demo-app-go", "the reader's instance `id`")
	table := fs.String("table", "payments", "the `table`")
	column := fs.String("column", "card", "the encrypted `column`")
	keyID := fs.String("key-id", "payments/kek", "the key to seal under where no rollout governs")
	nrows := fs.Int("rows", 100, "rows kept in memory")
	ops := fs.Int("ops", 1000, "operations after the first write of every row")
	writePct := fs.Int("write-percent", 20, "the share of operations that write")
	seed := fs.Int64("seed", 1, "the seed of the row and operation choice")
	asJSON := fs.Bool("json", false, "print the summary as JSON")
	if err := fs.Parse(args); err != nil {
		return 64
	}
	if *nrows < 1 || *ops < 0 || *writePct < 0 || *writePct > 100 {
		fmt.Fprintln(stderr, "demo-app: --rows must be at least 1, --ops at least 0 and --write-percent 0 to 100.")
		return 64
	}
	cfg := keyshift.Config{Keyring: *keyring, Database: *db, DefaultKeyID: *keyID}
	if *db != "" {
		cfg.InstanceID = *instance
	}
	if *passFile != "" {
		p, err := os.ReadFile(*passFile)
		if err != nil {
			fmt.Fprintf(stderr, "demo-app: cannot read the passphrase file: %v.\n", err)
			return 66
		}
		cfg.Passphrase = bytes.TrimSuffix(p, []byte("\n"))
		defer wipe(p)
	}
	app, err := keyshift.Open(cfg)
	if err != nil {
		fmt.Fprintf(stderr, "demo-app: %v\n", err)
		if errors.Is(err, keyshift.ErrRetryable) {
			return 75
		}
		return 69
	}
	defer app.Close()

	rng := rand.New(rand.NewSource(*seed))
	s := summary{ReadFailures: map[string]int{}, WriteFailures: map[string]int{}}
	rows := make([]row, *nrows)
	for i := range rows {
		rows[i] = row{id: i + 1, tenant: []byte(fmt.Sprintf("tenant-%d", i%5))}
		write(app, *table, *column, &rows[i], *instance, 0, &s)
	}
	var pt []byte // reused: AppendOpen allocates nothing once it is large enough
	for op := 1; op <= *ops; op++ {
		s.Ops++
		r := &rows[rng.Intn(len(rows))]
		if rng.Intn(100) < *writePct {
			write(app, *table, *column, r, *instance, op, &s)
			continue
		}
		s.Reads++
		if r.value == nil {
			continue // its first write failed (counted)
		}
		pt, err = app.AppendOpen(pt[:0], record(*table, *column, r), r.value)
		if err == nil && !bytes.Equal(pt, r.want) {
			err = errors.New("the plaintext is not the one written")
		}
		if err != nil {
			s.ReadFailures[errName(err)]++
		}
		wipe(pt)
	}
	if err := app.Close(); err != nil {
		fmt.Fprintf(stderr, "demo-app: %v\n", err)
	}
	if *asJSON {
		json.NewEncoder(stdout).Encode(s)
	} else {
		fmt.Fprintf(stdout, "ops %d reads %d writes %d read-failures %v write-failures %v\n",
			s.Ops, s.Reads, s.Writes, s.ReadFailures, s.WriteFailures)
	}
	if len(s.ReadFailures) > 0 {
		return 65
	}
	return 0
}

// record is r's record: its tenant and the context "table:id:column".
func record(table, column string, r *row) *keyshift.Record {
	return &keyshift.Record{Table: table, Column: column, Tenant: r.tenant,
		Context: []byte(fmt.Sprintf("%s:%d:%s", table, r.id, column))}
}

// write seals a new JSON plaintext for r as the rollout says and stores it.
func write(app *keyshift.App, table, column string, r *row, instance string, n int, s *summary) {
	s.Writes++
	pt, _ := json.Marshal(map[string]interface{}{"id": r.id, "by": instance, "n": n})
	v, err := app.Seal(record(table, column, r), pt)
	if err != nil {
		s.WriteFailures[errName(err)]++
		return
	}
	r.value, r.want = v, pt
}

// errName is the library's name of err, else its text.
func errName(err error) string {
	var ke *keyshift.Error
	if errors.As(err, &ke) {
		return ke.Name
	}
	return err.Error()
}

func wipe(b []byte) {
	for i := range b {
		b[i] = 0
	}
}
