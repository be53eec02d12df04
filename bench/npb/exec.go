package npb

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"
)

// ErrFinalizeHang is returned (wrapped) by RunCommand for a job killed
// because it did not exit within its grace period after its MPI5K-RESULT
// line. MPICH 4.0 with UCX 1.13's tcp transport sometimes never returns from
// MPI_Finalize (endpoint flush at cleanup, openucx/ucx#8738); the result is
// complete when printed, so such a job is killed and its result kept (see
// bench/README.md).
var ErrFinalizeHang = errors.New("did not exit after its result line (an MPICH/UCX finalize hang, openucx/ucx#8738, or a slow wrapper teardown); killed")

// RunCommand runs cmd in its own process group with stdout and stderr
// combined, copying lines to echo (may be nil) as they come. It kills the
// whole group when ctx ends or when the job is still running grace after
// its result line, and always once the command is done so no rank is left
// behind.
func RunCommand(ctx context.Context, cmd *exec.Cmd, echo io.Writer, grace time.Duration) ([]byte, error) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Setpgid = true
	pr, pw, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	cmd.Stdout, cmd.Stderr = pw, pw
	if err := cmd.Start(); err != nil {
		pr.Close()
		pw.Close()
		return nil, fmt.Errorf("start %s: %w", cmd.Path, err)
	}
	pw.Close()
	pgid := cmd.Process.Pid
	kill := func() { _ = syscall.Kill(-pgid, syscall.SIGKILL) }

	var mu sync.Mutex
	var buf bytes.Buffer
	seen := make(chan struct{})
	readDone := make(chan struct{})
	go func() {
		defer close(readDone)
		defer pr.Close()
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 64*1024), 1024*1024)
		closed := false
		for sc.Scan() {
			line := sc.Text()
			mu.Lock()
			buf.WriteString(line)
			buf.WriteByte('\n')
			mu.Unlock()
			if echo != nil {
				fmt.Fprintln(echo, line)
			}
			if !closed && strings.HasPrefix(strings.TrimSpace(line), resultTag+" ") {
				closed = true
				close(seen)
			}
		}
	}()
	waitDone := make(chan error, 1)
	go func() { waitDone <- cmd.Wait() }()

	var graceC <-chan time.Time
	var why error
	ctxDone := ctx.Done()
	for {
		select {
		case err := <-waitDone:
			// Ranks may still hold the pipe (a detached orted, ssh agents):
			// kill the group, then collect what they wrote.
			kill()
			select {
			case <-readDone:
			case <-time.After(2 * time.Second):
			}
			mu.Lock()
			out := append([]byte(nil), buf.Bytes()...)
			mu.Unlock()
			if why != nil {
				return out, why
			}
			return out, err
		case <-seen:
			seen = nil
			graceC = time.After(grace)
		case <-graceC:
			graceC = nil
			why = fmt.Errorf("%w after %v", ErrFinalizeHang, grace)
			kill()
		case <-ctxDone:
			ctxDone = nil
			why = fmt.Errorf("killed: %w", ctx.Err())
			kill()
		}
	}
}
