package keyshift

/*
#include "ksgo.h"
*/
import "C"

import (
	"fmt"
	"sync"
	"unsafe"

	"keyshift.local/keyshift/ksapi"
)

// bp is a pointer to b's bytes for the duration of one C call (nil when
// empty).
func bp(b []byte) *C.uint8_t {
	if len(b) == 0 {
		return nil
	}
	return (*C.uint8_t)(unsafe.Pointer(&b[0]))
}

// sp is a pointer to s's bytes for the duration of one C call (nil when
// empty); C only reads them.
func sp(s string) *C.char {
	if len(s) == 0 {
		return nil
	}
	return *(**C.char)(unsafe.Pointer(&s))
}

// grow returns dst with room for n more bytes after len(dst).
func grow(dst []byte, n int) []byte {
	if cap(dst)-len(dst) >= n {
		return dst
	}
	g := make([]byte, len(dst), len(dst)+n)
	copy(g, dst)
	return g
}

// SealMaxLen is an upper bound on the output of sealing n bytes; 0 past
// the format's limits (ks_app_seal_max_len).
func SealMaxLen(n int) int {
	return int(C.ks_app_seal_max_len(C.size_t(n)))
}

// Seal seals pt for r (ks_app_seal): the class the rollout names for r's
// tenant, else the default key, in the column's encoding (ColumnEncoding:
// the envelope's bytes, or its base64 text).  Before write-upgrade of a rollout from
// plaintext the result is pt itself, unsealed, as the column still holds
// plaintext for older readers.
func (a *App) Seal(r *Record, pt []byte) ([]byte, error) {
	env, err := a.AppendSeal(nil, r, pt)
	if err != nil {
		return nil, err
	}
	return env, nil
}

// AppendSeal appends the sealed value of pt for r to dst and returns the
// extended slice; with cap(dst)-len(dst) >= SealMaxLen(len(pt)) it makes
// no allocation.
func (a *App) AppendSeal(dst []byte, r *Record, pt []byte) ([]byte, error) {
	m := SealMaxLen(len(pt))
	if m == 0 {
		return dst, newError("seal", C.KS_ERR_INVALID_ARGUMENT, -1, "the plaintext is too long")
	}
	return a.call(1, "seal", dst, m, r, pt, nil)
}

// ValueClass is the class of a value (ks_rollout_class): plaintext, or an
// envelope's format, algorithm, key and key version.
type ValueClass struct {
	Plaintext  bool
	Version    Format
	Algorithm  Algorithm
	KeyID      string
	KeyVersion uint32
}

// String names the class as the CLI does: "plaintext" or
// "vF:ALG:KEY_ID:VERSION".
func (c ValueClass) String() string {
	if c.Plaintext {
		return "plaintext"
	}
	return fmt.Sprintf("v%d:%v:%s:%d", c.Version, c.Algorithm, c.KeyID, c.KeyVersion)
}

// SealClass is Seal that also returns the class written: the rollout's
// answer for r's tenant, in whichever encoding the column holds.
func (a *App) SealClass(r *Record, pt []byte) ([]byte, ValueClass, error) {
	m := SealMaxLen(len(pt))
	if m == 0 {
		return nil, ValueClass{}, newError("seal", C.KS_ERR_INVALID_ARGUMENT, -1, "the plaintext is too long")
	}
	var w C.ks_rollout_class
	env, err := a.call(1, "seal", nil, m, r, pt, &w)
	if err != nil {
		return nil, ValueClass{}, err
	}
	return env, ValueClass{Plaintext: w.is_plaintext != 0, Version: Format(w.version),
		Algorithm: Algorithm(w.algorithm), KeyID: C.GoString(&w.key_id[0]),
		KeyVersion: uint32(w.key_version)}, nil
}

// call runs ksgo_call (seal or open) for r on in, appending to dst, which
// it first grows by m bytes when needed; a seal's class goes to w unless
// it is nil.
func (a *App) call(seal C.int, op string, dst []byte, m int, r *Record, in []byte,
	w *C.ks_rollout_class) ([]byte, error) {
	dst = grow(dst, m)
	out := dst[len(dst):cap(dst)]
	a.mu.RLock()
	defer a.mu.RUnlock()
	if a.app == nil {
		return dst, ErrClosed
	}
	n := C.ksgo_call(C.uintptr_t(uintptr(unsafe.Pointer(a.app))), seal, sp(r.Table), C.size_t(len(r.Table)),
		sp(r.Column), C.size_t(len(r.Column)), bp(r.Tenant), C.size_t(len(r.Tenant)),
		bp(r.Context), C.size_t(len(r.Context)), bp(r.Purpose), C.size_t(len(r.Purpose)),
		bp(in), C.size_t(len(in)), bp(out), C.size_t(len(out)), w)
	if n < 0 {
		return dst, resultError(op, n)
	}
	return dst[:len(dst)+int(n)], nil
}

// Open opens the stored value v of r (ks_app_open_value), read in the
// column's encoding (ColumnEncoding): its class must
// be one the rollout's phase reads, its tenant r's (when r names one) and,
// in format 2, its purpose r's.  No unauthenticated plaintext is
// returned.  The plaintext is the caller's to wipe.
func (a *App) Open(r *Record, v []byte) ([]byte, error) {
	pt, err := a.AppendOpen(nil, r, v)
	if err != nil {
		return nil, err
	}
	return pt, nil
}

// AppendOpen appends the plaintext of v to dst and returns the extended
// slice; with cap(dst)-len(dst) >= len(v) it makes no allocation.  On
// failure nothing is appended.
func (a *App) AppendOpen(dst []byte, r *Record, v []byte) ([]byte, error) {
	return a.call(0, "open-value", dst, len(v), r, v, nil)
}

// Item is one record of a batch and its result (ksapi.Item, shared with
// the agent client keyshift/agent).
type Item = ksapi.Item

// SealBatch seals every item, all of table.column, in one call across to
// C (ks_app_seal_batch); one item's failure does not stop the others.  It
// returns the first item's error, if any.  The outputs share one new
// buffer.
func (a *App) SealBatch(table, column string, items []Item) error {
	_, err := a.batch(true, nil, table, column, items)
	return err
}

// OpenBatch opens every item, as SealBatch (ks_app_open_batch).
func (a *App) OpenBatch(table, column string, items []Item) error {
	_, err := a.batch(false, nil, table, column, items)
	return err
}

// AppendSealBatch is SealBatch with the outputs appended to buf, whose
// extension it returns: with a buffer reused from call to call it makes
// no large allocation.  The items' Out are slices of it.
func (a *App) AppendSealBatch(buf []byte, table, column string, items []Item) ([]byte, error) {
	return a.batch(true, buf, table, column, items)
}

// AppendOpenBatch is OpenBatch with the outputs appended to buf, as
// AppendSealBatch.
func (a *App) AppendOpenBatch(buf []byte, table, column string, items []Item) ([]byte, error) {
	return a.batch(false, buf, table, column, items)
}

// batchScratch is a batch's item array and the copy of its inputs, kept
// in a pool between batches (the inputs wiped).
type batchScratch struct {
	desc []C.ksgo_item
	in   []byte
}

var scratchPool = sync.Pool{New: func() interface{} { return new(batchScratch) }}

// batch lays the items' fields out in one input buffer and their outputs
// in buf (so that C is given no Go pointer inside Go memory), runs the
// batch, and slices the outputs.  The input copy holds plaintext when
// sealing: it is wiped before it goes back to the pool.
func (a *App) batch(seal bool, buf []byte, table, column string, items []Item) ([]byte, error) {
	op, sealFlag := "open-batch", C.int(0)
	if seal {
		op, sealFlag = "seal-batch", 1
	}
	if len(items) == 0 {
		return buf, nil
	}
	sc := scratchPool.Get().(*batchScratch)
	defer scratchPool.Put(sc)
	if cap(sc.desc) < len(items) {
		sc.desc = make([]C.ksgo_item, len(items))
	}
	desc := sc.desc[:len(items)]
	inLen := 0
	for i := range items {
		it := &items[i]
		inLen += len(it.Tenant) + len(it.Context) + len(it.Purpose) + len(it.In)
		desc[i].in_len = C.uint64_t(len(it.In))
	}
	outLen := C.ksgo_layout(sealFlag, &desc[0], C.size_t(len(desc)))
	if outLen == C.UINT64_MAX || uint64(outLen) > uint64(^uint(0)>>1) {
		return buf, newError(op, C.KS_ERR_INVALID_ARGUMENT, -1, "an input is too long")
	}
	buf = grow(buf, int(outLen))
	base := len(buf)
	out := buf[base : base+int(outLen)]
	if cap(sc.in) < inLen {
		sc.in = make([]byte, 0, inLen)
	}
	in := sc.in[:0]
	defer wipe(in[:cap(in)])
	put := func(b []byte) (C.uint64_t, C.uint64_t) {
		off := len(in)
		in = append(in, b...)
		return C.uint64_t(off), C.uint64_t(len(b))
	}
	for i := range items {
		it, d := &items[i], &desc[i]
		d.tenant_off, d.tenant_len = put(it.Tenant)
		d.context_off, d.context_len = put(it.Context)
		d.purpose_off, d.purpose_len = put(it.Purpose)
		d.in_off, d.in_len = put(it.In)
	}
	a.mu.RLock()
	defer a.mu.RUnlock()
	if a.app == nil {
		return buf, ErrClosed
	}
	e := C.ksgo_batch(C.uintptr_t(uintptr(unsafe.Pointer(a.app))), sealFlag, sp(table), C.size_t(len(table)),
		sp(column), C.size_t(len(column)), bp(in[:cap(in)]), bp(out), &desc[0], C.size_t(len(desc)))
	var first error
	for i := range items {
		r, d := desc[i].result, &desc[i]
		if r < 0 {
			items[i].Out, items[i].Err = nil, resultError(op, r)
		} else {
			o := int(d.out_off)
			items[i].Out, items[i].Err = out[o:o+int(r):o+int(r)], nil
		}
		if first == nil && items[i].Err != nil {
			first = items[i].Err
		}
	}
	if first == nil && e != C.KS_OK {
		first = newError(op, e, -1, "")
	}
	return buf[:base+int(outLen)], first
}

// wipe zeroes b.
func wipe(b []byte) {
	for i := range b {
		b[i] = 0
	}
}

// benchLoop seals (or opens) in, iters times, in a loop in C for the
// record the benchmarks use: the library's cost without the crossings.
func (a *App) benchLoop(seal bool, in, out []byte, iters int) error {
	s := C.int(0)
	if seal {
		s = 1
	}
	a.mu.RLock()
	defer a.mu.RUnlock()
	if e := C.ksgo_bench_loop(C.uintptr_t(uintptr(unsafe.Pointer(a.app))), s, bp(in), C.size_t(len(in)),
		bp(out), C.size_t(len(out)), C.uint64_t(iters)); e != C.KS_OK {
		return newError("bench", e, -1, "")
	}
	return nil
}
