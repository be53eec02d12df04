package gateway

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime/pprof"
)

// startProfile starts the CPU profile of Config.CPUProfile, if set: one
// file per gateway process, cpu-<site>-<pid>.pprof in that directory,
// covering the whole run, so a measurement can say where the gateways'
// CPU goes (go tool pprof). The returned stop writes it out.
func (g *Gateway) startProfile() (stop func(), err error) {
	if g.cfg.CPUProfile == "" {
		return func() {}, nil
	}
	name := filepath.Join(g.cfg.CPUProfile, fmt.Sprintf("cpu-%s-%d.pprof", g.cfg.Site, os.Getpid()))
	f, err := os.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return nil, fmt.Errorf("gateway: --cpu-profile: %w (the directory must exist on the gateway's host)", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		os.Remove(name)
		return nil, fmt.Errorf("gateway: --cpu-profile: %w", err)
	}
	return func() {
		pprof.StopCPUProfile()
		if err := f.Close(); err != nil {
			g.log.Warn("CPU profile not written whole", "file", name, "err", err)
		}
	}, nil
}
