package agent

import (
	"bytes"
	"encoding/hex"
	"errors"
	"strings"
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

// unhex is the bytes of hexadecimal s, spaces ignored.
func unhex(t *testing.T, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(strings.ReplaceAll(s, " ", ""))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// A batch frame is docs/agent.md's vector byte for byte [AG-BIN-2], and a
// result frame reads into outputs and errors, strictly [AG-BIN-4].
func TestFrame(t *testing.T) {
	items := []Item{{Tenant: []byte("acme"), Purpose: []byte("card"), Context: []byte("pay:1:card"),
		In: []byte("4111")}}
	want := unhex(t, "4b534231 00000001 00000008 7061792e63617264 00000004 61636d65 00000004 63617264 "+
		"0000000a 7061793a313a63617264 00000004 34313131")
	if got := appendFrame(nil, "pay.card", items); !bytes.Equal(got, want) {
		t.Fatalf("got %x\nwant %x", got, want)
	}
	res := unhex(t, "4b535231 00000002 01 0009 6261642d6d61676963 0007 72656675736564 01 00000000 "+
		"00 00000003 616263 01 02 00000001 0012 7863686163686132302d706f6c7931333035 0007 7061792f6b656b")
	two := make([]Item, 2)
	if !readResults("open-batch", res, two) {
		t.Fatal("a result frame was refused")
	}
	var ae *Error
	if !errors.As(two[0].Err, &ae) || ae.Name != "bad-magic" || ae.Offset != 0 || two[0].Out != nil ||
		!errors.Is(two[0].Err, ErrMalformed) {
		t.Fatalf("result 0: %v", two[0].Err)
	}
	if two[1].Err != nil || string(two[1].Out) != "abc" {
		t.Fatalf("result 1: %q %v", two[1].Out, two[1].Err)
	}
	for _, bad := range [][]byte{res[:len(res)-1], append(append([]byte{}, res...), 0), res[:8],
		append([]byte("KSR2"), res[4:]...)} {
		if readResults("open-batch", bad, make([]Item, 2)) {
			t.Fatalf("a broken result frame was read: %x", bad)
		}
	}
	if readResults("open-batch", res, make([]Item, 3)) {
		t.Fatal("a result frame of another count was read")
	}
}
