package keyshift

/*
#include "ksgo.h"
*/
import "C"

import (
	"errors"
	"fmt"

	"keyshift.local/keyshift/ksapi"
)

// Class is an error's class (ks_err_class): what the caller should do.
type Class int

// The classes.
const (
	ClassRetryable     Class = 1 // the same call may succeed later
	ClassRefused       Class = 2 // this record or call is refused; retrying will not help
	ClassConfiguration Class = 3 // the setup is wrong: fix it and open again
)

// String is the class's name: "retryable", "refused", "configuration".
func (c Class) String() string {
	if n := C.ks_error_class_name(C.ks_error_class(c)); n != nil {
		return C.GoString(n)
	}
	return fmt.Sprintf("class(%d)", int(c))
}

// Sentinels for errors.Is (package ksapi, shared with the agent client
// keyshift/agent).  Every *Error matches the sentinel of its class and,
// where one fits, the sentinel of its code.
var (
	ErrRetryable     = ksapi.ErrRetryable
	ErrRefused       = ksapi.ErrRefused
	ErrConfiguration = ksapi.ErrConfiguration

	ErrAuthFailed      = ksapi.ErrAuthFailed
	ErrMalformed       = ksapi.ErrMalformed
	ErrUnavailable     = ksapi.ErrUnavailable
	ErrBusy            = ksapi.ErrBusy
	ErrPhase           = ksapi.ErrPhase
	ErrKeyUnusable     = ksapi.ErrKeyUnusable
	ErrNoRollout       = ksapi.ErrNoRollout
	ErrInvalidArgument = ksapi.ErrInvalidArgument
	ErrClosed          = errors.New("keyshift: the App is closed")
)

// Error is a libkeyshift error: its stable name (ks_err_name), class and,
// for a malformed envelope, the byte offset the parser stopped at.
type Error struct {
	Op     string // "open", "seal", "open-value", "parse", "seal-batch", "open-batch"
	Code   int    // the ks_err code
	Name   string // e.g. "auth-failed", "truncated"
	Class  Class
	Offset int    // byte offset of a malformed envelope's error; -1 when none
	Msg    string // from Open: a sentence saying what is wrong (never a secret)
}

// Error says what failed, with the name, offset and message.
func (e *Error) Error() string {
	return ksapi.Describe("keyshift: ", e.Op, e.Name, "", e.Offset, e.Msg)
}

// Is matches the class sentinels and the code sentinels (ksapi.Match).
func (e *Error) Is(target error) bool {
	return ksapi.Match(target, e.Name, e.Class.String(), e.Code >= 1 && e.Code <= 31)
}

// newError builds the *Error of code (a ks_err) for op.
func newError(op string, code C.ks_err, offset int, msg string) *Error {
	name := "unknown"
	if n := C.ks_err_name(code); n != nil {
		name = C.GoString(n)
	}
	return &Error{Op: op, Code: int(code), Name: name, Class: Class(C.ks_err_class(code)),
		Offset: offset, Msg: msg}
}

// resultError decodes a negative ksgo result (ksgo.h).
func resultError(op string, r C.int64_t) *Error {
	v := uint64(-int64(r))
	return newError(op, C.ks_err(v&0xffff), int(v>>16)-1, "")
}

// errorOf is the *Error of code, for the tests of the mapping.
func errorOf(code int) *Error {
	return newError("test", C.ks_err(code), -1, "")
}
