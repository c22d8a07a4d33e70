package keyshift

/*
#include "ksgo.h"
*/
import "C"

// Span is where a field lies in the envelope: bytes [Offset, Offset+Len);
// zero for a field the envelope does not have.
type Span struct {
	Offset, Len int
}

// Header is an envelope's header fields and where each lies.
type Header struct {
	Version                                               Format
	Algorithm                                             Algorithm
	KeyVersion                                            uint32
	Tenant, KeyID, WrappedDEK, Nonce, Purpose, Commitment Span
	Ciphertext                                            Span // ciphertext || tag
	HeaderLen                                             int  // [0, HeaderLen) holds the prefix and every header field
	TotalLen                                              int  // the envelope's length
}

// Bytes returns the bytes of s in v (the envelope the span came from).
func (s Span) Bytes(v []byte) []byte {
	return v[s.Offset : s.Offset+s.Len : s.Offset+s.Len]
}

func span(s C.ks_app_span) Span {
	return Span{Offset: int(s.offset), Len: int(s.len)}
}

// Parse parses envelope v strictly (ks_app_parse) without keys or an App,
// for inspect-like tools.  A rejection is an *Error matching ErrMalformed,
// with the byte offset.
func Parse(v []byte) (Header, error) {
	var h C.ks_app_header
	if r := C.ksgo_parse(bp(v), C.size_t(len(v)), &h); r < 0 {
		return Header{}, resultError("parse", r)
	}
	return Header{
		Version:    Format(h.version),
		Algorithm:  Algorithm(h.algorithm),
		KeyVersion: uint32(h.key_version),
		Tenant:     span(h.tenant),
		KeyID:      span(h.key_id),
		WrappedDEK: span(h.wrapped_dek),
		Nonce:      span(h.nonce),
		Purpose:    span(h.purpose),
		Commitment: span(h.commitment),
		Ciphertext: span(h.ciphertext),
		HeaderLen:  int(h.header_len),
		TotalLen:   int(h.total_len),
	}, nil
}
