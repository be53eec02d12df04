// Package relay multiplexes many streams (relayed application connections)
// over the TCP connections between two site gateways, in the frames of
// docs/wire-format.md (package header).
//
// A Trunk joins two gateways: its Links, one per WAN connection (bulk
// links, and an express link that carries only messages), share one table
// of Streams. Link.Open starts a stream, the peer's Handler receives it and
// Stream.Accept connects it to its destination; each DATA frame then takes
// whichever link of the trunk suits it, and the receiver restores the
// order. A byte's path, file by file, each file opening with the functions
// it passes there:
//
//  1. outbound.go: a stream's out-stage reads the application's bytes and
//     frames them;
//  2. trunk.go: Trunk.pick chooses the link, the express link for a
//     message, the least queued bulk link for the rest;
//  3. send.go: the link writes the frame at once when it is idle, else its
//     writer batches it into one writev;
//  4. recv.go: the peer's link reader hands each DATA payload to its stream;
//  5. inbound.go: the stream's in-stage writes it to the application and
//     returns the credit.
//
// Config tunes a link; the gateway plugs its WAN tuning policies (package
// tuning) into the relay's hooks, QueueController and ExpressController.
// The design and the measurements behind it (flow control, scheduling, the
// poller thread, the express link's renewal, queue control), and each
// file's part, are in relay/doc.go past this summary;
// docs/architecture.md says where each concern of mpi5k lives.
package relay

// The relay's design, for its readers and maintainers (go doc prints the
// summary above alone).
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
// HALF_CLOSE carries the final offset. A link whose connection breaks
// resumes on a new one (resume.go) when both sides set HELLO feature
// RESUME; a link that fails takes with it the streams homed on it and,
// via RESET, those whose bytes crossed it.
//
// Per link: one writer goroutine and the reader, a stage (recv.go); the
// keepalives of all links run on one timer (keep.go). Per stream: two
// stages (stage.go), the out-stage (application -> link) and the in-stage
// (link -> application). Each is one step function
// that runs until it would block and then says what it waits for: a
// pipeline token, credit or queued data (whoever provides it kicks the
// stage), or the application's socket readable (the poller thread runs the
// step when it is; for a connection that is not a socket but says when it
// has bytes, a ReadNotifier such as an MX stream, its callback runs it,
// notify.go). The same step runs on the poller thread, without
// blocking, or on a goroutine, which may block; a waiting stage holds no
// goroutine, so an idle stream costs its structures, not goroutine stacks
// (bench/figures/scale).
//
//   - Flow control: every stream has a credit window (HELLO's initial
//     window, refilled by WINDOW frames). The out-stage reads at most
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
//   - Copies: the out-stage reads into a pooled buffer (power-of-two classes) that
//     becomes the DATA payload; the reader reads each payload straight into
//     a pooled buffer that becomes the stream's receive queue entry. Each
//     gateway copies a byte twice (kernel->user, user->kernel), as any
//     user-space relay must without splice.
//   - Pipelining: Config.Pipeline (default 2) chunks of a stream may wait for
//     the writer, so a stream reads chunk B while chunk A is written (double
//     buffering), and no stream can fill the writer's queue.
//   - Two-buffer forwarding (pipe.go): a PipelinedConn, a connection that
//     is not a kernel socket and can send a buffer without copying it (the
//     gateway's MX streams with --lan-forward pipelined), has its bulk
//     chunks handed to the writer even on an idle link, so the next read
//     overlaps the write, and its in-stage sends each payload from the
//     relay's buffer while the next arrives, at most two started, credit
//     returned once a write has finished. docs/architecture.md says where
//     each mode blocks and copies.
//   - Latency fast paths: when the link is idle, a small DATA frame is
//     written by the stream's out-stage itself (no hand-off to the writer),
//     and the reader delivers a small payload to an idle stream with one
//     non-blocking write (no hand-off to the in-stage). The reader itself never
//     blocks on a write, so two gateways cannot deadlock on each other.
//     So a frame is sent one way (Link.send) in one of three modes that
//     say who sends it: queued only (the reader, control frames), written
//     at once with a blocking write (an out-stage on a goroutine), or
//     written at once without blocking, small frames only (an out-stage on
//     the poller thread, which serves every socket and must not block).
//     When one epoll_wait finds several streams' messages, the poller
//     thread corks: the small frames the batch's steps send to an idle
//     link go out together in one non-blocking writev once the batch's
//     steps have run, not one writev (and one TCP segment for the peer to
//     read) each (bench/figures/permessage).
//   - Failure: a protocol violation (bad frame, DATA beyond the granted
//     window, OPEN id of the wrong parity), the peer's FIN, or a broken
//     connection (a read/write error, a peer silent for DeadAfter) of a
//     link that does not resume or stays down past ResumeWithin closes the
//     link with SO_LINGER 0; every stream is then reset toward its
//     application (code 7), on both sites. A resuming link's broken
//     connection only takes it down until Resume (resume.go).
//   - Limits: a peer that leaves more than Config.MaxControl control frames
//     unread (it floods PINGs or OPENs and does not read the answers) fails
//     its link; DATA for streams not yet connected to their destination
//     shares Config.MaxEarly per trunk, and the stream that would pass it is
//     reset (code 10). Both are counters kept where frames are queued.
//
// # Copy path
//
// Each gateway copies a byte twice, kernel to user and back. splice(2)
// would avoid the copies but costs three system calls per chunk (socket to
// pipe, header, pipe to socket) and cannot batch the frames of several
// streams into one write; on TCP to TCP it is slower and uses more CPU
// (BenchmarkCopyPath), so the relay reads into pooled buffers and writes
// with writev. A bulk chunk, like a small frame, is written by the stream's
// out-stage whenever the link is idle, which saves the sending gateway
// a thread wake-up per chunk. Figures: bench/figures/forwarding.
//
// # Poller thread
//
// Each link's Config chooses how idle sockets are waited for. By default
// one locked OS thread per process (poller.go) waits in epoll_wait for
// every quiet socket, LAN and WAN, and forwards a small message right on
// that thread: a message wakes one thread per gateway, not the two or
// three of Go's network poller (the netpoller's thread, another, sysmon),
// and on a VM every wake-up of an idle vCPU costs a VM exit. Its
// registrations are level-triggered and stay while it owns a socket, so a
// message costs no epoll_ctl; its periodic work runs on a timerfd tick, so
// a wait arms no timer; it passes through Go's scheduler every 5 ms, so
// sysmon does not preempt it. Its non-blocking reads, writes and
// epoll_ctl calls are raw system calls (rawsys.go). While it owns a
// socket, the socket's input is left out of the runtime's own epoll
// registration (rtquiet.go), so an arriving byte does not also wake a
// runtime thread. A socket that streams goes back to Go's poller, where a
// busy runtime finds it by polling: forwarding bulk through the poller
// thread costs about 10 % more CPU per byte. Config.NoPoller and
// Config.RuntimeWakes turn these off, for measuring them.
// Figures: bench/figures/pollthread.
//
// # Trunks, the express link and renewal
//
// A site pair is joined by a Trunk: one or more bulk links and, by default,
// an express link. The express link carries messages only, so its socket
// never holds bulk bytes for a message to wait behind; the gateway runs it
// on CUBIC, which does not pace a burst at the rate of the previous one,
// and the bulk links on BBR. A message is a burst of at most ExpressMax
// bytes (default in the gateway 68 KiB: Open MPI's 64 KiB eager fragments
// and their header) within the stream's budget per round trip; the rest
// of a stream's bytes are striped over the bulk links.
//
// Every loss cuts a TCP window, and app-limited messages never grow it
// back (Linux grows cwnd only while it limits the sender), so a
// long-lived express link on a lossy WAN ratchets down until one message
// needs several round trips. The trunk therefore renews it (HELLO feature
// RENEW, Trunk.Add, Link.RequestRenew): when the express link's cwnd and
// ssthresh are below one ExpressMax message (the express controller
// decides, Trunk.StepExpress), at most once per RenewGap, the dialing
// gateway connects a fresh link, Add puts it in the old one's
// place, and the old link writes what it has queued, sends RETIRE and
// closes once it has read the peer's RETIRE. Nothing is reset: both byte
// streams end whole and DATA_AT offsets restore the order across the two
// links. Figures: bench/figures/express.
//
// Against another flow that keeps the WAN queue full, the express link
// helps no message: each waits in that queue on any link, and there the
// loss-based express window is cut about once a second. A side can then
// hold the express link aside (Trunk.HoldExpress): for the hold, its
// messages take the bulk links, as in a trunk without an express link,
// while the peer decides for its own direction. The express controller
// decides when (Config.ExpressControl, express.go; package tuning has the
// policy, gateway.Config.ExpressYield turns it on). Figures:
// bench/figures/computework.
//
// # Queue control
//
// A bulk link left to itself fills the WAN bottleneck's queue, and every
// message waits behind it there. Queue control caps the bulk links'
// receive windows while messages cross: with Config.QueueControl set, one
// controller per trunk (a QueueController; package tuning has the policy)
// gets the bulk links' TCP_INFO samples every few milliseconds (queue.go)
// and decides a cap, which the relay carries to the peer in CLAMP frames;
// the peer sets TCP_WINDOW_CLAMP on its socket. The relay knows only the
// samples, the cap and the frames. Figures: bench/figures/queuecontrol,
// bench/figures/quietlink.
//
// # What the gateway drives from outside
//
// Link.Hold stops writes to a link's socket until a given time (at most
// MaxHold): the gateway's PROBE_RTT guard holds a busy BBR bulk link just
// long enough for BBR to see a restart from idle at its min_rtt expiry,
// instead of cutting cwnd to 4 segments for 200 ms (bench/figures/bulk).
// Link.Pad writes PAD frames, filler the peer discards: the gateway primes
// each new BBR link with them until BBR has measured the path, so it does
// not pace messages at the rate of earlier bursts (bench/figures/prime).
//
// # Files
//
//   - config.go: Config and its defaults, the HELLO exchange (Handshake).
//   - link.go: Link, one WAN connection: its life, failure, drain.
//   - keep.go: keepalives, one timer for all links.
//   - send.go: the write side: frames, the send queues, inline writes,
//     the poller thread's corked batches, the writer goroutine, Hold and
//     Pad.
//   - recv.go: the read side: the link's reader (a stage: on the poller
//     thread while the link is idle), frame decoding, dispatch to streams.
//   - renew.go: retiring a link for its successor (express renewal).
//   - resume.go: WAN resume: the replay list, ACKs, a link down between
//     two connections, Resume.
//   - stream.go: Stream, one relayed connection, and its life (open,
//     accept, end); outbound.go and inbound.go: its two stages' steps,
//     application to link (credit, reads, framing) and link to
//     application (reordering, writes, credit returned).
//   - stage.go: the stage, one "wait until ready" for every link's reader
//     and both stages of every stream, on the poller thread or a goroutine.
//   - trunk.go: Trunk, a site pair's links and the streams they share, and
//     which link each DATA frame takes (pick, the express budget).
//   - queue.go: the queue-control hook: sampling the bulk links, CLAMP.
//   - express.go: the express-control hook: the express link's renewals
//     and holds, decided on the caller's TCP_INFO samples.
//   - poller.go, rtquiet.go, rawsys.go: the poller thread and how it keeps
//     Go's runtime out of the small-message path.
//   - grid.go: the shared 100 ms grid of idle periodic work.
//   - pool.go, tcpconn.go: payload buffers; the kernel TCP Conn.
//   - pipe.go: PipelinedConn's in-stage (two-buffer forwarding).
//   - sealed.go: SealedConn, a keyed link's connection carrying package
//     seal's AEAD records, read and written on the poller thread too.
//
// The benchmarks (a) to (e) and the NPB-like comparison, with their
// history, are indexed in bench/figures/README.md.
