package testbed

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// OnOff is the client of one on/off competing flow (`mpi5k lab _onoff`,
// started by Cross inside a traffic host): until Duration is over, it
// opens a connection to Addr with congestion control CC, sends a
// Pareto-sized transfer, waits until the sink has read all of it, and
// pauses an exponential time.
type OnOff struct {
	Addr     string
	CC       string // "" keeps the host's default
	MeanSize int
	MeanGap  time.Duration
	Shape    float64
	Seed     uint64
	Duration time.Duration
}

// Run runs the flow, writing one line per transfer and a summary to w.
func (o OnOff) Run(w io.Writer) error {
	if o.MeanSize <= 0 || o.Shape <= 1 || o.MeanGap <= 0 || o.Duration <= 0 {
		return fmt.Errorf("on/off flow: bad parameters %+v", o)
	}
	draw := newOnOffDraw(o.Seed, o.MeanSize, o.Shape, o.MeanGap)
	end := time.Now().Add(o.Duration)
	ctx, cancel := context.WithDeadline(context.Background(), end)
	defer cancel()
	d := net.Dialer{Timeout: 5 * time.Second, Control: func(_, _ string, c syscall.RawConn) error {
		if o.CC == "" {
			return nil
		}
		var serr error
		if err := c.Control(func(fd uintptr) {
			serr = unix.SetsockoptString(int(fd), unix.IPPROTO_TCP, unix.TCP_CONGESTION, o.CC)
		}); err != nil {
			return err
		}
		if serr != nil {
			return fmt.Errorf("congestion control %s: %w", o.CC, serr)
		}
		return nil
	}}
	buf := make([]byte, 256<<10)
	var n, failed int
	var bytes int64
	var busy time.Duration
	for time.Now().Before(end) {
		size := draw.size()
		start := time.Now()
		err := o.transfer(ctx, &d, buf, size)
		took := time.Since(start)
		switch {
		case err == nil:
			n++
			bytes += int64(size)
			busy += took
			fmt.Fprintf(w, "transfer %d: %d B in %v (%.1f Mbit/s)\n", n, size, took.Round(time.Microsecond), float64(size)*8/took.Seconds()/1e6)
		case !time.Now().Before(end):
			// The clock, not ctx.Err: the dialer's connect deadline is
			// the context's but fires on a timer of its own, so a dial
			// cut by the end can return before ctx.Err is set.
			fmt.Fprintf(w, "transfer of %d B cut by the end of the run after %v\n", size, took.Round(time.Millisecond))
		default:
			failed++
			fmt.Fprintf(w, "transfer of %d B failed after %v: %v\n", size, took.Round(time.Millisecond), err)
		}
		t := time.NewTimer(draw.pause())
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
		}
	}
	mean := time.Duration(0)
	if n > 0 {
		mean = busy / time.Duration(n)
	}
	fmt.Fprintf(w, "done: %d transfers, %d B, mean transfer time %v, %d failed (cc %s, seed %d)\n",
		n, bytes, mean.Round(time.Microsecond), failed, ccOrDefault(o.CC), o.Seed)
	return nil
}

func ccOrDefault(cc string) string {
	if cc == "" {
		return "default"
	}
	return cc
}

// transfer sends size bytes on a new connection and waits for the sink's
// close, which comes once it has read them all.
func (o OnOff) transfer(ctx context.Context, d *net.Dialer, buf []byte, size int) error {
	c, err := d.DialContext(ctx, "tcp", o.Addr)
	if err != nil {
		return err
	}
	defer c.Close()
	stop := context.AfterFunc(ctx, func() { c.SetDeadline(time.Now()) })
	defer stop()
	for left := size; left > 0; {
		k, err := c.Write(buf[:min(left, len(buf))])
		if err != nil {
			return err
		}
		left -= k
	}
	if err := c.(*net.TCPConn).CloseWrite(); err != nil {
		return err
	}
	if _, err := c.Read(buf[:1]); err != io.EOF {
		if err == nil {
			err = errors.New("sink sent data")
		}
		return err
	}
	return nil
}

// RunSink accepts connections on addr and reads each to its end, then
// closes it (`mpi5k lab _sink`, the server of on/off flows). It returns
// after d.
func RunSink(addr string, d time.Duration) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	time.AfterFunc(d, func() { ln.Close() })
	for {
		c, err := ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return nil
			}
			fmt.Fprintf(os.Stderr, "sink %s: %v\n", addr, err)
			time.Sleep(10 * time.Millisecond)
			continue
		}
		go func() {
			defer c.Close()
			c.SetDeadline(time.Now().Add(d))
			_, _ = io.Copy(io.Discard, c)
		}()
	}
}
