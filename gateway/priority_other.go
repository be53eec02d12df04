//go:build !linux

package gateway

import "fmt"

// RaisePriority is implemented on Linux only; other systems keep the
// inherited priority.
func RaisePriority(nice int) error {
	if nice == 0 {
		return nil
	}
	return fmt.Errorf("--priority: setting a gateway's priority is implemented on Linux only")
}
