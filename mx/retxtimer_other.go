//go:build !linux

package mx

import "errors"

// No timerfd here: the engine's Clock runs the retransmission timer too.
func newFDTimer(func()) (retxTimer, error) { return nil, errors.New("mx: no timerfd on this system") }

const fdTimerSlack = 0
