// Package keyshift seals and opens the values an application keeps in its
// database as keyshift envelopes, obeying the key and format rollouts
// under way, through libkeyshift's application API (keyshift/app.h).
//
// Open an App once, seal and open values from any number of goroutines,
// and Close it at exit:
//
//	app, err := keyshift.Open(keyshift.Config{
//		Keyring:      "/etc/shop/keyring",
//		DefaultKeyID: "payments/kek",
//	})
//	if err != nil { ... }
//	defer app.Close()
//	rec := keyshift.Record{Table: "payments", Column: "card",
//		Tenant: []byte("acme"), Context: []byte("payments:42:card")}
//	env, err := app.Seal(&rec, []byte("4111111111111111"))
//	pt, err := app.Open(&rec, env)
//
// With Config.Database set, opening registers the process as a reader in
// the rollout state, Seal writes what the rollout asks for the record's
// tenant and Open refuses a value whose class the rollout's phase does not
// read (docs/embedding.md).
//
// Errors are *Error values; errors.Is matches them against the sentinels
// (ErrAuthFailed, ErrMalformed, ...) and the three classes (ErrRetryable,
// ErrRefused, ErrConfiguration).
//
// Memory: the library keeps no pointer to a Go buffer after a call
// returns; the copies this package makes of a passphrase (in C memory) and
// of a batch's plaintexts are wiped before they are freed.  Plaintext that
// Open returns is the caller's to wipe.
//
// The package uses cgo and finds libkeyshift through pkg-config
// (keyshift.pc, installed by make install).
package keyshift

/*
#include "ksgo.h"
*/
import "C"

import (
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"keyshift.local/keyshift/ksapi"
)

// Format is an envelope format version.
type Format uint8

// The envelope formats.
const (
	FormatV1 Format = 1 // no purpose, no key commitment
	FormatV2 Format = 2 // purpose and key commitment
)

// Algorithm is an envelope's AEAD.
type Algorithm uint32

// The algorithms.
const (
	AES256GCM         Algorithm = 1
	XChaCha20Poly1305 Algorithm = 2
)

// String names the algorithm as the CLI does.
func (a Algorithm) String() string {
	switch a {
	case AES256GCM:
		return "aes-256-gcm"
	case XChaCha20Poly1305:
		return "xchacha20-poly1305"
	}
	return "unknown"
}

// Encoding is how a column holds envelopes (ks_value_encoding): the
// envelope's bytes, or its canonical base64 text (docs/format.md section
// 10).  Seal and Open work in the column's encoding (App.ColumnEncoding).
type Encoding int

// The encodings.
const (
	EncodingBinary Encoding = 0 // the envelope's bytes: a BLOB or bytea column
	EncodingBase64 Encoding = 1 // its base64 text, beginning "S1NF": TEXT, text, varchar
)

// String names the encoding as the CLI's --encoding does
// (ks_value_encoding_name); "unknown" for another value.
func (e Encoding) String() string {
	if n := C.ks_value_encoding_name(C.int(e)); n != nil {
		return C.GoString(n)
	}
	return "unknown"
}

// Config says how to open an App; its fields are ks_app_options'
// (keyshift/app.h).  The zero value takes its keys from the environment
// (KEYSHIFT_PROVIDERS, else KEYSHIFT_KEYRING and KEYSHIFT_PASSPHRASE) and
// names no database.
type Config struct {
	// Keys: at most one of Keyring and Providers.
	Keyring    string // a local keyring file
	Passphrase []byte // the keyring's passphrase; nil: unsealed
	Providers  string // a provider registry file

	// Database is a SQLite file (which must exist) or a PostgreSQL URI
	// holding the rollout state; "": no rollout governs any column.
	Database   string
	InstanceID string // required with Database

	MaxFormat  Format        // highest format read; 0: FormatV2
	Algorithms []Algorithm   // algorithms read; nil: every one this CPU runs
	Keys       string        // key versions held ("kek:1,kek:2"); "": what the keys list
	Interval   time.Duration // heartbeat, report and reload period; 0: 5 s (policy refresh 500 ms)

	// What to seal where no rollout governs the column.
	DefaultKeyID      string
	DefaultKeyVersion uint32    // 0: the key's primary
	DefaultFormat     Format    // 0: FormatV2
	DefaultAlgorithm  Algorithm // 0: XChaCha20Poly1305

	Purpose string // format 2's purpose when a record names none; "": the column's name

	// How columns that no rollout covers hold envelopes (every column
	// without a Database); a column a rollout covers is in the encoding
	// the rollout records.  0: EncodingBinary.
	DefaultEncoding Encoding
}

// Record names one value of the application's table: where it lives and
// what is bound into its envelope (ksapi.Record, shared with the agent
// client keyshift/agent).
type Record = ksapi.Record

// App is an open application: keys, and with a database the rollout
// policy and its background thread.  It is safe for concurrent use.
type App struct {
	mu  sync.RWMutex // Close takes it exclusively, every call shared
	app *C.ks_app    // nil once closed
}

// liveApps counts the ks_app handles not yet closed (for the tests).
var liveApps int64

// cstr returns s as C memory (nil for ""), to be freed by the caller.
func cstr(s string) *C.char {
	if s == "" {
		return nil
	}
	return C.CString(s)
}

// Open opens an application with cfg (ks_app_open).  Close it when done;
// a finalizer closes an App that is no longer reachable only as a safety
// net.
func Open(cfg Config) (*App, error) {
	var o C.ks_app_options
	strs := []*C.char{}
	str := func(s string) *C.char {
		c := cstr(s)
		if c != nil {
			strs = append(strs, c)
		}
		return c
	}
	defer func() {
		for _, c := range strs {
			C.free(unsafe.Pointer(c))
		}
	}()
	o.keyring = str(cfg.Keyring)
	o.providers = str(cfg.Providers)
	o.database = str(cfg.Database)
	o.instance_id = str(cfg.InstanceID)
	o.keys = str(cfg.Keys)
	o.default_key_id = str(cfg.DefaultKeyID)
	o.purpose = str(cfg.Purpose)
	o.max_format = C.uint8_t(cfg.MaxFormat)
	for _, a := range cfg.Algorithms {
		if a >= 32 {
			return nil, newError("open", C.KS_ERR_INVALID_ARGUMENT, -1, "an algorithm is not known")
		}
		o.algorithms |= 1 << uint(a)
	}
	if cfg.Interval < 0 || cfg.Interval.Milliseconds() > 1<<31 {
		return nil, newError("open", C.KS_ERR_INVALID_ARGUMENT, -1, "Interval is out of range")
	}
	o.interval_ms = C.uint32_t(cfg.Interval.Milliseconds())
	o.default_key_version = C.uint32_t(cfg.DefaultKeyVersion)
	o.default_format = C.uint8_t(cfg.DefaultFormat)
	o.default_algorithm = C.uint32_t(cfg.DefaultAlgorithm)
	o.default_encoding = C.ks_value_encoding(cfg.DefaultEncoding)
	var pass unsafe.Pointer
	if len(cfg.Passphrase) > 0 {
		pass = unsafe.Pointer(C.ksgo_dup((*C.uint8_t)(&cfg.Passphrase[0]), C.size_t(len(cfg.Passphrase))))
		if pass == nil {
			return nil, newError("open", C.KS_ERR_NO_MEMORY, -1, "out of memory")
		}
		defer C.ksgo_free_wiped(pass, C.size_t(len(cfg.Passphrase)))
		o.passphrase.ptr = (*C.uint8_t)(pass)
		o.passphrase.len = C.size_t(len(cfg.Passphrase))
	}
	var msg [512]C.char
	var h *C.ks_app
	if e := C.ks_app_open(&o, &h, &msg[0], C.size_t(len(msg))); e != C.KS_OK {
		return nil, newError("open", e, -1, C.GoString(&msg[0]))
	}
	atomic.AddInt64(&liveApps, 1)
	a := &App{app: h}
	runtime.SetFinalizer(a, (*App).Close)
	return a, nil
}

// Close stops the background thread, deregisters the reader, wipes the
// keys and frees the application (ks_app_close).  It waits for calls
// under way; later calls fail with ErrClosed.  A second Close does
// nothing.
func (a *App) Close() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.app == nil {
		return nil
	}
	C.ks_app_close(a.app)
	a.app = nil
	atomic.AddInt64(&liveApps, -1)
	runtime.SetFinalizer(a, nil)
	return nil
}

// ColumnEncoding is how table.column holds envelopes, the form Seal writes
// and Open reads there (ks_app_column_encoding): the encoding recorded
// with the latest rollout covering the column, else
// Config.DefaultEncoding.
func (a *App) ColumnEncoding(table, column string) (Encoding, error) {
	t, c := cstr(table), cstr(column)
	defer C.free(unsafe.Pointer(t))
	defer C.free(unsafe.Pointer(c))
	a.mu.RLock()
	defer a.mu.RUnlock()
	if a.app == nil {
		return EncodingBinary, ErrClosed
	}
	var enc C.ks_value_encoding
	if e := C.ks_app_column_encoding(a.app, t, c, &enc); e != C.KS_OK {
		return EncodingBinary, newError("column-encoding", e, -1, "")
	}
	return Encoding(enc), nil
}
