package testbed

import (
	"fmt"
	"strings"
)

// sshArgOpts are ssh options that take a value (OpenSSH 9).
const sshArgOpts = "BbcDEeFIiJLlmOopQRSWw"

// sshNoArgOpts are ssh flags without a value.
const sshNoArgOpts = "46AaCfGgKkMNnqsTtVvXxYy"

// ParseSSHArgs splits an ssh command line (without argv[0]) as Open MPI's
// plm_rsh and MPICH hydra build it: options (ignored), the destination
// ([user@]host), then the remote command words, which ssh joins with spaces
// and hands to the remote shell.
func ParseSSHArgs(args []string) (host string, command string, err error) {
	i := 0
	for i < len(args) {
		a := args[i]
		if a == "--" {
			i++
			break
		}
		if len(a) < 2 || a[0] != '-' {
			break
		}
		// A cluster like -xT or -p22 or -oBatchMode=yes.
		consumedNext := false
		for j := 1; j < len(a); j++ {
			ch := a[j]
			if strings.IndexByte(sshArgOpts, ch) >= 0 {
				if j == len(a)-1 { // value is the next word
					if i+1 >= len(args) {
						return "", "", fmt.Errorf("ssh: option -%c needs a value", ch)
					}
					consumedNext = true
				}
				break // rest of the word is the value
			}
			if strings.IndexByte(sshNoArgOpts, ch) < 0 {
				return "", "", fmt.Errorf("ssh: unknown option -%c", ch)
			}
		}
		i++
		if consumedNext {
			i++
		}
	}
	if i >= len(args) {
		return "", "", fmt.Errorf("ssh: no destination host")
	}
	host = args[i]
	if at := strings.LastIndexByte(host, '@'); at >= 0 {
		host = host[at+1:]
	}
	if strings.HasPrefix(host, "ssh://") {
		host = strings.TrimPrefix(host, "ssh://")
	}
	if c := strings.LastIndexByte(host, ':'); c >= 0 {
		host = host[:c]
	}
	command = strings.Join(args[i+1:], " ")
	return host, command, nil
}
