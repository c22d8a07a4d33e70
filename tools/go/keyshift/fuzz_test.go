package keyshift

import (
	"errors"
	"testing"
)

// FuzzParse feeds Parse arbitrary bytes: it never panics, a success
// describes spans inside the input, and a failure is a malformed-envelope
// error with an offset inside it.  The seed corpus is testdata/fuzz/FuzzParse.
func FuzzParse(f *testing.F) {
	f.Add([]byte("KSE"))
	f.Fuzz(func(t *testing.T, v []byte) {
		h, err := Parse(v)
		if err != nil {
			var ke *Error
			if !errors.As(err, &ke) || !errors.Is(err, ErrMalformed) || ke.Offset > len(v) {
				t.Fatalf("Parse: %v", err)
			}
			return
		}
		if h.TotalLen != len(v) || h.HeaderLen > len(v) {
			t.Fatalf("lengths %+v for %d bytes", h, len(v))
		}
		for _, s := range []Span{h.Tenant, h.KeyID, h.WrappedDEK, h.Nonce, h.Purpose, h.Commitment, h.Ciphertext} {
			if s.Offset < 0 || s.Len < 0 || s.Offset+s.Len > len(v) {
				t.Fatalf("span %+v outside %d bytes", s, len(v))
			}
		}
	})
}
