//go:build !linux

package mx

import "errors"

type fdClock struct{ realClock }

func newFDClock() (*fdClock, error) { return nil, errors.New("no timerfd") }

func (c *fdClock) Close() error { return nil }
