package testbed

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
)

// errNoNft is returned when LAN loss is asked for and nft is missing.
var errNoNft = errors.New("lan-loss: needs the nft command (nftables; scripts/deps.sh installs it)")

// nft runs an nft command line in the lab's router namespace, with script
// on stdin if not "". The child is forked from inNetNS's locked thread, so
// it starts in the router namespace.
func (l *Lab) nft(script string, args ...string) ([]byte, error) {
	var out []byte
	err := inNetNS(filepath.Join(netnsDir(l.name), routerNS(l.name)), func() error {
		cmd := exec.Command("nft", args...)
		if script != "" {
			cmd.Stdin = strings.NewReader(script)
		}
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		var err error
		if out, err = cmd.Output(); err != nil {
			return fmt.Errorf("nft %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
		}
		return nil
	})
	return out, err
}

// applyLANLoss installs the LAN loss rules; after calibration, whose pings
// cross the LANs and must not be lost.
func (l *Lab) applyLANLoss() error {
	script := lanLossScript(&l.st.Config, l.hosts)
	if script == "" {
		return nil
	}
	if _, err := l.nft(script, "-f", "-"); err != nil {
		return fmt.Errorf("lan-loss: %w", err)
	}
	return nil
}

// LANStats reads each lossy site's LAN counters (nil if no site has loss).
func (l *Lab) LANStats() ([]LANStats, error) {
	c := &l.st.Config
	if lanLossScript(c, l.hosts) == "" {
		return nil, nil
	}
	byName := map[string]uint64{}
	for _, t := range [][2]string{{"bridge", lanTable}, {"netdev", lanQueueTable}} {
		if !strings.Contains(lanLossScript(c, l.hosts), "table "+t[0]+" "+t[1]+" ") {
			continue
		}
		out, err := l.nft("", "-j", "list", "counters", "table", t[0], t[1])
		if err != nil {
			return nil, fmt.Errorf("lab %s: LAN counters: %w", l.name, err)
		}
		var doc struct {
			Nftables []struct {
				Counter *struct {
					Name    string `json:"name"`
					Packets uint64 `json:"packets"`
				} `json:"counter"`
			} `json:"nftables"`
		}
		if err := json.Unmarshal(out, &doc); err != nil {
			return nil, fmt.Errorf("lab %s: LAN counters: %w", l.name, err)
		}
		for _, e := range doc.Nftables {
			if e.Counter != nil {
				byName[e.Counter.Name] = e.Counter.Packets
			}
		}
	}
	var st []LANStats
	for i, site := range c.Sites {
		loss, reorder := c.SiteLANLossOf(site), c.SiteLANReorderOf(site)
		if loss == 0 && reorder == 0 {
			continue
		}
		s := LANStats{Site: site, Loss: loss, Frames: byName[fmt.Sprintf("lan%d_frames", i+1)], Drops: byName[fmt.Sprintf("lan%d_drops", i+1)],
			Reorder: reorder, Held: byName[fmt.Sprintf("lan%d_held", i+1)]}
		if reorder > 0 {
			s.ReorderDelay = c.LANReorderDelay
		}
		st = append(st, s)
	}
	return st, nil
}
