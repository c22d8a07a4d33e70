package agent

import (
	"errors"
	"testing"
)

// A record is the JSON of [AG-REQ-7]: absent tenant and purpose when nil,
// no context when empty, canonical base64.
func TestAppendRecord(t *testing.T) {
	got := string(appendRecord(nil, "pay.card", []byte("acme"), []byte("pay:1:card"), []byte("card"),
		"plaintext", []byte("4111")))
	want := `{"scope":"pay.card","tenant":"acme","purpose":"card","context":"cGF5OjE6Y2FyZA==","plaintext":"NDExMQ=="}`
	if got != want {
		t.Fatalf("got %s\nwant %s", got, want)
	}
	got = string(appendRecord(nil, "pay.card", nil, nil, nil, "value", []byte("plain")))
	if want = `{"scope":"pay.card","value":"cGxhaW4="}`; got != want {
		t.Fatalf("got %s\nwant %s", got, want)
	}
}

// The agent's errors match the sentinels by status, name and class
// [AG-ERR-2].
func TestErrorIs(t *testing.T) {
	cases := []struct {
		e    Error
		is   []error
		isnt []error
	}{
		{Error{Status: 422, Name: "auth-failed", Class: "refused", Offset: -1},
			[]error{ErrAuthFailed, ErrRefused}, []error{ErrMalformed, ErrBadRequest}},
		{Error{Status: 422, Name: "truncated", Class: "refused", Offset: 19},
			[]error{ErrMalformed, ErrRefused}, []error{ErrAuthFailed}},
		{Error{Status: 200, Name: "not-found", Class: "refused", Offset: -1},
			[]error{ErrKeyUnusable, ErrRefused}, []error{ErrBadRequest}},
		{Error{Status: 404, Name: "not-found", Class: "refused", Offset: -1},
			[]error{ErrBadRequest, ErrRefused}, []error{ErrKeyUnusable}},
		{Error{Status: 404, Name: "unknown-scope", Class: "refused", Offset: -1},
			[]error{ErrUnknownScope, ErrBadRequest}, []error{ErrKeyUnusable}},
		{Error{Status: 403, Name: "not-authorized", Class: "refused", Offset: -1},
			[]error{ErrNotAuthorized, ErrRefused}, []error{ErrBadRequest, ErrKeyUnusable}},
		{Error{Status: 409, Name: "phase", Class: "refused", Offset: -1},
			[]error{ErrPhase}, []error{ErrBadRequest}},
		{Error{Status: 503, Name: "timeout", Class: "retryable", Offset: -1},
			[]error{ErrUnavailable, ErrRetryable}, []error{ErrRefused}},
		{Error{Status: 503, Name: "overloaded", Class: "retryable", Offset: -1},
			[]error{ErrRetryable}, []error{ErrUnavailable}},
		{Error{Status: 500, Name: "no-rollout", Class: "configuration", Offset: -1},
			[]error{ErrNoRollout, ErrConfiguration}, nil},
	}
	for _, c := range cases {
		for _, s := range c.is {
			if !errors.Is(&c.e, s) {
				t.Errorf("%v is not %v", &c.e, s)
			}
		}
		for _, s := range c.isnt {
			if errors.Is(&c.e, s) {
				t.Errorf("%v is %v", &c.e, s)
			}
		}
	}
}
