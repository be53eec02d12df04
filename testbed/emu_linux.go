package testbed

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"net"
	"net/netip"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// maxFlows bounds each link's flow table; later flows are aggregated.
const maxFlows = 4096

// emuReq / emuResp is the control protocol on /run/mpi5k/<lab>/emu.sock:
// one JSON request line, one JSON response line.
type emuReq struct {
	Op     string   `json:"op"` // ping, stats, set, tamper
	Set    []emuSet `json:"set,omitempty"`
	Tamper *Tamper  `json:"tamper,omitempty"`
}

// emuSet changes both directions between sites A and B; empty names change
// every link. Later entries override earlier ones.
type emuSet struct {
	A      string        `json:"a,omitempty"`
	B      string        `json:"b,omitempty"`
	OneWay time.Duration `json:"oneway_ns,omitempty"`
	Jitter time.Duration `json:"jitter_ns,omitempty"`
	Loss   float64       `json:"loss,omitempty"`
	// Reorder is the fraction of packets held back ReorderDelay.
	Reorder      float64       `json:"reorder,omitempty"`
	ReorderDelay time.Duration `json:"reorder_delay_ns,omitempty"`
}

type emuResp struct {
	Error string `json:"error,omitempty"`
	Stats *Stats `json:"stats,omitempty"`
}

func emuSocket(dir string) string { return filepath.Join(dir, "emu.sock") }

func emuRequest(dir string, req emuReq) (*emuResp, error) {
	c, err := net.DialTimeout("unix", emuSocket(dir), 2*time.Second)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if err := json.NewEncoder(c).Encode(&req); err != nil {
		return nil, err
	}
	var resp emuResp
	if err := json.NewDecoder(bufio.NewReader(c)).Decode(&resp); err != nil {
		return nil, fmt.Errorf("emulator answer: %w", err)
	}
	if resp.Error != "" {
		return nil, errors.New(resp.Error)
	}
	return &resp, nil
}

// Stats asks the emulator daemon for the WAN counters.
func (l *Lab) Stats() (Stats, error) {
	resp, err := emuRequest(l.dir, emuReq{Op: "stats"})
	if err != nil {
		return Stats{}, fmt.Errorf("lab %s: emulator stats: %w", l.name, err)
	}
	if resp.Stats == nil {
		return Stats{}, fmt.Errorf("lab %s: emulator sent no stats", l.name)
	}
	if resp.Stats.LANs, err = l.LANStats(); err != nil {
		return Stats{}, err
	}
	return *resp.Stats, nil
}

// setEmu changes one-way delays (as applied, path cost already
// subtracted), jitter and loss on the fly.
func (l *Lab) setEmu(set ...emuSet) error {
	_, err := emuRequest(l.dir, emuReq{Op: "set", Set: set})
	return err
}

// Tamper puts t in force on the running lab's emulator: from now on it
// flips a bit in every t.Every-th data segment of t.Port's flows between
// t.A and t.B (docs/lab.md); a zero Every stops it. Each call starts the
// counts afresh.
func (l *Lab) Tamper(t Tamper) error {
	if _, err := emuRequest(l.dir, emuReq{Op: "tamper", Tamper: &t}); err != nil {
		return fmt.Errorf("lab %s: %w", l.name, err)
	}
	return nil
}

// clock: CLOCK_MONOTONIC in ns, read through Go's vDSO-backed monotonic
// clock (time.Since) anchored once to clock_gettime, so the value can be
// handed to clock_nanosleep(TIMER_ABSTIME).
type clock struct {
	base  time.Time
	base0 int64
}

func newClock() clock {
	var ts unix.Timespec
	t := time.Now()
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return clock{base: t, base0: ts.Nano()}
}

func (c clock) now() int64 { return c.base0 + int64(time.Since(c.base)) }

func sleepUntil(t int64) {
	ts := unix.NsecToTimespec(t)
	for {
		err := unix.ClockNanosleep(unix.CLOCK_MONOTONIC, unix.TIMER_ABSTIME, &ts, nil)
		if err != unix.EINTR {
			return
		}
	}
}

// prioWarn reports a failed priority change once.
var prioWarn sync.Once

// setPacketPriority raises the calling (locked) packet thread above normal
// processes so a busy machine delays packets less: nice -10 by default
// (about 9 times the CPU share of a nice-0 thread under contention, once
// raiseAutogroup has given the daemon's group the same weight).
// MPI5K_EMU_PRIO=none leaves the thread alone; MPI5K_EMU_PRIO=rt uses
// SCHED_FIFO, which wakes the thread at once but can invert priorities with
// the Go runtime's normal threads: a real-time thread leaving a syscall
// spun in the runtime (casgstatus) while a starved sysmon or GC worker held
// its goroutine's status, costing 2 to 6 times the CPU per packet in
// BenchmarkLinkPipeline. Not the default for that reason.
func setPacketPriority() {
	var err error
	switch os.Getenv("MPI5K_EMU_PRIO") {
	case "none":
		return
	case "rt":
		// RESET_ON_FORK: threads the runtime clones from this one start as
		// normal threads.
		attr := &unix.SchedAttr{Policy: 1 /* SCHED_FIFO */, Priority: 10, Flags: 1 /* SCHED_FLAG_RESET_ON_FORK */}
		err = unix.SchedSetAttr(0, attr, 0)
	default:
		err = unix.Setpriority(unix.PRIO_PROCESS, unix.Gettid(), -10)
	}
	if err != nil {
		prioWarn.Do(func() {
			fmt.Fprintf(os.Stderr, "emulator: cannot raise packet thread priority (%v); timing may suffer under load\n", err)
		})
	}
}

type pkt struct {
	buf     []byte
	n       int
	deliver int64
}

// ring is a single-producer single-consumer queue of packet buffers. The
// reader and writer hand packets over through rings and an eventfd, never
// through Go channels or mutexes: waking a parked goroutine needs the Go
// scheduler, whose helper threads are normal threads that a busy machine
// starves (packets were measured ~800 ms late at p99 under a load average
// of 13 with a channel), whereas a thread blocked in read(eventfd) is woken
// by the kernel directly.
type ring struct {
	buf  []*pkt
	mask uint64
	head atomic.Uint64 // next to pop (consumer)
	tail atomic.Uint64 // next to push (producer)
}

func newRing(n int) *ring {
	size := 1
	for size < n {
		size <<= 1
	}
	return &ring{buf: make([]*pkt, size), mask: uint64(size - 1)}
}

func (r *ring) push(p *pkt) bool {
	t := r.tail.Load()
	if t-r.head.Load() == uint64(len(r.buf)) {
		return false
	}
	r.buf[t&r.mask] = p
	r.tail.Store(t + 1)
	return true
}

func (r *ring) pop() *pkt {
	h := r.head.Load()
	if h == r.tail.Load() {
		return nil
	}
	p := r.buf[h&r.mask]
	r.head.Store(h + 1)
	return p
}

type flowKey struct {
	proto    uint8
	src, dst [4]byte
	sp, dp   uint16
}

// lane is a FIFO of packets due in order and the writer thread that
// delivers them: buffers go reader -> fifo -> writer -> back -> reader.
type lane struct {
	fifo     *ring
	back     *ring
	wake     int          // eventfd the writer sleeps on when fifo is empty
	sleeping atomic.Int32 // 1 while the writer is (about to be) blocked on wake
}

func newLane(n int) (*lane, error) {
	efd, err := unix.Eventfd(0, unix.EFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("eventfd: %w", err)
	}
	return &lane{fifo: newRing(n), back: newRing(n), wake: efd}, nil
}

// link is one direction of the WAN: reader (TUN from->to) -> shaper ->
// lane -> writer (TUN to->from, re-entering the router towards site To).
// Packets held back for reordering take a second lane with a writer of its
// own, started on the first such packet: each lane's delivery times only
// grow, so neither needs sorting, and the two writers interleave them.
type link struct {
	from, to string
	in, out  int // TUN fds
	clk      clock
	params   *emuParams

	// The reader keeps free buffers on a LIFO stack so only buffers really
	// in flight become resident memory.
	stack      []*pkt
	scratch    *pkt // read target when every buffer is in flight (packet dropped)
	main       *lane
	side       *lane // held-back packets; created by the reader when first needed
	sideFailed bool  // the side lane could not be made (warned once)
	nbufs      int

	// strip: packets come with an Ethernet header to drop (a LAN lane:
	// nftables forwards frames into its TUN).
	strip bool

	shaper  shaper
	deliv   deliverer
	reorder reorderer
	rng     uint64
	// tamp: what the man in the middle alters (mitm.go); nil: nothing.
	tamp atomic.Pointer[tamperState]

	packets, bytes, dpackets, dbytes, qdrops, rdrops, held atomic.Uint64
	qdelay, late                                           histogram

	mu    sync.Mutex
	flows map[flowKey]*flowState
	other flowState
}

type emuParams struct {
	oneway, jitter atomic.Int64
	loss           atomic.Uint64 // math.Float64bits
	reorder        atomic.Uint64 // math.Float64bits
	reorderDelay   atomic.Int64
	rate           uint64
	queue          int
}

func newLink(from, to string, in, out int, p *emuParams, mtu int, clk clock, seed uint64) (*link, error) {
	oneway := time.Duration(p.oneway.Load())
	// Buffers for everything that can be in flight: the queue plus the
	// delay line, in packets of ~256 bytes on average, bounded.
	inflight := float64(p.queue)
	if p.rate > 0 {
		inflight += float64(p.rate) / 8 * (oneway.Seconds() + 0.1)
	} else {
		inflight = 16 << 20
	}
	n := int(inflight / 256)
	n = max(2048, min(n, 32768))
	main, err := newLane(n)
	if err != nil {
		return nil, err
	}
	l := &link{from: from, to: to, in: in, out: out, clk: clk, params: p, main: main, nbufs: n,
		shaper: shaper{rate: p.rate, queue: p.queue}, deliv: deliverer{rng: seed | 1}, rng: seed*7 + 1,
		flows: map[flowKey]*flowState{}}
	size := mtu + 64
	slab := make([]byte, n*size)
	l.stack = make([]*pkt, 0, n)
	for i := 0; i < n; i++ {
		l.stack = append(l.stack, &pkt{buf: slab[i*size : (i+1)*size : (i+1)*size]})
	}
	l.scratch = &pkt{buf: make([]byte, size)}
	return l, nil
}

func (l *link) rand01() float64 {
	l.rng ^= l.rng >> 12
	l.rng ^= l.rng << 25
	l.rng ^= l.rng >> 27
	return float64((l.rng*2685821657736338717)>>11) / (1 << 53)
}

// lose and hold draw the random choices for a packet (reader only): lost,
// then, if not, held back for reordering. A parameter at 0 draws nothing,
// so the choices are a function of the seed and the packets alone.
func (l *link) lose() bool {
	f := math.Float64frombits(l.params.loss.Load())
	return f > 0 && l.rand01() < f
}

func (l *link) hold() bool {
	f := math.Float64frombits(l.params.reorder.Load())
	return f > 0 && l.rand01() < f
}

// reader: blocking reads on its own thread; every decision for a packet is
// made here, so the shaper and flow table need no locking against writers.
func (l *link) reader() {
	runtime.LockOSThread()
	setPacketPriority()
	var ip4 layers.IPv4
	var tcp layers.TCP
	var udp layers.UDP
	parser := gopacket.NewDecodingLayerParser(layers.LayerTypeIPv4, &ip4, &tcp, &udp)
	parser.IgnoreUnsupported = true
	decoded := make([]gopacket.LayerType, 0, 4)
	for {
		p := l.get()
		n, err := unix.Read(l.in, p.buf)
		if err != nil || n <= 0 {
			l.put(p)
			if err == unix.EINTR || err == unix.EAGAIN {
				continue
			}
			if err == unix.EBADF || (err == nil && n == 0) {
				return // device closed (only happens in tests)
			}
			fmt.Fprintf(os.Stderr, "emu %s->%s: read: %v\n", l.from, l.to, err)
			time.Sleep(10 * time.Millisecond)
			continue
		}
		// nftables' fwd pushes the frame's Ethernet header back on (never
		// guess by the first byte: a MAC address may start with 0x4_).
		if l.strip && n > 14 && p.buf[12] == 0x08 && p.buf[13] == 0x00 && p.buf[14]>>4 == 4 {
			n = copy(p.buf, p.buf[14:n])
		}
		now := l.clk.now()
		l.packets.Add(1)
		l.bytes.Add(uint64(n))

		fs := l.observe(parser, &decoded, &ip4, &tcp, &udp, p.buf[:n])

		if p == l.scratch { // no buffer left: a queue drop
			l.qdrops.Add(1)
			l.count(fs, func(f *flowState) { f.queueDrops++ })
			continue
		}

		if l.lose() {
			l.rdrops.Add(1)
			l.count(fs, func(f *flowState) { f.randomDrops++ })
			l.put(p)
			continue
		}
		dep, wait, ok := l.shaper.admit(now, n)
		if !ok {
			l.qdrops.Add(1)
			l.count(fs, func(f *flowState) { f.queueDrops++ })
			l.put(p)
			continue
		}
		l.qdelay.add(time.Duration(wait))
		l.tamper(p.buf[:n])
		p.n = n
		p.deliver = l.deliv.at(dep, l.params.oneway.Load(), l.params.jitter.Load())
		ln := l.main
		if l.hold() {
			if side := l.sideLane(); side != nil {
				ln = side
				p.deliver = l.reorder.hold(p.deliver, l.params.reorderDelay.Load())
				l.held.Add(1)
			}
		}
		ln.fifo.push(p) // never full: it has room for every buffer
		if ln.sleeping.Load() == 1 {
			var one = [8]byte{1}
			_, _ = unix.Write(ln.wake, one[:])
		}
	}
}

// sideLane returns the lane of held-back packets, creating it and starting
// its writer on first use (reader only): a lab that never reorders runs no
// extra thread. Nil if it cannot be made; the packet then goes unheld.
func (l *link) sideLane() *lane {
	if l.side == nil {
		if l.sideFailed {
			return nil
		}
		side, err := newLane(l.nbufs)
		if err != nil {
			l.sideFailed = true
			fmt.Fprintf(os.Stderr, "emu %s->%s: cannot hold packets back for reordering, delivering them in order: %v\n", l.from, l.to, err)
			return nil
		}
		l.side = side
		go l.writer(side)
	}
	return l.side
}

func (l *link) count(f *flowState, fn func(*flowState)) {
	if f == nil {
		return
	}
	l.mu.Lock()
	fn(f)
	l.mu.Unlock()
}

// observe parses a packet and updates its flow; it returns the flow state.
func (l *link) observe(parser *gopacket.DecodingLayerParser, decoded *[]gopacket.LayerType,
	ip4 *layers.IPv4, tcp *layers.TCP, udp *layers.UDP, b []byte) *flowState {
	*decoded = (*decoded)[:0]
	_ = parser.DecodeLayers(b, decoded)
	var k flowKey
	haveIP, isTCP := false, false
	for _, t := range *decoded {
		switch t {
		case layers.LayerTypeIPv4:
			haveIP = true
			k.proto = uint8(ip4.Protocol)
			copy(k.src[:], ip4.SrcIP.To4())
			copy(k.dst[:], ip4.DstIP.To4())
		case layers.LayerTypeTCP:
			k.sp, k.dp = uint16(tcp.SrcPort), uint16(tcp.DstPort)
			isTCP = true
		case layers.LayerTypeUDP:
			k.sp, k.dp = uint16(udp.SrcPort), uint16(udp.DstPort)
		}
	}
	if !haveIP {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	f := l.flows[k]
	if f == nil {
		if len(l.flows) >= maxFlows {
			f = &l.other
		} else {
			f = &flowState{}
			l.flows[k] = f
		}
	}
	f.packets++
	f.bytes += uint64(len(b))
	if isTCP {
		f.observeTCP(tcp.Seq, len(tcp.Payload), tcp.SYN, tcp.FIN)
	}
	return f
}

// writer: sleeps with clock_nanosleep(TIMER_ABSTIME) and 1 ns timer slack
// (Go's timers were ~0.5 ms late), then writes into the far TUN. The write
// runs the packet's whole onward path in this thread.
func (l *link) writer(ln *lane) {
	runtime.LockOSThread()
	setPacketPriority()
	_ = unix.Prctl(unix.PR_SET_TIMERSLACK, 1, 0, 0, 0)
	var ev [8]byte
	for {
		p := ln.fifo.pop()
		if p == nil {
			// Announce the sleep, then look again: a packet pushed before
			// the announcement is seen now, one pushed after it rings wake.
			ln.sleeping.Store(1)
			if p = ln.fifo.pop(); p == nil {
				_, _ = unix.Read(ln.wake, ev[:])
				ln.sleeping.Store(0)
				continue
			}
			ln.sleeping.Store(0)
		}
		if now := l.clk.now(); p.deliver > now {
			sleepUntil(p.deliver)
		}
		now := l.clk.now()
		l.late.add(time.Duration(now - p.deliver))
		if _, err := unix.Write(l.out, p.buf[:p.n]); err == nil {
			l.dpackets.Add(1)
			l.dbytes.Add(uint64(p.n))
		}
		for !ln.back.push(p) { // cannot be full: sized for every buffer
			runtime.Gosched()
		}
	}
}

// get takes a free buffer (reader only): from the LIFO stack, refilled from
// the buffers the writer handed back; the scratch buffer when none is left.
func (l *link) get() *pkt {
	if len(l.stack) == 0 {
		for _, ln := range []*lane{l.main, l.side} {
			if ln == nil {
				continue
			}
			for p := ln.back.pop(); p != nil; p = ln.back.pop() {
				l.stack = append(l.stack, p)
			}
		}
	}
	if len(l.stack) == 0 {
		return l.scratch
	}
	p := l.stack[len(l.stack)-1]
	l.stack = l.stack[:len(l.stack)-1]
	return p
}

// put returns a buffer the reader did not queue (reader only).
func (l *link) put(p *pkt) {
	if p != l.scratch {
		l.stack = append(l.stack, p)
	}
}

func (l *link) stats() LinkStats {
	s := LinkStats{From: l.from, To: l.to, Rate: l.params.rate, Queue: l.params.queue,
		OneWay: time.Duration(l.params.oneway.Load()), Jitter: time.Duration(l.params.jitter.Load()),
		Loss:    math.Float64frombits(l.params.loss.Load()),
		Reorder: math.Float64frombits(l.params.reorder.Load()), ReorderDelay: time.Duration(l.params.reorderDelay.Load()),
		Held:    l.held.Load(),
		Packets: l.packets.Load(), Bytes: l.bytes.Load(), DeliveredPackets: l.dpackets.Load(),
		DeliveredBytes: l.dbytes.Load(), QueueDrops: l.qdrops.Load(), RandomDrops: l.rdrops.Load(),
		QueueDelay: l.qdelay.percentiles(), Late: l.late.percentiles(), Stalled: l.late.over(StallLate),
		Tampered: l.tampered()}
	l.mu.Lock()
	defer l.mu.Unlock()
	for k, f := range l.flows {
		s.Flows = append(s.Flows, flowStats(k, f))
	}
	if l.other.packets > 0 {
		o := flowStats(flowKey{}, &l.other)
		o.Proto, o.Src, o.Dst = "other", "", ""
		s.OtherFlows = &o
	}
	return s
}

func flowStats(k flowKey, f *flowState) FlowStats {
	src, dst := netip.AddrFrom4(k.src), netip.AddrFrom4(k.dst)
	fs := FlowStats{Packets: f.packets, Bytes: f.bytes, QueueDrops: f.queueDrops, RandomDrops: f.randomDrops, Retrans: f.retrans}
	switch k.proto {
	case 6, 17:
		fs.Proto = map[uint8]string{6: "tcp", 17: "udp"}[k.proto]
		fs.Src = netip.AddrPortFrom(src, k.sp).String()
		fs.Dst = netip.AddrPortFrom(dst, k.dp).String()
	case 1:
		fs.Proto, fs.Src, fs.Dst = "icmp", src.String(), dst.String()
	default:
		fs.Proto, fs.Src, fs.Dst = strconv.Itoa(int(k.proto)), src.String(), dst.String()
	}
	return fs
}

// openTUN creates a non-persistent TUN device (IFF_TUN|IFF_NO_PI, no vnet
// header: the kernel segments GSO packets before us, so we see MTU-sized
// packets) in the calling thread's network namespace. It disappears when
// the daemon exits.
func openTUN(name string) (int, error) {
	fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("open /dev/net/tun: %w", err)
	}
	ifr, err := unix.NewIfreq(name)
	if err != nil {
		unix.Close(fd)
		return -1, err
	}
	ifr.SetUint16(unix.IFF_TUN | unix.IFF_NO_PI)
	if err := unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("TUNSETIFF %s: %w", name, err)
	}
	return fd, nil
}

// raiseAutogroup gives the emulator daemon's autogroup nice -10. With
// kernel.sched_autogroup_enabled (Debian's default) the scheduler first
// shares a CPU between autogroups (one per setsid), then between threads
// of one autogroup by nice: a nice -10 thread in an autogroup of its own
// got no more than any other autogroup, and 4 busy-polling MPI ranks plus
// iperf3 (an autogroup per process) left the packet threads runnable but
// unscheduled for 1.5 s, long enough for every TCP flow across the WAN to
// time out (TestBenchLab with the gateways' PROBE_RTT guard on, about 1 run
// in 3). The daemon runs under setsid (startEmulator), so its autogroup is
// its own and this raises nothing else.
func raiseAutogroup() {
	err := os.WriteFile("/proc/self/autogroup", []byte("-10"), 0)
	if err != nil && !errors.Is(err, fs.ErrNotExist) { // no file: autogroup not built in
		fmt.Fprintf(os.Stderr, "emulator: cannot raise the autogroup's priority (%v); timing may suffer under load\n", err)
	}
}

// RunEmulator is the WAN emulator daemon of a lab (`mpi5k lab _emu`). It
// creates the TUN devices in the router namespace, routes each site's
// traffic to other sites through them, and serves stats until killed.
func RunEmulator(name string) error {
	dir := labDir(name)
	b, err := os.ReadFile(filepath.Join(dir, "lab.json"))
	if err != nil {
		return err
	}
	var st state
	if err := json.Unmarshal(b, &st); err != nil {
		return err
	}
	c := st.Config
	if os.Getenv("MPI5K_EMU_PRIO") != "none" {
		raiseAutogroup()
	}
	if err := os.WriteFile(filepath.Join(dir, "emu.pid"), []byte(strconv.Itoa(os.Getpid())+"\n"), 0o644); err != nil {
		return err
	}
	rpath := filepath.Join(netnsDir(name), routerNS(name))
	fds, lanFDs, err := openEmuTUNs(rpath, c)
	if err != nil {
		return err
	}
	if err := routeEmuTUNs(rpath, c, fds, lanFDs); err != nil {
		return err
	}
	setEmuProcs(c, len(lanFDs))
	clk := newClock()
	// The lab's seed (Up records one), so a lab brought up again with the
	// same --seed makes the same choices for the same packets.
	seed := c.Seed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	links, err := startEmuLinks(c, fds, pairParams(st), clk, seed)
	if err != nil {
		return err
	}
	if err := startLANLanes(c, lanFDs, clk, seed); err != nil {
		return err
	}
	return serveEmulator(name, dir, seed, links)
}

// openEmuTUNs opens, in the router namespace rpath, the TUN device of
// each direction of each site pair (fds, by (from, to) site number) and
// of each site whose LAN reorders (lanFDs, by site number).
func openEmuTUNs(rpath string, c Config) (fds map[[2]int]int, lanFDs map[int]int, err error) {
	nsites := len(c.Sites)
	fds = map[[2]int]int{}
	lanFDs = map[int]int{} // site -> TUN of its reordered LAN packets
	err = inNetNS(rpath, func() error {
		for i, site := range c.Sites {
			if c.SiteLANReorderOf(site) > 0 {
				fd, err := openTUN(lanTUN(i + 1))
				if err != nil {
					return err
				}
				lanFDs[i+1] = fd
			}
		}
		for i := 1; i <= nsites; i++ {
			for j := 1; j <= nsites; j++ {
				if i == j {
					continue
				}
				fd, err := openTUN(tunName(i, j))
				if err != nil {
					return err
				}
				fds[[2]int{i, j}] = fd
			}
		}
		return nil
	})
	return fds, lanFDs, err
}

// routeEmuTUNs brings the TUN devices up and routes through them: each
// site's traffic to another site's LAN and WAN through the pair's TUN, a
// held LAN packet written back as if from its site's bridge.
func routeEmuTUNs(rpath string, c Config, fds map[[2]int]int, lanFDs map[int]int) error {
	rh, err := netlinkIn(rpath)
	if err != nil {
		return err
	}
	defer rh.Close()
	for key := range fds {
		i, j := key[0], key[1]
		lk, err := rh.LinkByName(tunName(i, j))
		if err != nil {
			return err
		}
		if err := rh.LinkSetMTU(lk, c.LinkMTU()); err != nil {
			return err
		}
		// The default 500-packet queue overflows while the reader thread
		// waits for a CPU under bursts; those drops would be invisible.
		if err := rh.LinkSetTxQLen(lk, 10000); err != nil {
			return err
		}
		if err := rh.LinkSetUp(lk); err != nil {
			return err
		}
		for _, p := range []netip.Prefix{siteLAN(j), siteWAN(j)} {
			rt := &netlink.Route{Dst: ipNet(p), Table: tableFor(i), LinkIndex: lk.Attrs().Index, Priority: 10}
			if err := rh.RouteReplace(rt); err != nil {
				return fmt.Errorf("route %s via %s: %w", p, tunName(i, j), err)
			}
		}
	}
	for k := range lanFDs {
		lk, err := rh.LinkByName(lanTUN(k))
		if err != nil {
			return err
		}
		// Frames arrive with their Ethernet header.
		if err := rh.LinkSetMTU(lk, c.LinkMTU()+14); err != nil {
			return err
		}
		if err := rh.LinkSetTxQLen(lk, 10000); err != nil {
			return err
		}
		if err := rh.LinkSetUp(lk); err != nil {
			return err
		}
		// Written back, a held packet is routed as if it came from its
		// site's bridge: over the emulated WAN if it leaves the site.
		r := netlink.NewRule()
		r.IifName = lanTUN(k)
		r.Table = tableFor(k)
		r.Priority = 1000 + 10*k + 5
		if err := rh.RuleAdd(r); err != nil && !errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("rule iif %s: %w", lanTUN(k), err)
		}
	}
	return nil
}

// setEmuProcs gives the packet threads their Ps.
//
// Every reader and writer is a locked thread that spends its life in
// blocking syscalls (read, clock_nanosleep, write). Leaving a syscall or
// waking a goroutine needs a free P; with GOMAXPROCS = #cores the Ps sit
// with threads blocked in syscalls until sysmon retakes them (up to 10 ms
// later when it has been idle), which showed up as packets written
// milliseconds late. One P per thread plus spares removes that wait.
// A lab that reorders from the start runs a third thread per link.
func setEmuProcs(c Config, lanLanes int) {
	nsites := len(c.Sites)
	threads := 2
	if c.Reorder > 0 || slices.ContainsFunc(c.Pairs, func(p PairLink) bool { return p.Reorder > 0 }) {
		threads = 3
	}
	runtime.GOMAXPROCS(threads*nsites*(nsites-1) + 2*lanLanes + 4)
}

// pairParams is one parameter set per site pair, shared by its two
// directions (by (from, to) site number).
func pairParams(st state) map[[2]int]*emuParams {
	c := st.Config
	nsites := len(c.Sites)
	params := map[[2]int]*emuParams{}
	for i := 1; i <= nsites; i++ {
		for j := i + 1; j <= nsites; j++ {
			pl := c.Pair(c.Sites[i-1], c.Sites[j-1])
			p := &emuParams{rate: pl.Rate, queue: pl.Queue}
			if st.Ready { // restarted daemon: keep the calibrated delay
				p.oneway.Store(int64(pairOneWay(pl.RTT, st.PathCost)))
				p.jitter.Store(int64(pl.Jitter))
				p.loss.Store(math.Float64bits(pl.Loss))
				p.reorder.Store(math.Float64bits(pl.Reorder))
				p.reorderDelay.Store(int64(pl.ReorderDelay))
			} else {
				// Calibration first (Up measures the path, then sets the rest).
				p.oneway.Store(int64(pl.RTT / 2))
			}
			params[[2]int{i, j}], params[[2]int{j, i}] = p, p
		}
	}
	return params
}

// startEmuLinks starts the emulated WAN link of each direction of each
// site pair: its reader and writer threads.
func startEmuLinks(c Config, fds map[[2]int]int, params map[[2]int]*emuParams, clk clock, seed uint64) ([]*link, error) {
	nsites := len(c.Sites)
	var links []*link
	for i := 1; i <= nsites; i++ {
		for j := 1; j <= nsites; j++ {
			if i == j {
				continue
			}
			lk, err := newLink(c.Sites[i-1], c.Sites[j-1], fds[[2]int{i, j}], fds[[2]int{j, i}], params[[2]int{i, j}], c.LinkMTU(), clk, seed+uint64(i*64+j))
			if err != nil {
				return nil, err
			}
			links = append(links, lk)
			go lk.reader()
			go lk.writer(lk.main)
		}
	}
	return links, nil
}

// startLANLanes starts the lane of each site whose LAN reorders: it holds
// every packet nftables hands it the same time and writes it back into
// the same TUN, with no rate and no loss.
func startLANLanes(c Config, lanFDs map[int]int, clk clock, seed uint64) error {
	for k, fd := range lanFDs {
		p := &emuParams{queue: 16 << 20}
		p.oneway.Store(int64(c.LANReorderDelay))
		site := c.Sites[k-1]
		lk, err := newLink(site, site+"-lan", fd, fd, p, c.LinkMTU()+14, clk, seed+uint64(k)<<32)
		if err != nil {
			return err
		}
		lk.strip = true
		go lk.reader()
		go lk.writer(lk.main)
	}
	return nil
}

// serveEmulator answers the control socket of lab name until a signal
// ends the daemon.
func serveEmulator(name, dir string, seed uint64, links []*link) error {
	sock := emuSocket(dir)
	_ = os.Remove(sock)
	ln, err := net.Listen("unix", sock)
	if err != nil {
		return err
	}
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		<-sigs
		ln.Close()
		os.Remove(sock)
		os.Exit(0)
	}()
	fmt.Fprintf(os.Stderr, "mpi5k lab %s: emulator up, %d links\n", name, len(links))
	for {
		conn, err := ln.Accept()
		if err != nil {
			return err
		}
		go serveControl(conn, name, seed, links)
	}
}

func serveControl(conn net.Conn, name string, seed uint64, links []*link) {
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	var req emuReq
	if err := json.NewDecoder(bufio.NewReader(conn)).Decode(&req); err != nil {
		return
	}
	var resp emuResp
	switch req.Op {
	case "ping":
	case "stats":
		s := &Stats{Lab: name, Seed: seed}
		for _, l := range links {
			s.Links = append(s.Links, l.stats())
		}
		resp.Stats = s
	case "set":
		resp.Error = applySet(links, req.Set)
	case "tamper":
		resp.Error = applyTamper(links, req.Tamper)
	default:
		resp.Error = "unknown op " + strconv.Quote(req.Op)
	}
	_ = json.NewEncoder(conn).Encode(&resp)
}

// applySet checks every entry, then applies them in order; it returns an
// error text naming the bad entry, and changes nothing then.
func applySet(links []*link, set []emuSet) string {
	for _, e := range set {
		if e.OneWay < 0 || e.Jitter < 0 || e.Loss < 0 || e.Loss > 1 || math.IsNaN(e.Loss) ||
			e.Reorder < 0 || e.Reorder > 1 || math.IsNaN(e.Reorder) || e.ReorderDelay < 0 {
			return fmt.Sprintf("set %s-%s: out of range", e.A, e.B)
		}
		found := e.A == "" && e.B == ""
		for _, l := range links {
			found = found || (l.from == e.A && l.to == e.B)
		}
		if !found {
			return fmt.Sprintf("set: no link between sites %q and %q", e.A, e.B)
		}
	}
	for _, e := range set {
		for _, l := range links {
			if e.A == "" && e.B == "" || (l.from == e.A && l.to == e.B) || (l.from == e.B && l.to == e.A) {
				l.params.oneway.Store(int64(e.OneWay))
				l.params.jitter.Store(int64(e.Jitter))
				l.params.loss.Store(math.Float64bits(e.Loss))
				l.params.reorder.Store(math.Float64bits(e.Reorder))
				l.params.reorderDelay.Store(int64(e.ReorderDelay))
			}
		}
	}
	return ""
}
