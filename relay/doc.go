// Package relay multiplexes many streams (relayed application connections)
// over the TCP connections between two site gateways: Links, grouped in a
// Trunk per site pair. It speaks the frames of docs/wire-format.md through
// package header.
//
// # Design
//
// A Trunk owns the streams and the stream ids of all links of a site pair.
// A stream is homed on the link its OPEN used (its control frames stay
// there), but once the peer has confirmed it, each DATA frame picks a link.
// A message takes the express link, a link that carries only messages, so
// the kernel socket in front of one is always nearly empty. Everything else
// takes the bulk link with the fewest bytes waiting in user space, which
// stripes one large transfer over all bulk links. A message is a burst (the
// bytes a stream's application writes without leaving the gateway's read
// waiting 500 us) of at most ExpressMax bytes, within the stream's express
// budget of ExpressMax bytes per round trip (at least 5 ms) of the express
// link. Burst, not frame size, decides because reads return what the
// socket holds: on loopback a bulk transfer arrives in 64 KiB pieces. The
// budget keeps a stream that writes message after message, which is
// throughput-bound, from filling the express link. DATA_AT
// frames carry the stream offset and the receiver restores the order;
// HALF_CLOSE carries the final offset. A link that dies takes with it the
// streams homed on it and, via RESET, those whose bytes crossed it.
//
// Per link: one writer goroutine, one reader goroutine, one keepalive
// ticker. Per stream: pumpOut (application -> link) and pumpIn (link ->
// application).
//
//   - Flow control: every stream has a credit window (HELLO's initial
//     window, refilled by WINDOW frames). pumpOut reads at most
//     min(chunk, credit) bytes, so a destination that stops reading stalls
//     only its own stream, and a gateway never holds more than
//     streams x window bytes for the far side. Credit is returned in batches
//     of window/8 once the bytes are written to the destination socket.
//   - Scheduling: the writer keeps two queues. Control frames and DATA of up
//     to SmallFrame bytes (16 KiB) go to the urgent queue and are written
//     first; larger DATA goes to the bulk queue, of which at most about one
//     chunk is taken per writev. On a lone link (no trunk, plain DATA) a
//     stream whose earlier frames are still in the bulk queue keeps using
//     it, so its bytes are never reordered; in a trunk offsets make that
//     rule unnecessary.
//     Frames are encoded into one net.Buffers and written with one writev
//     (header and payload together; several frames per call when queued).
//     The gateway sets TCP_NOTSENT_LOWAT on WAN sockets (default 128 KiB)
//     so the kernel holds little unsent data and priority is decided here.
//   - Copies: pumpOut reads into a pooled buffer (power-of-two classes) that
//     becomes the DATA payload; the reader reads each payload straight into
//     a pooled buffer that becomes the stream's receive queue entry. Each
//     gateway copies a byte twice (kernel->user, user->kernel), as any
//     user-space relay must without splice.
//   - Pipelining: Config.Pipeline (default 2) chunks of a stream may wait for
//     the writer, so a stream reads chunk B while chunk A is written (double
//     buffering), and no stream can fill the writer's queue.
//   - Latency fast paths: when the link is idle, a small DATA frame is
//     written by the stream's own goroutine (no hand-off to the writer), and
//     the reader delivers a small payload to an idle stream with one
//     non-blocking write (no hand-off to pumpIn). The reader itself never
//     blocks on a write, so two gateways cannot deadlock on each other.

//   - Failure: a read/write error, a protocol violation (bad frame, DATA
//     beyond the granted window, OPEN id of the wrong parity) or a peer
//     silent for DeadAfter closes the link with SO_LINGER 0; every stream is
//     then reset toward its application (code 7), on both sites.
//   - Limits: a peer that leaves more than Config.MaxControl control frames
//     unread (it floods PINGs or OPENs and does not read the answers) fails
//     its link; DATA for streams not yet connected to their destination
//     shares Config.MaxEarly per trunk, and the stream that would pass it is
//     reset (code 10). Both are counters kept where frames are queued.
//   - Queue control (Config.QueueTarget, queue.go): while messages cross
//     the trunk, one controller per trunk keeps the WAN bottleneck's queue
//     near the target by having the peers cap the bulk links' receive
//     windows (CLAMP) at the measured rate x (min RTT + target), split
//     evenly over the bulk links; it steps aside for other flows.
//
// # Measurements (2 shared cores, AMD EPYC VM, loopback; other jobs running)
//
// Payload path, one stream's LAN socket -> framed DATA on the WAN socket
// (BenchmarkCopyPath, go test -run '^$' -bench CopyPath -benchtime 2000x ./relay):
//
//	read + writev, 64 KiB chunk    966 MB/s   822 CPU-ms/GB
//	splice + send(MSG_MORE) + splice, 64 KiB   718 MB/s  1012 CPU-ms/GB
//	read + writev, 128 KiB chunk  1364 MB/s   681 CPU-ms/GB
//	splice ..., 128 KiB            986 MB/s   981 CPU-ms/GB
//
// splice(2) costs three system calls per chunk (socket->pipe, header,
// pipe->socket) and cannot batch frames of several streams into one write;
// on TCP->TCP it was slower and used more CPU, so the relay keeps read +
// writev with pooled buffers.
// Again in the twentieth session, nothing else running, 2 runs each:
// read + writev 1911 and 2177 MB/s, 883 and 828 CPU-ms/GB (64 KiB), 2328
// and 2284 MB/s, 774 and 793 (128 KiB); splice 1889 and 1720 MB/s, 898 and
// 1002 (64 KiB), 2256 and 2354 MB/s, 846 and 794 (128 KiB). Still no gain.
//
// Single vs double buffering (BenchmarkStream, one bulk stream through a
// link pair in one process): pipeline 1, 2 and 4 were within the run-to-run
// noise of the shared machine (650-920 MB/s, 1020-1180 CPU-ms/GB); depth 2
// is kept because it lets a stream read while its previous chunk waits for
// a WAN socket held back by TCP_NOTSENT_LOWAT.
//
// Bulk chunks are written inline too, by the stream's own goroutine
// whenever the link is idle, which saves the sending gateway a thread
// wake-up per chunk (tried in the twentieth session, taken back out, kept
// since the twenty-first). BenchmarkForward (./gateway, one stream through
// a gateway pair as processes on loopback), sending gateway's Gbit/s per
// CPU-second, 5 runs alternating, median (min-max), two sittings an hour
// apart:
//
//	                  writer goroutine    inline
//	64 KiB chunks     9.59 (9.17-10.69)   11.81 (11.41-12.61)
//	128 KiB chunks    10.23 (9.81-11.98)  11.81 (10.23-13.32)
//	slower sitting:
//	64 KiB chunks     9.12 (7.77-9.87)    9.87 (9.37-12.43)
//	128 KiB chunks    9.37 (8.22-11.26)   11.11 (9.02-11.41)
//
// On the emulated WAN alone nothing changed ((b) 100.2-101.1 % both; (d)
// p99 beside bulk 21.69-22.48 ms against 21.92-22.30). But beside a
// competing direct flow with queue control on (TestGatewayCompeting), the
// gateway stream's rate over its rate with --wan-queue 0 was 0.47-1.17
// (mean 0.81, 8 runs, one below the test's bound of 0.5) against 0.79-1.09
// (mean 0.94, 6 runs) with the writer. Without the pipeline's queued chunk
// the link shows no backlog whenever its stream is descheduled between
// writes, and queue control only judges a foreign queue on a link
// backlogged for a whole round trip.
//
// Twenty-first session: that guess was wrong. A per-sample trace of queue
// control (8 runs of the inline build) showed the link backlogged in
// nearly every sample. Alternating 4 runs of each build, the ratio was
// 0.47-1.05 (mean 0.74) inline and 0.54-0.94 (mean 0.77) with the writer:
// it swings as much in either build, partly because its --wan-queue 0
// reference swings (93-155 Mbit/s). What the low runs of both builds
// shared: the cap fell to a tenth of its settled value (37-52 KB) before
// the foreign queue was judged and the cap lifted, and BBR, having
// measured the capped rate, then took seconds to climb back (in flight
// 47 KB growing to 600 KB over 4 s after the lift). Queue control now
// lowers the cap by at most half per round trip as the link sees it
// (srtt, not min_rtt), keeps sampling while a loss stalls the cumulative
// ACK (it slept 200 ms as if idle), and engages from the best rate of the
// last 2 busy seconds rather than one sample (a sample spanning a stall
// set caps of 16 KB). TestQueueCtlForeignArrives and TestQueueCtlStalls
// model these.
// With that controller, 6 runs of each alternating: inline 0.60-1.28
// (mean 0.97, median 1.00), with the writer 0.66-1.15 (mean 0.93, median
// 0.93), so the inline writes came back.
//
// # Gateway pair figures (issue 4 benchmarks)
//
// Two series: the first session's, on this VM shared with other jobs (load
// average 8-17), and the second's on the same VM with nothing else running
// (load < 1). They differ in instructive ways, so both are kept.
//
// (a) 1-byte ping-pong round trip on loopback, same path for all rows
// (bench/pingpong.sh: go test -run '^$' -bench PingPong -benchtime 20000x
// ./gateway, 3 runs, p50 min / median; the rows run one after the other in
// each run). With the poller thread (see poller.go; fifth session):
//
//	                                             quiet VM as shipped   halt polling on
//	direct (both ends in the test process)       11.8 / 11.8 us        11.6 / 11.6 us
//	gateway pair in this process, Go's poller    36.5 / 36.5 us        35.7 / 35.9 us
//	gateway pair in this process, poller thread  97.8 / 98.8 us        52.5 / 53.2 us
//	gateway pair, own processes (as shipped)     77.7 / 80.1 us        64.0 / 67.9 us
//	the same, --poll-thread=false                138.6 / 142.9 us      76.4 / 78.7 us
//	two epoll forwarders, own processes (floor)  70.2 / 73.0 us        58.2 / 59.0 us
//	two Go read/write forwarders, own processes  136.0 / 143.8 us      73.1 / 76.4 us
//	two socat forwarders (socat chain)           95.4 / 98.4 us        69.4 / 69.9 us
//	ninth session, same runs: direct             11.1 / 11.5 us        11.2 / 11.5 us
//	  no relay process, the kernel forwards      34.2 / 35.2 us        35.4 / 35.4 us
//	  (sockmap, sk_skb redirect; no framing)
//	  gateway pair, own processes                73.0 / 73.0 us        60.0 / 61.7 us
//
// (bench/figures/pollthread/pingpong.txt.) As separate processes, each of
// the four extra process hops of a round trip wakes a process whose vCPU
// went idle. This VM ships with the guest's halt polling off
// (cpuidle-haltpoll, guest_halt_poll_ns = 0), so such a wake costs a VM
// exit and entry; the script measures once more with the kernel's default
// 200 us of polling and restores the setting. Go's poller made it worse:
// perf sched showed each hop waking two or three runtime threads of the
// gateway (the netpoller's M, another M, sysmon from entersyscall), so the
// pair cost what two minimal Go forwarders cost and more than socat. The
// poller thread forwards a quiet socket's bytes on the thread that woke,
// like a C event loop, and the pair is now below socat in both
// configurations and 6-8 us above the floor: two minimal forwarders that
// wait in epoll_wait on one locked thread each and do nothing but read and
// write. That floor, +58 us over direct as shipped, is the price of four
// process wake-ups on this VM, which no relay avoids, so the goal's +30 us
// over direct holds only in one process, where no hop sleeps: +25 us with
// Go's poller (there the poller thread adds a thread hop the round trip
// otherwise does without). Even with no relay process in the path, two
// hops of kernel forwarding (sockmap) cost +23 us: each egress redirect
// runs the target socket's send from a kworker
// (bench/figures/pollthread, ninth session). Bulk forwarding pays for it: about 10 % more CPU
// per byte in BenchmarkForward, because every WINDOW frame wakes the
// poller thread where a busy Go runtime finds it by polling; streaming
// sockets therefore wait in Go's poller.
//
// Seventeenth session: a byte for the poller thread still woke one of the
// runtime's threads as well, because every package-net socket is also in
// the runtime's own epoll set. While the poller thread owns a socket its
// input is now left out of that registration (rtquiet.go), and the thread's
// non-blocking calls are raw (rawsys.go). Context switches of a gateway in
// the ping-pong halved; with C-like endpoints (MPI5K_ECHO=proc
// MPI5K_RAWCLIENT=1), halt polling on / idle vCPUs polling: direct 12.9 /
// 13.0 us, pair as processes 67.3 / 67.4 us (73.6 / 83.2 with
// --quiet-runtime=false), socat 60.1 / 65.0 us. As configured the pair beat
// --quiet-runtime=false in 5 of 6 runs by 16-49 us and was within -4..+61
// us of socat (median +20); bench/figures/pollthread, seventeenth session.
//
// Eighteenth session: the small-message path allocated 40 times per round
// trip (closures handed to RawConn escape; now made once per socket) and
// the poller thread, which never passed through the scheduler, was
// preempted by sysmon every 10 ms, which kept sysmon waking every 20 us
// (now a runtime.Gosched every 5 ms; poller.go). C-like endpoints, 6 runs
// alternating with the build before, min / median p50: idle vCPUs polling
// 60.8 / 66.4 us against 67.3 / 79.7, as configured 133.0 / 140.2 against
// 127.5 / 153.0; CPU per round trip, median, 70.9 against 86.6 and 122.6
// against 147.4 us. The pair was below socat in 4 of 5 runs with polling
// and 3 of 5 as configured; bench/figures/pollthread, eighteenth session.
//
// Nineteenth session, nothing else running, same rows, 5 runs: with idle
// vCPUs polling the pair took 54.8 / 55.8 us, below socat (62.7 / 65.1) in
// every run, +41.8 to +48.4 us over direct; as configured 97.8 / 102.8 us,
// 1.5 to 4.6 us above socat in 4 runs, level with two epoll forwarders
// (100.9 / 103.1). Of the pair's CPU over those forwarders (about 10 us per
// round trip with polling) one epoll_ctl per message re-arming the one-shot
// registration is 1.6 us; the rest is user space, 1.5 us per forwarded
// message; bench/figures/pollthread, nineteenth session.
//
// Twenty-third session: the poller thread's registration is level-triggered
// and stays while the thread keeps the socket, so a message no longer costs
// an epoll_ctl to re-arm (4 per round trip to none); its periodic work runs
// on a timerfd tick, so epoll_wait arms no timer per message (poller.go).
// Halt polling on, alternating with the build before each: p50 median 56.2
// against 60.2 us (10 runs), then 45.5 against 46.3 (6 runs; CPU per round
// trip 48.7 against 51.4). The benchmark's raw client had itself kept
// sysmon waking every 20 us (syscall.Syscall in a blocking read); with raw
// calls every row gained (pair 46.2 against 57.0, socat 49.3 against 66.6).
// bench/pingpong.sh 5 then, min / median, halt polling on: direct 13.9 /
// 17.1 us, pair 45.5 / 60.5 (+31.6 at the minimum), socat 49.3 / 62.2, two
// C event loops 43.2 / 43.7 (+29.3), the kernel alone 38.6 / 39.7; as
// configured direct 50.9 / 53.7, pair 88.5 / 95.2, socat 96.2 / 100.4, C
// event loops 85.0 / 102.9. Single runs swing by 10-20 % with the same
// system calls (the vCPUs' speed), so the pair and socat trade places run
// to run. The goal of +30 us sits at the floor of two minimal C relays on
// this VM; the pair is about 2 us above it; bench/figures/pollthread,
// twenty-third session.
//
// Before the poller thread (fourth session, same VM): pair as processes
// 138.8 / 139.9 us, socat 111.6 / 115.4 us; with halt polling 70.4 / 71.7
// and 58.8 / 65.3 us. Busy polling, which removes the wakes at the price
// of a core per spinning reader, was tried then (an experiment, not kept:
// every LAN and WAN read retried non-blocking reads for a set time before
// waiting in the poller). On these 2 vCPUs, shared by both gateways and
// the test process, the spinners took the cores the other hops needed: p50
// 274-276 us spinning 50 us, 623-679 us spinning 200 us, against 151-180
// us without and socat's 116-150 us in the same runs. The first session,
// on a VM loaded by other jobs (load 8-17, vCPUs kept awake), measured
// direct 12 us, in one process 38 us, as processes 65-97 us, socat 61-72
// us.
//
// (b) bulk goodput over the emulated WAN, 200 Mbit/s, 20 ms RTT, 1-BDP
// drop-tail queue (go test -run TestGatewayWAN -v ./e2e, as root, after
// make). With trunks (an express link beside the bulk link, DATA_AT
// framing): 97.2, 100.1, 100.3 % of direct with the defaults (BBR bulk
// link, 4 MiB window); with today's (CUBIC express link for messages)
// 100.2 % three times; 98.4-98.6 % paced at 190 Mbit/s (11 runs); with
// the poller thread 97.5 % (one run); with queue control, which is off
// while no messages flow, 100.3 and 100.2 %.
// Those runs sit at two levels, 100.2 % or 97.2-97.5 %, and the ninth
// session found why: BBR's PROBE_RTT. A BBR socket that has sent for 10 s
// without an RTT sample at or below its min_rtt holds cwnd at 4 segments
// for at least 200 ms (tcp_bbr.c), and a bulk link that fills the
// bottleneck queue sees no such sample; one dip inside the 8 s transfer
// costs 2.5-3 %. The gateways now export the dips
// (mpi5k_wan_bbr_probe_rtt_total, from TCP_CC_INFO every 100 ms) and the
// test logs them: 3 runs, 1 dip -> 97.3 and 97.2 %, none -> 100.2 %; with
// --wan-conns 2 both links dipped together (they share their start),
// 97.5 %. With --wan-cc cubic on the bulk link there is no dip: 100.1 %
// twice, (d) p99 22.02 and 21.91 ms. BBR stays the default because of
// lossy WANs: at 0.1 % random loss (MPI5K_LAB_LOSS=0.1%) the BBR bulk link
// got 185.1 Mbit/s (97.6 % of direct, whose hosts ran BBR too; one dip),
// a CUBIC one 21.4 Mbit/s (11.2 %). On a clean WAN that a site pair has to
// itself, --wan-cc cubic gains back the 2.5 % of every 10 s of continuous
// bulk.
// The tenth session made the gateways able to skip the dip
// (--wan-skip-probe-rtt, gateway/probertt.go; the default since the
// eleventh session, see below):
// BBR does not dip when the first ACK after its min_rtt filter expires ends
// a restart from idle, so the gateway places the filter's stamp from 5 ms
// samples of TCP_CC_INFO and holds the busy link's writes (Link.Hold) until
// its flight has drained before the expiry, resuming a min RTT before the
// latest expiry. 25 s of bulk (MPI5K_BULK_SECS=25), where two expiries fall:
// 101.7, 101.6, 101.3 % of direct (direct dips), 0 dips, 2 holds and 2
// skips each, about 100 ms held per hold of which the bottleneck idles a
// few tens; without it 99.0, 100.0, 100.0 % and 1-2
// dips. The 8 s runs: 100.2 % four times. At 0.1 % loss one of two holds
// was followed by a dip anyway (one run): 101.2 %. The guard was opt-in
// for a session because e2e TestBenchLab (BT through the gateways beside
// iperf3 cross traffic) stalled in most runs with it on; the lab was at
// fault (the emulator's priority only counted inside its own autogroup,
// testbed/README.md), and with that fixed 6 of 6 runs were clean. With
// the defaults (eleventh session, 25 s): 101.6 %, 0 dips, 2 holds, 2 skips.
// Before trunks: 100.2 % (quiet VM), 97.1-98.6 % (loaded VM). With a 1 MiB
// window the pair fell to 79-83 % in overloaded runs (credit round trips
// stretched by scheduling delays).
//
// Stalled receivers (same test): 4 streams whose destination never reads
// fill their windows, then another stream through the same pair gets
// 98.0-101.3 % of what it got alone; the far gateway's RSS grows 17.3-17.6
// MiB for the 4 x 4 MiB windows it must hold (11.8 -> 29.1 MiB).
//
// (d) 1-byte ping-pong (5 ms gaps) while one stream saturates the WAN, same
// lab and test, p50/p99 at 20 ms RTT (500 round trips; quiet VM; each
// configuration 2-3 runs, MPI5K_GW_ARGS='...' selects the gateway flags):
//
//	direct idle                                          20.1-20.5 / 20.3-23.6 ms
//	direct beside a direct bulk flow                     20.3-20.8 / 27.9-36.5 ms
//	trunk, defaults (queue control 1 ms, unpaced)        20.5 / 21.66, 21.68 ms
//	  the same, cap also kept for bulk alone (3 runs)    20.5-20.6 / 21.69-22.07 ms
//	  cap on bulk alone, --wan-queue 2ms (2 runs)        20.6-20.7 / 22.66-22.70 ms
//	trunk (bulk + express link), --wan-queue 0           20.6-21.2 / 28.0-34.4 ms
//	trunk, --wan-pace 190mbit (BBR)                      20.7-20.8 / 21.5-23.3 ms
//	trunk, --wan-pace 190mbit --wan-cc cubic (9 runs)     20.6-21.0 / 21.7-23.1 ms
//	one link (--wan-express=false), same pacing, CUBIC   20.6-21.3 / 33.8-33.9 ms
//	before trunks, one link, defaults                    20.6 / 43.5 ms
//	  --wan-pace 190mbit --chunk 32KiB
//	    --wan-notsent-lowat 32KiB (BBR or CUBIC)         20.7-20.9 / 25.0-25.2 ms
//
// Twenty-third session, a smaller target tried: --wan-queue 500us against
// the default 1 ms, 3 runs alternating, p99 22.87, 22.14, 23.05 ms against
// 23.05, 23.07, 22.30, while the bulk stream beside the ping-pong fell from
// 185-188 to 179-180 Mbit/s. The tail is not the queue's (see below); the
// default stays. The default's runs of that day, full test: p99 22.58,
// 23.22, 23.64, 23.31 ms, direct beside its own bulk flow 27.6-31.6 ms.
//
// Queue control (queue.go, the default since the sixth session) meets the
// goal without knowing the WAN: while messages cross the express link the
// bulk link has its peer cap the receive window at rate x (min_rtt + 1 ms),
// so the bottleneck queue stays near 1 ms plus the lab's ACK-timing noise
// (srtt sits 0.5-1 ms above min_rtt with no queue at all). A cap kept on a
// bulk transfer alone cost it 2-5 % here (94.9, 95.4, 97.6 % of direct),
// because that noise eats most of 1 ms of headroom; hence the cap is only
// on while messages flow (bulk alone: 100.3, 100.2, 100.2 %). Against a direct TCP
// flow filling the queue the cap steps aside (TestGatewayCompeting, 8 s
// each at once, 4 runs): the gateway stream got 95.7-106.8 Mbit/s with
// queue control, 94.5-121.2 without (shares on 2 cores vary run to run).
//
// Seventh session: with --wan-conns 2 that controller, then one per bulk
// link, failed (p99 40.2-40.4 ms in 3 of 4 runs): a receiver never
// shrinks a window it has offered, and after a bulk run its autotuned 5-8
// MB window let the queue fill for tenths of a second after a cap was
// sent; the controllers read that as another flow's queue and lifted. Now
// one controller caps the trunk, and counts a queue as foreign only while
// no link can have more in flight than its cap: a link with bytes waiting
// by its peer's window (tcpi_snd_wnd), one with none by its bytes
// unacknowledged. (Until the fifteenth session every link by its window,
// which a link that carries few chunks keeps at megabytes for minutes:
// against a BBR flow the cap was never lifted and the busier link sat at
// 16 KiB.) p99 with
// two bulk links 21.59-21.88 ms (5 runs), with one 21.49-22.08 ms (5 runs;
// bench/figures/queuecontrol). Its
// foreign-queue rule is faster and tighter (target + 2 ms for 4 RTTs):
// against a direct flow that keeps 2-5 ms of queue, the gateway stream got
// 86.4-109.3 Mbit/s with queue control, 98.4-114.7 without (4 runs).
//
// Before queue control, two things kept a small message from waiting
// behind bulk. Unpaced, the bulk keeps the bottleneck's 1-BDP drop-tail queue full (~870-1 100 fast
// retransmissions per run), so every packet, direct or relayed, waits up to
// a queue: the trunk's p99 (28-29 ms) is then no worse than direct TCP
// beside bulk. A gateway knows its WAN: --wan-pace caps the bulk links
// (SO_MAX_PACING_RATE) just below the bottleneck, the queue never builds
// (zero WAN retransmissions; the lab measured its queueing delay at p99
// 1.2 ms) and what is left is the gateway's own socket: on one link a small
// frame queues behind up to TCP_NOTSENT_LOWAT plus one chunk of bulk bytes
// (33.8 ms p99 at 128 KiB + 128 KiB; 25 ms at 32 + 32 KiB). The express
// link, which carries only messages, removes that queue:
// p99 RTT + 1.5-3.3 ms, and RTT + 1.7-3.1 ms with CUBIC (RTT + 1.7-2.0 in 6
// of 9 runs), whose rate under the cap needs no probing (BBR's PROBE_RTT
// stranded bytes for 117-181 ms in earlier one-link runs). The goal, p99 <=
// RTT + 2 ms, is met paced in most runs; the
// rest is 2 shared cores (even idle, direct p99 reached RTT + 3.6 ms once).
// On the loaded VM (first session) the unpaced p99 was 80-120 ms with one WAN
// connection and 39.8 ms with --wan-conns 2.
//
// Twenty-second session: TestGatewayWAN gave (d) p99 22.88, 22.86 and
// 23.95 ms with the defaults (through the gateways idle 20.75-21.50), so
// where does the tail come from? Not the bottleneck queue: around the slow
// round trips (24-26 ms) the bulk link's srtt stayed at 20.3-21.3 ms and
// queue control's estimate at 0.6-0.9 ms; the emulator queued packets
// 0.67 ms at p50 and wrote them late by 0.12 ms (p99; reverse direction
// 0.37). It used 92-100 % of one vCPU at nice -10, the two gateways 6 and
// 18 %. Pinging direct and through the gateways at the same time beside a
// gateway bulk stream (both crossing the same queue; 22 rounds of 250
// round trips): direct p99 20.6-24.4 ms, so even direct TCP misses RTT +
// 2 ms in about half the rounds on this host; the gateway path's excess
// over direct, median, 0.65-0.74 ms at p50 (0.4 ms idle) and 0.81-1.17 ms
// at p99. Giving the poller thread nice -10 (it shares a CPU with the
// sender, the sink and the gateways' bulk threads, all at nice 0) cut the
// p99 excess from 1.17 to 0.76 ms in 12 pairs of rounds (less in 9), and
// not at all in 10 more (0.89 against 0.81; less in 6): no reliable gain,
// not kept.
//
// The same rounds showed queue control starving the bulk stream. In about a
// third of gateway starts min_rtt read 19.000 ms where it otherwise read
// 19.54-19.78: a round trip timed by TCP timestamps (whole milliseconds;
// the kernel times a retransmitted segment that way, and priming fills the
// bottleneck's queue). srtt - min_rtt then never fell below 1.2 ms, above
// the 1 ms target, so every sample read as queue and lowered the cap, and
// every lower cap lowered the rate instead of the delay: from 193 Mbit/s
// down to 75 within a second; over the 8 s, 75, 97.6, 107.9 and 115.1
// Mbit/s in 4 of 16 rounds, each one with min_rtt at 19 ms, against
// 181.9-189.8 in the others. TestQueueCtlAckDelay models it (utilisation
// 0.57 with srtt 1.4 ms above min_rtt, 0.03 with 1.9). Queue control now
// learns that offset: a cap that fell by a tenth over two round trips in
// which every sample showed a queue that did not shrink is given back, and
// the queue it saw, less half the target, counts as offset from then on
// (until min_rtt changes or srtt comes closer to it). A first version that
// kept its reference across samples below the target learned 0.55-0.92 ms
// of offset on correct min_rtt too, from ordinary rate noise, and the queue
// grew with it. As shipped: 20 rounds at 186.2-191.1 Mbit/s with no offset
// learned (min_rtt read 19.77-19.96 that day, never 19 ms); with 0.05 %
// random loss (MPI5K_LAB_LOSS), where min_rtt read 19 ms in most rounds,
// 154.4-173.5 Mbit/s in 12 of 12 rounds against 83.1, 90.7, 103.9, 111.9,
// 173.9 and 175.8 for the build before, offsets 0.45-1.63 ms. Beside a
// competing direct flow (TestGatewayCompeting, ratio to --wan-queue 0) it
// changed nothing measurable: 0.75, 1.01, 1.06 against 0.82, 1.17, 1.04,
// alternating.
//
// Measuring the rate in delivered segments (tcpi_delivered x MSS, which
// counts SACKed data) instead of bytes acknowledged was tried the same day:
// rate samples above 210 Mbit/s on the 200 Mbit/s WAN fell from 144 to 9
// over 12 rounds (bytes_acked stands still while a loss holds the
// cumulative ACK, then jumps), and a false lift after such a jump did not
// recur. But beside a competing direct flow TestGatewayCompeting's ratio
// fell to 0.71-0.84 (mean 0.78, 7 runs) against 0.77-0.98 (mean 0.89, 5
// runs) for the build before, alternating, so it was reverted.
//
// (e) MPI ping-pong by message size through the trunk (mpi5k bench
// --workloads pingpong on the 20 ms lab, Open MPI 4.1, Reno hosts, 3
// repetitions, median half round trip; old16 is the first trunk: express
// link for frames of at most 16 KiB, BBR on every WAN socket):
//
//	                       1 B        4 KiB      16 KiB     64 KiB     1 MiB
//	direct                 9.91 ms    10.03 ms   10.54 ms   32.38 ms   100.9 ms
//	trunk, defaults        10.03 ms   10.16 ms   10.67 ms   32.69 ms    73.5 ms
//	old16                   9.97 ms   10.69 ms   16.87 ms   38.67 ms    73.9 ms
//
// Two things cost old16 6 ms at 16 KiB. A 16 KiB MPI message is 16 KiB plus
// Open MPI's headers, so it took the bulk link; and BBR paces a socket at
// the delivery rate it measured, which for one message per round trip is
// that message's size per RTT: each message was spread over a third of an
// RTT. A CUBIC express link does not pace (and a socket that was ever BBR
// keeps the kernel's pacing, so the gateway creates WAN sockets with the
// express CC and switches the bulk links to BBR after the handshake); 68
// KiB covers Open MPI's eager fragments (64 KiB plus a header). With both,
// every size is within 1.3 % of direct up to 64 KiB, and 1 MiB, which
// direct Reno sends from a cold window, is 27 % faster.
//
// A BBR link can be made to learn the path instead (thirteenth session):
// the gateway primes every new BBR link with PAD frames, filler the peer
// discards (HELLO feature PAD, Link.Pad), until BBR's estimate stops
// growing; BBR ignores app-limited samples below its estimate, so messages
// then go at the path's rate until a loss (gateway/prime.go: a
// retransmission replaces the aged estimate, which is why the express link
// stays CUBIC). Same lab, 3 repetitions, median half round trip, side by
// side:
//
//	                          16 KiB     64 KiB     1 MiB      4 MiB      sweep (min/median)
//	direct                    10.63 ms   32.62 ms   101.7 ms   361.1 ms   12.1 / 12.1 s
//	trunk, primed (default)   10.76 ms   32.85 ms    73.9 ms   208.9 ms    9.8 /  9.8 s
//	BBR express link, primed  10.74 ms   32.83 ms    73.9 ms   204.4 ms    9.6 /  9.7 s
//	trunk, --wan-prime=false  10.79 ms   32.87 ms    73.8 ms   491.5 ms   10.8 / 13.3 s
//	BBR express, unprimed     17.04 ms   39.66 ms   (an earlier run, same hour)
//
// The 4 MiB row is the bulk link's: one whose STARTUP ended on a low
// estimate grows it by only 25 % per eight round trips, so unprimed its
// time varied from run to run (225-491 ms).
//
// Renewal of the express link (HELLO feature RENEW, trunk.go Add, link.go
// retire). Every loss cuts a TCP window, and app-limited messages never
// regrow it (Linux grows cwnd only while it limits the sender): at 0.1 %
// random loss the express link's window fell to 14 segments with a
// slow-start threshold of 7 (a loss among 1-byte pings), and a 64 KiB
// message (45 segments) took four round trips, p50 82.9 ms against 30 ms
// direct. A fresh connection starts in slow start with no threshold and
// grows to twice the largest message within a few. So the gateway replaces
// a cold express link (ssthresh and cwnd below one ExpressMax message, at
// most once a second): the dialer connects a new link, Add puts it in the
// old one's place, and the old one writes what it has queued, then RETIRE;
// a frame sent to it after that goes to its successor. It reads up to the
// peer's RETIRE and closes with no stream reset, since both byte streams
// ended whole and DATA_AT offsets restore the order across the two links.
// At 0.1 % loss, 300 ping-pongs of 64 KiB (go test -run
// TestGatewayLossyExpress -v ./e2e; 2 runs): p50 29.0 and 25.9 ms with
// renewal (14 and 11 renewals), 63.7 and 65.8 ms without, direct TCP 42.0
// and 39.6 ms; p99 102-123 ms in all (a loss in a message costs a round
// trip whatever carries it). Without loss no renewal happens (0 in
// TestGatewayWAN). TestTrunkRenewExpress renews 20 times under traffic
// with nothing lost or reset.
//
// Correctness at scale: 1000 concurrent streams, sizes uniform in 0..8 MiB
// (4.16 GB) through two in-process gateways with SHA-256 end to end: all
// intact, 58.5 s (MPI5K_FULL=1 go test -run ThousandStreams ./gateway; the
// default run draws log-uniform sizes, 0.57 GB, 4.4 s). Beside 40 stalled
// streams the far gateway's RSS grew 15-17 MiB for 40 x 256 KiB windows.
package relay
