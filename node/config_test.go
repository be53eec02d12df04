package node

import (
	"net/netip"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/mpi5k/mpi5k/mx"
)

// TestConfigDefaults: zero fields take DefaultConfig's values; a negative
// one, a missing one and a bad stream setting are refused by name.
func TestConfigDefaults(t *testing.T) {
	var c Config
	c.fillDefaults()
	c.Log = nil
	if d := DefaultConfig(); !reflect.DeepEqual(c, d) {
		t.Errorf("zero Config filled:\n%+v\nwant DefaultConfig:\n%+v", c, d)
	}
	ep := endpoint(t, mx.NewMemHub(1500).Attach(mx.MAC{2, 0, 0, 0, 9, 1}), mx.Config{})
	ok := Config{Addr: nodeAddr, Listen: netip.MustParseAddrPort("127.0.0.2:0"), Gateways: []Gateway{{LAN: gwLAN, MX: ep.Addr()}}, EP: ep}
	if err := ok.Validate(); err != nil {
		t.Errorf("a Config with zero settings: %v", err)
	}
	for field, mod := range map[string]func(*Config){
		"Hold":         func(c *Config) { c.Hold = -time.Second },
		"MaxConns":     func(c *Config) { c.MaxConns = -1 },
		"node address": func(c *Config) { c.Addr = netip.Addr{} },
		"Chunk":        func(c *Config) { c.Stream.Chunk = 1 << 30 },
	} {
		c := ok
		mod(&c)
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), field) {
			t.Errorf("%s: %v", field, err)
		}
		if _, err := New(c); err == nil {
			t.Errorf("%s: New took it", field)
		}
	}
}
