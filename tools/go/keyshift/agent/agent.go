// Package agent is the client of keyshift serve, the local encryption
// agent (docs/agent.md): the Seal and Open API of the package keyshift,
// served over the agent's Unix socket with HTTP/1.1 and JSON.  It uses the
// standard library only and no cgo, so that a service built with
// CGO_ENABLED=0 holds no key material and links no libkeyshift.  Its
// errors match the same sentinels as the package keyshift's (ksapi).
package agent

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"

	"keyshift.local/keyshift/ksapi"
)

// Record is the package keyshift's Record: where a value lives and what is
// bound into its envelope.
type Record = ksapi.Record

// The sentinels of the package keyshift, for errors.Is, and the agent's own.
var (
	ErrRetryable       = ksapi.ErrRetryable
	ErrRefused         = ksapi.ErrRefused
	ErrConfiguration   = ksapi.ErrConfiguration
	ErrAuthFailed      = ksapi.ErrAuthFailed
	ErrMalformed       = ksapi.ErrMalformed
	ErrUnavailable     = ksapi.ErrUnavailable
	ErrBusy            = ksapi.ErrBusy
	ErrPhase           = ksapi.ErrPhase
	ErrKeyUnusable     = ksapi.ErrKeyUnusable
	ErrNoRollout       = ksapi.ErrNoRollout
	ErrInvalidArgument = ksapi.ErrInvalidArgument

	ErrNotAuthorized = errors.New("keyshift agent: the policy does not allow this")      // 403 not-authorized [AG-AUTH-2]
	ErrUnknownScope  = errors.New("keyshift agent: the agent does not serve this scope") // 404 unknown-scope [AG-REQ-4]
	ErrBadRequest    = errors.New("keyshift agent: the request is malformed")            // 400, 404, 405, 413 [AG-ERR-2]
)

// Error is an error answer of the agent ([AG-ERR-1]): the HTTP status, the
// stable name and class, and where they apply the member at fault and the
// byte offset of a parse rejection.
type Error struct {
	Op     string // "seal", "open"
	Status int    // the HTTP status
	Name   string // e.g. "auth-failed", "truncated", "not-authorized"
	Class  string // "retryable", "refused" or "configuration"
	Member string // the request member at fault; "" when none
	Offset int    // byte offset of a malformed envelope's error; -1 when none
	Msg    string // the agent's sentence for people; never parsed
}

// Error says what failed, with the name, offset and message.
func (e *Error) Error() string {
	s := "keyshift agent: " + e.Op + ": " + e.Name
	if e.Member != "" {
		s += " (" + e.Member + ")"
	}
	if e.Offset >= 0 {
		s += fmt.Sprintf(" at byte %d", e.Offset)
	}
	if e.Msg != "" {
		s += ": " + e.Msg
	}
	return s
}

// Is matches the agent's own sentinels by status and name [AG-ERR-2], and
// the library's by ksapi.Match; a 404 not-found is an endpoint, not a key.
func (e *Error) Is(target error) bool {
	switch target {
	case ErrNotAuthorized:
		return e.Name == "not-authorized"
	case ErrUnknownScope:
		return e.Name == "unknown-scope"
	case ErrBadRequest:
		return e.Status == 400 || e.Status == 404 || e.Status == 405 || e.Status == 413
	}
	if e.Status != 422 && e.Status != 409 && e.Status != 500 && e.Status != 503 {
		return ksapi.Match(target, "", e.Class, false)
	}
	return ksapi.Match(target, e.Name, e.Class, e.Offset >= 0)
}

// Client is a connection pool to one agent socket.  It is safe for
// concurrent use.
type Client struct {
	hc *http.Client
	tr *http.Transport
}

// Dial returns a Client of the agent listening on the Unix socket
// socketPath, after checking that it answers GET /healthz
// [AG-HEALTH-1].
func Dial(socketPath string) (*Client, error) {
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", socketPath)
		},
		MaxIdleConnsPerHost: 64,
		IdleConnTimeout:     30 * time.Second,
		DisableCompression:  true,
	}
	c := &Client{hc: &http.Client{Transport: tr, Timeout: 30 * time.Second}, tr: tr}
	resp, err := c.hc.Get("http://agent/healthz")
	if err != nil {
		tr.CloseIdleConnections()
		return nil, fmt.Errorf("keyshift agent: cannot reach %s: %w", socketPath, err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		tr.CloseIdleConnections()
		return nil, fmt.Errorf("keyshift agent: %s answered /healthz with %s", socketPath, resp.Status)
	}
	return c, nil
}

// Close closes the idle connections; the Client is not used afterwards.
func (c *Client) Close() error {
	c.tr.CloseIdleConnections()
	return nil
}

// b64 is the canonical base64 [F-TEXT-1] of b.
func b64(b []byte) string { return base64.StdEncoding.EncodeToString(b) }

// request is a seal or open record [AG-REQ-7].
type request struct {
	Scope     string  `json:"scope"`
	Tenant    *string `json:"tenant,omitempty"`
	Purpose   *string `json:"purpose,omitempty"`
	Context   string  `json:"context,omitempty"`
	Plaintext *string `json:"plaintext,omitempty"`
	Value     *string `json:"value,omitempty"`
}

// newRequest is r's record; a nil tenant or purpose is absent.
func newRequest(r *Record) request {
	q := request{Scope: r.Table + "." + r.Column, Context: b64(r.Context)}
	if r.Tenant != nil {
		t := string(r.Tenant)
		q.Tenant = &t
	}
	if r.Purpose != nil {
		p := string(r.Purpose)
		q.Purpose = &p
	}
	return q
}

// answer is a seal's or open's answer [AG-RESP-2..3], or an error
// [AG-ERR-1].
type answer struct {
	Value     *string `json:"value"`
	Plaintext *string `json:"plaintext"`
	Error     string  `json:"error"`
	Class     string  `json:"class"`
	Member    string  `json:"member"`
	Offset    *int    `json:"offset"`
	Message   string  `json:"message"`
}

// wipe overwrites b.
func wipe(b []byte) {
	for i := range b {
		b[i] = 0
	}
}

// post sends body to path and decodes the answer; it wipes the body and
// the answer's bytes it read, as either may hold plaintext.
func (c *Client) post(op, path string, body []byte) (*answer, error) {
	defer wipe(body)
	resp, err := c.hc.Post("http://agent"+path, "application/json", bytes.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("keyshift agent: %s: %w: %v", op, ErrUnavailable, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 1<<30))
	defer wipe(raw)
	if err != nil {
		return nil, fmt.Errorf("keyshift agent: %s: %w: %v", op, ErrUnavailable, err)
	}
	var a answer
	if err := json.Unmarshal(raw, &a); err != nil {
		return nil, &Error{Op: op, Status: resp.StatusCode, Name: "bad-answer", Class: "configuration",
			Offset: -1, Msg: "the agent's answer is not JSON: " + strings.TrimSpace(resp.Status)}
	}
	if resp.StatusCode != http.StatusOK || a.Error != "" {
		e := &Error{Op: op, Status: resp.StatusCode, Name: a.Error, Class: a.Class,
			Member: a.Member, Offset: -1, Msg: a.Message}
		if a.Offset != nil {
			e.Offset = *a.Offset
		}
		return nil, e
	}
	return &a, nil
}

// decode is the bytes of the base64 member s of an answer.
func decode(op, member string, s *string) ([]byte, error) {
	if s == nil {
		return nil, &Error{Op: op, Status: 200, Name: "bad-answer", Class: "configuration", Offset: -1,
			Msg: "the agent's answer has no " + member}
	}
	b, err := base64.StdEncoding.DecodeString(*s)
	if err != nil {
		return nil, &Error{Op: op, Status: 200, Name: "bad-answer", Class: "configuration", Offset: -1,
			Msg: "the agent's " + member + " is not base64"}
	}
	return b, nil
}

// call sends the record q to path and returns the answer's base64 member
// (value or plaintext), decoded.
func (c *Client) call(op, path, member string, q request) ([]byte, error) {
	body, err := json.Marshal(q)
	if err != nil {
		return nil, err
	}
	a, err := c.post(op, path, body)
	if err != nil {
		return nil, err
	}
	if member == "value" {
		return decode(op, member, a.Value)
	}
	return decode(op, member, a.Plaintext)
}

// Seal seals pt for r through the agent (POST /v1/seal): the class the
// rollout names for r's tenant, else the agent's --key.  Before
// write-upgrade of a rollout from plaintext the result is pt itself.
func (c *Client) Seal(r *Record, pt []byte) ([]byte, error) {
	q := newRequest(r)
	p := b64(pt)
	q.Plaintext = &p
	return c.call("seal", "/v1/seal", "value", q)
}

// Open opens the stored value v for r through the agent (POST /v1/open),
// after it authenticated.  The caller owns the plaintext and should wipe
// it when done.
func (c *Client) Open(r *Record, v []byte) ([]byte, error) {
	q := newRequest(r)
	s := b64(v)
	q.Value = &s
	return c.call("open", "/v1/open", "plaintext", q)
}
