// Package agent is the client of keyshift serve, the local encryption
// agent (docs/agent.md): the Seal and Open API of the package keyshift,
// served over the agent's Unix socket with HTTP/1.1 and JSON, batches in
// the agent's batch frame (docs/agent.md section 4a).  It uses the
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
	"time"

	"keyshift.local/keyshift/ksapi"
)

// Record is the package keyshift's Record: where a value lives and what is
// bound into its envelope.
type Record = ksapi.Record

// Item is the package keyshift's Item: one value of a batch and its result.
type Item = ksapi.Item

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
	Status int    // the HTTP status (200: a record's error in a batch)
	Name   string // e.g. "auth-failed", "truncated", "not-authorized"
	Class  string // "retryable", "refused" or "configuration"
	Member string // the request member at fault; "" when none
	Offset int    // byte offset of a malformed envelope's error; -1 when none
	Msg    string // the agent's sentence for people; never parsed
}

// Error says what failed, with the name, offset and message.
func (e *Error) Error() string {
	return ksapi.Describe("keyshift agent: ", e.Op, e.Name, e.Member, e.Offset, e.Msg)
}

// Is matches the agent's own sentinels by status and name [AG-ERR-2], and
// the library's by ksapi.Match; a 404 not-found is an endpoint, not a key.
// Status is 200 for a record's error in a batch [AG-RESP-5].
func (e *Error) Is(target error) bool {
	switch target {
	case ErrNotAuthorized:
		return e.Name == "not-authorized"
	case ErrUnknownScope:
		return e.Name == "unknown-scope"
	case ErrBadRequest:
		return e.protocol()
	}
	if e.protocol() || e.Status == 403 {
		return ksapi.Match(target, "", e.Class, false)
	}
	return ksapi.Match(target, e.Name, e.Class, e.Offset >= 0)
}

// protocol reports whether e refuses the request itself rather than
// carrying an error of the library [AG-ERR-2] (a batch's record errors
// come with the batch's 200).
func (e *Error) protocol() bool {
	return e.Status == 400 || e.Status == 404 || e.Status == 405 || e.Status == 413
}

// Client is a connection pool to one agent socket.  It is safe for
// concurrent use.
type Client struct {
	hc *http.Client
	tr *http.Transport
}

// Dial returns a Client of the agent listening on the Unix socket
// socketPath, after checking that it answers GET /healthz
// [AG-HEALTH-1]; an agent that does not answer matches ErrUnavailable.
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
		return nil, fmt.Errorf("keyshift agent: cannot reach %s: %w: %v", socketPath, ErrUnavailable, err)
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

// appendB64 appends the canonical base64 [F-TEXT-1] of b to dst.
func appendB64(dst, b []byte) []byte {
	n := base64.StdEncoding.EncodedLen(len(b))
	if cap(dst)-len(dst) < n {
		g := make([]byte, len(dst), 2*cap(dst)+n)
		copy(g, dst)
		wipe(dst)
		dst = g
	}
	base64.StdEncoding.Encode(dst[len(dst):len(dst)+n], b)
	return dst[:len(dst)+n]
}

// appendString appends the JSON string of s (never a secret: a scope,
// tenant or purpose) to dst.
func appendString(dst []byte, s string) []byte {
	j, _ := json.Marshal(s) // a string always marshals
	return append(dst, j...)
}

// appendRecord appends the JSON object of one record [AG-REQ-7] to dst,
// the base64 member data (plaintext or value) encoded straight into it, so
// that the only copy of a plaintext is dst, which the caller wipes.  A nil
// tenant or purpose is absent, and so is an empty context.
func appendRecord(dst []byte, scope string, tenant, context, purpose []byte, data string, in []byte) []byte {
	dst = append(dst, `{"scope":`...)
	dst = appendString(dst, scope)
	if tenant != nil {
		dst = appendString(append(dst, `,"tenant":`...), string(tenant))
	}
	if purpose != nil {
		dst = appendString(append(dst, `,"purpose":`...), string(purpose))
	}
	if len(context) > 0 {
		dst = append(appendB64(append(dst, `,"context":"`...), context), '"')
	}
	dst = append(dst, `,"`+data+`":"`...)
	return append(appendB64(dst, in), `"}`...)
}

// answer is a seal's or open's answer [AG-RESP-2..3], or an error
// [AG-ERR-1]; Value and Plaintext stay raw JSON so that they can be wiped.
type answer struct {
	Value     json.RawMessage `json:"value"`
	Plaintext json.RawMessage `json:"plaintext"`
	Error     string          `json:"error"`
	Class     string          `json:"class"`
	Member    string          `json:"member"`
	Offset    *int            `json:"offset"`
	Message   string          `json:"message"`
}

// wipe clears the raw members of a.
func (a *answer) wipe() {
	wipe(a.Value)
	wipe(a.Plaintext)
}

// err is the *Error of an error answer with status, or nil.
func (a *answer) err(op string, status int) error {
	if status == http.StatusOK && a.Error == "" {
		return nil
	}
	e := &Error{Op: op, Status: status, Name: a.Error, Class: a.Class, Member: a.Member,
		Offset: -1, Msg: a.Message}
	if a.Offset != nil {
		e.Offset = *a.Offset
	}
	return e
}

// wipe overwrites b.
func wipe(b []byte) {
	for i := range b {
		b[i] = 0
	}
}

// post sends body to path and decodes the answer into out (wiping the
// answer's bytes it read, as they may hold plaintext), returning the HTTP
// status.  It wipes body, which may hold plaintext too.
func (c *Client) post(op, path string, body []byte, out interface{}) (int, error) {
	status, _, raw, err := c.send(op, path, "application/json", body)
	defer wipe(raw)
	if err != nil {
		return 0, err
	}
	if err := json.Unmarshal(raw, out); err != nil {
		return 0, &Error{Op: op, Status: status, Name: "bad-answer", Class: "configuration",
			Offset: -1, Msg: "the agent's answer is not JSON: " + http.StatusText(status)}
	}
	return status, nil
}

// send posts body of type ctype to path and returns the answer's status,
// Content-Type and bytes, which the caller wipes.  It wipes body.
func (c *Client) send(op, path, ctype string, body []byte) (int, string, []byte, error) {
	defer wipe(body)
	req, err := http.NewRequest(http.MethodPost, "http://agent"+path, bytes.NewReader(body))
	if err != nil {
		return 0, "", nil, err
	}
	req.Header.Set("Content-Type", ctype)
	// A request written on an idle connection the agent closed is never
	// read [AG-RUN-3], and no call changes the agent's state: the
	// transport may send it again on a new connection (RFC 9112 section
	// 9.3.1).  A nil value marks it so without sending the header.
	req.Header["X-Idempotency-Key"] = nil
	resp, err := c.hc.Do(req)
	if err != nil {
		return 0, "", nil, fmt.Errorf("keyshift agent: %s: %w: %v", op, ErrUnavailable, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 1<<30))
	if err != nil {
		wipe(raw)
		return 0, "", nil, fmt.Errorf("keyshift agent: %s: %w: %v", op, ErrUnavailable, err)
	}
	return resp.StatusCode, resp.Header.Get("Content-Type"), raw, nil
}

// decode is the bytes of the raw JSON base64 string member of an answer.
func decode(op, member string, raw json.RawMessage) ([]byte, error) {
	n := len(raw)
	if n < 2 || raw[0] != '"' || raw[n-1] != '"' {
		return nil, &Error{Op: op, Status: 200, Name: "bad-answer", Class: "configuration", Offset: -1,
			Msg: "the agent's answer has no " + member + " string"}
	}
	out := make([]byte, base64.StdEncoding.DecodedLen(n-2))
	m, err := base64.StdEncoding.Strict().Decode(out, raw[1:n-1])
	if err != nil {
		wipe(out)
		return nil, &Error{Op: op, Status: 200, Name: "bad-answer", Class: "configuration", Offset: -1,
			Msg: "the agent's " + member + " is not canonical base64"}
	}
	return out[:m:m], nil
}

// call sends one record to path and returns the answer's base64 member
// (value or plaintext), decoded.
func (c *Client) call(op, path, data string, r *Record, in []byte) ([]byte, error) {
	body := appendRecord(make([]byte, 0, 256+base64.StdEncoding.EncodedLen(len(in))),
		r.Table+"."+r.Column, r.Tenant, r.Context, r.Purpose, data, in)
	var a answer
	defer a.wipe()
	status, err := c.post(op, path, body, &a)
	if err != nil {
		return nil, err
	}
	if err := a.err(op, status); err != nil {
		return nil, err
	}
	if op == "seal" {
		return decode(op, "value", a.Value)
	}
	return decode(op, "plaintext", a.Plaintext)
}

// Seal seals pt for r through the agent (POST /v1/seal): the class the
// rollout names for r's tenant, else the agent's --key.  Before
// write-upgrade of a rollout from plaintext the result is pt itself.
func (c *Client) Seal(r *Record, pt []byte) ([]byte, error) {
	return c.call("seal", "/v1/seal", "plaintext", r, pt)
}

// Open opens the stored value v for r through the agent (POST /v1/open),
// after it authenticated.  The caller owns the plaintext and should wipe
// it when done.
func (c *Client) Open(r *Record, v []byte) ([]byte, error) {
	return c.call("open", "/v1/open", "value", r, v)
}

// SealBatch seals every item, all of table.column, in one request (POST
// /v1/seal-batch in the batch frame, at most the agent's --max-batch items
// [AG-REQ-8], [AG-BIN-1..4]); one item's failure does not stop the others
// [AG-RESP-5].  It returns the request's error, else the first item's
// error, if any.  The outputs share one new buffer.
func (c *Client) SealBatch(table, column string, items []Item) error {
	return c.batch("seal-batch", table, column, items)
}

// OpenBatch opens every item, as SealBatch (POST /v1/open-batch).
func (c *Client) OpenBatch(table, column string, items []Item) error {
	return c.batch("open-batch", table, column, items)
}

// frameType is the media type of the batch frame [AG-BIN-1].
const frameType = "application/vnd.keyshift.batch"

// appendU32 appends v, big-endian, to dst.
func appendU32(dst []byte, v uint32) []byte {
	return append(dst, byte(v>>24), byte(v>>16), byte(v>>8), byte(v))
}

// appendField appends a frame field [AG-BIN-2]: b's length as a u32, then b.
func appendField(dst, b []byte) []byte {
	return append(appendU32(dst, uint32(len(b))), b...)
}

// appendFrame appends the request frame of items, all of scope, to dst
// [AG-BIN-2]: a nil or empty tenant or purpose is absent, and so is an
// empty context.
func appendFrame(dst []byte, scope string, items []Item) []byte {
	dst = appendU32(append(dst, "KSB1"...), uint32(len(items)))
	for i := range items {
		it := &items[i]
		dst = appendField(dst, []byte(scope))
		dst = appendField(dst, it.Tenant)
		dst = appendField(dst, it.Purpose)
		dst = appendField(dst, it.Context)
		dst = appendField(dst, it.In)
	}
	return dst
}

// frameReader reads a result frame [AG-BIN-4] strictly: every length is
// checked against the bytes left; the first fault latches bad.
type frameReader struct {
	b   []byte
	bad bool
}

// take returns the next n bytes, or nil (and latches bad) when fewer remain.
func (r *frameReader) take(n int) []byte {
	if r.bad || n < 0 || n > len(r.b) {
		r.bad = true
		return nil
	}
	out := r.b[:n:n]
	r.b = r.b[n:]
	return out
}

// u8, u16 and u32 read big-endian integers; 0 once bad.
func (r *frameReader) u8() int {
	if b := r.take(1); b != nil {
		return int(b[0])
	}
	return 0
}

func (r *frameReader) u16() int {
	if b := r.take(2); b != nil {
		return int(b[0])<<8 | int(b[1])
	}
	return 0
}

func (r *frameReader) u32() uint32 {
	if b := r.take(4); b != nil {
		return uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
	}
	return 0
}

// readResults reads the result frame raw of n records into items, each
// Out a copy (into one new buffer) or Err; false when raw is not a result
// frame of n results [AG-BIN-4].
func readResults(op string, raw []byte, items []Item) bool {
	r := frameReader{b: raw}
	if string(r.take(4)) != "KSR1" || r.u32() != uint32(len(items)) {
		return false
	}
	type span struct{ at, n int }
	outs := make([]span, len(items))
	errs := make([]error, len(items))
	var all []byte
	for i := range items {
		switch r.u8() {
		case 0:
			out := r.take(int(r.u32()))
			sealed, format := r.u8(), r.u8()
			r.u32() // key_version
			alg, kid := r.take(r.u16()), r.take(r.u16())
			if sealed > 1 || (sealed == 0 && (format != 0 || len(alg) != 0 || len(kid) != 0)) {
				r.bad = true
			}
			outs[i] = span{len(all), len(out)}
			all = append(all, out...)
		case 1:
			name, class := r.take(r.u16()), r.take(r.u16())
			has, off := r.u8(), r.u32()
			e := &Error{Op: op, Status: http.StatusOK, Name: string(name), Class: string(class), Offset: -1}
			if has > 1 || (has == 0 && off != 0) {
				r.bad = true
			} else if has == 1 {
				e.Offset = int(off)
			}
			errs[i] = e
		default:
			r.bad = true
		}
	}
	if r.bad || len(r.b) != 0 {
		wipe(all)
		return false
	}
	for i := range items {
		items[i].Out, items[i].Err = nil, errs[i]
		if errs[i] == nil {
			s := outs[i]
			items[i].Out = all[s.at : s.at+s.n : s.at+s.n]
		}
	}
	return true
}

// batch sends items as one batch request in the batch frame and sets each
// item's Out or Err.
func (c *Client) batch(op, table, column string, items []Item) error {
	size := 8
	for i := range items {
		it := &items[i]
		size += 20 + len(table) + 1 + len(column) + len(it.Tenant) + len(it.Purpose) + len(it.Context) + len(it.In)
	}
	body := appendFrame(make([]byte, 0, size), table+"."+column, items)
	status, ctype, raw, err := c.send(op, "/v1/"+op, frameType, body)
	defer wipe(raw)
	if err != nil {
		return err
	}
	if status != http.StatusOK || ctype != frameType {
		var a answer
		if json.Unmarshal(raw, &a) != nil || a.Error == "" {
			return &Error{Op: op, Status: status, Name: "bad-answer", Class: "configuration", Offset: -1,
				Msg: "the agent's answer is neither a result frame nor an error: " + http.StatusText(status)}
		}
		return a.err(op, status)
	}
	if !readResults(op, raw, items) {
		return &Error{Op: op, Status: status, Name: "bad-answer", Class: "configuration", Offset: -1,
			Msg: "the agent's answer is not a result frame of " + fmt.Sprint(len(items)) + " results"}
	}
	for i := range items {
		if items[i].Err != nil {
			return items[i].Err
		}
	}
	return nil
}

// Header is an envelope's header as the agent parses it [AG-RESP-4]: the
// fields, without where each lies (the package keyshift's Parse has the
// spans, in process).
type Header struct {
	Version       int    `json:"version"`
	Algorithm     string `json:"algorithm"` // "aes-256-gcm", "xchacha20-poly1305"
	Tenant        string `json:"tenant"`
	KeyID         string `json:"key_id"`
	KeyVersion    uint32 `json:"key_version"`
	Purpose       string `json:"purpose"` // format 2 only
	CiphertextLen int    `json:"ciphertext_len"`
	HeaderLen     int    `json:"header_len"`
	TotalLen      int    `json:"total_len"`
}

// Parse parses envelope v of table.column strictly through the agent
// (POST /v1/parse), without opening it.  A rejection matches ErrMalformed,
// with the byte offset.
func (c *Client) Parse(table, column string, v []byte) (Header, error) {
	body := append(appendString([]byte(`{"scope":`), table+"."+column), `,"value":"`...)
	body = append(appendB64(body, v), `"}`...)
	var a struct {
		answer
		Header
	}
	status, err := c.post("parse", "/v1/parse", body, &a)
	if err != nil {
		return Header{}, err
	}
	if err := a.answer.err("parse", status); err != nil {
		return Header{}, err
	}
	return a.Header, nil
}
