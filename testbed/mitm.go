package testbed

import (
	"encoding/binary"
	"fmt"
	"sync/atomic"
)

// The emulator is on the path of every WAN packet, so it can play the
// man in the middle an on-path attacker is: Tamper makes it flip one bit
// in the TCP payload of data segments of one port's flows (the gateways'
// WAN port), and recompute the TCP checksum so the receiving kernel
// accepts the segment and hands the altered byte to the application.
// Only an integrity check above TCP (TLS between keyed gateways) can tell.

// Tamper is what the emulator alters on a running lab (Lab.Tamper). The
// zero value (Every 0) stops tampering.
type Tamper struct {
	// A and B name a site pair (both directions); empty: every pair.
	A string `json:"a,omitempty"`
	B string `json:"b,omitempty"`
	// Port selects the TCP flows whose source or destination port it is
	// (GatewayWANPort: the links between gateways).
	Port uint16 `json:"port"`
	// Every: the Nth data segment of those flows, counted per direction,
	// gets a bit flipped (1: every one).
	Every uint64 `json:"every"`
	// Count stops after that many flips per direction (0: no limit).
	Count uint64 `json:"count,omitempty"`
}

// TamperMinPayload is the least TCP payload of a segment Tamper alters:
// a data segment of a bulk transfer, so the flip lands in stream bytes
// and leaves handshakes and short control messages alone.
const TamperMinPayload = 512

// tamperState is one direction's Tamper and its counters; the reader
// thread alone updates seen, and flipped is read by stats.
type tamperState struct {
	spec          Tamper
	seen, flipped atomic.Uint64
}

// check validates a Tamper against the lab's site pairs (links).
func (t Tamper) check(links []*link) error {
	if t.Every > 0 && t.Port == 0 {
		return fmt.Errorf("tamper: port 0: give the TCP port whose flows to alter (the gateways' WAN port is %d)", GatewayWANPort)
	}
	if (t.A == "") != (t.B == "") {
		return fmt.Errorf("tamper: give both sites of the pair (a=%q b=%q), or neither for every pair", t.A, t.B)
	}
	if t.A == "" {
		return nil
	}
	for _, l := range links {
		if l.from == t.A && l.to == t.B {
			return nil
		}
	}
	return fmt.Errorf("tamper: no link between sites %q and %q", t.A, t.B)
}

// applies reports whether t selects direction l.
func (t Tamper) applies(l *link) bool {
	return t.A == "" || (l.from == t.A && l.to == t.B) || (l.from == t.B && l.to == t.A)
}

// tamper flips a bit of pkt (an IPv4 packet) if l's Tamper selects it,
// and reports whether it did (reader only).
func (l *link) tamper(pkt []byte) bool {
	ts := l.tamp.Load()
	if ts == nil || ts.spec.Every == 0 {
		return false
	}
	if ts.spec.Count > 0 && ts.flipped.Load() >= ts.spec.Count {
		return false
	}
	off, ok := tcpPayload(pkt, ts.spec.Port)
	if !ok {
		return false
	}
	if ts.seen.Add(1)%ts.spec.Every != 0 {
		return false
	}
	flipBit(pkt, off+(len(pkt)-off)/2, 3)
	ts.flipped.Add(1)
	return true
}

// tcpPayload returns the offset of the payload of pkt if it is an
// unfragmented IPv4 TCP segment to or from port carrying at least
// TamperMinPayload bytes.
func tcpPayload(pkt []byte, port uint16) (int, bool) {
	if len(pkt) < 20 || pkt[0]>>4 != 4 || pkt[9] != 6 {
		return 0, false
	}
	ihl := int(pkt[0]&0xf) * 4
	total := int(binary.BigEndian.Uint16(pkt[2:]))
	if ihl < 20 || total > len(pkt) || total < ihl+20 || binary.BigEndian.Uint16(pkt[6:])&0x3fff != 0 {
		return 0, false // short, or a fragment (MF set or an offset)
	}
	tcp := pkt[ihl:total]
	if binary.BigEndian.Uint16(tcp[0:]) != port && binary.BigEndian.Uint16(tcp[2:]) != port {
		return 0, false
	}
	doff := int(tcp[12]>>4) * 4
	if doff < 20 || len(tcp)-doff < TamperMinPayload {
		return 0, false
	}
	return ihl + doff, true
}

// flipBit inverts bit of byte i of the IPv4 TCP packet pkt and updates
// the TCP checksum to match (RFC 1624: HC' = ~(~HC + ~m + m') over the
// 16-bit word m that holds the byte).
func flipBit(pkt []byte, i int, bit uint) {
	ihl := int(pkt[0]&0xf) * 4
	w := i &^ 1 // the checksum sums 16-bit words from the TCP header, which starts at an even offset
	old := binary.BigEndian.Uint16(pkt[w:])
	pkt[i] ^= 1 << bit
	cur := binary.BigEndian.Uint16(pkt[w:])
	ck := ihl + 16
	sum := uint32(^binary.BigEndian.Uint16(pkt[ck:])) + uint32(^old) + uint32(cur)
	for sum>>16 != 0 {
		sum = sum&0xffff + sum>>16
	}
	binary.BigEndian.PutUint16(pkt[ck:], ^uint16(sum))
}

// tcpChecksumOK reports whether the TCP checksum of the IPv4 packet pkt
// is right (tests).
func tcpChecksumOK(pkt []byte) bool {
	ihl := int(pkt[0]&0xf) * 4
	total := int(binary.BigEndian.Uint16(pkt[2:]))
	var sum uint32
	add := func(b []byte) {
		for len(b) >= 2 {
			sum += uint32(binary.BigEndian.Uint16(b))
			b = b[2:]
		}
		if len(b) == 1 {
			sum += uint32(b[0]) << 8
		}
	}
	add(pkt[12:20]) // source and destination addresses
	sum += 6 + uint32(total-ihl)
	add(pkt[ihl:total])
	for sum>>16 != 0 {
		sum = sum&0xffff + sum>>16
	}
	return uint16(sum) == 0xffff
}

// tampered is the segments l's Tamper altered.
func (l *link) tampered() uint64 {
	if ts := l.tamp.Load(); ts != nil {
		return ts.flipped.Load()
	}
	return 0
}

// applyTamper puts t in force on the links it selects and stops it on
// the others; it returns an error text naming what is wrong, and changes
// nothing then.
func applyTamper(links []*link, t *Tamper) string {
	if t == nil {
		return "tamper: no tamper given"
	}
	if err := t.check(links); err != nil {
		return err.Error()
	}
	for _, l := range links {
		if t.Every > 0 && t.applies(l) {
			l.tamp.Store(&tamperState{spec: *t})
		} else {
			l.tamp.Store(nil)
		}
	}
	return ""
}
