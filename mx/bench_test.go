package mx

import (
	"io"
	"testing"
)

// BenchmarkStreamBulk: one stream's bulk rate over MemHub, the engine's
// own cost per byte without a kernel in the way.
func BenchmarkStreamBulk(b *testing.B) {
	_, _, _, a, e := pair(b, nil, Config{})
	ln, _ := Listen(e, StreamConfig{})
	ctx := ctx10(b)
	d, err := Dial(ctx, a, e.Addr(), nil, StreamConfig{})
	if err != nil {
		b.Fatal(err)
	}
	s, err := ln.Accept(ctx)
	if err != nil {
		b.Fatal(err)
	}
	done := make(chan int64)
	go func() {
		n, _ := io.Copy(io.Discard, s)
		done <- n
	}()
	data := make([]byte, 1<<20)
	b.SetBytes(1 << 20)
	b.ResetTimer()
	for range b.N {
		if _, err := d.Write(data); err != nil {
			b.Fatal(err)
		}
	}
	d.CloseWrite()
	<-done
}

// BenchmarkStreamRTT1B: a 1-byte round trip over MemHub.
func BenchmarkStreamRTT1B(b *testing.B) {
	_, _, _, a, e := pair(b, nil, Config{})
	ln, _ := Listen(e, StreamConfig{})
	ctx := ctx10(b)
	d, _ := Dial(ctx, a, e.Addr(), nil, StreamConfig{})
	s, _ := ln.Accept(ctx)
	go io.Copy(s, s)
	buf := []byte{1}
	b.ResetTimer()
	for range b.N {
		d.Write(buf)
		if _, err := io.ReadFull(d, buf); err != nil {
			b.Fatal(err)
		}
	}
}
