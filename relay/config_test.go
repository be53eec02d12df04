package relay

import (
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/mpi5k/mpi5k/header"
)

// TestDefaultConfig: a zero Config becomes DefaultConfig, and a field that
// follows another (DeadAfter, ExpressMax) follows the value given.
func TestDefaultConfig(t *testing.T) {
	var c Config
	c.fillDefaults()
	c.Logger = nil
	if d := DefaultConfig(); !reflect.DeepEqual(c, d) {
		t.Errorf("zero Config filled:\n%+v\nwant DefaultConfig:\n%+v", c, d)
	}
	c = Config{PingInterval: 100 * time.Millisecond, SmallFrame: 4 << 10}
	c.fillDefaults()
	if c.DeadAfter != 400*time.Millisecond || c.ExpressMax != 4<<10 {
		t.Errorf("DeadAfter %v, ExpressMax %d: want 4 × PingInterval and SmallFrame", c.DeadAfter, c.ExpressMax)
	}
	d := DefaultConfig()
	if err := d.Validate(); err != nil {
		t.Errorf("DefaultConfig: %v", err)
	}
	if err := (&Config{}).Validate(); err != nil {
		t.Errorf("zero Config: %v", err)
	}
}

// TestValidate: a field out of range is named in the error, and a link
// given one panics instead of running with it.
func TestValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		c    Config
	}{
		{"Chunk", Config{Chunk: header.MaxPayload + 1}},
		{"Chunk", Config{Chunk: -1}},
		{"Pipeline", Config{Pipeline: -2}},
		{"PingInterval", Config{PingInterval: -time.Second}},
		{"DeadAfter", Config{DeadAfter: -time.Second}},
		{"MaxEarly", Config{MaxEarly: -1}},
		{"ReplayMax", Config{ReplayMax: -1}},
	} {
		err := tc.c.Validate()
		if err == nil || !strings.Contains(err.Error(), tc.name) {
			t.Errorf("%+v: %v, want an error naming %s", tc.c, err, tc.name)
		}
	}
	defer func() {
		if recover() == nil {
			t.Error("a link took a negative PingInterval")
		}
	}()
	newLink(nil, Config{PingInterval: -1}, header.Hello{Window: 1 << 20, MaxPayload: header.MaxPayload}, NewTrunk(true, nil), 0, false, 0)
}
