// Command keyshift-go-example is keyshift-demo-app's job written in Go: one
// instance of a service that reads and writes random rows of an encrypted
// column of a SQLite or PostgreSQL table under the rollout policy stored in
// the same database (package keyshift.local/keyshift; docs/embedding.md,
// "The example services").
//
//	keyshift-go-example --db DB --table T --column C [--id-column I]
//	    --tenant-column COL --context TEMPLATE --purpose P --instance NAME
//	    [--keyring FILE] [--passphrase-file FILE] [--key-id K]
//	    [--encoding binary|base64] [--ops N | --seconds S] [--write-percent P]
//	    [--rate N] [--seed N] [--reload-ms MS] [--json]
//
// DB is a SQLite file (github.com/mattn/go-sqlite3) or a PostgreSQL URI or
// key=value string (github.com/lib/pq).  Each operation picks a random row
// by its integer id; reads its value, which App.Open opens when the
// rollout's phase reads its class (a plaintext the phase reads is returned
// as it is), checking that the plaintext is a JSON object whose "id", when
// it has one, is the row's; and with probability --write-percent UPDATEs
// the row with a new JSON object sealed by App.SealClass in the class the
// rollout names for the row's tenant (where no rollout governs, under
// --key-id).  {id} in --context is the row's id.  SIGUSR1 prints the
// summary so far; SIGTERM and SIGINT stop after the current operation.
// The summary (one JSON object with --json) counts reads, failed reads by
// error name and writes by class ("plaintext" or "vF:ALG:KEY:VERSION");
// never a plaintext.  Exit status: 0 when no read failed, 65 when one did,
// 74 when only database errors occurred, 64 for a usage error, 66 for a
// passphrase file it cannot read, 69 when the database or the keys cannot
// be opened.
package main

import (
	"bytes"
	"database/sql"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand"
	"os"
	"os/signal"
	"regexp"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	_ "github.com/lib/pq"
	_ "github.com/mattn/go-sqlite3"
	"keyshift.local/keyshift"
)

// summary is what the program prints: the C demo app's names.
type summary struct {
	Instance     string         `json:"instance"`
	Ops          int            `json:"ops"`
	Reads        int            `json:"reads"`
	FailedReads  int            `json:"failed_reads"`
	OpenFailures map[string]int `json:"open_failures"`
	Writes       map[string]int `json:"writes"`
	WriteFails   map[string]int `json:"write_failures"`
	DBErrors     int            `json:"db_errors"`
}

// pgDSN matches a PostgreSQL connection string, as ks_app_open tells one.
var pgDSN = regexp.MustCompile(`^(postgres(ql)?://|[a-z_]+\s*=)`)

func main() {
	usr1 := make(chan os.Signal, 1)
	signal.Notify(usr1, syscall.SIGUSR1)
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr, usr1, stop))
}

// run is the program; it returns the exit status.
func run(args []string, stdout, stderr io.Writer, usr1, stop <-chan os.Signal) int {
	fs := flag.NewFlagSet("keyshift-go-example", flag.ContinueOnError)
	fs.SetOutput(stderr)
	str := func(name, def, usage string) *string { return fs.String(name, def, usage) }
	db, table, column := str("db", "", "SQLite `file` or PostgreSQL connection string"), str("table", "", "the `table`"), str("column", "", "its encrypted `column`")
	idCol, tenantCol := str("id-column", "id", "the integer id `column`"), str("tenant-column", "", "the tenant `column`")
	context, purpose, instance := str("context", "", "context `template` ({id}: the row's id)"), str("purpose", "", "format 2's `purpose`"), str("instance", "", "this instance's `id`")
	keyring, passFile := str("keyring", os.Getenv("KEYSHIFT_KEYRING"), "the keyring `file`"), str("passphrase-file", "", "its passphrase `file`")
	keyID, encoding := str("key-id", "", "the `key` to seal under where no rollout governs"), str("encoding", "binary", "the column's encoding where no rollout records one: binary or base64")
	ops, writePct, rate := fs.Int("ops", 0, "stop after `N` operations"), fs.Int("write-percent", 10, "percent of operations that write"), fs.Int("rate", 0, "at most `N` operations a second")
	seconds, seed, reload := fs.Float64("seconds", 0, "stop after `S` seconds"), fs.Int64("seed", time.Now().UnixNano(), "the PRNG seed"), fs.Int("reload-ms", 500, "heartbeat and report period")
	asJSON := fs.Bool("json", false, "print the summary as one JSON object")
	if err := fs.Parse(args); err == flag.ErrHelp {
		return 0
	} else if err != nil {
		return 64
	}
	if *db == "" || *table == "" || *column == "" || *tenantCol == "" || *instance == "" || *writePct < 0 || *writePct > 100 || (*ops > 0 && *seconds > 0) {
		fmt.Fprintln(stderr, "keyshift-go-example: --db, --table, --column, --tenant-column and --instance are required; --write-percent is 0 to 100; give --ops or --seconds, not both.")
		return 64
	}
	enc := map[string]keyshift.Encoding{"binary": keyshift.EncodingBinary, "base64": keyshift.EncodingBase64}
	defEnc, okEnc := enc[*encoding]
	if !okEnc {
		fmt.Fprintf(stderr, "keyshift-go-example: --encoding %q: give binary or base64.\n", *encoding)
		return 64
	}
	cfg := keyshift.Config{Keyring: *keyring, Database: *db, InstanceID: *instance, DefaultKeyID: *keyID,
		Purpose: *purpose, Interval: time.Duration(*reload) * time.Millisecond, DefaultEncoding: defEnc}
	if *passFile != "" {
		p, err := os.ReadFile(*passFile)
		if err != nil {
			fmt.Fprintf(stderr, "keyshift-go-example: cannot read the passphrase file: %v.\n", err)
			return 66
		}
		cfg.Passphrase = bytes.TrimSuffix(p, []byte("\n"))
		defer wipe(p)
	}
	q := func(s string) string { return `"` + strings.ReplaceAll(s, `"`, `""`) + `"` }
	driver, dsn := "sqlite3", "file:"+*db+"?mode=rw&_busy_timeout=10000"
	if pgDSN.MatchString(*db) {
		driver, dsn = "postgres", *db
	}
	conn, err := sql.Open(driver, dsn)
	var lo, hi int64
	if err == nil {
		conn.SetMaxOpenConns(1)
		defer conn.Close()
		err = conn.QueryRow("SELECT min("+q(*idCol)+"), max("+q(*idCol)+") FROM "+q(*table)).Scan(&lo, &hi)
	}
	if err != nil {
		fmt.Fprintf(stderr, "keyshift-go-example: cannot read table %s: %v.\n", *table, err)
		return 69
	}
	pick := "SELECT " + q(*idCol) + ", " + q(*tenantCol) + ", " + q(*column) + " FROM " + q(*table) + " WHERE " + q(*idCol) + " >= $1 ORDER BY " + q(*idCol) + " LIMIT 1"
	update := "UPDATE " + q(*table) + " SET " + q(*column) + " = $1 WHERE " + q(*idCol) + " = $2"
	app, err := keyshift.Open(cfg)
	if err != nil {
		fmt.Fprintf(stderr, "keyshift-go-example: %v\n", err)
		return 69
	}
	defer app.Close()

	s := summary{Instance: *instance, OpenFailures: map[string]int{}, Writes: map[string]int{}, WriteFails: map[string]int{}}
	report := func() {
		if *asJSON {
			json.NewEncoder(stdout).Encode(s)
		} else {
			fmt.Fprintf(stdout, "%s: %d operations, %d reads, %d failed %v, writes %v, write failures %v, database errors %d\n",
				s.Instance, s.Ops, s.Reads, s.FailedReads, s.OpenFailures, s.Writes, s.WriteFails, s.DBErrors)
		}
	}
	var stopped int32
	go func() { <-stop; atomic.StoreInt32(&stopped, 1) }()
	rng, n, start := rand.New(rand.NewSource(*seed)), 0, time.Now()
	for atomic.LoadInt32(&stopped) == 0 && (*ops == 0 || s.Ops < *ops) && (*seconds == 0 || time.Since(start).Seconds() < *seconds) {
		select {
		case <-usr1:
			report()
		default:
		}
		if *rate > 0 {
			time.Sleep(time.Until(start.Add(time.Duration(s.Ops) * time.Second / time.Duration(*rate))))
		}
		s.Ops++
		var id int64
		var tenant, v []byte
		err := conn.QueryRow(pick, lo+rng.Int63n(hi-lo+1)).Scan(&id, &tenant, &v)
		if err != nil {
			s.DBErrors++
			fmt.Fprintf(stderr, "keyshift-go-example: SELECT: %v\n", err)
			continue
		}
		rec := &keyshift.Record{Table: *table, Column: *column, Tenant: tenant,
			Context: []byte(strings.ReplaceAll(*context, "{id}", fmt.Sprint(id)))}
		if v != nil {
			s.Reads++
			pt, err := app.Open(rec, v)
			var obj map[string]interface{}
			if err == nil && (json.Unmarshal(pt, &obj) != nil || (obj["id"] != nil && obj["id"] != float64(id))) {
				err = errors.New("malformed-plaintext")
			}
			wipe(pt)
			if err != nil {
				s.FailedReads++
				s.OpenFailures[errName(err)]++
			}
		}
		if rng.Intn(100) >= *writePct {
			continue
		}
		n++
		pt := []byte(fmt.Sprintf(`{"id":%d,"writer":%q,"n":%d}`, id, *instance, n))
		out, class, err := app.SealClass(rec, pt)
		if err != nil {
			s.WriteFails[errName(err)]++
			continue
		}
		var arg interface{} = out
		colEnc, _ := app.ColumnEncoding(*table, *column)
		if colEnc == keyshift.EncodingBase64 || (driver == "sqlite3" && class.Plaintext) {
			arg = string(out) // a text column's value, or a plaintext that stays TEXT
		}
		if _, err := conn.Exec(update, arg, id); err != nil {
			s.DBErrors++
			fmt.Fprintf(stderr, "keyshift-go-example: UPDATE: %v\n", err)
		} else {
			s.Writes[class.String()]++
		}
		wipe(pt)
	}
	app.Close() // the last report, then deregistration
	report()
	if s.FailedReads > 0 {
		return 65
	} else if s.DBErrors > 0 {
		return 74
	}
	return 0
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
