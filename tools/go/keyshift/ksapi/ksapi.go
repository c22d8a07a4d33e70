// Package ksapi holds what the in-process package keyshift (cgo over
// libkeyshift) and its agent client keyshift/agent (no cgo, docs/agent.md)
// share: the Record and Item types and the sentinel errors, with the one rule that
// maps an error's stable name and class to them.  It imports no cgo.
package ksapi

import (
	"errors"
	"strconv"
)

// Record names one value of the application's table: where it lives and
// what is bound into its envelope.
type Record struct {
	Table, Column string
	Tenant        []byte // required to seal; to open, nil means any tenant
	Context       []byte // bytes the reader rebuilds from trusted data, e.g. "payments:42:card"
	Purpose       []byte // format 2's purpose; nil: the configured purpose, else the column's name
}

// Item is one value of a batch, all of one table.column: its tenant,
// context, purpose and input; SealBatch and OpenBatch set Out (or Err).
type Item struct {
	Tenant, Context, Purpose []byte
	In                       []byte // the plaintext (seal) or the stored value (open)
	Out                      []byte // set: the output (in-process: a slice of one buffer shared by the batch)
	Err                      error  // set: this item's error
}

// Sentinels for errors.Is.  Every error of either package matches the
// sentinel of its class and, where one fits, the sentinel of its name.
var (
	ErrRetryable     = errors.New("keyshift: retryable")
	ErrRefused       = errors.New("keyshift: refused")
	ErrConfiguration = errors.New("keyshift: configuration")

	ErrAuthFailed      = errors.New("keyshift: authentication failed")            // auth-failed
	ErrMalformed       = errors.New("keyshift: malformed envelope")               // a parse rejection, with Offset
	ErrUnavailable     = errors.New("keyshift: key provider unavailable")         // unavailable, timeout
	ErrBusy            = errors.New("keyshift: database busy")                    // busy
	ErrPhase           = errors.New("keyshift: the rollout's phase refuses this") // phase
	ErrKeyUnusable     = errors.New("keyshift: key version unusable")             // denied, revoked, not-found
	ErrNoRollout       = errors.New("keyshift: no rollout and no default key")    // no-rollout
	ErrInvalidArgument = errors.New("keyshift: invalid argument")                 // invalid-argument
)

// Describe is the text of an error of both packages: prefix, op, the
// stable name, the member it concerns (when not empty), the byte offset
// of a malformed envelope's error (when not negative) and the sentence
// for people (when not empty).
func Describe(prefix, op, name, member string, offset int, msg string) string {
	s := prefix + op + ": " + name
	if member != "" {
		s += " (" + member + ")"
	}
	if offset >= 0 {
		s += " at byte " + strconv.Itoa(offset)
	}
	if msg != "" {
		s += ": " + msg
	}
	return s
}

// Match reports whether an error of the library named name (ks_err_name)
// in class (ks_error_class_name: "retryable", "refused", "configuration")
// matches target; malformed says it is a parse rejection of an envelope
// (ks_err codes 1..31).  It is the one mapping both packages use.
func Match(target error, name, class string, malformed bool) bool {
	switch target {
	case ErrRetryable:
		return class == "retryable"
	case ErrRefused:
		return class == "refused"
	case ErrConfiguration:
		return class == "configuration"
	case ErrAuthFailed:
		return name == "auth-failed"
	case ErrMalformed:
		return malformed
	case ErrUnavailable:
		return name == "unavailable" || name == "timeout"
	case ErrBusy:
		return name == "busy"
	case ErrPhase:
		return name == "phase"
	case ErrKeyUnusable:
		return name == "denied" || name == "revoked" || name == "not-found"
	case ErrNoRollout:
		return name == "no-rollout"
	case ErrInvalidArgument:
		return name == "invalid-argument"
	}
	return false
}
