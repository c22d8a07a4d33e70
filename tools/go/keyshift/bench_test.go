package keyshift

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"fmt"
	"testing"
)

// The sizes make bench reports: a short value, a typical row, a document.
var benchSizes = []int{128, 2048, 65536}

// benchAAD is as long as the associated data keyshift binds for the
// benchmark's record (the context "payments:42:card").
var benchAAD = []byte("payments:42:card")

func benchApp(b *testing.B) *App {
	return openApp(b, newKeyring(b), FormatV2, AES256GCM)
}

// BenchmarkAppSeal is App.AppendSeal into a reused buffer.
func BenchmarkAppSeal(b *testing.B) {
	a := benchApp(b)
	r := rec("payments:42:card")
	for _, n := range benchSizes {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			pt := make([]byte, n)
			env := make([]byte, 0, SealMaxLen(n))
			b.SetBytes(int64(n))
			b.ReportAllocs()
			for i := 0; i < b.N; i++ {
				var err error
				if env, err = a.AppendSeal(env[:0], r, pt); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkAppOpen is App.AppendOpen into a reused buffer.
func BenchmarkAppOpen(b *testing.B) {
	a := benchApp(b)
	r := rec("payments:42:card")
	for _, n := range benchSizes {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			env, err := a.Seal(r, make([]byte, n))
			if err != nil {
				b.Fatal(err)
			}
			out := make([]byte, 0, len(env))
			b.SetBytes(int64(n))
			b.ReportAllocs()
			for i := 0; i < b.N; i++ {
				if out, err = a.AppendOpen(out[:0], r, env); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkCSeal and BenchmarkCOpen run the same calls in a loop in C:
// AppSeal - CSeal is what the cgo crossing and the Go side add.
func BenchmarkCSeal(b *testing.B) { benchC(b, true) }
func BenchmarkCOpen(b *testing.B) { benchC(b, false) }

func benchC(b *testing.B, seal bool) {
	a := benchApp(b)
	r := rec("payments:42:card")
	for _, n := range benchSizes {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			in := make([]byte, n)
			out := make([]byte, SealMaxLen(n))
			if !seal {
				var err error
				if in, err = a.Seal(r, in); err != nil {
					b.Fatal(err)
				}
			}
			b.SetBytes(int64(n))
			b.ReportAllocs()
			if err := a.benchLoop(seal, in, out, b.N); err != nil {
				b.Fatal(err)
			}
		})
	}
}

// gcm is what a Go developer writes instead: crypto/cipher's AES-256-GCM
// with a random nonce prepended, and AAD of the same length.
func gcm(b *testing.B) cipher.AEAD {
	key := make([]byte, 32)
	rand.Read(key)
	blk, err := aes.NewCipher(key)
	if err != nil {
		b.Fatal(err)
	}
	g, err := cipher.NewGCM(blk)
	if err != nil {
		b.Fatal(err)
	}
	return g
}

// BenchmarkGCMSeal is the baseline of BenchmarkAppSeal.
func BenchmarkGCMSeal(b *testing.B) {
	g := gcm(b)
	for _, n := range benchSizes {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			pt := make([]byte, n)
			out := make([]byte, 0, g.NonceSize()+n+g.Overhead())
			b.SetBytes(int64(n))
			b.ReportAllocs()
			for i := 0; i < b.N; i++ {
				out = out[:g.NonceSize()]
				if _, err := rand.Read(out); err != nil {
					b.Fatal(err)
				}
				out = g.Seal(out, out, pt, benchAAD)
			}
		})
	}
}

// BenchmarkGCMOpen is the baseline of BenchmarkAppOpen.
func BenchmarkGCMOpen(b *testing.B) {
	g := gcm(b)
	for _, n := range benchSizes {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			nonce := make([]byte, g.NonceSize())
			rand.Read(nonce)
			ct := g.Seal(append([]byte(nil), nonce...), nonce, make([]byte, n), benchAAD)
			out := make([]byte, 0, n)
			b.SetBytes(int64(n))
			b.ReportAllocs()
			for i := 0; i < b.N; i++ {
				var err error
				if out, err = g.Open(out[:0], ct[:g.NonceSize()], ct[g.NonceSize():], benchAAD); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// batchItems is 64 items of 128 bytes.
func batchItems() []Item {
	items := make([]Item, 64)
	for i := range items {
		items[i] = Item{Tenant: []byte("acme"), Context: benchAAD, In: make([]byte, 128)}
	}
	return items
}

// BenchmarkBatchSeal seals 64 values of 128 bytes in one call, into a
// reused buffer; its baseline is BenchmarkLoopSeal.
func BenchmarkBatchSeal(b *testing.B) {
	a := benchApp(b)
	items := batchItems()
	var buf []byte
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		var err error
		if buf, err = a.AppendSealBatch(buf[:0], "payments", "card", items); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkLoopSeal seals the same 64 values one call each.
func BenchmarkLoopSeal(b *testing.B) {
	a := benchApp(b)
	items := batchItems()
	var env []byte
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		for j := range items {
			r := Record{Table: "payments", Column: "card", Tenant: items[j].Tenant, Context: items[j].Context}
			var err error
			if env, err = a.AppendSeal(env[:0], &r, items[j].In); err != nil {
				b.Fatal(err)
			}
		}
	}
}

// BenchmarkCgoCrossing is one call into C that does no work
// (ks_app_seal_max_len): the fixed cost every App call pays.
func BenchmarkCgoCrossing(b *testing.B) {
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		if SealMaxLen(128) == 0 {
			b.Fatal("no bound")
		}
	}
}

// BenchmarkBatchOpen opens 64 envelopes of 128 bytes in one call, into a
// reused buffer; its baseline is BenchmarkLoopOpen.
func BenchmarkBatchOpen(b *testing.B) {
	a := benchApp(b)
	items := sealedItems(b, a)
	var buf []byte
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		var err error
		if buf, err = a.AppendOpenBatch(buf[:0], "payments", "card", items); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkLoopOpen opens the same 64 envelopes one call each.
func BenchmarkLoopOpen(b *testing.B) {
	a := benchApp(b)
	items := sealedItems(b, a)
	var pt []byte
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		for j := range items {
			r := Record{Table: "payments", Column: "card", Tenant: items[j].Tenant, Context: items[j].Context}
			var err error
			if pt, err = a.AppendOpen(pt[:0], &r, items[j].In); err != nil {
				b.Fatal(err)
			}
		}
	}
}

// sealedItems is batchItems sealed, as items to open.
func sealedItems(b *testing.B, a *App) []Item {
	items := batchItems()
	if err := a.SealBatch("payments", "card", items); err != nil {
		b.Fatal(err)
	}
	for i := range items {
		items[i].In, items[i].Out = items[i].Out, nil
	}
	return items
}
